-- partial_latency: log-bucketed histogram of layer latency per service: SERVER span
-- durations, and for callees that send no SERVER spans (uninstrumented, e.g. a database:
-- none in this data nor, live, earlier in the window, `window_servers`) the
-- client-observed attempt durations. Each row is also split by the Prometheus bucket
-- (`le`, index into histogram::le_bounds) and carries the exact sum of its durations, so
-- the same rows feed the report's quantiles (by bucket) and
-- stormglass_layer_duration_seconds (by le). Mergeable by SUM of n and seconds.
--
-- Inputs: spans, attempts, window_servers.
-- Output: service, bucket, le, n, seconds
WITH instrumented AS (
  SELECT DISTINCT service_name AS service FROM spans WHERE kind = 'server'
  UNION
  SELECT service FROM window_servers
)
SELECT service, bucket, sg_le(ms / 1e3) AS le, SUM(weight) AS n, SUM(ms * weight) / 1e3 AS seconds
FROM (
  SELECT service_name AS service, sg_bucket(duration_ns / 1e6) AS bucket, duration_ns / 1e6 AS ms,
    weight
  FROM spans WHERE kind = 'server'
  UNION ALL
  SELECT a.callee AS service, sg_bucket(a.duration_ms) AS bucket, a.duration_ms AS ms, a.weight
  FROM attempts a LEFT JOIN instrumented i ON i.service = a.callee
  WHERE i.service IS NULL
) durations
GROUP BY service, bucket, sg_le(ms / 1e3)
