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
--   unsafe_retry          a retry (attempt >= 1, a hedge included: it duplicates the write
--                         as well) of a non-idempotent operation without an idempotency key,
--                         or any retry whose idempotency key is not its first attempt's
--                         (attempts.unstable_key);
--   overlapping_retry     a retry (not a hedge) of a non-idempotent operation without a
--                         stable idempotency key (none, or not the first attempt's) that
--                         reached the callee while it still worked on the attempt before
--                         (attempts.overlapping): the write may run twice at once;
--   rerun_write           a write call made for a retry of an upstream call that repeats
--                         (same edge) a write made for an earlier attempt of that call
--                         without the earlier write's idempotency key (attempts.rerun_write):
--                         the retry above may be safe, the write below runs again;
--   duplicate_rejection   a retry of a non-idempotent operation answered as a duplicate
--                         (HTTP 409, gRPC ALREADY_EXISTS, an error.type naming one): an
--                         earlier attempt had done the write and a unique index caught the
--                         repeat; the caller reads a failure for a call that succeeded;
--   retry_after_violation a retry (not a hedge) started before the wait the previous
--                         attempt's answer asked for elapsed (HTTP Retry-After, gRPC
--                         grpc-retry-pushback-ms), or at all after a pushback saying not to;
--   unbudgeted_call       a call (its first attempt) whose callee sent a SERVER span, with no
--                         deadline on either side: it can wait forever (the calls of
--                         edges.attempts_without_deadline);
--   write_without_key     a write (by method, or flagged `idempotent=false`; its first
--                         attempt) sent without an idempotency key: a retry of it anywhere
--                         cannot be told from a new write (coverage.idempotency_key);
--   timeout_retry_on_write a retry caused by `deadline` of a non-idempotent operation;
--   immediate_retry       a retry (not a hedge) started less than advice.min_backoff_ms after
--                         the previous attempt ended;
--   non_retryable_retry   a retry (not a hedge) after an attempt that ended `client_error`:
--                         the same request meets the same error (a 4xx but 408 and 429,
--                         INVALID_ARGUMENT, NOT_FOUND, ... a non-zero err_code);
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
-- Output: kind, trace_id, caller, callee, operation, detail, weight, edge
-- edge: the key of (caller, callee, operation) in `edge_names` (see attempts); null for
-- multi_layer_retry, which names a trace's entry, not an edge.
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
  -- What follows runs on these parents' calls alone (in most traces, none).
  SELECT b.trace_id, b.parent_span_id
  FROM params p CROSS JOIN budgeted b
  GROUP BY b.trace_id, b.parent_span_id, p.deadline_tolerance_ms
  HAVING COUNT(*) >= 2
    AND SUM(b.deadline_ms) * 1.000001 >= MIN(b.anchor_deadline_ms) + p.deadline_tolerance_ms
),
ordered AS (
  -- the crowded parents' budgeted calls in one order, by parent and start, each with its
  -- neighbours' parent: one ordered pass finds every parent's boundaries, where a window
  -- per parent cost ~5 us a parent in DataFusion (a parent has a few calls)
  SELECT b.trace_id, b.parent_span_id, b.logical_call_id, b.caller, b.callee, b.operation,
    b.start_ns, b.end_ns, b.deadline_ms, b.anchor_deadline_ms, b.inverted, b.weight, b.edge,
    COALESCE(LAG(b.trace_id) OVER (ORDER BY b.trace_id, b.parent_span_id, b.start_ns, b.logical_call_id
        ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) <> b.trace_id
      OR LAG(b.parent_span_id) OVER (ORDER BY b.trace_id, b.parent_span_id, b.start_ns, b.logical_call_id
        ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) <> b.parent_span_id,
      TRUE) AS first_of_parent,
    CASE WHEN LEAD(b.trace_id) OVER (ORDER BY b.trace_id, b.parent_span_id, b.start_ns, b.logical_call_id
        ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) = b.trace_id
      AND LEAD(b.parent_span_id) OVER (ORDER BY b.trace_id, b.parent_span_id, b.start_ns, b.logical_call_id
        ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) = b.parent_span_id
      THEN LEAD(b.start_ns) OVER (ORDER BY b.trace_id, b.parent_span_id, b.start_ns, b.logical_call_id
        ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) END AS next_start_ns
  -- (crowded on the left: the hash join's build side, so with no crowded parent, the
  -- usual case, the budgeted calls are not read again)
  FROM crowded c
  JOIN budgeted b ON c.trace_id = b.trace_id AND c.parent_span_id = b.parent_span_id
),
numbered AS (
  -- parent_no: the parent's number in that order
  SELECT o.*,
    SUM(CASE WHEN o.first_of_parent THEN 1 ELSE 0 END) OVER (ORDER BY o.trace_id, o.parent_span_id, o.start_ns, o.logical_call_id
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS parent_no
  FROM ordered o
),
keyed AS (
  -- earlier_key: the largest (parent_no, end) among the calls before, as one exact decimal
  -- (parent_no * 1e20 + end_ns + 2^63: an end shifted to >= 0 stays below 1e20); it is
  -- this parent's latest earlier end when the call has an earlier sibling, else below
  -- parent_floor
  SELECT n.*,
    MAX(CAST(n.parent_no AS DECIMAL(38, 0)) * CAST('100000000000000000000' AS DECIMAL(38, 0))
        + CAST(n.end_ns AS DECIMAL(38, 0)) + CAST('9223372036854775808' AS DECIMAL(38, 0)))
      OVER (ORDER BY n.trace_id, n.parent_span_id, n.start_ns, n.logical_call_id
        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS earlier_key,
    CAST(n.parent_no AS DECIMAL(38, 0)) * CAST('100000000000000000000' AS DECIMAL(38, 0))
      AS parent_floor
  FROM numbered n
),
siblings AS (
  -- earlier_end_ns: the latest end among the parent's earlier calls (clamped before the
  -- cast, which may run on every row)
  SELECT k.*,
    CASE WHEN k.earlier_key >= k.parent_floor THEN
      CAST(GREATEST(k.earlier_key - k.parent_floor - CAST('9223372036854775808' AS DECIMAL(38, 0)),
        CAST('-9223372036854775808' AS DECIMAL(38, 0))) AS BIGINT) END AS earlier_end_ns
  FROM keyed k
),
sequential_calls AS (
  -- not overlapping any budgeted sibling by more than deadlines.tolerance_ms: the latest
  -- end among the earlier siblings and the next sibling's start decide it (clocks of
  -- millisecond resolution make back-to-back calls touch or overlap by a tick)
  SELECT k.trace_id, k.parent_span_id, k.logical_call_id, k.caller, k.callee, k.operation,
    k.start_ns, k.deadline_ms, k.anchor_deadline_ms, k.inverted, k.weight, k.edge, k.parent_no
  FROM params p CROSS JOIN siblings k
  WHERE (k.earlier_end_ns IS NULL OR k.earlier_end_ns <= k.start_ns + p.deadline_tolerance_ms * 1e6)
    AND (k.next_start_ns IS NULL OR k.next_start_ns >= k.end_ns - p.deadline_tolerance_ms * 1e6)
),
sequential AS (
  -- through: the budgets of the sequential calls up to this one in that order, summed
  -- exactly (decimal; a budget over 1e15 ms counts as 1e15); a parent's running sum is
  -- through minus what came before its first call, so no window per parent is needed
  SELECT s.*, CAST(LEAST(s.deadline_ms, 1e15) AS DECIMAL(38, 10)) AS budget,
    SUM(CAST(LEAST(s.deadline_ms, 1e15) AS DECIMAL(38, 10))) OVER (ORDER BY s.trace_id, s.parent_span_id, s.start_ns, s.logical_call_id
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS through
  FROM sequential_calls s
),
overcommitted AS (
  -- each sequential call with its parent's sequential calls as a whole: how many, what came
  -- before the parent's first (before_parent), their budgets' sum, the parent's budget and
  -- whether any is inverted. Windows over the parent, not a GROUP BY joined back to
  -- `sequential`: used twice, the chain above (and `crowded`'s aggregate of every budgeted
  -- call) ran twice.
  SELECT s.*,
    COUNT(*) OVER parent AS calls,
    MIN(s.through - s.budget) OVER parent AS before_parent,
    CAST(SUM(s.budget) OVER parent AS DOUBLE) AS total_ms,
    MAX(s.anchor_deadline_ms) OVER parent AS parent_budget_ms,
    bool_or(s.inverted) OVER parent AS any_inverted
  FROM sequential s
  WINDOW parent AS (PARTITION BY s.parent_no)
),
multi_layer AS (
  SELECT trace_id, COUNT(DISTINCT layer) AS retrying_layers
  FROM (
    SELECT trace_id, caller AS layer FROM attempts WHERE attempt >= 1 AND NOT hedged
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
  a.weight, a.edge
FROM params p CROSS JOIN attempts a
WHERE a.own_deadline_ms IS NOT NULL AND a.anchor_deadline_ms IS NOT NULL
  AND a.own_deadline_ms > a.anchor_deadline_ms - (a.start_ns - a.anchor_start_ns) / 1e6
    + p.deadline_tolerance_ms
UNION ALL
SELECT 'deadline_inversion', b.trace_id, b.caller, b.callee, b.operation,
  concat('budget ', CAST(ROUND(b.deadline_ms) AS BIGINT), ' ms exceeds the ',
    CAST(ROUND(b.anchor_deadline_ms - (b.start_ns - b.anchor_start_ns) / 1e6) AS BIGINT),
    ' ms the caller had left'),
  b.weight, b.edge
FROM budgeted b
WHERE b.inverted AND b.budget_on_call_span
UNION ALL
SELECT 'overcommit', o.trace_id, o.caller, o.callee, o.operation,
  concat(CAST(o.calls AS VARCHAR), ' sequential calls budget ', CAST(ROUND(o.total_ms) AS BIGINT),
    ' ms in all, more than the caller''s ', CAST(ROUND(o.parent_budget_ms) AS BIGINT), ' ms'),
  o.weight, o.edge
FROM params p CROSS JOIN overcommitted o
-- parents whose sequential calls' budgets sum to more than the parent's
WHERE o.calls >= 2 AND NOT o.any_inverted
  AND o.total_ms > o.parent_budget_ms + p.deadline_tolerance_ms
  -- the call whose budget crosses the parent's: over after it, not before
  AND CAST(o.through - o.before_parent AS DOUBLE) > o.parent_budget_ms + p.deadline_tolerance_ms
  AND CAST(o.through - o.budget - o.before_parent AS DOUBLE)
    <= o.parent_budget_ms + p.deadline_tolerance_ms
UNION ALL
SELECT 'not_propagated', a.trace_id, a.caller, a.callee, a.operation,
  concat('the attempt had a ', CAST(ROUND(a.deadline_ms) AS BIGINT),
    ' ms budget; the callee received none'),
  a.weight, a.edge
FROM attempts a
WHERE a.server_span_id IS NOT NULL AND a.server_deadline_ms IS NULL AND a.deadline_ms IS NOT NULL
UNION ALL
SELECT 'unsafe_retry', a.trace_id, a.caller, a.callee, a.operation,
  CASE WHEN a.unstable_key
    THEN concat('retry #', CAST(a.attempt AS VARCHAR),
      ' did not send the first attempt''s idempotency key: the callee cannot tell it is a repeat')
    ELSE concat('retry #', CAST(a.attempt AS VARCHAR),
      ' of a non-idempotent call without an idempotency key') END,
  a.weight, a.edge
FROM attempts a
-- (retries, a few percent of the attempts, last: see entries)
WHERE (a.non_idempotent AND NOT a.has_idempotency_key AND a.attempt >= 1) OR a.unstable_key
UNION ALL
SELECT 'overlapping_retry', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR),
    ' of a write without a stable idempotency key reached the callee while it still ran the attempt before'),
  a.weight, a.edge
FROM attempts a
WHERE a.overlapping AND a.attempt >= 1 AND NOT a.hedged AND a.non_idempotent
  AND (NOT a.has_idempotency_key OR a.unstable_key)
UNION ALL
SELECT 'rerun_write', a.trace_id, a.caller, a.callee, a.operation,
  'a write made again for a retry of an upstream call, without the first write''s idempotency key',
  a.weight, a.edge
FROM attempts a
WHERE a.rerun_write
UNION ALL
SELECT 'duplicate_rejection', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR),
    ' of a write was answered as a duplicate: an earlier attempt had done it'),
  a.weight, a.edge
