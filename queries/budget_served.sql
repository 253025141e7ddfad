-- budget_served: per declared (caller, callee), the weighted attempts whose callee served
-- them (its SERVER span ended) and those of them longer than the declared timeout: the
-- share of the edge's calls that timeout would kill. One hash join with the declared
-- table, whatever the number of declared edges.
--
-- Inputs: attempts, declared (caller, callee, timeout_ms: one row per declared pair, the
--   budget table's first entry for it).
-- Output: caller, callee, n, longer
SELECT a.caller, a.callee, SUM(a.weight) AS n,
  SUM(a.weight) FILTER (WHERE (a.server_end_ns - a.server_start_ns) / 1e6 > d.timeout_ms)
    AS longer
FROM attempts a
JOIN declared d ON a.caller = d.caller AND a.callee = d.callee
WHERE a.server_end_ns IS NOT NULL
GROUP BY a.caller, a.callee
