-- partial_retry_budgets: per edge, two log-bucketed histograms (sg_bucket, 2%) on the same
-- buckets, so the report can set the budget retries start with against the time the
-- callee needs on that edge (retry_budgets):
--   durations  the callee's duration of every attempt: its SERVER span's when the callee
--              sent one that ended, else the attempt's as the caller saw it;
--   retries    the remaining budget each retry (attempt >= 1, hedges aside) started with:
--              as partial_budgets computes it, from the nearest budgeted ancestor (the
--              attempt's own deadline, if any, is not its budget), clock-corrected, 0 when
--              already spent; retries without a budgeted ancestor have none.
-- example_trace_id: the smallest trace id among the bucket's retries (null without).
-- Counts are sums of sampling weights. Mergeable by SUM of durations and retries, MIN of
-- example_trace_id.
--
-- Inputs: attempts, edge_names.
-- Output: caller, callee, operation, bucket, durations, retries, example_trace_id
WITH measured AS (
  SELECT edge,
    sg_bucket(CASE WHEN server_end_ns IS NOT NULL AND NOT COALESCE(server_pending, false)
      THEN (server_end_ns - server_start_ns) / 1e6 ELSE duration_ms END) AS bucket,
    weight AS durations, 0.0 AS retries, CAST(NULL AS VARCHAR) AS trace_hex
  FROM attempts
  UNION ALL
  SELECT edge,
    sg_bucket(GREATEST(anchor_deadline_ms - (start_ns - anchor_start_ns) / 1e6, 0.0)),
    0.0, weight, encode(arrow_cast(trace_id, 'Binary'), 'hex')
  FROM attempts
  WHERE anchor_deadline_ms IS NOT NULL AND anchor_start_ns IS NOT NULL
    AND attempt >= 1 AND NOT hedged
),
counted AS (
  SELECT edge, bucket, SUM(durations) AS durations, SUM(retries) AS retries,
    MIN(trace_hex) AS example_trace_id
  FROM measured
  GROUP BY edge, bucket
)
SELECT e.caller, e.callee, e.operation, c.bucket, c.durations, c.retries, c.example_trace_id
FROM counted c
JOIN edge_names e ON e.edge = c.edge
