-- layers: per service (layer) figures over a window: requests received, baseline attempts,
-- amplification (received / baseline, exact), P99 and P99.9 latency and tail_ratio
-- (p999 / p99) from the merged log-bucketed histograms (sg_bucket_quantile: nearest-rank,
-- <= 2% relative error). Ratios with an empty denominator are null.
--
-- Inputs: p_layers, p_latency (the window's merged partials).
-- Output: service, requests, baseline_attempts, amplification, p99_ms, p999_ms, tail_ratio
WITH counts AS (
  SELECT service, SUM(received) AS received, SUM(baseline) AS baseline
  FROM p_layers GROUP BY service
),
quantiles AS (
  SELECT service,
    sg_bucket_quantile(bucket, n, 0.99) AS p99_ms,
    sg_bucket_quantile(bucket, n, 0.999) AS p999_ms
  FROM p_latency GROUP BY service
)
SELECT COALESCE(c.service, q.service) AS service,
  CAST(ROUND(COALESCE(c.received, 0)) AS BIGINT) AS requests,
  CAST(ROUND(COALESCE(c.baseline, 0)) AS BIGINT) AS baseline_attempts,
  CAST(c.received AS DOUBLE) / NULLIF(c.baseline, 0) AS amplification,
  q.p99_ms, q.p999_ms,
  q.p999_ms / NULLIF(q.p99_ms, 0) AS tail_ratio
FROM counts c
FULL OUTER JOIN quantiles q ON q.service = c.service
ORDER BY service
