-- partial_latency: log-bucketed histogram of layer latency per service: SERVER span
-- durations, and for callees that send no SERVER spans (uninstrumented, e.g. a database)
-- the client-observed attempt durations. Mergeable by SUM of n per bucket.
--
-- Inputs: spans, attempts.
-- Output: service, bucket, n
WITH instrumented AS (
  SELECT DISTINCT service_name AS service FROM spans WHERE kind = 'server'
)
SELECT service, bucket, COUNT(*) AS n
FROM (
  SELECT service_name AS service, sg_bucket(duration_ns / 1e6) AS bucket
  FROM spans WHERE kind = 'server'
  UNION ALL
  SELECT a.callee AS service, sg_bucket(a.duration_ms) AS bucket
  FROM attempts a LEFT JOIN instrumented i ON i.service = a.callee
  WHERE i.service IS NULL
) durations
GROUP BY service, bucket
