-- trace_counts: entry requests and multi-layer retry traces per entry service over a window.
--
-- Inputs: p_traces.
-- Output: service, entry_requests, multi_layer_retry_traces
SELECT service, SUM(entry_requests) AS entry_requests,
  SUM(multi_layer_retry_traces) AS multi_layer_retry_traces
FROM p_traces
GROUP BY service
ORDER BY service
