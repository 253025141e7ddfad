-- partial_links: the call graph below each entry operation, as distinct (entry, upstream
-- edge, edge) links; an edge with no upstream attempt hangs directly under the entry. With
-- each edge's max attempt number this gives storm potential. Mergeable by UNION.
--
-- Inputs: attempts, entries.
-- Output: entry_service, entry_operation, parent_caller, parent_callee, parent_operation,
--   caller, callee, operation
SELECT DISTINCT e.service AS entry_service, e.operation AS entry_operation,
  u.caller AS parent_caller, u.callee AS parent_callee, u.operation AS parent_operation,
  a.caller, a.callee, a.operation
FROM attempts a
-- (the lineage's row keys: the root's and upstream attempt's span ids in the trace)
JOIN entries e ON e.row_id = a.root_row
LEFT JOIN attempts u ON u.row_id = a.upstream_attempt_row
