-- partial_sequences: per calling service, the callees it called one after another while
-- serving one request (each call starting after the one before it ended; a callee called
-- again right after itself counted once), as a sequence of at least two, with how many
-- requests made it: calls whose worst cases must fit the service's budget together.
-- Mergeable by summing n per (caller, sequence).
--
-- Only parents calling two callees or more are ordered, in one ordered pass over them all
-- with each call's predecessor by LAG (a window per parent costs ~5 us a parent; most
-- parents make one call).
--
-- Inputs: logical_calls.
-- Output: caller, sequence (the callees in order, a list: any separator could be in a
--   service's name), n
WITH multi AS (
  SELECT trace_id, parent_span_id, caller
  FROM logical_calls
  WHERE caller <> 'unknown' AND parent_span_id IS NOT NULL
  GROUP BY trace_id, parent_span_id, caller
  HAVING MIN(callee) <> MAX(callee)
),
ordered AS (
  SELECT c.trace_id, c.parent_span_id, c.caller, c.callee, c.start_ns, c.end_ns,
    c.logical_call_id,
    LAG(c.trace_id) OVER w AS prev_trace, LAG(c.parent_span_id) OVER w AS prev_parent,
    LAG(c.caller) OVER w AS prev_caller, LAG(c.callee) OVER w AS prev_callee,
    LAG(c.end_ns) OVER w AS prev_end
  -- (multi on the left: the hash join's build side, usually small)
  FROM multi m
  JOIN logical_calls c ON c.trace_id = m.trace_id AND c.parent_span_id = m.parent_span_id
    AND c.caller = m.caller
  WINDOW w AS (ORDER BY c.trace_id, c.parent_span_id, c.caller, c.start_ns, c.end_ns,
    c.logical_call_id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
),
steps AS (
  SELECT trace_id, parent_span_id, caller, callee, start_ns, end_ns, logical_call_id,
    COALESCE(prev_trace = trace_id AND prev_parent = parent_span_id AND prev_caller = caller,
      FALSE) AS has_prev,
    prev_callee, prev_end
  FROM ordered
),
requests AS (
  SELECT caller,
    array_agg(callee ORDER BY start_ns, end_ns, logical_call_id)
      FILTER (WHERE NOT has_prev OR callee <> prev_callee) AS sequence,
    COUNT(*) FILTER (WHERE NOT has_prev OR callee <> prev_callee) AS steps,
    BOOL_AND(NOT has_prev OR start_ns >= prev_end) AS one_after_another
  FROM steps
  GROUP BY trace_id, parent_span_id, caller
)
SELECT caller, sequence, CAST(COUNT(*) AS DOUBLE) AS n
FROM requests
WHERE one_after_another AND steps >= 2
GROUP BY caller, sequence
