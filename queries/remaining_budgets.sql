-- remaining_budgets: per edge over a window, the median remaining budget of its attempts
-- when they start (p_budgets; log-bucketed, within 2%), for the budget topology: read with
-- the edge's timeout, it shows which hop is squeezed. Unordered: the report places each row
-- by its edge.
--
-- Inputs: p_budgets.
-- Output: caller, callee, operation, remaining_budget_ms
SELECT caller, callee, operation,
  sg_bucket_quantile(bucket, n, 0.5) AS remaining_budget_ms
FROM p_budgets
GROUP BY caller, callee, operation
