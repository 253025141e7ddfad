-- partial_clock_skew: per (caller service, callee service), the clock offsets (ms, added to
-- the callee's times) consistent with every answered call of the chunk: each call's
-- [client start - server start, client end - server end], intersected (see
-- crates/analytics/src/clock.rs). Mergeable: MAX of low_ms, MIN of high_ms, SUM of pairs.
--
-- Inputs: clock_pairs (computed with the lineage).
-- Output: caller, callee, low_ms, high_ms, pairs
SELECT caller, callee, MAX(low_ms) AS low_ms, MIN(high_ms) AS high_ms, COUNT(*) AS pairs
FROM clock_pairs
GROUP BY caller, callee
