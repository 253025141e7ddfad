-- partial_budgets: the caller's remaining budget when each attempt starts (the budget
-- topology): the deadline of the nearest budgeted ancestor (attempts.anchor_deadline_ms)
-- minus the time already spent since that ancestor started; 0 when already spent.
-- Attempts without a budgeted ancestor have none. Log-bucketed per edge for the report's
-- median (sg_bucket, 2%), and split by Prometheus bucket (`le`, index into
-- histogram::le_bounds) with the exact sum for stormglass_remaining_budget_seconds. Counts
-- are sums of sampling weights. Mergeable by SUM of n and seconds.
--
-- Grouped by the attempts' integer `edge`, the names joined once per edge (see
-- partial_edges).
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, bucket, le, n, seconds
WITH remaining AS (
  SELECT edge, weight,
    GREATEST(anchor_deadline_ms - (start_ns - anchor_start_ns) / 1e6, 0.0) AS ms
  FROM attempts
  WHERE anchor_deadline_ms IS NOT NULL AND anchor_start_ns IS NOT NULL
),
counted AS (
  SELECT edge, sg_bucket(ms) AS bucket, sg_le(ms / 1e3) AS le,
    SUM(weight) AS n, SUM(ms * weight) / 1e3 AS seconds
  FROM remaining
  GROUP BY edge, sg_bucket(ms), sg_le(ms / 1e3)
)
SELECT e.caller, e.callee, e.operation, c.bucket, c.le, c.n, c.seconds
FROM counted c
JOIN edge_names e ON e.edge = c.edge
