-- entry_operations: per entry (service, operation) over a window: requests; error_rate =
-- failed entry requests / requests; p99_ms and p999_ms of the entry requests' durations
-- (nearest rank over the 2% histogram, as the layers'); latency_slo_share = the share of the
-- entry requests within params.slo_latency_ms (those in its 2% bucket or below: within 2%).
-- Storm potential is added by the report from p_links and the edges' max attempts (a graph
-- walk).
--
-- Inputs: p_entries, p_entry_latency, params.
-- Output: service, operation, requests, error_rate, p99_ms, p999_ms, latency_slo_share
WITH r AS (
  SELECT service, operation, SUM(requests) AS requests, SUM(failed) AS failed
  FROM p_entries
  GROUP BY service, operation
),
q AS (
  SELECT l.service, l.operation,
    sg_bucket_quantile(l.bucket, l.n, 0.99) AS p99_ms,
    sg_bucket_quantile(l.bucket, l.n, 0.999) AS p999_ms,
    COALESCE(SUM(l.n) FILTER (WHERE l.bucket <= sg_bucket(p.slo_latency_ms)), 0.0)
      / NULLIF(SUM(l.n), 0) AS latency_slo_share
  FROM params p CROSS JOIN p_entry_latency l
  GROUP BY l.service, l.operation
)
SELECT r.service, r.operation, CAST(ROUND(r.requests) AS BIGINT) AS requests,
  CAST(r.failed AS DOUBLE) / NULLIF(r.requests, 0) AS error_rate, q.p99_ms, q.p999_ms,
  q.latency_slo_share
FROM r
LEFT JOIN q ON (q.service IS NOT DISTINCT FROM r.service)
  AND (q.operation IS NOT DISTINCT FROM r.operation)
ORDER BY r.service, r.operation
