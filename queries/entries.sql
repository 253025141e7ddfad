-- entries: one row per entry request: a SERVER or CONSUMER span with no parent in its
-- trace, or a root span (no parent at all) of any kind. A SERVER span that is an attempt
-- (an uninstrumented caller's retry) enters once per logical call: only its first attempt
-- is an entry, and is_attempt says the layer counts it among its attempts already.
--
-- Inputs: lineage (the spans with depth: number of ancestors present).
-- Output: trace_id, span_id, service, operation, kind, start_ns, end_ns, duration_ms, outcome,
--   is_attempt, weight, row_id (the lineage's integer key of the span)
SELECT s.trace_id, s.span_id, s.service_name AS service, s.operation, s.kind,
  s.start_ns, s.end_ns, s.duration_ns / 1e6 AS duration_ms, s.outcome, s.is_attempt, s.weight,
  s.row_id
FROM lineage s
-- The selective condition last: DataFusion 55 evaluates `a AND b`, when `a` holds on at most
-- a fifth of the rows, by filtering every column of the batch down to those rows first
-- ("pre-selection"), which here copied a tenth of every span's columns twice (once per
-- AND) to spare a comparison.
WHERE (NOT s.is_attempt OR s.is_first_attempt)
  AND (s.kind IN ('server', 'consumer') OR s.parent_span_id IS NULL)
  AND s.depth = 0
