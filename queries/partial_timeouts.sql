-- partial_timeouts: log-bucketed histogram of attempt budgets (deadline_ms) per edge, for
-- the median timeout. Mergeable by SUM of n per bucket (sg_bucket: <= 2% relative error).
--
-- Grouped by the attempts' integer `edge`, the names joined once per edge (see
-- partial_edges).
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, bucket, n
SELECT e.caller, e.callee, e.operation, t.bucket, t.n
FROM (
  SELECT edge, sg_bucket(deadline_ms) AS bucket, SUM(weight) AS n
  FROM attempts
  WHERE deadline_ms IS NOT NULL
  GROUP BY edge, sg_bucket(deadline_ms)
) t
JOIN edge_names e ON e.edge = t.edge
