-- partial_edges: per (caller, callee, operation), the counts every edge figure is a ratio of.
-- Counts are sums of sampling weights (each span stands for its adjusted count).
-- Mergeable by SUM (MAX for max_attempt and max_outer_attempt): one row per edge per
-- analysis interval. max_outer_attempt: the highest attempt number of an in-process retry
-- loop around the edge's calls (attempts.outer_attempt), null when there is none.
-- budgeted_attempts and deadline_ms_total: the attempts that carry a budget (deadline_ms)
-- and the sum of their budgets, so a Prometheus user gets the mean timeout of an edge from
-- counters summed over instances (the configured timeout, exactly, when the edge has one).
-- non_retryable_retries: retries (hedges aside) after an attempt that ended `client_error`
-- (a 4xx but 408 and 429, a gRPC status the same request meets again, a non-zero err_code).
-- unstable_key_retries: retries (a hedge included) whose idempotency key differs from their
-- logical call's first attempt's (attempts.unstable_key); they are unsafe_retries too.
-- idempotency_hits: attempts whose callee's SERVER span answered from its idempotency store.
-- retries_after_deadline: retries (hedges aside) started when the caller's remaining budget
-- (see partial_budgets) was already spent: they cannot be answered in time.
-- retried_calls, retried_failed_calls: logical calls with more than one attempt, and those
-- of them whose last attempt failed.
-- timeout_attempts: attempts ending in `deadline` (the timeout rate's numerator).
-- timed_out_served_attempts: attempts ending in `deadline` whose callee sent a SERVER span;
-- timed_out_server_ok_attempts: those whose SERVER span ended ok (not pending), however long
-- after the caller gave up.
-- unbudgeted_served_attempts: attempts whose callee sent a SERVER span, with no deadline on
-- either side (the attempt's own or its call's, the SERVER span's).
-- served_budgeted_attempts: attempts with a budget whose callee sent a SERVER span;
-- timeout_killed_attempts: those whose SERVER span ran longer than the attempt's budget
-- (the call would have been answered, later than the timeout allowed).
-- Instrumentation coverage (what the spans say themselves; see coverage): numbered_attempts
-- (an attempt number of their own), caused_retries (retries with a cause attribute),
-- write_attempts (writes, or attempts that say whether they are idempotent),
-- declared_writes (those with an idempotent flag or an idempotency key), key_writes (writes
-- by method or an `idempotent=false` flag) and keyed_writes (those carrying a key: a flag
-- alone is none), served_attempts
-- (attempts whose callee sent a SERVER span).
-- How attempts were found: hidden_attempts (read from SERVER spans without a number:
-- re-sends below a CLIENT span, uninstrumented callers), inferred_attempts (application
-- loops), hedged_attempts (attempts started before an earlier one ended: in attempts, not
-- in the retry counts), per_try_timeout_retries (retries started before an earlier attempt
-- ended, read as sent after a per-try timeout: the overlapping attempts not hedged),
-- overlapping_retries (retries, hedges aside, whose SERVER span started before the previous
-- attempt's SERVER span ended: the callee still worked on the call when it came again),
-- overlapping_write_retries (those of non-idempotent calls without a stable idempotency
-- key: the overlapping_retry findings); rerun_writes (write calls made for a retry of an
-- upstream call that repeat a write made for an earlier attempt of it without its key:
-- the rerun_write findings); duplicate_rejections (retries of non-idempotent calls answered
-- as a duplicate: HTTP 409, gRPC ALREADY_EXISTS, an error.type naming one);
-- backoff_retries and backoff_ms_total (retries, hedges aside, after an attempt that ended,
-- and the gaps they waited, floored at 0: the mean backoff summed across instances);
-- unknown_results (keyed writes the caller gave up on: their result unknown),
-- unknown_resolved and unknown_result_ms_total (those a later span with the key answered,
-- and how long after), unknown_results_over_limit (those answered after more than
-- params.unknown_after_ms, or not at all);
-- retry_after_violations (retries started before the wait the previous answer asked for
-- elapsed, or after a pushback saying not to retry);
-- instance_retries and other_instance_retries: retries whose
-- instance and the previous attempt's are known, and those that landed elsewhere.
--
-- Conditional sums are written SUM(x) FILTER (WHERE c), not SUM(CASE WHEN c THEN x ELSE 0.0
-- END): the same sums (a row whose condition is false or null adds nothing either way; COALESCE
-- gives 0.0 to an edge without such rows), but the aggregate skips the filtered rows instead
-- of evaluating a CASE into a column per sum: about half the `at` aggregate's compute on a
-- 45k-span chunk (EXPLAIN ANALYZE through `stormglass query`).
--
-- Every part groups by the attempts' integer `edge` and the names are joined once per edge
-- from `edge_names` (see attempts): the same groups as (caller, callee, operation), without
-- hashing and comparing three strings per row in each of the four aggregates.
--
-- Inputs: attempts, logical_calls, orphans, findings, edge_names, params.
-- Output: caller, callee, operation, logical_calls, final_ok, first_ok, final_ok_retried,
--   retried_calls, retried_failed_calls,
--   attempts, ok_attempts, timeout_attempts, timed_out_served_attempts,
--   timed_out_server_ok_attempts, unbudgeted_served_attempts, served_budgeted_attempts,
--   timeout_killed_attempts, first_attempts, retry_attempts, ok_retry_attempts, max_attempt,
--   max_outer_attempt, budgeted_attempts, deadline_ms_total, numbered_attempts,
--   caused_retries, write_attempts, declared_writes, served_attempts, hidden_attempts,
--   inferred_attempts, hedged_attempts, per_try_timeout_retries, overlapping_retries,
--   overlapping_write_retries, rerun_writes, duplicate_rejections,
--   retry_after_violations, backoff_retries, backoff_ms_total, unknown_results,
--   unknown_resolved, unknown_result_ms_total, unknown_results_over_limit,
--   instance_retries,
--   other_instance_retries,
--   unsafe_retries, timeout_retries_on_writes, immediate_retries, non_retryable_retries,
--   retries_after_deadline, unstable_key_retries, idempotency_hits, key_writes, keyed_writes,
--   orphan_pairs,
--   orphan_work_ms, deadline_inversions
WITH lc AS (
  SELECT edge,
    SUM(weight) AS logical_calls,
    COALESCE(SUM(weight) FILTER (WHERE final_outcome = 'ok'), 0.0) AS final_ok,
    COALESCE(SUM(weight) FILTER (WHERE first_outcome = 'ok'), 0.0) AS first_ok,
    COALESCE(SUM(weight) FILTER (WHERE final_outcome = 'ok' AND attempts > 1), 0.0) AS final_ok_retried,
    COALESCE(SUM(weight) FILTER (WHERE attempts > 1), 0.0) AS retried_calls,
    COALESCE(SUM(weight) FILTER (WHERE final_outcome <> 'ok' AND attempts > 1), 0.0)
      AS retried_failed_calls
  FROM logical_calls
  GROUP BY edge
),
at AS (
  -- (in the filters, retries, a few percent of the attempts, come last: DataFusion copies
  -- the aggregate's input rows where an AND's left side is selective; see entries)
  SELECT a.edge,
    SUM(a.weight) AS attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.outcome = 'ok'), 0.0) AS ok_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.outcome = 'deadline'), 0.0) AS timeout_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.outcome = 'deadline'
      AND a.server_span_id IS NOT NULL), 0.0) AS timed_out_served_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.outcome = 'deadline' AND a.server_outcome = 'ok'
      AND NOT COALESCE(a.server_pending, false)), 0.0) AS timed_out_server_ok_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.server_span_id IS NOT NULL
      AND a.deadline_ms IS NULL AND a.server_deadline_ms IS NULL), 0.0)
      AS unbudgeted_served_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.deadline_ms IS NOT NULL
      AND a.server_end_ns IS NOT NULL), 0.0) AS served_budgeted_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.deadline_ms IS NOT NULL
      AND (a.server_end_ns - a.server_start_ns) / 1e6 > a.deadline_ms), 0.0)
      AS timeout_killed_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt = 0), 0.0) AS first_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged), 0.0) AS retry_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.outcome = 'ok' AND a.attempt >= 1 AND NOT a.hedged), 0.0)
      AS ok_retry_attempts,
    MAX(a.attempt) AS max_attempt,
    MAX(a.outer_attempt) FILTER (WHERE a.outer_attempt >= 0) AS max_outer_attempt,
    COALESCE(SUM(a.weight) FILTER (WHERE a.deadline_ms IS NOT NULL), 0.0) AS budgeted_attempts,
    COALESCE(SUM(a.deadline_ms * a.weight) FILTER (WHERE a.deadline_ms IS NOT NULL), 0.0)
      AS deadline_ms_total,
    COALESCE(SUM(a.weight) FILTER (WHERE a.numbered), 0.0) AS numbered_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged AND a.has_cause), 0.0)
      AS caused_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.is_write OR a.idempotent IS NOT NULL), 0.0)
      AS write_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE (a.is_write OR a.idempotent IS NOT NULL)
      AND (a.idempotent IS NOT NULL OR a.has_idempotency_key)), 0.0)
      AS declared_writes,
    COALESCE(SUM(a.weight) FILTER (WHERE a.server_span_id IS NOT NULL), 0.0) AS served_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.hidden), 0.0) AS hidden_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.inferred), 0.0) AS inferred_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.hedged), 0.0) AS hedged_attempts,
    COALESCE(SUM(a.weight) FILTER (WHERE a.overlapped AND NOT a.hedged), 0.0)
      AS per_try_timeout_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged AND a.overlapping), 0.0)
      AS overlapping_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged AND a.overlapping
      AND a.non_idempotent AND (NOT a.has_idempotency_key OR a.unstable_key)), 0.0)
      AS overlapping_write_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.rerun_write), 0.0) AS rerun_writes,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND a.duplicate AND a.non_idempotent), 0.0)
      AS duplicate_rejections,
    COALESCE(SUM(a.weight) FILTER (WHERE a.retry_after_violation), 0.0) AS retry_after_violations,
    COALESCE(SUM(a.weight) FILTER (WHERE a.unknown_result_ms IS NOT NULL
      OR a.unknown_unresolved), 0.0) AS unknown_results,
    COALESCE(SUM(a.weight) FILTER (WHERE a.unknown_result_ms IS NOT NULL), 0.0)
      AS unknown_resolved,
    COALESCE(SUM(a.weight * a.unknown_result_ms), 0.0) AS unknown_result_ms_total,
    COALESCE(SUM(a.weight) FILTER (WHERE a.unknown_unresolved
      OR a.unknown_result_ms > p.unknown_after_ms), 0.0) AS unknown_results_over_limit,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged
      AND a.backoff_ms IS NOT NULL), 0.0) AS backoff_retries,
    COALESCE(SUM(a.weight * GREATEST(a.backoff_ms, 0.0)) FILTER (WHERE a.attempt >= 1
      AND NOT a.hedged AND a.backoff_ms IS NOT NULL), 0.0) AS backoff_ms_total,
    COALESCE(SUM(a.weight) FILTER (WHERE a.other_instance IS NOT NULL AND NOT a.hedged), 0.0)
      AS instance_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.other_instance AND NOT a.hedged), 0.0)
      AS other_instance_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE (a.non_idempotent AND NOT a.has_idempotency_key
      AND a.attempt >= 1) OR a.unstable_key), 0.0) AS unsafe_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.unstable_key), 0.0) AS unstable_key_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.server_idempotency_hit), 0.0) AS idempotency_hits,
    COALESCE(SUM(a.weight) FILTER (WHERE a.is_write OR NOT a.idempotent), 0.0) AS key_writes,
    COALESCE(SUM(a.weight) FILTER (WHERE (a.is_write OR NOT a.idempotent)
      AND a.has_idempotency_key), 0.0) AS keyed_writes,
    COALESCE(SUM(a.weight) FILTER (WHERE a.non_idempotent AND a.cause = 'deadline' AND a.attempt >= 1), 0.0)
      AS timeout_retries_on_writes,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged
      AND a.backoff_ms < p.min_backoff_ms), 0.0) AS immediate_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged
      AND a.prev_outcome = 'client_error'), 0.0) AS non_retryable_retries,
    COALESCE(SUM(a.weight) FILTER (WHERE a.attempt >= 1 AND NOT a.hedged
      AND a.anchor_deadline_ms - (a.start_ns - a.anchor_start_ns) / 1e6 <= 0), 0.0)
      AS retries_after_deadline
  FROM params p CROSS JOIN attempts a
  GROUP BY a.edge
),
orph AS (
  SELECT edge, SUM(weight) AS orphan_pairs,
    SUM(COALESCE(work_after_cancel_ms, 0.0) * weight) AS orphan_work_ms
  FROM orphans
  GROUP BY edge
),
inv AS (
  SELECT edge, SUM(weight) AS deadline_inversions
  FROM findings WHERE kind = 'deadline_inversion'
  GROUP BY edge
),
-- The narrow tables joined first, the wide attempt sums once, probed against them: each
-- join copies every column it passes on, and at width every chunk holds most edges.
keyed AS (
  SELECT lc.edge, n.caller, n.callee, n.operation,
    lc.logical_calls, lc.final_ok, lc.first_ok, lc.final_ok_retried,
    lc.retried_calls, lc.retried_failed_calls,
    COALESCE(orph.orphan_pairs, 0.0) AS orphan_pairs,
    COALESCE(orph.orphan_work_ms, 0.0) AS orphan_work_ms,
    COALESCE(inv.deadline_inversions, 0.0) AS deadline_inversions
  FROM lc
  JOIN edge_names n ON n.edge = lc.edge
  LEFT JOIN orph ON orph.edge = lc.edge
  LEFT JOIN inv ON inv.edge = lc.edge
)
SELECT k.caller, k.callee, k.operation,
  k.logical_calls, k.final_ok, k.first_ok, k.final_ok_retried,
  k.retried_calls, k.retried_failed_calls,
  at.attempts, at.ok_attempts, at.timeout_attempts, at.timed_out_served_attempts,
  at.timed_out_server_ok_attempts, at.unbudgeted_served_attempts, at.served_budgeted_attempts,
  at.timeout_killed_attempts, at.first_attempts, at.retry_attempts, at.ok_retry_attempts,
  at.max_attempt, at.max_outer_attempt, at.budgeted_attempts, at.deadline_ms_total,
  at.numbered_attempts, at.caused_retries, at.write_attempts, at.declared_writes,
  at.served_attempts, at.hidden_attempts, at.inferred_attempts, at.hedged_attempts,
  at.per_try_timeout_retries, at.overlapping_retries, at.overlapping_write_retries,
  at.rerun_writes, at.duplicate_rejections, at.retry_after_violations,
  at.backoff_retries, at.backoff_ms_total, at.unknown_results, at.unknown_resolved,
  at.unknown_result_ms_total, at.unknown_results_over_limit,
  at.instance_retries, at.other_instance_retries,
  at.unsafe_retries, at.timeout_retries_on_writes, at.immediate_retries,
  at.non_retryable_retries, at.retries_after_deadline, at.unstable_key_retries,
  at.idempotency_hits, at.key_writes, at.keyed_writes,
  k.orphan_pairs, k.orphan_work_ms, k.deadline_inversions
FROM keyed k
JOIN at ON at.edge = k.edge
