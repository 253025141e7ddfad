-- partial_entries: entry requests per (service, operation). Mergeable by SUM.
--
-- Inputs: entries.
-- Output: service, operation, requests
SELECT service, operation, COUNT(*) AS requests
FROM entries
GROUP BY service, operation
