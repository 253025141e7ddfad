-- partial_traces: per entry service, entry requests and traces in which two or more
-- distinct callers retried. A trace counts once in multi_layer_retry_traces, under its
-- first entry (earliest start, then span id), even when a missing parent gives it several
-- entry rows. A trace is released (and so analysed) once: mergeable by SUM.
--
-- Inputs: entries, findings.
-- Output: service, entry_requests, multi_layer_retry_traces
WITH first_entry AS (
  SELECT trace_id, service FROM (
    SELECT trace_id, service,
      ROW_NUMBER() OVER (PARTITION BY trace_id ORDER BY start_ns, span_id) AS n
    FROM entries
  ) ranked
  WHERE n = 1
),
retried AS (
  SELECT fe.service, COUNT(*) AS traces
  FROM first_entry fe
  JOIN (SELECT DISTINCT trace_id FROM findings WHERE kind = 'multi_layer_retry') f
    ON f.trace_id = fe.trace_id
  GROUP BY fe.service
)
SELECT e.service, COUNT(*) AS entry_requests,
  COALESCE(MAX(r.traces), 0) AS multi_layer_retry_traces
FROM entries e
LEFT JOIN retried r ON r.service = e.service
GROUP BY e.service
