-- trace_counts: entry requests, multi-layer retry traces and broken traces (a parent span
-- never arrived) per entry service over a window.
--
-- Inputs: p_traces.
-- Output: service, entry_requests, multi_layer_retry_traces, broken_traces
SELECT service, SUM(entry_requests) AS entry_requests,
  SUM(multi_layer_retry_traces) AS multi_layer_retry_traces,
  SUM(broken_traces) AS broken_traces
FROM p_traces
GROUP BY service
ORDER BY service
