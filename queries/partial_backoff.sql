-- partial_backoff: per edge, retry number and log bucket (sg_bucket, 2%), the gaps between
-- a retry's start and the end of the attempt before it (backoff_ms, floored at 0: an
-- overlapping retry waited none), for retries that are not hedges: their weight n, and
-- the weighted sum and sum of squares of the gaps (the mean and the spread at one retry
-- number, whatever the bucket). Counts are sums of sampling weights. Mergeable by SUM of
-- n, gap_sum, gap_squares.
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, attempt, bucket, n, gap_sum, gap_squares
WITH gaps AS (
  SELECT edge, attempt, weight, GREATEST(backoff_ms, 0.0) AS gap
  FROM attempts
  WHERE attempt >= 1 AND NOT hedged AND backoff_ms IS NOT NULL
),
counted AS (
  SELECT edge, attempt, sg_bucket(gap) AS bucket, SUM(weight) AS n,
    SUM(weight * gap) AS gap_sum, SUM(weight * gap * gap) AS gap_squares
  FROM gaps
  GROUP BY edge, attempt, sg_bucket(gap)
)
SELECT e.caller, e.callee, e.operation, c.attempt, c.bucket, c.n, c.gap_sum, c.gap_squares
FROM counted c
JOIN edge_names e ON e.edge = c.edge
