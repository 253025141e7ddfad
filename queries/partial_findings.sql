-- partial_findings: findings counted per (kind, caller, callee, operation), with one
-- example trace and its detail. Mergeable: SUM of count, any example.
--
-- Inputs: findings.
-- Output: kind, caller, callee, operation, count, example_trace_id, detail
SELECT kind, caller, callee, operation, COUNT(*) AS count,
  MIN(encode(arrow_cast(trace_id, 'Binary'), 'hex')) AS example_trace_id,
  MIN(detail) AS detail
FROM findings
GROUP BY kind, caller, callee, operation
