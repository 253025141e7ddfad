-- partial_traces: per entry service, entry requests, traces in which two or more distinct
-- callers retried, and broken traces (a span whose parent never arrived). A trace counts
-- once in multi_layer_retry_traces, under its first entry (earliest start, then span id),
-- even when a missing parent gives it several entry rows; a broken trace counts once, under
-- its first span without a parent in the trace. A trace is released (and so analysed)
-- once: mergeable by SUM.
--
-- Inputs: entries, findings, lineage.
-- Output: service, entry_requests, multi_layer_retry_traces, broken_traces
WITH multi_layer AS (
  SELECT DISTINCT trace_id FROM findings WHERE kind = 'multi_layer_retry'
),
first_entry AS (
  -- ranked only within the traces counted here: a per-trace window costs per trace
  SELECT trace_id, service, weight FROM (
    SELECT e.trace_id, e.service, e.weight,
      ROW_NUMBER() OVER (PARTITION BY e.trace_id ORDER BY e.start_ns, e.span_id) AS n
    FROM entries e
    JOIN multi_layer m ON m.trace_id = e.trace_id
  ) ranked
  WHERE n = 1
),
retried AS (
  SELECT service, SUM(weight) AS traces FROM first_entry GROUP BY service
),
broken AS (
  SELECT service, SUM(weight) AS traces
  FROM (
    SELECT trace_id, service_name AS service, weight,
      ROW_NUMBER() OVER (PARTITION BY trace_id ORDER BY start_ns, span_id) AS n
    FROM lineage
    -- (the selective condition last: see entries)
    WHERE parent_span_id IS NOT NULL AND depth = 0
  ) orphaned
  WHERE n = 1
  GROUP BY service
),
per_service AS (
  SELECT service, SUM(weight) AS entry_requests FROM entries GROUP BY service
),
services AS (
  SELECT service FROM per_service UNION SELECT service FROM broken
)
SELECT s.service, COALESCE(p.entry_requests, 0.0) AS entry_requests,
  COALESCE(r.traces, 0.0) AS multi_layer_retry_traces,
  COALESCE(b.traces, 0.0) AS broken_traces
FROM services s
LEFT JOIN per_service p ON p.service = s.service
LEFT JOIN retried r ON r.service = s.service
LEFT JOIN broken b ON b.service = s.service
