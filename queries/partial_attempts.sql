-- partial_attempts: attempts per edge by attempt kind (`first` = attempt 0, `hedge` = a
-- hedged attempt, `retry` = the rest), outcome class and cause, the counts behind
-- stormglass_attempts_total and retries_by_cause. A first attempt has no cause (`none`); a
-- retry whose cause is neither an attribute nor a previous attempt's outcome has cause
-- `unknown`; a hedge's cause is `hedge`. Mergeable by SUM.
--
-- Grouped by the attempts' integer `edge`, the names joined once per edge (see
-- partial_edges).
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, attempt, outcome, cause, attempts
SELECT n.caller, n.callee, n.operation, a.attempt, a.outcome, a.cause, a.attempts
FROM (
  SELECT edge,
    CASE WHEN attempt = 0 THEN 'first' WHEN hedged THEN 'hedge' ELSE 'retry' END AS attempt,
    outcome,
    COALESCE(cause, CASE WHEN attempt = 0 THEN 'none' ELSE 'unknown' END) AS cause,
    SUM(weight) AS attempts
  FROM attempts
  GROUP BY edge,
    CASE WHEN attempt = 0 THEN 'first' WHEN hedged THEN 'hedge' ELSE 'retry' END,
    outcome,
    COALESCE(cause, CASE WHEN attempt = 0 THEN 'none' ELSE 'unknown' END)
) a
JOIN edge_names n ON n.edge = a.edge
