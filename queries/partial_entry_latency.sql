-- partial_entry_latency: log-bucketed histogram of entry request durations (entries) per
-- (service, operation), each row also split by the Prometheus bucket `le` as
-- partial_latency's are, so the same rows feed the entry operations' quantiles (by bucket)
-- and stormglass_entry_duration_seconds (by le). Counts are sums of sampling weights.
-- Mergeable by SUM of n and seconds.
--
-- Inputs: entries.
-- Output: service, operation, bucket, le, n, seconds
SELECT service, operation, sg_bucket(duration_ms) AS bucket, sg_le(duration_ms / 1e3) AS le,
  SUM(weight) AS n, SUM(duration_ms * weight) / 1e3 AS seconds
FROM entries
GROUP BY service, operation, sg_bucket(duration_ms), sg_le(duration_ms / 1e3)
