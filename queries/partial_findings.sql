-- partial_findings: findings counted per (kind, caller, callee, operation), with one
-- example: the finding of the smallest trace id, and that finding's own detail. Mergeable:
-- SUM of count; the example with the smallest trace id (and its detail) wins.
--
-- Inputs: findings.
-- Output: kind, caller, callee, operation, count, example_trace_id, detail
SELECT kind, caller, callee, operation, SUM(weight) AS count,
  MIN(trace_hex) AS example_trace_id,
  first_value(detail ORDER BY trace_hex, detail) AS detail
FROM (
  SELECT kind, caller, callee, operation, detail, weight,
    encode(arrow_cast(trace_id, 'Binary'), 'hex') AS trace_hex
  FROM findings
) f
GROUP BY kind, caller, callee, operation
