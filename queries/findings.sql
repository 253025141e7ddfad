-- findings: one row per rule violation found in the data.
--
-- Inputs: attempts, logical_calls, entries, params.
-- Kinds:
--   deadline_inversion    an attempt's own budget exceeds what its nearest budgeted ancestor
--                         had left when the attempt started (remaining = ancestor budget -
--                         (attempt start - ancestor start)), by more than deadlines.tolerance_ms;
--                         in gRPC's shape a budget on the call span is checked the same way,
--                         against the anchor above the call span;
--   overcommit            two or more sequential (overlapping by at most the tolerance)
--                         budgeted logical calls of one
--                         parent, none inverted, whose budgets sum to more than the parent's
--                         budget (plus tolerance); one finding per parent, named after the call
--                         whose budget crosses it;
--   not_propagated        a SERVER span without a deadline whose calling attempt had one;
--   unsafe_retry          a retry (attempt >= 1) of a non-idempotent operation without an
--                         idempotency key;
--   timeout_retry_on_write a retry caused by `deadline` of a non-idempotent operation;
--   immediate_retry       a retry started less than advice.min_backoff_ms after the previous
--                         attempt ended;
--   multi_layer_retry     a trace in which two or more retry layers retried: each caller
--                         is one, and an in-process retry loop around a caller's calls
--                         (attempts.outer_attempt) is another (named after the trace's entry).
-- Non-idempotent: the `idempotent` flag is false, or it is absent and the write inference
-- (POST, PATCH, INSERT, UPDATE) says write.
-- timeout_below_tail is a per-edge comparison of merged figures and is added by the report.
--
-- weight: how many such findings this one stands for under sampling (the weight of the
-- attempt, call or entry it is about).
--
-- Output: kind, trace_id, caller, callee, operation, detail, weight
WITH budgeted AS (
  SELECT lc.*,
    lc.deadline_ms > lc.anchor_deadline_ms - (lc.start_ns - lc.anchor_start_ns) / 1e6
      + p.deadline_tolerance_ms AS inverted
  FROM params p CROSS JOIN logical_calls lc
  WHERE lc.deadline_ms IS NOT NULL AND lc.anchor_deadline_ms IS NOT NULL
),
crowded AS (
  -- the parents an overcommit can be found under: two or more budgeted calls whose budgets
  -- sum to more than the smallest budget they had to fit in. The rule below sums a subset
  -- of these calls (the sequential ones) against their largest budget, and budgets are
  -- finite and >= 0 (the encoder's contract), so no other parent can qualify. (Loosened
  -- by a millionth, so summing in another order cannot round a qualifying parent out.)
  -- The per-parent windows below then run on these parents' calls alone: a window costs
  -- per parent, and in most traces no parent is crowded.
  SELECT b.trace_id, b.parent_span_id
  FROM params p CROSS JOIN budgeted b
  GROUP BY b.trace_id, b.parent_span_id, p.deadline_tolerance_ms
  HAVING COUNT(*) >= 2
    AND SUM(b.deadline_ms) * 1.000001 >= MIN(b.anchor_deadline_ms) + p.deadline_tolerance_ms
),
ordered AS (
  -- budgeted calls of one parent in start order, with the latest end before each and the
  -- next start after it: a call overlaps a sibling iff one of those two does (n log n per
  -- parent, where pairing every two siblings was n^2)
  SELECT b.trace_id, b.parent_span_id, b.logical_call_id, b.caller, b.callee, b.operation,
    b.start_ns, b.end_ns, b.deadline_ms, b.anchor_deadline_ms, b.inverted, b.weight,
    MAX(b.end_ns) OVER (PARTITION BY b.trace_id, b.parent_span_id
      ORDER BY b.start_ns, b.logical_call_id
      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS earlier_end_ns,
    LEAD(b.start_ns) OVER (PARTITION BY b.trace_id, b.parent_span_id
      ORDER BY b.start_ns, b.logical_call_id) AS next_start_ns
  FROM budgeted b
  JOIN crowded c ON c.trace_id = b.trace_id AND c.parent_span_id = b.parent_span_id
),
sequential_calls AS (
  -- not overlapping any budgeted sibling by more than deadlines.tolerance_ms: clocks of
  -- millisecond resolution make back-to-back calls touch or overlap by a tick
  SELECT o.* FROM params p CROSS JOIN ordered o
  WHERE (o.earlier_end_ns IS NULL OR o.earlier_end_ns <= o.start_ns + p.deadline_tolerance_ms * 1e6)
    AND (o.next_start_ns IS NULL OR o.next_start_ns >= o.end_ns - p.deadline_tolerance_ms * 1e6)
),
sequential AS (
  -- per crowded parent, over its sequential calls: budget_so_far, this call's budget plus
  -- every earlier one's, and the totals the rule compares (windows over the one
  -- partitioning, so the sibling windows above run once)
  SELECT s.trace_id, s.logical_call_id, s.caller, s.callee, s.operation, s.deadline_ms,
    s.weight,
    SUM(s.deadline_ms) OVER (PARTITION BY s.trace_id, s.parent_span_id
      ORDER BY s.start_ns, s.logical_call_id
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS budget_so_far,
    SUM(s.deadline_ms) OVER (PARTITION BY s.trace_id, s.parent_span_id) AS total_ms,
    COUNT(*) OVER (PARTITION BY s.trace_id, s.parent_span_id) AS calls,
    MAX(s.anchor_deadline_ms) OVER (PARTITION BY s.trace_id, s.parent_span_id) AS parent_budget_ms,
    bool_or(s.inverted) OVER (PARTITION BY s.trace_id, s.parent_span_id) AS any_inverted
  FROM sequential_calls s
),
multi_layer AS (
  SELECT trace_id, COUNT(DISTINCT layer) AS retrying_layers
  FROM (
    SELECT trace_id, caller AS layer FROM attempts WHERE attempt >= 1
    UNION ALL
    SELECT trace_id, concat(caller, ' (in-process loop)') FROM attempts WHERE outer_attempt <> 0
  ) retried
  GROUP BY trace_id
  HAVING COUNT(DISTINCT layer) >= 2
)
SELECT 'deadline_inversion' AS kind, a.trace_id, a.caller, a.callee, a.operation,
  concat('budget ', CAST(ROUND(a.own_deadline_ms) AS BIGINT), ' ms exceeds the ',
    CAST(ROUND(a.anchor_deadline_ms - (a.start_ns - a.anchor_start_ns) / 1e6) AS BIGINT),
    ' ms the caller had left') AS detail,
  a.weight
FROM params p CROSS JOIN attempts a
WHERE a.own_deadline_ms IS NOT NULL AND a.anchor_deadline_ms IS NOT NULL
  AND a.own_deadline_ms > a.anchor_deadline_ms - (a.start_ns - a.anchor_start_ns) / 1e6
    + p.deadline_tolerance_ms
UNION ALL
SELECT 'deadline_inversion', b.trace_id, b.caller, b.callee, b.operation,
  concat('budget ', CAST(ROUND(b.deadline_ms) AS BIGINT), ' ms exceeds the ',
    CAST(ROUND(b.anchor_deadline_ms - (b.start_ns - b.anchor_start_ns) / 1e6) AS BIGINT),
    ' ms the caller had left'),
  b.weight
FROM budgeted b
WHERE b.inverted AND b.budget_on_call_span
UNION ALL
SELECT 'overcommit', s.trace_id, s.caller, s.callee, s.operation,
  concat(CAST(s.calls AS VARCHAR), ' sequential calls budget ', CAST(ROUND(s.total_ms) AS BIGINT),
    ' ms in all, more than the caller''s ', CAST(ROUND(s.parent_budget_ms) AS BIGINT), ' ms'),
  s.weight
FROM params p CROSS JOIN sequential s
WHERE s.calls >= 2 AND NOT s.any_inverted
  AND s.total_ms > s.parent_budget_ms + p.deadline_tolerance_ms
  -- the call whose budget crosses the parent's: over after it, not before
  AND s.budget_so_far > s.parent_budget_ms + p.deadline_tolerance_ms
  AND s.budget_so_far - s.deadline_ms <= s.parent_budget_ms + p.deadline_tolerance_ms
UNION ALL
SELECT 'not_propagated', a.trace_id, a.caller, a.callee, a.operation,
  concat('the attempt had a ', CAST(ROUND(a.deadline_ms) AS BIGINT),
    ' ms budget; the callee received none'),
  a.weight
FROM attempts a
WHERE a.server_span_id IS NOT NULL AND a.server_deadline_ms IS NULL AND a.deadline_ms IS NOT NULL
UNION ALL
SELECT 'unsafe_retry', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR), ' of a non-idempotent call without an idempotency key'),
  a.weight
FROM attempts a
WHERE a.attempt >= 1 AND a.non_idempotent AND NOT a.has_idempotency_key
UNION ALL
SELECT 'timeout_retry_on_write', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR), ' of a timed-out write'),
  a.weight
FROM attempts a
WHERE a.attempt >= 1 AND a.cause = 'deadline' AND a.non_idempotent
UNION ALL
SELECT 'immediate_retry', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR), ' started ', CAST(ROUND(a.backoff_ms, 1) AS VARCHAR),
    ' ms after the previous attempt ended'),
  a.weight
FROM params p CROSS JOIN attempts a
WHERE a.attempt >= 1 AND a.backoff_ms < p.min_backoff_ms
UNION ALL
SELECT 'multi_layer_retry', e.trace_id, e.service, '', e.operation,
  concat(CAST(m.retrying_layers AS VARCHAR), ' layers retried in one trace'),
  e.weight
FROM multi_layer m
JOIN entries e ON e.trace_id = m.trace_id