FROM attempts a
WHERE a.attempt >= 1 AND a.duplicate AND a.non_idempotent
UNION ALL
SELECT 'retry_after_violation', a.trace_id, a.caller, a.callee, a.operation,
  CASE WHEN a.prev_retry_after_ms < 0
    THEN concat('retry #', CAST(a.attempt AS VARCHAR),
      ' after a pushback that said not to retry')
    ELSE concat('retry #', CAST(a.attempt AS VARCHAR), ' started ',
      CAST(ROUND(a.backoff_ms, 1) AS VARCHAR),
      ' ms after an answer that asked for ', CAST(ROUND(a.prev_retry_after_ms, 1) AS VARCHAR),
      ' ms') END,
  a.weight, a.edge
FROM attempts a
WHERE a.retry_after_violation
UNION ALL
SELECT 'unbudgeted_call', a.trace_id, a.caller, a.callee, a.operation,
  'a call with no deadline on either side: it can wait forever',
  a.weight, a.edge
FROM attempts a
WHERE a.attempt = 0 AND a.server_span_id IS NOT NULL AND a.deadline_ms IS NULL
  AND a.server_deadline_ms IS NULL
UNION ALL
SELECT 'write_without_key', a.trace_id, a.caller, a.callee, a.operation,
  'a write sent without an idempotency key: a retry of it cannot be told from a new write',
  a.weight, a.edge
