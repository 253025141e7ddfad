-- entry_operations: entry requests per (service, operation) over a window. Storm potential
-- is added by the report from p_links and the edges' max attempts (a graph walk).
--
-- Inputs: p_entries.
-- Output: service, operation, requests
SELECT service, operation, CAST(ROUND(SUM(requests)) AS BIGINT) AS requests
FROM p_entries
GROUP BY service, operation
ORDER BY service, operation
