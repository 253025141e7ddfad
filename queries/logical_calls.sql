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
--   deadline_ms, anchor_deadline_ms, anchor_start_ns, root_span_id, budget_on_call_span, weight
-- weight: the first attempt's (how many calls this one stands for under sampling).
-- (Built from each call's first attempt, its last, and integer-keyed counts: grouping the
-- whole attempts table by trace and call id was most of this query's cost.)
WITH counts AS (
  SELECT logical_call_id, COUNT(*) AS attempts, MAX(attempt) AS max_attempt,
    MIN(start_ns) AS start_ns, MAX(end_ns) AS end_ns
  FROM attempts
  GROUP BY logical_call_id
),
last AS (
  SELECT logical_call_id, outcome AS final_outcome FROM attempts WHERE is_last_attempt
)
SELECT f.trace_id, f.logical_call_id, f.calling_span_id AS parent_span_id,
  f.caller, f.callee, f.operation,
  c.attempts, c.max_attempt,
  f.outcome AS first_outcome, l.final_outcome,
  c.attempts > 1 AS retried,
  c.start_ns, c.end_ns, (c.end_ns - c.start_ns) / 1e6 AS duration_ms,
  COALESCE(f.call_deadline_ms, f.own_deadline_ms) AS deadline_ms,
  CASE WHEN f.call_deadline_ms IS NULL THEN f.anchor_deadline_ms
       ELSE f.call_anchor_deadline_ms END AS anchor_deadline_ms,
  CASE WHEN f.call_deadline_ms IS NULL THEN f.anchor_start_ns
       ELSE f.call_anchor_start_ns END AS anchor_start_ns,
  f.root_span_id,
  f.call_deadline_ms IS NOT NULL AS budget_on_call_span, f.weight
FROM attempts f
JOIN counts c ON c.logical_call_id = f.logical_call_id
JOIN last l ON l.logical_call_id = f.logical_call_id
WHERE f.is_first_attempt
