-- partial_traces: per entry service, entry requests and traces in which two or more
-- distinct callers retried. A trace is released (and so analysed) once: mergeable by SUM.
--
-- Inputs: entries, findings.
-- Output: service, entry_requests, multi_layer_retry_traces
SELECT e.service, COUNT(*) AS entry_requests,
  COUNT(DISTINCT f.trace_id) AS multi_layer_retry_traces
FROM entries e
LEFT JOIN (SELECT DISTINCT trace_id FROM findings WHERE kind = 'multi_layer_retry') f
  ON f.trace_id = e.trace_id
GROUP BY e.service
