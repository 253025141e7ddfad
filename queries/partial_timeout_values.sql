-- partial_timeout_values: the most common exact attempt budgets (deadline_ms) per edge, up
-- to 16 per edge per partial (timeout_values), for the configured timeout: when one value
-- covers at least half of an edge's budgeted attempts it is reported exactly (a configured
-- timeout), not as a histogram bucket. Mergeable by SUM of n per value (a value outside an
-- interval's top 16 is rare by construction; the half-of-all test is made against the
-- exact total of partial_timeouts).
--
-- Inputs: timeout_values.
-- Output: caller, callee, operation, deadline_ms, n
SELECT caller, callee, operation, deadline_ms, n FROM timeout_values
