-- timeout_values: the most common exact attempt budgets (deadline_ms) per edge in this
-- batch, up to 16 per edge, with their (weighted) counts: the candidates for an edge's
-- configured timeout (partial_timeout_values) and for the exact P99.9 comparison
-- (partial_tail).
--
-- Counted and ranked per integer `edge`, the names joined once per edge (see
-- partial_edges).
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, deadline_ms, n
SELECT e.caller, e.callee, e.operation, ranked.deadline_ms, ranked.n
FROM (
  SELECT edge, deadline_ms, n,
    ROW_NUMBER() OVER (PARTITION BY edge ORDER BY n DESC, deadline_ms) AS r
  FROM (
    SELECT edge, deadline_ms, SUM(weight) AS n
    FROM attempts
    WHERE deadline_ms IS NOT NULL
    GROUP BY edge, deadline_ms
  ) counted
) ranked
JOIN edge_names e ON e.edge = ranked.edge
WHERE ranked.r <= 16
