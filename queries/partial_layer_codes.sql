-- partial_layer_codes: per layer (the callee of attempts), the attempts it received by the
-- response code kept raw (the callee's SERVER span's, else the attempt's own: an HTTP
-- status as its number, a gRPC status by its name; `none` without either, as when the
-- caller timed out) and the outcome class. Counts are sums of sampling weights. Mergeable
-- by SUM of n.
--
-- Inputs: attempts.
-- Output: service, status_code, outcome, n
SELECT callee AS service, COALESCE(response_code, 'none') AS status_code, outcome,
  SUM(weight) AS n
FROM attempts
GROUP BY callee, COALESCE(response_code, 'none'), outcome
