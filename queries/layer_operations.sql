-- layer_operations: per service and operation it served, over a window: requests (the
-- weighted count of its layer durations, SERVER spans or, for uninstrumented callees, the
-- attempts as their callers saw them) and the P95, P99 and P99.9 of those durations from
-- the merged log-bucketed histograms (sg_bucket_quantile: nearest rank, <= 2% relative
-- error), so a slow operation is not hidden in a fast service's tail, nor a fast one
-- judged against a slow one's. The report nests them under their layer
-- (`layers[].operations[]`).
--
-- Inputs: p_latency.
-- Output: service, operation, requests, p95_ms, p99_ms, p999_ms
SELECT service, operation, CAST(ROUND(SUM(n)) AS BIGINT) AS requests,
  sg_bucket_quantile(bucket, n, 0.95) AS p95_ms,
  sg_bucket_quantile(bucket, n, 0.99) AS p99_ms,
  sg_bucket_quantile(bucket, n, 0.999) AS p999_ms
FROM p_latency
WHERE operation IS NOT NULL
GROUP BY service, operation
ORDER BY service, operation
