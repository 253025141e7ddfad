-- partial_entries: entry requests per (service, operation). Mergeable by SUM.
--
-- Inputs: entries.
-- Output: service, operation, requests
SELECT service, operation, SUM(weight) AS requests
FROM entries
GROUP BY service, operation
