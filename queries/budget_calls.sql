-- budget_calls: every logical call of a known caller under its calling span, with when it
-- started and ended: from these `check-budget --emit` reads which callees a service calls
-- one after another while serving one request.
--
-- Inputs: logical_calls.
-- Output: caller, callee, parent_span_id (hex), start_ns, end_ns
SELECT caller, callee, encode(CAST(parent_span_id AS BYTEA), 'hex') AS parent_span_id,
  start_ns, end_ns
FROM logical_calls
WHERE caller <> 'unknown'
