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
JOIN entries e ON e.trace_id = a.trace_id AND e.span_id = a.root_span_id
LEFT JOIN attempts u ON u.trace_id = a.trace_id AND u.span_id = a.upstream_attempt_span_id
