-- partial_entries: entry requests per (service, operation), and those that failed (the
-- entry span's outcome is not ok). Mergeable by SUM.
--
-- Inputs: entries.
-- Output: service, operation, requests, failed
SELECT service, operation, SUM(weight) AS requests,
  COALESCE(SUM(weight) FILTER (WHERE outcome <> 'ok'), 0.0) AS failed
FROM entries
GROUP BY service, operation
