-- trace_counts: entry requests, multi-layer retry traces and broken traces (a parent span
-- never arrived) per entry service over a window.
--
-- Inputs: p_traces.
-- Output: service, entry_requests, multi_layer_retry_traces, broken_traces
SELECT service, CAST(ROUND(SUM(entry_requests)) AS BIGINT) AS entry_requests,
  CAST(ROUND(SUM(multi_layer_retry_traces)) AS BIGINT) AS multi_layer_retry_traces,
  CAST(ROUND(SUM(broken_traces)) AS BIGINT) AS broken_traces
FROM p_traces
GROUP BY service
ORDER BY service
