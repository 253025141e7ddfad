-- partial_causes: retry attempts by cause per edge. Mergeable by SUM.
--
-- Inputs: attempts.
-- Output: caller, callee, operation, cause, retries
SELECT caller, callee, operation, COALESCE(cause, 'unknown') AS cause, COUNT(*) AS retries
FROM attempts
WHERE attempt >= 1
GROUP BY caller, callee, operation, COALESCE(cause, 'unknown')