FROM attempts a
WHERE a.attempt = 0 AND (a.is_write OR NOT a.idempotent) AND NOT a.has_idempotency_key
UNION ALL
SELECT 'timeout_retry_on_write', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR), ' of a timed-out write'),
  a.weight, a.edge
FROM attempts a
WHERE a.non_idempotent AND a.cause = 'deadline' AND a.attempt >= 1
UNION ALL
SELECT 'immediate_retry', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR), ' started ', CAST(ROUND(a.backoff_ms, 1) AS VARCHAR),
    ' ms after the previous attempt ended'),
  a.weight, a.edge
FROM params p CROSS JOIN attempts a
WHERE a.attempt >= 1 AND NOT a.hedged AND a.backoff_ms < p.min_backoff_ms
UNION ALL
SELECT 'non_retryable_retry', a.trace_id, a.caller, a.callee, a.operation,
  concat('retry #', CAST(a.attempt AS VARCHAR),
    ' after a client_error, which the same request meets again'),
  a.weight, a.edge
FROM attempts a
WHERE a.attempt >= 1 AND NOT a.hedged AND a.prev_outcome = 'client_error'
UNION ALL
SELECT 'multi_layer_retry', e.trace_id, e.service, '', e.operation,
  concat(CAST(m.retrying_layers AS VARCHAR), ' layers retried in one trace'),
  e.weight, CAST(NULL AS BIGINT)
FROM multi_layer m
JOIN entries e ON e.trace_id = m.trace_id
