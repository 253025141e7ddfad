-- partial_tail: for each callee service and candidate timeout, the (weighted) count of the
-- service's layer durations at or below the candidate, and the count of all of them (n),
-- so the report compares an edge's configured timeout with the callee's P99.9 exactly:
-- timeout < P99.9 (nearest rank) iff fewer than ceil(0.999 * N) durations are at or
-- below it. Candidates: the deadline values callers give the service most often (each
-- edge's 16 most common in this chunk, timeout_values) and, live,
-- those of the window so far (`window_timeouts`). The report uses a candidate only when
-- its n covers every duration of the window. Mergeable by SUM.
--
-- Inputs: layer_durations, timeout_values, window_timeouts.
-- Output: service, deadline_ms, at_or_below, n
WITH candidates AS (
  SELECT callee AS service, deadline_ms FROM timeout_values
  UNION
  SELECT service, deadline_ms FROM window_timeouts
)
SELECT c.service, c.deadline_ms,
  SUM(CASE WHEN d.ms <= c.deadline_ms THEN d.weight ELSE 0.0 END) AS at_or_below,
  SUM(d.weight) AS n
FROM candidates c
JOIN layer_durations d ON d.service = c.service
GROUP BY c.service, c.deadline_ms
