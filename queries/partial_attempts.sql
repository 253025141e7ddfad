-- partial_attempts: attempts per edge by attempt kind (`first` = attempt 0, `retry` = the
-- rest), outcome class and cause, the counts behind stormglass_attempts_total and
-- retries_by_cause. A first attempt has no cause (`none`); a retry whose cause is neither
-- an attribute nor a previous attempt's outcome has cause `unknown`. Mergeable by SUM.
--
-- Inputs: attempts.
-- Output: caller, callee, operation, attempt, outcome, cause, attempts
SELECT caller, callee, operation,
  CASE WHEN attempt = 0 THEN 'first' ELSE 'retry' END AS attempt,
  outcome,
  COALESCE(cause, CASE WHEN attempt = 0 THEN 'none' ELSE 'unknown' END) AS cause,
  SUM(weight) AS attempts
FROM attempts
GROUP BY caller, callee, operation,
  CASE WHEN attempt = 0 THEN 'first' ELSE 'retry' END,
  outcome,
  COALESCE(cause, CASE WHEN attempt = 0 THEN 'none' ELSE 'unknown' END)
