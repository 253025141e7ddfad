-- partial_edge_latency: per edge, a log-bucketed histogram (sg_bucket, 2%) of the durations
-- of the callee's SERVER spans under the edge's attempts (those that ended, not pending):
-- the latency of the operation the edge's timeout guards, which a service's other
-- operations cannot hide or inflate (edges: callee_p999_ms). Counts are sums of sampling
-- weights. Mergeable by SUM of n.
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, bucket, n
WITH counted AS (
  SELECT edge, sg_bucket((server_end_ns - server_start_ns) / 1e6) AS bucket, SUM(weight) AS n
  FROM attempts
  WHERE server_end_ns IS NOT NULL AND NOT COALESCE(server_pending, false)
  GROUP BY edge, sg_bucket((server_end_ns - server_start_ns) / 1e6)
)
SELECT e.caller, e.callee, e.operation, c.bucket, c.n
FROM counted c
JOIN edge_names e ON e.edge = c.edge
