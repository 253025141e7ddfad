-- replay_attempts: the observed attempts as the replay of an edge a token bucket throttles,
-- or whose budget holds concurrent retries, reads them, attempt by attempt in time.
--
-- Inputs: attempts.
-- Output: caller, callee, operation, trace_id (hex), logical_call_id, attempt, outcome,
--   start_ns, end_ns
SELECT caller, callee, operation, encode(CAST(trace_id AS BYTEA), 'hex') AS trace_id,
  logical_call_id, attempt, outcome, start_ns, end_ns
FROM attempts
