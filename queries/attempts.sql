-- attempts: one row per attempt, i.e. one try of a logical call.
--
-- Inputs: spans, lineage.
-- Both retry shapes of DESIGN.md end up here in the same form:
--   * sibling attempts: CLIENT spans under one parent, numbered by retry /
--     http.request.resend_count (the `attempt` column; absent = 0);
--   * call span with attempt children (gRPC per-attempt tracing): a CLIENT or INTERNAL
--     span whose CLIENT/INTERNAL children carry attempt numbers. The call span itself is
--     not an attempt; its children are, and inherit its callee hint, deadline and
--     idempotency when they carry none.
-- Attempts of one parent to one callee hint and operation, ordered by start, form logical
-- calls; a new logical call starts at every attempt numbered 0, so a parent calling the
-- same operation twice makes two logical calls. The logical call id is the span id of its
-- first attempt. The callee is the service of a SERVER span under any attempt of the call,
-- else the service such SERVER spans most often have for this callee hint, else the hint.
-- cause: the attempt's cause attribute, else the previous attempt's outcome (null on
-- attempt 0). backoff_ms: gap since the previous attempt's end (null on the first).
-- baseline: the attempt would happen with no retry anywhere upstream (its number and every
-- ancestor attempt's number are 0).
--
-- Output: trace_id, span_id, parent_span_id, logical_call_id, caller, callee, operation,
--   attempt, cause, outcome, start_ns, end_ns, duration_ms, deadline_ms, own_deadline_ms,
--   idempotent, has_idempotency_key, is_write, non_idempotent, backoff_ms, baseline,
--   anchor_deadline_ms, anchor_start_ns, upstream_attempt_span_id, root_span_id,
--   server_span_id, server_service, server_end_ns, server_outcome, server_pending,
--   server_ctx_cancelled, server_deadline_ms
WITH marked_parents AS (
  -- call spans: CLIENT/INTERNAL spans with numbered CLIENT/INTERNAL children. (A SERVER
  -- span with numbered CLIENT children is the parent of sibling attempts, not a call span.)
  SELECT DISTINCT c.trace_id, c.parent_span_id AS span_id
  FROM spans c
  JOIN spans p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id
  WHERE c.attempt IS NOT NULL AND c.kind IN ('client', 'internal')
    AND p.kind IN ('client', 'internal')
),
server_children AS (
  SELECT trace_id, parent_span_id AS span_id,
    first_value(span_id ORDER BY start_ns) AS server_span_id,
    first_value(service_name ORDER BY start_ns) AS server_service,
    first_value(end_ns ORDER BY start_ns) AS server_end_ns,
    first_value(outcome ORDER BY start_ns) AS server_outcome,
    first_value(pending ORDER BY start_ns) AS server_pending,
    first_value(ctx_cancelled ORDER BY start_ns) AS server_ctx_cancelled,
    first_value(deadline_ms ORDER BY start_ns) AS server_deadline_ms
  FROM spans
  WHERE kind = 'server' AND parent_span_id IS NOT NULL
  GROUP BY trace_id, parent_span_id
),
tries AS (
  SELECT s.trace_id, s.span_id, s.parent_span_id, s.service_name AS caller,
    CASE WHEN mp.span_id IS NOT NULL THEN COALESCE(s.callee_hint, p.callee_hint)
         ELSE s.callee_hint END AS callee_hint,
    s.operation, COALESCE(s.attempt, 0) AS attempt, s.retry_cause, s.outcome,
    s.start_ns, s.end_ns,
    CASE WHEN mp.span_id IS NOT NULL THEN COALESCE(s.deadline_ms, p.deadline_ms)
         ELSE s.deadline_ms END AS deadline_ms,
    s.deadline_ms AS own_deadline_ms,
    CASE WHEN mp.span_id IS NOT NULL THEN COALESCE(s.idempotent, p.idempotent)
         ELSE s.idempotent END AS idempotent,
    s.has_idempotency_key OR (mp.span_id IS NOT NULL AND COALESCE(p.has_idempotency_key, false))
      AS has_idempotency_key,
    s.is_write OR (mp.span_id IS NOT NULL AND COALESCE(p.is_write, false)) AS is_write,
    sc.server_span_id, sc.server_service, sc.server_end_ns, sc.server_outcome,
    sc.server_pending, sc.server_ctx_cancelled, sc.server_deadline_ms
  FROM spans s
  LEFT JOIN marked_parents self_marked
    ON self_marked.trace_id = s.trace_id AND self_marked.span_id = s.span_id
  LEFT JOIN marked_parents mp ON mp.trace_id = s.trace_id AND mp.span_id = s.parent_span_id
  LEFT JOIN spans p ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id
  LEFT JOIN server_children sc ON sc.trace_id = s.trace_id AND sc.span_id = s.span_id
  WHERE self_marked.span_id IS NULL
    AND (s.kind = 'client'
         OR (s.kind = 'internal' AND s.attempt IS NOT NULL AND mp.span_id IS NOT NULL))
),
hints AS (
  SELECT callee_hint, server_service,
    ROW_NUMBER() OVER (PARTITION BY callee_hint ORDER BY COUNT(*) DESC, server_service) AS hint_rank
  FROM tries
  WHERE callee_hint IS NOT NULL AND server_service IS NOT NULL
  GROUP BY callee_hint, server_service
),
numbered AS (
  SELECT t.*,
    SUM(CASE WHEN t.attempt = 0 THEN 1 ELSE 0 END) OVER (
      PARTITION BY t.trace_id, t.parent_span_id, t.callee_hint, t.operation
      ORDER BY t.start_ns, t.span_id
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS call_index
  FROM tries t
),
calls AS (
  SELECT n.*,
    first_value(n.span_id) OVER (
      PARTITION BY n.trace_id, n.parent_span_id, n.callee_hint, n.operation, n.call_index
      ORDER BY n.start_ns, n.span_id) AS logical_call_id,
    MAX(n.server_service) OVER (
      PARTITION BY n.trace_id, n.parent_span_id, n.callee_hint, n.operation, n.call_index)
      AS call_server_service
  FROM numbered n
),
resolved AS (
  SELECT c.*, COALESCE(c.call_server_service, h.server_service, c.callee_hint, 'unknown') AS callee
  FROM calls c
  LEFT JOIN hints h ON h.callee_hint = c.callee_hint AND h.hint_rank = 1
),
ordered AS (
  SELECT r.*,
    LAG(r.outcome) OVER (PARTITION BY r.trace_id, r.logical_call_id ORDER BY r.attempt, r.start_ns)
      AS previous_outcome,
    LAG(r.end_ns) OVER (PARTITION BY r.trace_id, r.logical_call_id ORDER BY r.attempt, r.start_ns)
      AS previous_end_ns
  FROM resolved r
)
SELECT o.trace_id, o.span_id, o.parent_span_id, o.logical_call_id, o.caller, o.callee,
  o.operation, o.attempt,
  CASE WHEN o.attempt = 0 THEN NULL ELSE COALESCE(o.retry_cause, o.previous_outcome) END AS cause,
  o.outcome, o.start_ns, o.end_ns, (o.end_ns - o.start_ns) / 1e6 AS duration_ms,
  o.deadline_ms, o.own_deadline_ms, o.idempotent, o.has_idempotency_key, o.is_write,
  COALESCE(NOT o.idempotent, o.is_write) AS non_idempotent,
  CASE WHEN o.previous_end_ns IS NULL THEN NULL
       ELSE (o.start_ns - o.previous_end_ns) / 1e6 END AS backoff_ms,
  o.attempt = 0 AND NOT l.upstream_retry AS baseline,
  l.anchor_deadline_ms, l.anchor_start_ns, l.upstream_attempt_span_id, l.root_span_id,
  o.server_span_id, o.server_service, o.server_end_ns, o.server_outcome, o.server_pending,
  o.server_ctx_cancelled, o.server_deadline_ms
FROM ordered o
JOIN lineage l ON l.trace_id = o.trace_id AND l.span_id = o.span_id
