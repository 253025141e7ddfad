-- replay_calls: the observed logical calls as `stormglass replay` reads them: per call its
-- edge, attempts, final outcome, weight and times.
--
-- Inputs: logical_calls.
-- Output: caller, callee, operation, attempts, final_outcome, weight, start_ns, end_ns
SELECT caller, callee, operation, attempts, final_outcome, weight, start_ns, end_ns
FROM logical_calls
