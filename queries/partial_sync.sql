-- partial_sync: per edge and 100 ms slot (the retry's start on its trace's clock, in
-- tenths of a second), the retries (hedges aside) sent in it: the calls that retried (n,
-- each by its sampling weight) and their retries (retries). Summed over a callee's edges,
-- a slot's calls say when retries of many callers land together (synchronised_retries in
-- edges). A call lives in one trace, so the calls of a slot add up across chunks:
-- mergeable by SUM of n and retries.
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, slot, n, retries
WITH per_call AS (
  SELECT edge, start_ns / 100000000 AS slot, logical_call_id,
    MAX(weight) AS weight, SUM(weight) AS retries
  FROM attempts
  WHERE attempt >= 1 AND NOT hedged
  GROUP BY edge, start_ns / 100000000, logical_call_id
),
counted AS (
  SELECT edge, slot, SUM(weight) AS n, SUM(retries) AS retries
  FROM per_call
  GROUP BY edge, slot
)
SELECT e.caller, e.callee, e.operation, c.slot, c.n, c.retries
FROM counted c
JOIN edge_names e ON e.edge = c.edge
