-- partial_orphans: orphan pairs per edge and server outcome, the counts behind
-- stormglass_orphan_pairs_total and stormglass_orphan_work_seconds_total. Mergeable by SUM.
--
-- Inputs: orphans.
-- Output: caller, callee, operation, server_outcome, pairs, work_ms
SELECT caller, callee, operation, server_outcome, SUM(weight) AS pairs,
  SUM(COALESCE(work_after_cancel_ms, 0.0) * weight) AS work_ms
FROM orphans
GROUP BY caller, callee, operation, server_outcome
