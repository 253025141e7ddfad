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
-- (Built from each call's first attempt, plus integer-keyed aggregates over the attempts of
-- retried calls only: most calls have one attempt, which is its call's first and last, so
-- aggregating and joining every attempt, as this query did, was twice the cost: EXPLAIN
-- ANALYZE over 1 M spans, 230-430 ms of compute against 115-130 ms.)
WITH retried AS (
  SELECT logical_call_id, COUNT(*) AS attempts, MAX(attempt) AS max_attempt,
    MIN(start_ns) AS start_ns, MAX(end_ns) AS end_ns,
    MAX(CASE WHEN is_last_attempt THEN outcome END) AS final_outcome
  FROM attempts
  WHERE NOT (is_first_attempt AND is_last_attempt)
  GROUP BY logical_call_id
)
SELECT f.trace_id, f.logical_call_id, f.calling_span_id AS parent_span_id,
  f.caller, f.callee, f.operation,
  COALESCE(c.attempts, 1) AS attempts, COALESCE(c.max_attempt, f.attempt) AS max_attempt,
  f.outcome AS first_outcome, COALESCE(c.final_outcome, f.outcome) AS final_outcome,
  c.attempts IS NOT NULL AS retried,
  COALESCE(c.start_ns, f.start_ns) AS start_ns, COALESCE(c.end_ns, f.end_ns) AS end_ns,
  (COALESCE(c.end_ns, f.end_ns) - COALESCE(c.start_ns, f.start_ns)) / 1e6 AS duration_ms,
  COALESCE(f.call_deadline_ms, f.own_deadline_ms) AS deadline_ms,
  CASE WHEN f.call_deadline_ms IS NULL THEN f.anchor_deadline_ms
       ELSE f.call_anchor_deadline_ms END AS anchor_deadline_ms,
  CASE WHEN f.call_deadline_ms IS NULL THEN f.anchor_start_ns
       ELSE f.call_anchor_start_ns END AS anchor_start_ns,
  f.root_span_id,
  f.call_deadline_ms IS NOT NULL AS budget_on_call_span, f.weight, f.edge
FROM attempts f
LEFT JOIN retried c ON c.logical_call_id = f.logical_call_id
WHERE f.is_first_attempt
