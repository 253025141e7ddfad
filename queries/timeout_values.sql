-- timeout_values: the most common exact attempt budgets (deadline_ms) per edge in this
-- batch, up to 16 per edge, with their (weighted) counts: the candidates for an edge's
-- configured timeout (partial_timeout_values) and for the exact P99.9 comparison
-- (partial_tail).
--
-- Counted per integer `edge`, the names joined once per edge (see partial_edges). Only
-- the edges with more than 16 values are ranked: a window sorting every edge's values
-- took 35 ms a chunk at 160,000 edges, where most edges have one or two.
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, deadline_ms, n
WITH counted AS (
  SELECT edge, deadline_ms, SUM(weight) AS n
  FROM attempts
  WHERE deadline_ms IS NOT NULL
  GROUP BY edge, deadline_ms
),
crowded AS (
  SELECT edge FROM counted GROUP BY edge HAVING COUNT(*) > 16
),
kept AS (
  SELECT edge, deadline_ms, n
  FROM counted c
  WHERE NOT EXISTS (SELECT 1 FROM crowded k WHERE k.edge = c.edge)
  UNION ALL
  SELECT edge, deadline_ms, n
  FROM (
    SELECT c.edge, c.deadline_ms, c.n,
      ROW_NUMBER() OVER (PARTITION BY c.edge ORDER BY c.n DESC, c.deadline_ms) AS r
    FROM counted c
    JOIN crowded k ON k.edge = c.edge
  ) ranked
  WHERE r <= 16
)
SELECT e.caller, e.callee, e.operation, kept.deadline_ms, kept.n
FROM kept
JOIN edge_names e ON e.edge = kept.edge
