-- edge_causes: retries_by_cause per edge over a window, unordered (the report places each
-- row by its edge).
--
-- Inputs: p_attempts.
-- Output: caller, callee, operation, cause, retries
SELECT caller, callee, operation, cause, CAST(ROUND(SUM(attempts)) AS BIGINT) AS retries
FROM p_attempts
WHERE attempt = 'retry'
GROUP BY caller, callee, operation, cause
