-- edge_causes: retries_by_cause per edge over a window.
--
-- Inputs: p_causes.
-- Output: caller, callee, operation, cause, retries
SELECT caller, callee, operation, cause, SUM(retries) AS retries
FROM p_causes
GROUP BY caller, callee, operation, cause
ORDER BY caller, callee, operation, cause
