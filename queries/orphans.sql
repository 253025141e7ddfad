-- orphans: one row per orphan pair ("ctx_cancelled but pending"): a client attempt that
-- ended in `deadline` or `cancelled`, and its callee SERVER span (child of the attempt)
-- that either ended more than orphans.grace_ms after the attempt, or reports
-- ctx_cancelled together with a pending state, or was never received although the callee
-- is instrumented (it sent SERVER spans in this data, or earlier in the live window:
-- `window_servers`, empty offline).
--
-- Inputs: attempts, spans, window_servers, params.
-- work_after_cancel_ms: max(0, server end - client end), null when the server span is missing.
-- server_outcome: `pending` (missing, or reports pending), `ok`, or `failed`.
--
-- Output: trace_id, client_span_id, server_span_id, caller, callee, operation,
--   client_outcome, work_after_cancel_ms, server_outcome, weight (the client attempt's), edge
-- edge: the attempt's key of (caller, callee, operation) in `edge_names` (see attempts).
WITH instrumented AS (
  SELECT DISTINCT service_name AS service FROM spans WHERE kind = 'server'
  UNION
  SELECT service FROM window_servers
)
SELECT a.trace_id, a.span_id AS client_span_id, a.server_span_id, a.caller, a.callee,
  a.operation, a.outcome AS client_outcome,
  CASE WHEN a.server_span_id IS NULL THEN NULL
       ELSE GREATEST(0.0, (a.server_end_ns - a.end_ns) / 1e6) END AS work_after_cancel_ms,
  CASE WHEN a.server_span_id IS NULL OR a.server_pending THEN 'pending'
       WHEN a.server_outcome = 'ok' THEN 'ok'
       ELSE 'failed' END AS server_outcome,
  a.weight, a.edge
FROM params p
CROSS JOIN attempts a
LEFT JOIN instrumented i ON i.service = a.callee
WHERE a.outcome IN ('deadline', 'cancelled')
  AND ((a.server_span_id IS NOT NULL AND (a.server_end_ns - a.end_ns) / 1e6 > p.orphan_grace_ms)
    OR (a.server_span_id IS NOT NULL AND a.server_ctx_cancelled AND a.server_pending)
    OR (a.server_span_id IS NULL AND i.service IS NOT NULL))
