-- replay_calls: the observed logical calls as `stormglass replay` reads them: per call its
-- edge, attempts, final outcome, weight and times, and the upstream attempt it was made
-- for (the call and attempt number of its first attempt's upstream attempt; null for a
-- call no attempt made), so that a call made for an attempt the policy drops upstream is
-- not made either.
--
-- Inputs: attempts (its first attempts carry their call as a whole, as in logical_calls).
-- Output: caller, callee, operation, attempts, final_outcome, weight, start_ns, end_ns,
--   trace_id (hex), logical_call_id, upstream_call_id, upstream_attempt
SELECT f.caller, f.callee, f.operation, f.logical_attempts AS attempts,
  f.logical_final_outcome AS final_outcome, f.weight,
  f.logical_start_ns AS start_ns, f.logical_end_ns AS end_ns,
  encode(CAST(f.trace_id AS BYTEA), 'hex') AS trace_id, f.logical_call_id,
  u.logical_call_id AS upstream_call_id, u.attempt AS upstream_attempt
FROM attempts f
LEFT JOIN attempts u ON u.row_id = f.upstream_attempt_row
WHERE f.is_first_attempt
