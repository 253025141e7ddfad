-- edge_causes: retries_by_cause per edge over a window.
--
-- Inputs: p_attempts.
-- Output: caller, callee, operation, cause, retries
SELECT caller, callee, operation, cause, CAST(ROUND(SUM(attempts)) AS BIGINT) AS retries
FROM p_attempts
WHERE attempt = 'retry'
GROUP BY caller, callee, operation, cause
ORDER BY caller, callee, operation, cause
