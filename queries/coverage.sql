-- coverage: instrumentation coverage, per edge (level 'edge') and per calling service
-- (level 'service', callee and operation null): which share of the attempts carry what each
-- figure needs, so a user sees which figure is missing and why (README, "Instrumenting
-- your services").
--   attempt_number  attempts with an attempt number of their own (retry,
--                   http.request.resend_count, gRPC attempt spans) / attempts; without it
--                   every attempt reads as a first try and the retry figures stay at 0
--   cause           retries with a cause attribute / retries (null without retries);
--                   without it, a retry's cause is the previous attempt's outcome
--   deadline        attempts with a budget / attempts: timeouts, inversions
--   idempotency     writes (and attempts that say whether they are idempotent) with an
--                   idempotent flag or an idempotency key / those attempts (null without
--                   writes): unsafe retries
--   idempotency_key writes (by method, or flagged `idempotent=false`) carrying an
--                   idempotency key / those writes (null without writes): a flag alone
--                   counts as none; unstable keys, idempotency hits
--   server_spans    attempts whose callee sent a SERVER span / attempts: layer latency,
--                   orphan work, clock skew
--   from_server_spans  attempts read from SERVER spans without a number (re-sends below
--                   the CLIENT span, uninstrumented callers) / attempts
--   inferred        attempts inferred from sibling CLIENT spans (application loops) /
--                   attempts
-- (attempt_number, from_server_spans and inferred say how the attempts were found; the
-- rest are unnumbered single attempts, read as first tries.)
-- Shares of sampling-weighted counts. Unordered: the report sorts them.
--
-- Inputs: p_edges.
-- Output: level, service, callee, operation, attempts, attempt_number, cause, deadline,
--   idempotency, idempotency_key, server_spans, from_server_spans, inferred
WITH e AS (
  SELECT 'edge' AS level, caller AS service, callee, operation,
    SUM(attempts) AS attempts, SUM(numbered_attempts) AS numbered,
    SUM(retry_attempts) AS retries, SUM(caused_retries) AS caused,
    SUM(budgeted_attempts) AS budgeted, SUM(write_attempts) AS writes,
    SUM(declared_writes) AS declared, SUM(key_writes) AS key_writes,
    SUM(keyed_writes) AS keyed, SUM(served_attempts) AS served,
    SUM(hidden_attempts) AS hidden, SUM(inferred_attempts) AS inferred
  FROM p_edges GROUP BY caller, callee, operation
  UNION ALL
  SELECT 'service' AS level, caller AS service, CAST(NULL AS VARCHAR) AS callee,
    CAST(NULL AS VARCHAR) AS operation,
    SUM(attempts), SUM(numbered_attempts), SUM(retry_attempts), SUM(caused_retries),
    SUM(budgeted_attempts), SUM(write_attempts), SUM(declared_writes), SUM(key_writes),
    SUM(keyed_writes), SUM(served_attempts), SUM(hidden_attempts), SUM(inferred_attempts)
  FROM p_edges GROUP BY caller
)
SELECT level, service, callee, operation, CAST(ROUND(attempts) AS BIGINT) AS attempts,
  numbered / NULLIF(attempts, 0) AS attempt_number,
  caused / NULLIF(retries, 0) AS cause,
  budgeted / NULLIF(attempts, 0) AS deadline,
  declared / NULLIF(writes, 0) AS idempotency,
  keyed / NULLIF(key_writes, 0) AS idempotency_key,
  served / NULLIF(attempts, 0) AS server_spans,
  hidden / NULLIF(attempts, 0) AS from_server_spans,
  inferred / NULLIF(attempts, 0) AS inferred
FROM e
