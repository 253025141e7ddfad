-- logical_calls: one row per logical call (a call and all its attempts).
--
-- Inputs: attempts.
-- first_outcome / final_outcome: outcome of the lowest / highest numbered attempt (ties by
-- start; is_first_attempt and is_last_attempt of attempts). retried: more than one attempt.
-- duration: first start to last end. deadline_ms: the first attempt's own budget;
-- anchor_*: the budget it had to fit in (see lineage). parent_span_id: the span that made
-- the call (attempts' calling_span_id), so sequential calls of one span meet whatever their
-- retry shape.
--
-- Output: trace_id, logical_call_id, parent_span_id, caller, callee, operation, attempts,
--   max_attempt, first_outcome, final_outcome, retried, start_ns, end_ns, duration_ms,
--   deadline_ms, anchor_deadline_ms, anchor_start_ns, root_span_id
SELECT trace_id, logical_call_id,
  MAX(calling_span_id) AS parent_span_id,
  MAX(caller) AS caller, MAX(callee) AS callee, MAX(operation) AS operation,
  COUNT(*) AS attempts,
  MAX(attempt) AS max_attempt,
  MAX(CASE WHEN is_first_attempt THEN outcome END) AS first_outcome,
  MAX(CASE WHEN is_last_attempt THEN outcome END) AS final_outcome,
  COUNT(*) > 1 AS retried,
  MIN(start_ns) AS start_ns,
  MAX(end_ns) AS end_ns,
  (MAX(end_ns) - MIN(start_ns)) / 1e6 AS duration_ms,
  MAX(CASE WHEN is_first_attempt THEN own_deadline_ms END) AS deadline_ms,
  MAX(CASE WHEN is_first_attempt THEN anchor_deadline_ms END) AS anchor_deadline_ms,
  MAX(CASE WHEN is_first_attempt THEN anchor_start_ns END) AS anchor_start_ns,
  MAX(root_span_id) AS root_span_id
FROM attempts
GROUP BY trace_id, logical_call_id
