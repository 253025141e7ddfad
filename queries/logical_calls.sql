-- logical_calls: one row per logical call (a call and all its attempts).
--
-- Inputs: attempts.
-- first_outcome / final_outcome: outcome of the lowest / highest numbered attempt (ties by
-- start; is_first_attempt and is_last_attempt of attempts). retried: more than one attempt.
-- duration: first start to last end. deadline_ms: the call's budget: in gRPC's shape the
-- call span's own when it carries one (budget_on_call_span), else the first attempt's own;
-- anchor_*: the budget it had to fit in (see lineage): for a budget on the call span, the
-- anchor above the call span, not the call span itself. parent_span_id: the span that made
-- the call (attempts' calling_span_id), so sequential calls of one span meet whatever their
-- retry shape.
--
-- Output: trace_id, logical_call_id, parent_span_id, caller, callee, operation, attempts,
--   max_attempt, first_outcome, final_outcome, retried, start_ns, end_ns, duration_ms,
--   deadline_ms, anchor_deadline_ms, anchor_start_ns, root_span_id, budget_on_call_span, weight,
--   edge
-- weight: the first attempt's (how many calls this one stands for under sampling).
-- edge: the attempts' key of (caller, callee, operation) in `edge_names` (see attempts).
-- (Read from each call's first attempt, which carries its call as a whole: the lineage
-- groups the attempts into calls and sums them up there (attempts.logical_*). Aggregating
-- the retried calls' attempts and joining them back, as this query did before, was its
-- largest part.)
SELECT f.trace_id, f.logical_call_id, f.calling_span_id AS parent_span_id,
  f.caller, f.callee, f.operation,
  f.logical_attempts AS attempts, f.logical_max_attempt AS max_attempt,
  f.outcome AS first_outcome, f.logical_final_outcome AS final_outcome,
  f.logical_attempts > 1 AS retried,
  f.logical_start_ns AS start_ns, f.logical_end_ns AS end_ns,
  (f.logical_end_ns - f.logical_start_ns) / 1e6 AS duration_ms,
  COALESCE(f.call_deadline_ms, f.own_deadline_ms) AS deadline_ms,
  CASE WHEN f.call_deadline_ms IS NULL THEN f.anchor_deadline_ms
       ELSE f.call_anchor_deadline_ms END AS anchor_deadline_ms,
  CASE WHEN f.call_deadline_ms IS NULL THEN f.anchor_start_ns
       ELSE f.call_anchor_start_ns END AS anchor_start_ns,
  f.root_span_id,
  f.call_deadline_ms IS NOT NULL AS budget_on_call_span, f.weight, f.edge
FROM attempts f
WHERE f.is_first_attempt
