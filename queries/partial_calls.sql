-- partial_calls: logical calls per edge by first and final outcome, each `ok` or `failed`
-- (any class but ok), the counts behind stormglass_logical_calls_total. Mergeable by SUM.
--
-- Grouped by the attempts' integer `edge`, the names joined once per edge (see
-- partial_edges).
--
-- Inputs: logical_calls, edge_names.
-- Output: caller, callee, operation, first_outcome, final_outcome, calls
SELECT n.caller, n.callee, n.operation, c.first_outcome, c.final_outcome, c.calls
FROM (
  SELECT edge,
    CASE WHEN first_outcome = 'ok' THEN 'ok' ELSE 'failed' END AS first_outcome,
    CASE WHEN final_outcome = 'ok' THEN 'ok' ELSE 'failed' END AS final_outcome,
    SUM(weight) AS calls
  FROM logical_calls
  GROUP BY edge,
    CASE WHEN first_outcome = 'ok' THEN 'ok' ELSE 'failed' END,
    CASE WHEN final_outcome = 'ok' THEN 'ok' ELSE 'failed' END
) c
JOIN edge_names n ON n.edge = c.edge
