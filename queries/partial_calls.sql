-- partial_calls: logical calls per edge by first and final outcome, each `ok` or `failed`
-- (any class but ok), the counts behind stormglass_logical_calls_total. Mergeable by SUM.
--
-- Inputs: logical_calls.
-- Output: caller, callee, operation, first_outcome, final_outcome, calls
SELECT caller, callee, operation,
  CASE WHEN first_outcome = 'ok' THEN 'ok' ELSE 'failed' END AS first_outcome,
  CASE WHEN final_outcome = 'ok' THEN 'ok' ELSE 'failed' END AS final_outcome,
  SUM(weight) AS calls
FROM logical_calls
GROUP BY caller, callee, operation,
  CASE WHEN first_outcome = 'ok' THEN 'ok' ELSE 'failed' END,
  CASE WHEN final_outcome = 'ok' THEN 'ok' ELSE 'failed' END
