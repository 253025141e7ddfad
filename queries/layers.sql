-- layers: per service (layer) figures over a window: requests received, baseline attempts,
-- amplification (received / baseline, exact), P99 and P99.9 latency and tail_ratio
-- (p999 / p99) from the merged log-bucketed histograms (sg_bucket_quantile: nearest-rank,
-- <= 2% relative error), and timeout_rate: of the attempts the layer received (its edges'
-- attempts, entry requests aside), those ending in `deadline`; error_rate: of those
-- attempts, the ones not `ok` (p_layer_codes, whose counters keep the raw status codes).
-- Ratios with an empty denominator are null.
--
-- Inputs: p_layers, p_latency, p_edges, p_layer_codes (the window's merged partials).
-- Output: service, requests, baseline_attempts, amplification, p99_ms, p999_ms, tail_ratio,
--   timeout_rate, error_rate
WITH counts AS (
  SELECT service, SUM(received) AS received, SUM(baseline) AS baseline
  FROM p_layers GROUP BY service
),
quantiles AS (
  SELECT service,
    sg_bucket_quantile(bucket, n, 0.99) AS p99_ms,
    sg_bucket_quantile(bucket, n, 0.999) AS p999_ms
  FROM p_latency GROUP BY service
),
timeouts AS (
  SELECT callee AS service, SUM(attempts) AS attempts, SUM(timeout_attempts) AS timeout_attempts
  FROM p_edges GROUP BY callee
),
errors AS (
  SELECT service, SUM(n) AS attempts, COALESCE(SUM(n) FILTER (WHERE outcome <> 'ok'), 0.0) AS failed
  FROM p_layer_codes GROUP BY service
)
SELECT COALESCE(c.service, q.service) AS service,
  CAST(ROUND(COALESCE(c.received, 0)) AS BIGINT) AS requests,
  CAST(ROUND(COALESCE(c.baseline, 0)) AS BIGINT) AS baseline_attempts,
  CAST(c.received AS DOUBLE) / NULLIF(c.baseline, 0) AS amplification,
  q.p99_ms, q.p999_ms,
  q.p999_ms / NULLIF(q.p99_ms, 0) AS tail_ratio,
  CAST(t.timeout_attempts AS DOUBLE) / NULLIF(t.attempts, 0) AS timeout_rate,
  er.failed / NULLIF(er.attempts, 0) AS error_rate
FROM counts c
FULL OUTER JOIN quantiles q ON q.service = c.service
LEFT JOIN timeouts t ON t.service = COALESCE(c.service, q.service)
LEFT JOIN errors er ON er.service = COALESCE(c.service, q.service)
ORDER BY service
