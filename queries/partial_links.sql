-- partial_links: the call graph below each entry operation, as distinct (entry, upstream
-- edge, edge) links; an edge with no upstream attempt hangs directly under the entry. With
-- each edge's max attempt number this gives storm potential. Mergeable by UNION.
--
-- The links are made distinct over the attempts' integer edges (`upstream_edge` is the
-- upstream attempt's, from the lineage, so no join of attempts to attempts is needed) and
-- named once per link from `edge_names` (see attempts).
--
-- Inputs: attempts, entries, edge_names.
-- Output: entry_service, entry_operation, parent_caller, parent_callee, parent_operation,
--   caller, callee, operation
SELECT l.entry_service, l.entry_operation,
  u.caller AS parent_caller, u.callee AS parent_callee, u.operation AS parent_operation,
  n.caller, n.callee, n.operation
FROM (
  SELECT DISTINCT e.service AS entry_service, e.operation AS entry_operation,
    a.upstream_edge, a.edge
  FROM attempts a
  -- (the lineage's row key of the root's span id in the trace)
  JOIN entries e ON e.row_id = a.root_row
) l
JOIN edge_names n ON n.edge = l.edge
LEFT JOIN edge_names u ON u.edge = l.upstream_edge
