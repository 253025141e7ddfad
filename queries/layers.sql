-- layers: per service (layer) figures over a window: requests received, baseline attempts,
-- amplification (received / baseline, exact), P99 and P99.9 latency and tail_ratio
-- (p999 / p99) from the merged log-bucketed histograms. Quantiles are nearest-rank: the
-- first bucket whose cumulative count reaches ceil(q * n), read back at the bucket's
-- representative value (<= 2% relative error). Ratios with an empty denominator are null.
--
-- Inputs: p_layers, p_latency (the window's merged partials).
-- Output: service, requests, baseline_attempts, amplification, p99_ms, p999_ms, tail_ratio
WITH counts AS (
  SELECT service, SUM(received) AS received, SUM(baseline) AS baseline
  FROM p_layers GROUP BY service
),
buckets AS (
  SELECT service, bucket, SUM(n) AS n FROM p_latency GROUP BY service, bucket
),
cumulative AS (
  SELECT service, bucket,
    SUM(n) OVER (PARTITION BY service ORDER BY bucket ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
    SUM(n) OVER (PARTITION BY service) AS total
  FROM buckets
),
quantiles AS (
  SELECT service,
    sg_bucket_ms(MIN(CASE WHEN cum >= CEIL(0.99 * total) THEN bucket END)) AS p99_ms,
    sg_bucket_ms(MIN(CASE WHEN cum >= CEIL(0.999 * total) THEN bucket END)) AS p999_ms
  FROM cumulative GROUP BY service
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
