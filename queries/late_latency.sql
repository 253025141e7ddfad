-- late_latency: partial_latency's rows for SERVER spans that arrived after their trace was
-- released (a callee stalled longer than assembly.idle reports late). Their trace was
-- analysed without them, but their durations are still their service's latency: without
-- them a stall would hide its own tail. Added to the interval's partial_latency.
--
-- Inputs: spans (late SERVER spans only).
-- Output: service, operation, bucket, le, n, seconds
SELECT service_name AS service, operation, sg_bucket(duration_ns / 1e6) AS bucket,
  sg_le(duration_ns / 1e9) AS le, SUM(weight) AS n, SUM(duration_ns / 1e6 * weight) / 1e3 AS seconds
FROM spans
WHERE kind = 'server'
GROUP BY service_name, operation, sg_bucket(duration_ns / 1e6), sg_le(duration_ns / 1e9)
