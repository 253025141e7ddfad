-- budget_edges: each (caller, callee) of the traffic with what `check-budget` compares,
-- operations merged: the most attempts per call, the timeout, the recommended timeout,
-- the callee's P99.9 and the shortest median backoff of its operations. Known callers
-- only: a budget table names both sides.
--
-- Inputs: edges (the report table of a query context).
-- Output: caller, callee, max_attempt, timeout_ms, recommended_timeout_ms, callee_p999_ms,
--   backoff_median_ms
SELECT caller, callee, MAX(max_attempt) AS max_attempt, MAX(timeout_ms) AS timeout_ms,
  MAX(recommended_timeout_ms) AS recommended_timeout_ms,
  MAX(callee_p999_ms) AS callee_p999_ms, MIN(backoff_median_ms) AS backoff_median_ms
FROM edges
WHERE caller <> 'unknown'
GROUP BY caller, callee
ORDER BY caller, callee
