-- clock_skew: per (caller service, callee service) over a window, how far the callee's clock
-- reads ahead of the caller's (ms; negative: behind), estimated from the answered calls
-- between them: the smallest shift that puts every callee SERVER span inside its caller's
-- attempt, 0 when the clocks agree within clocks.tolerance_ms (sg_clock_offset_ms, defined
-- in crates/analytics/src/clock.rs, the rule the analysis corrects times with).
-- exceeds_threshold: |clock_skew_ms| > clocks.skew_threshold_ms (a clock_skew finding).
-- Unordered: read only by other queries.
--
-- Inputs: p_clock_skew, params.
-- Output: caller, callee, pairs, low_ms, high_ms, clock_skew_ms, exceeds_threshold
WITH merged AS (
  SELECT caller, callee, SUM(pairs) AS pairs, MAX(low_ms) AS low_ms, MIN(high_ms) AS high_ms
  FROM p_clock_skew GROUP BY caller, callee
)
SELECT m.caller, m.callee, m.pairs, m.low_ms, m.high_ms,
  0.0 - sg_clock_offset_ms(m.low_ms, m.high_ms, p.clock_tolerance_ms) AS clock_skew_ms,
  ABS(sg_clock_offset_ms(m.low_ms, m.high_ms, p.clock_tolerance_ms)) > p.clock_skew_threshold_ms
    AS exceeds_threshold
FROM params p CROSS JOIN merged m
