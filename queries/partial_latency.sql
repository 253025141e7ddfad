-- partial_latency: log-bucketed histogram of layer latency per service and operation
-- (layer_durations): the layers' quantiles sum a service's operations, `layer_operations`
-- reads them apart. Each row is also split by the Prometheus bucket (`le`, index into histogram::le_bounds)
-- and carries the exact sum of its durations, so the same rows feed the report's quantiles
-- (by bucket) and stormglass_layer_duration_seconds (by le). Counts are sums of sampling
-- weights. Mergeable by SUM of n and seconds.
--
-- Inputs: layer_durations.
-- Output: service, operation, bucket, le, n, seconds
SELECT service, operation, sg_bucket(ms) AS bucket, sg_le(ms / 1e3) AS le, SUM(weight) AS n,
  SUM(ms * weight) / 1e3 AS seconds
FROM layer_durations
GROUP BY service, operation, sg_bucket(ms), sg_le(ms / 1e3)
