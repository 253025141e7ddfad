-- partial_layers: per service (layer), the attempts it received and how many of them it
-- would have received with no retry anywhere upstream (baseline). Requests entering the
-- system at a layer (server entries) are received once and are baseline, unless they are
-- attempts (counted as such already). Mergeable by SUM;
-- amplification = received / baseline.
--
-- Inputs: attempts, entries.
-- Output: service, received, baseline
SELECT service, SUM(received) AS received, SUM(baseline) AS baseline
FROM (
  SELECT callee AS service, weight AS received, CASE WHEN baseline THEN weight ELSE 0.0 END AS baseline
  FROM attempts
  UNION ALL
  SELECT service, weight AS received, weight AS baseline
  FROM entries
  WHERE kind IN ('server', 'consumer') AND NOT is_attempt
) received
GROUP BY service
