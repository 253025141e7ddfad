-- partial_orphan_list: the orphan pairs themselves, for the report's `orphans` array
-- (bounded by the caller: the most recent pairs are kept).
--
-- Inputs: orphans.
-- Output: trace_id, caller, callee, operation, work_after_cancel_ms, server_outcome
SELECT encode(arrow_cast(trace_id, 'Binary'), 'hex') AS trace_id, caller, callee, operation,
  work_after_cancel_ms, server_outcome
FROM orphans
ORDER BY trace_id, caller, callee, operation
