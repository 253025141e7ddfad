-- layer_durations: one row per request a layer served, with its duration: SERVER span
-- durations, and for callees that send no SERVER spans (uninstrumented, e.g. a database:
-- none in this data nor, live, earlier in the window, `window_servers`) the
-- client-observed attempt durations. The one definition of "layer latency" that
-- partial_latency (the histograms, per service and per operation) counts. operation: the
-- SERVER span's, else the attempt's.
--
-- Inputs: spans, attempts, window_servers.
-- Output: service, operation, ms, weight
WITH instrumented AS (
  SELECT DISTINCT service_name AS service FROM spans WHERE kind = 'server'
  UNION
  SELECT service FROM window_servers
)
SELECT service_name AS service, operation, duration_ns / 1e6 AS ms, weight
FROM spans WHERE kind = 'server'
UNION ALL
SELECT a.callee AS service, a.operation, a.duration_ms AS ms, a.weight
-- An attempt with a SERVER span under it names that span's service or another SERVER
-- span's as its callee (see attempts), an instrumented service: only the others can name
-- an uninstrumented one, so only they are joined (joining every attempt by its callee's
-- name was a third of this query, `EXPLAIN ANALYZE`).
FROM (SELECT callee, operation, duration_ms, weight FROM attempts WHERE server_span_id IS NULL) a
LEFT JOIN instrumented i ON i.service = a.callee
WHERE i.service IS NULL
