-- partial_timeouts: log-bucketed histogram of attempt budgets (deadline_ms) per edge, for
-- the median timeout. Mergeable by SUM of n per bucket (sg_bucket: <= 2% relative error).
--
-- Inputs: attempts.
-- Output: caller, callee, operation, bucket, n
SELECT caller, callee, operation, sg_bucket(deadline_ms) AS bucket, SUM(weight) AS n
FROM attempts
WHERE deadline_ms IS NOT NULL
GROUP BY caller, callee, operation, sg_bucket(deadline_ms)
