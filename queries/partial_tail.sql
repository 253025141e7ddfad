-- partial_tail: for each edge and candidate timeout, the (weighted) count of the durations
-- of the callee's SERVER spans under the edge's attempts (as partial_edge_latency counts
-- them) at or below the candidate, and the count of all of them (n), so the report
-- compares an edge's configured timeout with the P99.9 of the operation it guards exactly:
-- timeout < P99.9 (nearest rank) iff fewer than ceil(0.999 * N) durations are at or below
-- it. Candidates: the edge's own most common deadline values in this chunk (up to 16,
-- timeout_values): a configured timeout is on every attempt of the edge, so every chunk
-- with the edge's durations counts it. The report uses a candidate only when its n covers
-- every such duration of the window (otherwise it compares with the 2% P99.9). Mergeable
-- by SUM.
--
-- Inputs: attempts, edge_names, timeout_values.
-- Output: caller, callee, operation, deadline_ms, at_or_below, n
WITH durations AS (
  SELECT edge, (server_end_ns - server_start_ns) / 1e6 AS ms, weight
  FROM attempts
  WHERE server_end_ns IS NOT NULL AND NOT COALESCE(server_pending, false)
),
-- Named candidates joined to this chunk's edges once, so the counting joins on `edge`.
candidates AS (
  SELECT e.edge, c.deadline_ms
  FROM timeout_values c
  JOIN edge_names e ON e.caller = c.caller AND e.callee = c.callee AND e.operation = c.operation
),
counted AS (
  SELECT c.edge, c.deadline_ms,
    SUM(CASE WHEN d.ms <= c.deadline_ms THEN d.weight ELSE 0.0 END) AS at_or_below,
    SUM(d.weight) AS n
  FROM candidates c
  JOIN durations d ON d.edge = c.edge
  GROUP BY c.edge, c.deadline_ms
)
SELECT e.caller, e.callee, e.operation, c.deadline_ms, c.at_or_below, c.n
FROM counted c
JOIN edge_names e ON e.edge = c.edge
