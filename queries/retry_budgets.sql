-- retry_budgets: per edge over a window, whether its retries could fit in what was left of
-- the caller's budget (p_retry_budgets):
--   callee_median_ms       the median of the callee's durations on the edge (nearest rank,
--                          log-bucketed, within 2%)
--   out_of_budget_retries  retries that started with less budget left than that median
--                          (retries after the deadline, with none left, among them): their
--                          remaining budget's bucket lies below the median's, so a budget
--                          within 2% of the median is not counted
--   example_trace_id       the smallest trace id among those retries
-- The exporter counts stormglass_out_of_budget_retries_total with the same rule, each
-- interval's retries against the window's median when the interval is analysed
-- (stormglass_analytics::counts::out_of_budget).
--
-- Inputs: p_retry_budgets.
-- Output: caller, callee, operation, callee_median_ms, out_of_budget_retries, example_trace_id
WITH medians AS (
  SELECT caller, callee, operation,
    sg_bucket_quantile(bucket, durations, 0.5) AS callee_median_ms
  FROM p_retry_budgets
  WHERE durations > 0
  GROUP BY caller, callee, operation
)
SELECT m.caller, m.callee, m.operation, m.callee_median_ms,
  COALESCE(SUM(b.retries), 0.0) AS out_of_budget_retries,
  MIN(b.example_trace_id) AS example_trace_id
FROM medians m
LEFT JOIN p_retry_budgets b ON b.caller = m.caller AND b.callee = m.callee
  AND b.operation = m.operation AND b.retries > 0
  AND b.bucket < sg_bucket(m.callee_median_ms)
GROUP BY m.caller, m.callee, m.operation, m.callee_median_ms
