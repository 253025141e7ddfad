-- finding_counts: one row per (kind, caller, callee, operation) over a window, with the
-- severity of its kind, the count, an example trace and its detail; timeout_below_tail,
-- timeout_without_margin and timeout_too_long findings come from the edges' merged figures,
-- out_of_budget_retry ones from them and retry_budgets (the example: the smallest trace id
-- among the out-of-budget retries), clock_skew ones (operation '*', counting the calls the
-- estimate rests on) from clock_skew.
--
-- Unordered: the report orders findings by kind and impact.
--
-- Inputs: p_findings, edges, retry_budgets, clock_skew.
-- Output: kind, severity, caller, callee, operation, count, detail, example_trace_id
WITH found AS (
  SELECT kind, caller, callee, operation, SUM(count) AS count,
    -- the detail of the example trace, not the smallest detail of any
    first_value(detail ORDER BY example_trace_id, detail) AS detail,
    MIN(example_trace_id) AS example_trace_id
  FROM p_findings
  GROUP BY kind, caller, callee, operation
  UNION ALL
  SELECT 'timeout_below_tail', caller, callee, operation, attempts,
    concat('timeout ', CAST(ROUND(timeout_ms) AS BIGINT), ' ms is below the callee P99.9 of ',
      CAST(ROUND(callee_p999_ms) AS BIGINT), ' ms',
      CASE WHEN timeout_kill_share IS NULL
        THEN concat(' (the callee ', callee_latency_source, '''s: no SERVER span answered this edge)')
        ELSE concat(' and cuts off ', CAST(ROUND(timeout_kill_share * 100, 2) AS VARCHAR),
          '% of its calls') END,
      '; recommended ', CAST(ROUND(recommended_timeout_ms) AS BIGINT), ' ms'),
    CAST(NULL AS VARCHAR)
  FROM edges WHERE timeout_below_tail
  UNION ALL
  SELECT 'timeout_without_margin', caller, callee, operation, attempts,
    concat('timeout ', CAST(ROUND(timeout_ms) AS BIGINT), ' ms is only ',
      CAST(ROUND(timeout_ms / callee_p999_ms, 2) AS VARCHAR), ' x the callee P99.9 of ',
      CAST(ROUND(callee_p999_ms) AS BIGINT), ' ms; recommended ',
      CAST(ROUND(recommended_timeout_ms) AS BIGINT), ' ms'),
    CAST(NULL AS VARCHAR)
  FROM edges WHERE timeout_without_margin
  UNION ALL
  SELECT 'timeout_too_long', caller, callee, operation, attempts,
    concat('timeout ', CAST(ROUND(timeout_ms) AS BIGINT), ' ms is ',
      CAST(ROUND(timeout_ms / recommended_timeout_ms, 1) AS VARCHAR),
      ' x the recommended ', CAST(ROUND(recommended_timeout_ms) AS BIGINT),
      ' ms (callee P99.9 ', CAST(ROUND(callee_p999_ms) AS BIGINT),
      ' ms): a stuck callee holds the caller that long'),
    CAST(NULL AS VARCHAR)
  FROM edges WHERE timeout_too_long
  UNION ALL
  SELECT 'out_of_budget_retry', e.caller, e.callee, e.operation, e.out_of_budget_retries,
    concat(CAST(e.out_of_budget_retries AS VARCHAR), ' of ', CAST(e.retry_attempts AS VARCHAR),
      ' retries started with less of the budget left than the callee''s median of ',
      CAST(ROUND(e.callee_median_ms) AS BIGINT), ' ms (',
      CAST(e.retries_after_deadline AS VARCHAR), ' after the deadline): stop retrying when ',
      'the retry cannot fit'),
    rb.example_trace_id
  FROM edges e
  JOIN retry_budgets rb ON rb.caller = e.caller AND rb.callee = e.callee
    AND rb.operation = e.operation
  WHERE e.out_of_budget_retries > 0
  UNION ALL
  SELECT 'clock_skew', caller, callee, '*', pairs,
    concat('the clock of ', callee, ' reads ', CAST(ROUND(clock_skew_ms, 1) AS VARCHAR),
      ' ms ahead of the clock of ', caller, ' (corrected before orphan and deadline checks)'),
    CAST(NULL AS VARCHAR)
  FROM clock_skew WHERE exceeds_threshold
)
SELECT kind,
  CASE kind WHEN 'unsafe_retry' THEN 'critical'
            WHEN 'overlapping_retry' THEN 'critical'
            WHEN 'rerun_write' THEN 'critical'
            WHEN 'deadline_inversion' THEN 'warning'
            WHEN 'overcommit' THEN 'warning'
            WHEN 'duplicate_rejection' THEN 'warning'
            WHEN 'retry_after_violation' THEN 'warning'
            WHEN 'timeout_retry_on_write' THEN 'warning'
            WHEN 'non_retryable_retry' THEN 'warning'
            WHEN 'out_of_budget_retry' THEN 'warning'
            WHEN 'timeout_below_tail' THEN 'warning'
            WHEN 'clock_skew' THEN 'warning'
            ELSE 'info' END AS severity,
  caller, callee, operation, CAST(ROUND(count) AS BIGINT) AS count, detail, example_trace_id
FROM found
