-- logical_calls: one row per logical call (a call and all its attempts).
--
-- Inputs: attempts.
-- first_outcome / final_outcome: outcome of the lowest / highest numbered attempt (ties by
-- start). retried: more than one attempt. duration: first start to last end. deadline_ms:
-- the first attempt's own budget; anchor_*: the budget it had to fit in (see lineage).
--
-- Output: trace_id, logical_call_id, parent_span_id, caller, callee, operation, attempts,
--   max_attempt, first_outcome, final_outcome, retried, start_ns, end_ns, duration_ms,
--   deadline_ms, anchor_deadline_ms, anchor_start_ns, root_span_id
SELECT trace_id, logical_call_id, parent_span_id, caller, callee, operation,
  COUNT(*) AS attempts,
  MAX(attempt) AS max_attempt,
  first_value(outcome ORDER BY attempt, start_ns) AS first_outcome,
  last_value(outcome ORDER BY attempt, start_ns) AS final_outcome,
  COUNT(*) > 1 AS retried,
  MIN(start_ns) AS start_ns,
  MAX(end_ns) AS end_ns,
  (MAX(end_ns) - MIN(start_ns)) / 1e6 AS duration_ms,
  first_value(own_deadline_ms ORDER BY attempt, start_ns) AS deadline_ms,
  first_value(anchor_deadline_ms ORDER BY attempt, start_ns) AS anchor_deadline_ms,
  first_value(anchor_start_ns ORDER BY attempt, start_ns) AS anchor_start_ns,
  first_value(root_span_id ORDER BY attempt, start_ns) AS root_span_id
FROM attempts
GROUP BY trace_id, logical_call_id, parent_span_id, caller, callee, operation
