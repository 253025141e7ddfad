-- remaining_budgets: per edge over a window, the median remaining budget of its attempts
-- when they start (p_budgets; log-bucketed, within 2%), for the budget topology: read with
-- the edge's timeout, it shows which hop is squeezed.
--
-- Inputs: p_budgets.
-- Output: caller, callee, operation, remaining_budget_ms
WITH buckets AS (
  SELECT caller, callee, operation, bucket, SUM(n) AS n
  FROM p_budgets GROUP BY caller, callee, operation, bucket
),
cumulative AS (
  SELECT caller, callee, operation, bucket,
    SUM(n) OVER (PARTITION BY caller, callee, operation ORDER BY bucket
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
    SUM(n) OVER (PARTITION BY caller, callee, operation) AS total
  FROM buckets
)
SELECT caller, callee, operation,
  sg_bucket_ms(MIN(CASE WHEN cum >= CEIL(0.5 * total) THEN bucket END)) AS remaining_budget_ms
FROM cumulative
GROUP BY caller, callee, operation
ORDER BY caller, callee, operation
