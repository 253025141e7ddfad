-- timeout_values: the most common exact attempt budgets (deadline_ms) per edge in this
-- batch, up to 16 per edge, with their (weighted) counts: the candidates for an edge's
-- configured timeout (partial_timeout_values) and for the exact P99.9 comparison
-- (partial_tail).
--
-- Inputs: attempts.
-- Output: caller, callee, operation, deadline_ms, n
SELECT caller, callee, operation, deadline_ms, n
FROM (
  SELECT caller, callee, operation, deadline_ms, n,
    ROW_NUMBER() OVER (PARTITION BY caller, callee, operation ORDER BY n DESC, deadline_ms) AS r
  FROM (
    SELECT caller, callee, operation, deadline_ms, SUM(weight) AS n
    FROM attempts
    WHERE deadline_ms IS NOT NULL
    GROUP BY caller, callee, operation, deadline_ms
  ) counted
) ranked
WHERE r <= 16
