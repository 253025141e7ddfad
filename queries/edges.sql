-- edges: per (caller, callee, operation) figures over a window, from the merged partials:
--   raw_success_rate        final ok / logical calls
--   effective_success_rate  first-attempt ok / logical calls
--   attempt_success_rate    ok attempts / attempts
--   retry_contribution      final ok after a retry / final ok
--   retry_success_rate      ok retry attempts / retry attempts
--   retried_failed_share    retried logical calls (more than one attempt) whose last attempt
--                           failed / retried logical calls (retried_calls)
--   retry_ratio             retry attempts / first attempts
--   hedge_ratio             hedged attempts / first attempts: the load hedging adds (a
--                           hedging delay at the callee's P95 hedges about 5% of calls)
--   edge_amplification      attempts / logical calls
--   timeout_rate            attempts ending in `deadline` / attempts
--   timeout_ms              the configured timeout: the most common exact attempt budget when
--                           it covers at least half of the budgeted attempts; otherwise
--                           (budgets that shrink hop by hop) their median, log-bucketed (<= 2%)
--   callee_p999_ms          the P99.9 of the operation the edge's timeout guards: of the
--                           callee's SERVER spans under the edge's attempts (p_edge_latency),
--                           else of the callee operation's layer durations
--                           (layer_operations), else of the callee layer's (layers); 2%
--   callee_latency_source   which of the three: `edge`, `operation`, `layer`
--   timeout_below_tail      timeout_ms < callee_p999_ms; for `edge`, exactly: fewer than
--                           ceil(0.999 N) of the edge's N SERVER span durations are at or
--                           below the timeout (p_tail), when the timeout is one of the
--                           candidate values counted over every such duration of the window;
--                           otherwise against the 2% P99.9
--   recommended_timeout_ms  callee_p999_ms x advice.timeout_factor
--   timed_out_server_ok_share  of the attempts ending in `deadline` whose callee sent a SERVER
--                           span, the share whose SERVER span ended ok (however long after):
--                           timeouts that threw away work the callee finished
--   attempts_without_deadline  of the attempts whose callee sent a SERVER span, the share with
--                           no deadline on either side: calls that can wait forever
--   timeout_too_long        timeout_ms above 10 x recommended_timeout_ms
--   timeout_kill_share      of the attempts with a budget whose callee sent a SERVER span, the
--                           share whose SERVER span ran longer than the budget: the calls,
--                           slow but answered, that the timeout cuts off
--   timeout_without_margin  the timeout is not below the tail but below
--                           recommended_timeout_ms: a slightly slower day starts cutting calls
--   orphan_work_seconds, unsafe_retries, timeout_retries_on_writes, immediate_retries,
--   non_retryable_retries (retries after a `client_error`: the same request meets it again),
--   retries_after_deadline (retries started with the caller's budget already spent),
--   unstable_key_retries (retries whose idempotency key is not their first attempt's: in
--   unsafe_retries too), idempotency_hits (attempts the callee answered from its idempotency
--   store),
--   deadline_inversions, max_attempt, max_outer_attempt: sums (max) of the partials.
--   clock_skew_ms           how far the callee's clock reads ahead of the caller's (clock_skew)
--   hidden_attempts, inferred_attempts, hedged_attempts: attempts found without a number
--                           of their own (see attempts): sums of the partials
--   per_try_timeout_retries retries sent while an earlier attempt of their call still ran,
--                           read as sent after a per-try timeout (not hedges): a sum
--   overlapping_retries     retries (not hedges) that reached the callee while it still worked
--                           on the attempt before (its SERVER span had not ended): a sum
--   overlapping_write_retries  those of writes without a stable idempotency key: a sum
--   rerun_writes            write calls made for a retry of an upstream call that repeat a
--                           write made for an earlier attempt of it without its key: a sum
--   duplicate_rejections    retries of writes answered as a duplicate (HTTP 409, gRPC
--                           ALREADY_EXISTS, an error.type naming one): a sum
--   backoff                 how the edge's retries wait (p_backoff: the gap from the end of
--                           the attempt before to the retry's start, hedges aside): null
--                           below retries.backoff_min_calls retried calls; `none` when no
--                           retry number waits min_backoff_ms on average; `exponential`
--                           when backoff_growth >= 1.5, `exponential_jitter` when its
--                           backoff_jitter is also >= 0.2; else `constant`
--   backoff_median_ms       the median gap (2% buckets)
--   backoff_growth          each retry number's mean gap / the number before's (where that
--                           one waited), weighted by retries; null with one retry number
--   backoff_jitter          the coefficient of variation of the gaps at the retry number
--                           with the most retries among those that waited
--   backoff_per_call_ms     all gaps / retried calls: the wait a retried call spent
--   synchronised_retries    the share of the edge's retries (hedges aside) sent in a 100 ms
--                           slot in which retries of many calls reached its callee (p_sync:
--                           at least retries.synchronised_min_calls calls, and 3 times the
--                           callee's mean per slot from its first slot with retries to its
--                           last): retries on one schedule, the storm re-igniting; null
--                           without retries
--   unknown_results         keyed writes the caller gave up on (deadline, cancelled): a sum
--   unknown_result_seconds  the mean time until a later span with the key answered, over
--                           those answered (null without)
--   unknown_results_over_limit  those answered after more than idempotency.unknown_after,
--                           or not at all: a sum
--   retry_after_violations  retries started before the previous answer's Retry-After or
--                           gRPC pushback elapsed, or after a pushback saying not to: a sum
--   retries_to_other_instance  retries that reached another instance than the attempt
--                           before / retries where both instances are known
--   callee_median_ms, out_of_budget_retries: retries that started with less of the caller's
--                           budget left than the callee's median on the edge (retry_budgets)
-- Ratios with an empty denominator are null.
--
-- Inputs: p_edges, p_timeouts, p_timeout_values, p_tail, p_edge_latency, p_backoff, p_sync,
--   layer_operations,
--   layers, clock_skew, retry_budgets, params.
-- Output: caller, callee, operation, logical_calls, attempts, retry_attempts,
--   raw_success_rate, effective_success_rate, attempt_success_rate, retry_contribution,
--   retry_success_rate, retried_calls, retried_failed_share, retry_ratio, hedge_ratio,
--   timed_out_server_ok_share, edge_amplification, timeout_rate, max_attempt, max_outer_attempt,
--   timeout_ms,
--   callee_p999_ms, callee_latency_source, timeout_below_tail, recommended_timeout_ms, timeout_kill_share,
--   timeout_without_margin, attempts_without_deadline, timeout_too_long, orphan_pairs,
--   orphan_work_seconds, unsafe_retries, timeout_retries_on_writes, immediate_retries,
--   non_retryable_retries, retries_after_deadline, callee_median_ms, out_of_budget_retries,
--   unstable_key_retries, idempotency_hits,
--   deadline_inversions, clock_skew_ms, hidden_attempts, inferred_attempts, hedged_attempts,
--   per_try_timeout_retries, overlapping_retries, overlapping_write_retries, rerun_writes,
--   duplicate_rejections, retry_after_violations, retries_to_other_instance, backoff,
--   backoff_median_ms, backoff_growth, backoff_jitter, backoff_per_call_ms,
--   synchronised_retries, unknown_results, unknown_result_seconds, unknown_results_over_limit
WITH e AS (
  SELECT caller, callee, operation,
    SUM(logical_calls) AS logical_calls, SUM(final_ok) AS final_ok, SUM(first_ok) AS first_ok,
    SUM(final_ok_retried) AS final_ok_retried, SUM(attempts) AS attempts,
    SUM(retried_calls) AS retried_calls, SUM(retried_failed_calls) AS retried_failed_calls,
    SUM(ok_attempts) AS ok_attempts, SUM(timeout_attempts) AS timeout_attempts,
    SUM(timed_out_served_attempts) AS timed_out_served_attempts,
    SUM(timed_out_server_ok_attempts) AS timed_out_server_ok_attempts,
    SUM(served_budgeted_attempts) AS served_budgeted_attempts,
    SUM(unbudgeted_served_attempts) AS unbudgeted_served_attempts,
    SUM(served_attempts) AS served_attempts,
    SUM(timeout_killed_attempts) AS timeout_killed_attempts,
    SUM(first_attempts) AS first_attempts,
    SUM(retry_attempts) AS retry_attempts, SUM(ok_retry_attempts) AS ok_retry_attempts,
    MAX(max_attempt) AS max_attempt, MAX(max_outer_attempt) AS max_outer_attempt,
    SUM(unsafe_retries) AS unsafe_retries,
    SUM(timeout_retries_on_writes) AS timeout_retries_on_writes,
    SUM(immediate_retries) AS immediate_retries, SUM(orphan_pairs) AS orphan_pairs,
    SUM(non_retryable_retries) AS non_retryable_retries,
    SUM(retries_after_deadline) AS retries_after_deadline,
    SUM(unstable_key_retries) AS unstable_key_retries, SUM(idempotency_hits) AS idempotency_hits,
    SUM(orphan_work_ms) AS orphan_work_ms, SUM(deadline_inversions) AS deadline_inversions,
    SUM(hidden_attempts) AS hidden_attempts, SUM(inferred_attempts) AS inferred_attempts,
    SUM(hedged_attempts) AS hedged_attempts,
    SUM(per_try_timeout_retries) AS per_try_timeout_retries,
    SUM(overlapping_retries) AS overlapping_retries,
    SUM(overlapping_write_retries) AS overlapping_write_retries,
    SUM(rerun_writes) AS rerun_writes,
    SUM(duplicate_rejections) AS duplicate_rejections,
    SUM(retry_after_violations) AS retry_after_violations,
    SUM(unknown_results) AS unknown_results, SUM(unknown_resolved) AS unknown_resolved,
    SUM(unknown_result_ms_total) AS unknown_result_ms_total,
    SUM(unknown_results_over_limit) AS unknown_results_over_limit,
    SUM(instance_retries) AS instance_retries,
    SUM(other_instance_retries) AS other_instance_retries
  FROM p_edges
  GROUP BY caller, callee, operation
),
medians AS (
  SELECT caller, callee, operation, SUM(n) AS total,
    sg_bucket_quantile(bucket, n, 0.5) AS median_ms
  FROM p_timeouts GROUP BY caller, callee, operation
),
-- The most frequent value (the smallest of equals), as an ordered aggregate: a window's
-- sort over every edge's values took a fifth of this query at 160,000 edges.
modes AS (
  SELECT caller, callee, operation,
    first_value(deadline_ms ORDER BY n DESC, deadline_ms) AS mode_ms, MAX(n) AS mode_n
  FROM (
    SELECT caller, callee, operation, deadline_ms, SUM(n) AS n
    FROM p_timeout_values GROUP BY caller, callee, operation, deadline_ms
  ) summed
  GROUP BY caller, callee, operation
),
tail AS (
  SELECT caller, callee, operation, deadline_ms, SUM(at_or_below) AS at_or_below, SUM(n) AS n
  FROM p_tail GROUP BY caller, callee, operation, deadline_ms
),
-- Backoff: per retry number, the gaps' weight, mean and coefficient of variation.
backoff_numbers AS (
  SELECT caller, callee, operation, attempt, SUM(n) AS n, SUM(gap_sum) / SUM(n) AS mean_ms,
    SQRT(GREATEST(SUM(gap_squares) / SUM(n) - POWER(SUM(gap_sum) / SUM(n), 2), 0.0))
      / NULLIF(SUM(gap_sum) / SUM(n), 0.0) AS cv
  FROM p_backoff GROUP BY caller, callee, operation, attempt
),
-- Each retry number's mean gap against the number before's (where that one waited at
-- least min_backoff_ms), averaged weighted by the later number's retries.
backoff_growth AS (
  SELECT b.caller, b.callee, b.operation, SUM(b.n * b.mean_ms / a.mean_ms) / SUM(b.n) AS growth
  FROM params p
  CROSS JOIN backoff_numbers b
  JOIN backoff_numbers a ON a.caller = b.caller AND a.callee = b.callee
    AND a.operation = b.operation AND a.attempt = b.attempt - 1
  WHERE a.mean_ms >= p.min_backoff_ms
  GROUP BY b.caller, b.callee, b.operation
),
-- The spread at one retry number: the one with the most retries among those that waited
-- (the lowest of equals), as an ordered aggregate like `modes`.
backoff_jitter AS (
  SELECT b.caller, b.callee, b.operation, first_value(b.cv ORDER BY b.n DESC, b.attempt) AS jitter
  FROM params p CROSS JOIN backoff_numbers b
  WHERE b.mean_ms >= p.min_backoff_ms
  GROUP BY b.caller, b.callee, b.operation
),
-- Growth and jitter to 3 decimals, the wait per call to the microsecond: sums of floats
-- merged in another order (live intervals, offline chunks) differ in their last bits.
backoff AS (
  SELECT w.caller, w.callee, w.operation, w.median_ms, w.total_ms, w.max_mean_ms,
    ROUND(g.growth, 3) AS growth, ROUND(j.jitter, 3) AS jitter
  FROM (
    SELECT f.caller, f.callee, f.operation, f.median_ms, f.total_ms, m.max_mean_ms
    FROM (
      SELECT caller, callee, operation, sg_bucket_quantile(bucket, n, 0.5) AS median_ms,
        SUM(gap_sum) AS total_ms
      FROM p_backoff GROUP BY caller, callee, operation
    ) f
    JOIN (
      SELECT caller, callee, operation, MAX(mean_ms) AS max_mean_ms
      FROM backoff_numbers GROUP BY caller, callee, operation
    ) m ON m.caller = f.caller AND m.callee = f.callee AND m.operation = f.operation
  ) w
  LEFT JOIN backoff_growth g ON g.caller = w.caller AND g.callee = w.callee
    AND g.operation = w.operation
  LEFT JOIN backoff_jitter j ON j.caller = w.caller AND j.callee = w.callee
    AND j.operation = w.operation
),
-- Synchronised retries: a callee's slots, its line (the calls a slot must hold), and per
-- edge the retries sent in slots at or over it.
sync_slots AS (
  SELECT callee, slot, SUM(n) AS calls FROM p_sync GROUP BY callee, slot
),
sync_lines AS (
  SELECT s.callee,
    GREATEST(MAX(p.synchronised_min_calls), 3.0 * SUM(s.calls) / (MAX(s.slot) - MIN(s.slot) + 1))
      AS line
  FROM params p CROSS JOIN sync_slots s
  GROUP BY s.callee
),
synchronised AS (
  SELECT r.caller, r.callee, r.operation, SUM(r.retries) AS retries,
    SUM(CASE WHEN t.calls >= l.line THEN r.retries ELSE 0.0 END) AS synchronised
  FROM p_sync r
  JOIN sync_slots t ON t.callee = r.callee AND t.slot = r.slot
  JOIN sync_lines l ON l.callee = r.callee
  GROUP BY r.caller, r.callee, r.operation
),
edge_latency AS (
  SELECT caller, callee, operation, SUM(n) AS total,
    sg_bucket_quantile(bucket, n, 0.999) AS p999_ms
  FROM p_edge_latency GROUP BY caller, callee, operation
),

-- The lookups keyed by the whole edge, gathered by one aggregate over their union (each
-- holds one row per edge: MAX picks its value) instead of a hash join each (a fifth of this
-- query at 160,000 edges); then those keyed otherwise, joined to the edges' keys alone
-- (joined to the wide sums, each copied every column of every edge again). The timeout:
-- the mode where it covers half of the budgeted attempts, else the median.
lookups AS (
  SELECT caller, callee, operation,
    CASE WHEN md_total IS NULL THEN NULL WHEN mode_n * 2 >= md_total THEN mode_ms
         ELSE md_median_ms END AS timeout_ms,
    el_p999_ms, el_total, callee_median_ms, out_of_budget_retries, bo_median_ms,
    bo_max_mean_ms, bo_growth, bo_jitter, bo_total_ms, sy_synchronised, sy_retries
  FROM (
    SELECT caller, callee, operation,
      MAX(md_median_ms) AS md_median_ms, MAX(md_total) AS md_total, MAX(mode_ms) AS mode_ms,
      MAX(mode_n) AS mode_n, MAX(el_p999_ms) AS el_p999_ms, MAX(el_total) AS el_total,
      MAX(callee_median_ms) AS callee_median_ms, MAX(out_of_budget_retries) AS out_of_budget_retries,
      MAX(bo_median_ms) AS bo_median_ms, MAX(bo_max_mean_ms) AS bo_max_mean_ms,
      MAX(bo_growth) AS bo_growth, MAX(bo_jitter) AS bo_jitter, MAX(bo_total_ms) AS bo_total_ms,
      MAX(sy_synchronised) AS sy_synchronised, MAX(sy_retries) AS sy_retries
    FROM (
      SELECT caller, callee, operation, CAST(median_ms AS DOUBLE) AS md_median_ms,
        CAST(total AS DOUBLE) AS md_total, CAST(NULL AS DOUBLE) AS mode_ms,
        CAST(NULL AS DOUBLE) AS mode_n, CAST(NULL AS DOUBLE) AS el_p999_ms,
        CAST(NULL AS DOUBLE) AS el_total, CAST(NULL AS DOUBLE) AS callee_median_ms,
        CAST(NULL AS DOUBLE) AS out_of_budget_retries, CAST(NULL AS DOUBLE) AS bo_median_ms,
        CAST(NULL AS DOUBLE) AS bo_max_mean_ms, CAST(NULL AS DOUBLE) AS bo_growth,
        CAST(NULL AS DOUBLE) AS bo_jitter, CAST(NULL AS DOUBLE) AS bo_total_ms,
        CAST(NULL AS DOUBLE) AS sy_synchronised, CAST(NULL AS DOUBLE) AS sy_retries
      FROM medians
      UNION ALL
      SELECT caller, callee, operation, NULL, NULL, mode_ms, mode_n, NULL, NULL, NULL, NULL,
        NULL, NULL, NULL, NULL, NULL, NULL, NULL
      FROM modes
      UNION ALL
      SELECT caller, callee, operation, NULL, NULL, NULL, NULL, p999_ms, total, NULL, NULL,
        NULL, NULL, NULL, NULL, NULL, NULL, NULL
      FROM edge_latency
      UNION ALL
      SELECT caller, callee, operation, NULL, NULL, NULL, NULL, NULL, NULL, callee_median_ms,
        out_of_budget_retries, NULL, NULL, NULL, NULL, NULL, NULL, NULL
      FROM retry_budgets
      UNION ALL
      SELECT caller, callee, operation, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        median_ms, max_mean_ms, growth, jitter, total_ms, NULL, NULL
      FROM backoff
      UNION ALL
      SELECT caller, callee, operation, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL, NULL, NULL, NULL, synchronised, retries
      FROM synchronised
    ) u
    GROUP BY caller, callee, operation
  ) gathered
),
side AS (
SELECT e.caller, e.callee, e.operation, x.timeout_ms, x.el_p999_ms,
  x.el_total, op.p999_ms AS op_p999_ms, l.p999_ms AS l_p999_ms, tl.n AS tl_n,
  tl.at_or_below AS tl_at_or_below, k.clock_skew_ms, x.callee_median_ms,
  x.out_of_budget_retries, x.bo_median_ms, x.bo_max_mean_ms,
  x.bo_growth, x.bo_jitter, x.bo_total_ms,
  x.sy_synchronised, x.sy_retries
FROM (SELECT caller, callee, operation FROM e) e
LEFT JOIN lookups x ON x.caller = e.caller AND x.callee = e.callee AND x.operation = e.operation
LEFT JOIN layer_operations op ON op.service = e.callee AND op.operation = e.operation
LEFT JOIN layers l ON l.service = e.callee
LEFT JOIN tail tl ON tl.caller = e.caller AND tl.callee = e.callee
  AND tl.operation = e.operation AND tl.deadline_ms = x.timeout_ms
LEFT JOIN clock_skew k ON k.caller = e.caller AND k.callee = e.callee
),
figures AS (
SELECT e.caller, e.callee, e.operation, CAST(ROUND(e.logical_calls) AS BIGINT) AS logical_calls,
  CAST(ROUND(e.attempts) AS BIGINT) AS attempts,
  CAST(ROUND(e.retry_attempts) AS BIGINT) AS retry_attempts,
  CAST(e.final_ok AS DOUBLE) / NULLIF(e.logical_calls, 0) AS raw_success_rate,
  CAST(e.first_ok AS DOUBLE) / NULLIF(e.logical_calls, 0) AS effective_success_rate,
  CAST(e.ok_attempts AS DOUBLE) / NULLIF(e.attempts, 0) AS attempt_success_rate,
  CAST(e.final_ok_retried AS DOUBLE) / NULLIF(e.final_ok, 0) AS retry_contribution,
  CAST(e.ok_retry_attempts AS DOUBLE) / NULLIF(e.retry_attempts, 0) AS retry_success_rate,
  CAST(ROUND(e.retried_calls) AS BIGINT) AS retried_calls,
  CAST(e.retried_failed_calls AS DOUBLE) / NULLIF(e.retried_calls, 0) AS retried_failed_share,
  CAST(e.retry_attempts AS DOUBLE) / NULLIF(e.first_attempts, 0) AS retry_ratio,
  CAST(e.hedged_attempts AS DOUBLE) / NULLIF(e.first_attempts, 0) AS hedge_ratio,
  CAST(e.attempts AS DOUBLE) / NULLIF(e.logical_calls, 0) AS edge_amplification,
  CAST(e.timeout_attempts AS DOUBLE) / NULLIF(e.attempts, 0) AS timeout_rate,
  CAST(e.timed_out_server_ok_attempts AS DOUBLE) / NULLIF(e.timed_out_served_attempts, 0)
    AS timed_out_server_ok_share,
  e.max_attempt, e.max_outer_attempt,
  s.timeout_ms,
  COALESCE(s.el_p999_ms, s.op_p999_ms, s.l_p999_ms) AS callee_p999_ms,
  CASE WHEN s.el_p999_ms IS NOT NULL THEN 'edge' WHEN s.op_p999_ms IS NOT NULL THEN 'operation'
       WHEN s.l_p999_ms IS NOT NULL THEN 'layer' END AS callee_latency_source,
  CASE WHEN s.timeout_ms IS NULL OR COALESCE(s.el_p999_ms, s.op_p999_ms, s.l_p999_ms) IS NULL THEN NULL
       WHEN s.el_p999_ms IS NOT NULL AND ABS(s.tl_n - s.el_total) <= 1e-9 * s.el_total
         THEN s.tl_at_or_below < CEIL(0.999 * s.el_total)
       ELSE s.timeout_ms < COALESCE(s.el_p999_ms, s.op_p999_ms, s.l_p999_ms) END AS timeout_below_tail,
  COALESCE(s.el_p999_ms, s.op_p999_ms, s.l_p999_ms) * p.timeout_factor AS recommended_timeout_ms,
  CAST(e.timeout_killed_attempts AS DOUBLE) / NULLIF(e.served_budgeted_attempts, 0)
    AS timeout_kill_share,
  CAST(e.unbudgeted_served_attempts AS DOUBLE) / NULLIF(e.served_attempts, 0)
    AS attempts_without_deadline,
  CAST(ROUND(e.orphan_pairs) AS BIGINT) AS orphan_pairs, e.orphan_work_ms / 1e3 AS orphan_work_seconds,
  CAST(ROUND(e.unsafe_retries) AS BIGINT) AS unsafe_retries,
  CAST(ROUND(e.timeout_retries_on_writes) AS BIGINT) AS timeout_retries_on_writes,
  CAST(ROUND(e.immediate_retries) AS BIGINT) AS immediate_retries,
  CAST(ROUND(e.non_retryable_retries) AS BIGINT) AS non_retryable_retries,
  CAST(ROUND(e.retries_after_deadline) AS BIGINT) AS retries_after_deadline,
  s.callee_median_ms,
  CAST(ROUND(COALESCE(s.out_of_budget_retries, 0.0)) AS BIGINT) AS out_of_budget_retries,
  CAST(ROUND(e.unstable_key_retries) AS BIGINT) AS unstable_key_retries,
  CAST(ROUND(e.idempotency_hits) AS BIGINT) AS idempotency_hits,
  CAST(ROUND(e.deadline_inversions) AS BIGINT) AS deadline_inversions,
  s.clock_skew_ms,
  CAST(ROUND(e.hidden_attempts) AS BIGINT) AS hidden_attempts,
  CAST(ROUND(e.inferred_attempts) AS BIGINT) AS inferred_attempts,
  CAST(ROUND(e.hedged_attempts) AS BIGINT) AS hedged_attempts,
  CAST(ROUND(e.per_try_timeout_retries) AS BIGINT) AS per_try_timeout_retries,
  CAST(ROUND(e.overlapping_retries) AS BIGINT) AS overlapping_retries,
  CAST(ROUND(e.overlapping_write_retries) AS BIGINT) AS overlapping_write_retries,
  CAST(ROUND(e.rerun_writes) AS BIGINT) AS rerun_writes,
  CAST(ROUND(e.duplicate_rejections) AS BIGINT) AS duplicate_rejections,
  CAST(ROUND(e.retry_after_violations) AS BIGINT) AS retry_after_violations,
  CAST(e.other_instance_retries AS DOUBLE) / NULLIF(e.instance_retries, 0)
    AS retries_to_other_instance,
  CASE WHEN s.bo_median_ms IS NULL OR e.retried_calls < p.backoff_min_calls THEN NULL
       WHEN s.bo_max_mean_ms < p.min_backoff_ms THEN 'none'
       WHEN s.bo_growth >= 1.5 AND s.bo_jitter >= 0.2 THEN 'exponential_jitter'
       WHEN s.bo_growth >= 1.5 THEN 'exponential'
       ELSE 'constant' END AS backoff,
  s.bo_median_ms AS backoff_median_ms,
  s.bo_growth AS backoff_growth,
  s.bo_jitter AS backoff_jitter,
  ROUND(s.bo_total_ms / NULLIF(e.retried_calls, 0), 3) AS backoff_per_call_ms,
  ROUND(s.sy_synchronised / NULLIF(s.sy_retries, 0.0), 4) AS synchronised_retries,
  CAST(ROUND(e.unknown_results) AS BIGINT) AS unknown_results,
  ROUND(e.unknown_result_ms_total / NULLIF(e.unknown_resolved, 0) / 1e3, 6)
    AS unknown_result_seconds,
  CAST(ROUND(e.unknown_results_over_limit) AS BIGINT) AS unknown_results_over_limit
-- The lookups (narrow) are the join's build side, the wide sums stream through it: built
-- from the sums, it copied every column of every edge into its table first (a fifth of
-- this query at 160,000 edges).
FROM params p
CROSS JOIN side s
JOIN e ON e.caller = s.caller AND e.callee = s.callee AND e.operation = s.operation
)
SELECT figures.*,
  NOT timeout_below_tail AND timeout_ms < recommended_timeout_ms AS timeout_without_margin,
  timeout_ms > 10 * recommended_timeout_ms AS timeout_too_long
FROM figures
ORDER BY caller, callee, operation
