-- attempts: one row per attempt, i.e. one try of a logical call.
--
-- Inputs: lineage_attempts (the attempts' rows of lineage, with their structural links, see
-- crates/analytics/src/lineage.rs).
-- Both retry shapes of the README end up here in the same form:
--   * sibling attempts: CLIENT spans under one parent, numbered by retry /
--     http.request.resend_count (the `attempt` column; absent = 0);
--   * call span with attempt children (gRPC per-attempt tracing): a CLIENT or INTERNAL
--     span whose CLIENT/INTERNAL children carry attempt numbers. The call span itself is
--     not an attempt; its children are, and inherit its callee hint, deadline and
--     idempotency when they carry none.
--   * uninstrumented callers: a SERVER span carrying an attempt number whose parent is not
--     an attempt (a proxy or gateway that sends no CLIENT spans retried it), or any SERVER
--     span whose parent is another service's non-CLIENT span (the caller propagates the
--     context but sends no CLIENT span), is an attempt of its parent's service (caller
--     `unknown` without a parent) to its own service; an unnumbered one after a sibling
--     SERVER span of the same parent is a re-send of the same call.
--   * re-sends below the instrumentation: a CLIENT span with several SERVER children of
--     one service (a client library or proxy sent the request again) is a call span; each
--     SERVER child is an attempt, in start order, with its own outcome (the last one takes
--     the CLIENT span's outcome and end when the client gave up: deadline, cancelled), and
--     the CLIENT span's operation and budget.
--   * application loops: unnumbered sibling CLIENT spans to one callee and operation, each
--     started after the one before ended in a retryable failure, to the same URL where both
--     carry one, are one call (`retries.infer_loops`).
-- Attempts of one parent to one callee hint and operation, ordered by start, form logical
-- calls; a new logical call starts at every attempt numbered 0 that none of the rules
-- above joins to the one before, so a parent calling the same operation twice makes two
-- logical calls. In a call with attempts found without numbers, `attempt` is the position. The grouping (logical_call_id, unique within
-- one analysis, and each attempt's place in its call) is computed in Rust with the lineage:
-- as two window passes over the whole table it dominated every interval's analysis.
-- The callee is the service of a SERVER span under any attempt of the call,
-- else the service such SERVER spans most often have for this callee hint, else the hint,
-- else `unknown`; the caller is the service that made the attempt (a SERVER attempt's
-- parent's), else `unknown`. Both are named with the lineage (its `callee` and `caller`),
-- which also gives each (caller, callee, operation) one integer, `edge`.
-- cause: the attempt's cause attribute, else the previous attempt's outcome (null on
-- attempt 0). prev_outcome: the previous attempt's outcome, whatever the attribute says. backoff_ms: gap since the previous attempt's end (null on the first).
-- baseline: the attempt would happen with no retry anywhere upstream (its number and every
-- ancestor attempt's number are 0).
--
-- calling_span_id: the span that made the call: the parent, or for gRPC's shape the call
-- span's parent.
-- outer_attempt: the attempt number of an in-process retry loop around the call: the call
-- span's own number (an INTERNAL span carrying `retry` whose CLIENT children carry theirs),
-- null when the call span has none.
--
-- Output: trace_id, span_id, parent_span_id, calling_span_id, logical_call_id, caller,
--   callee, operation,
--   attempt, cause, prev_outcome, outcome, start_ns, end_ns, duration_ms, deadline_ms, own_deadline_ms,
--   idempotent, has_idempotency_key, idempotency_key_hash, unstable_key, is_write,
--   non_idempotent, backoff_ms, baseline,
--   anchor_deadline_ms, anchor_start_ns, upstream_attempt_span_id, root_span_id,
--   server_span_id, server_service, server_start_ns, server_end_ns, server_outcome, server_pending,
--   server_ctx_cancelled, server_deadline_ms, server_idempotency_hit, is_first_attempt, is_last_attempt, outer_attempt,
--   call_deadline_ms, call_anchor_deadline_ms, call_anchor_start_ns, weight, numbered,
--   has_cause, row_id, root_row, upstream_attempt_row, edge, upstream_edge,
--   logical_attempts, logical_max_attempt, logical_start_ns, logical_end_ns,
--   logical_final_outcome, hidden, hedged, overlapped, inferred, other_instance, overlapping,
--   rerun_write, duplicate, prev_retry_after_ms, retry_after_violation, response_code,
--   unknown_result_ms, unknown_unresolved
-- weight: how many attempts this one stands for (the span's sampling adjusted count).
-- deadline_ms: the attempt's budget: its own, else its call span's, else the one its
-- callee's SERVER span received (a proxy that records no budget on its own spans gives one
-- on the request: Envoy's x-envoy-expected-rq-timeout-ms, its route or per-try timeout, as
-- the callee captured it); own_deadline_ms: its own only.
-- row_id, root_row, upstream_attempt_row: the lineage's integer keys of the span, its root
-- and its upstream attempt (joins within one analysis).
-- logical_*: the attempt's logical call as a whole (from the lineage): its attempts, highest
-- attempt number, first start, last end and last attempt's outcome (see logical_calls).
-- edge, upstream_edge: the integer key of (caller, callee, operation) in `edge_names`, and
-- the upstream attempt's (null when the upstream span is not an attempt): the partials
-- group by it and join the names once per edge (grouping by the three strings was most of
-- their work).
-- numbered, has_cause: the span carries an attempt number / a cause attribute of its own
-- (instrumentation coverage; `attempt` defaults to 0 and `cause` to the previous outcome).
-- hidden: read from a SERVER span without a number of its own (a re-send below the CLIENT
-- span, or a call from an uninstrumented caller); inferred: joined to its call as an
-- application loop's retry; hedged: a SERVER attempt started before an earlier attempt of
-- its call had ended, read as a hedge (an attempt, not a retry: its cause is `hedge`, and
-- the retry figures leave it out; see lineage/races.rs for when such an attempt is a retry
-- after a per-try timeout instead); overlapped: such a SERVER attempt either way (hedged,
-- or not: a retry after a per-try timeout). An attempt its caller abandoned while it ran has the
-- caller's outcome (`deadline`, `cancelled`) and end. other_instance: a retry whose SERVER span ran on another instance
-- (service.instance.id, else host.name) than the attempt before's (null when either is
-- unknown or on first attempts). overlapping: the attempt's SERVER span started before the
-- previous attempt's SERVER span ended (beyond retries.overlap_tolerance_ms): the callee
-- still worked on the call when it came again. rerun_write: the first attempt of a write
-- call made for a retry of an upstream call, repeating (same edge) a write made for an
-- earlier attempt of that call without the earlier write's idempotency key (see
-- lineage/reruns.rs): the write runs again although the retry above may be safe.
-- call_*: for gRPC's shape, the call span's own budget and the anchor the whole call had to
-- fit in (null otherwise).
-- idempotency_key_hash: the keyed hash of the attempt's idempotency key, else its call
-- span's (the key's value is kept nowhere). unstable_key: a retry (attempt >= 1, a hedge
-- included) whose key differs from its logical call's first attempt's, one of them
-- carrying none included: the callee cannot tell it repeats the first, so it is also an
-- unsafe retry. duplicate: the attempt was answered as a repeat of a request already done
-- (HTTP 409, gRPC ALREADY_EXISTS, an error.type naming a duplicate), by its own span or its
-- callee's SERVER span. response_code: the code the attempt was answered with, kept raw
-- (the callee's SERVER span's, else the attempt's own; null without either).
-- unknown_result_ms / unknown_unresolved: a keyed write its caller gave up on (deadline,
-- cancelled): how long until a later span with its key answered (ok, or a duplicate), or
-- that none in its trace did (lineage/unknowns.rs).
-- prev_retry_after_ms: the wait the previous attempt's answer asked
-- for (HTTP Retry-After, gRPC grpc-retry-pushback-ms; -1 for a pushback saying not to
-- retry); retry_after_violation: a retry (not a hedge) started before that wait elapsed
-- (from the previous attempt's end, by more than retries.overlap_tolerance_ms), or at all
-- after a pushback saying not to (lineage).
-- server_idempotency_hit: the callee's SERVER span says it answered from its
-- idempotency store.
WITH tries AS (
  SELECT s.trace_id, s.span_id, s.parent_span_id,
    COALESCE(s.call_parent_span_id, s.parent_span_id) AS calling_span_id,
    s.caller,
    s.operation, COALESCE(s.attempt, 0) AS attempt, s.retry_cause, s.outcome,
    s.start_ns, s.end_ns,
    COALESCE(s.deadline_ms, s.call_deadline_ms, s.server_deadline_ms) AS deadline_ms,
    s.deadline_ms AS own_deadline_ms,
    COALESCE(s.idempotent, s.call_idempotent) AS idempotent,
    s.has_idempotency_key OR COALESCE(s.call_has_idempotency_key, false) AS has_idempotency_key,
    COALESCE(s.idempotency_key_hash, s.call_idempotency_key_hash) AS idempotency_key_hash,
    COALESCE(s.logical_first_key_hash, s.call_idempotency_key_hash) AS first_key_hash,
    s.is_write OR COALESCE(s.call_is_write, false) AS is_write,
    s.upstream_retry, s.anchor_deadline_ms, s.anchor_start_ns, s.upstream_attempt_span_id,
    s.root_span_id,
    s.server_span_id, s.server_service, s.server_start_ns, s.server_end_ns, s.server_outcome,
    s.server_pending, s.server_ctx_cancelled, s.server_deadline_ms, s.server_idempotency_hit,
    s.logical_call_id, s.is_first_attempt, s.is_last_attempt, s.prev_outcome, s.prev_end_ns,
    s.callee,
    s.call_attempt AS outer_attempt,
    s.call_deadline_ms, s.call_anchor_deadline_ms, s.call_anchor_start_ns, s.weight,
    s.numbered, s.retry_cause IS NOT NULL AS has_cause,
    s.row_id, s.root_row, s.upstream_attempt_row, s.edge, s.upstream_edge,
    s.logical_attempts, s.logical_max_attempt, s.logical_start_ns, s.logical_end_ns,
    s.logical_final_outcome, s.hidden, s.hedged, s.overlapped, s.inferred, s.other_instance,
    s.overlapping, s.rerun_write,
    COALESCE(s.duplicate, false) OR COALESCE(s.server_duplicate, false) AS duplicate,
    s.prev_retry_after_ms, s.retry_after_violation,
    COALESCE(s.server_response_code, s.response_code) AS response_code,
    s.unknown_result_ms, s.unknown_unresolved
  -- the attempts' rows of lineage (a call span is not an attempt; its numbered children
  -- are), with the columns of the spans each is linked to
  FROM lineage_attempts s
)
SELECT o.trace_id, o.span_id, o.parent_span_id, o.calling_span_id, o.logical_call_id,
  o.caller, o.callee,
  o.operation, o.attempt,
  CASE WHEN o.attempt = 0 THEN NULL
       WHEN o.hedged THEN 'hedge'
       ELSE COALESCE(o.retry_cause, o.prev_outcome)
  END AS cause,
  o.prev_outcome,
  o.outcome, o.start_ns, o.end_ns, (o.end_ns - o.start_ns) / 1e6 AS duration_ms,
  o.deadline_ms, o.own_deadline_ms, o.idempotent, o.has_idempotency_key,
  o.idempotency_key_hash,
  o.attempt >= 1 AND o.idempotency_key_hash IS DISTINCT FROM o.first_key_hash AS unstable_key,
  o.is_write,
  COALESCE(NOT o.idempotent, o.is_write) AS non_idempotent,
  (o.start_ns - o.prev_end_ns) / 1e6 AS backoff_ms,
  o.attempt = 0 AND NOT o.upstream_retry AS baseline,
  o.anchor_deadline_ms, o.anchor_start_ns, o.upstream_attempt_span_id, o.root_span_id,
  o.server_span_id, o.server_service, o.server_start_ns, o.server_end_ns, o.server_outcome,
  o.server_pending,
  o.server_ctx_cancelled, o.server_deadline_ms, o.server_idempotency_hit,
  o.is_first_attempt, o.is_last_attempt, o.outer_attempt,
  o.call_deadline_ms, o.call_anchor_deadline_ms, o.call_anchor_start_ns, o.weight,
  o.numbered, o.has_cause, o.row_id, o.root_row, o.upstream_attempt_row, o.edge,
  o.upstream_edge, o.logical_attempts, o.logical_max_attempt, o.logical_start_ns,
  o.logical_end_ns, o.logical_final_outcome, o.hidden, o.hedged, o.overlapped, o.inferred,
  o.other_instance, o.overlapping, o.rerun_write, o.duplicate, o.prev_retry_after_ms,
  o.retry_after_violation, o.response_code, o.unknown_result_ms, o.unknown_unresolved
FROM tries o
