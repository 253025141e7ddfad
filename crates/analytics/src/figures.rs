//! The figure catalogue: each figure declared once, and everything that shows it (the
//! exported counters, docs/metrics.md) derived from or held to its entry.
//!
//! Its first part is the per-edge counts: columns of `partial_edges` (queries/
//! partial_edges.sql defines each) that every interval adds to a counter labelled caller,
//! callee and operation. Adding one is its SQL, one entry below, a fixture and its goldens:
//! [`crate::counts::EdgeCounts`] reads the column, export names and exports the counter,
//! and a test holds docs/metrics.md to the list.
//!
//! Its second part ([`columns`]) is the report's tables as `analyze` prints them: each
//! header beside the figure it shows.

pub mod columns;

/// The unit of a count's column; counters are exported in base units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A number of events.
    Count,
    /// Milliseconds, exported as seconds.
    Milliseconds,
}

impl Unit {
    /// What a column value is multiplied by for its counter.
    pub fn to_base(self) -> f64 {
        match self {
            Unit::Count => 1.0,
            Unit::Milliseconds => 1e-3,
        }
    }
}

/// One per-edge count: a column of `partial_edges`, summed into a counter.
#[derive(Debug)]
pub struct EdgeCount {
    /// Its column in `partial_edges`.
    pub column: &'static str,
    /// The counter's name without prefix and `_total`: export names it
    /// `stormglass_<counter>_total`.
    pub counter: &'static str,
    pub unit: Unit,
    /// The counter's help text.
    pub help: &'static str,
}

/// Every per-edge count, in the order export lists them.
pub static EDGE_COUNTS: &[EdgeCount] = &[
    EdgeCount {
        column: "unsafe_retries",
        counter: "unsafe_retries",
        unit: Unit::Count,
        help: "Retries of non-idempotent operations without an idempotency key.",
    },
    EdgeCount {
        column: "timeout_retries_on_writes",
        counter: "timeout_retries_on_writes",
        unit: Unit::Count,
        help: "Retries caused by a deadline on non-idempotent operations (double-write risk).",
    },
    EdgeCount {
        column: "immediate_retries",
        counter: "immediate_retries",
        unit: Unit::Count,
        help: "Retries started sooner than advice.min_backoff_ms after the previous attempt.",
    },
    EdgeCount {
        column: "budgeted_attempts",
        counter: "budgeted_attempts",
        unit: Unit::Count,
        help: "Attempts that carry a budget (a deadline): the attempts stormglass_timeout_seconds is the median of.",
    },
    EdgeCount {
        column: "deadline_ms_total",
        counter: "attempt_deadline_seconds",
        unit: Unit::Milliseconds,
        help: "Sum of the budgets of budgeted attempts: divided by stormglass_budgeted_attempts_total it is the edge's mean timeout.",
    },
    EdgeCount {
        column: "retried_calls",
        counter: "retried_calls",
        unit: Unit::Count,
        help: "Logical calls with more than one attempt.",
    },
    EdgeCount {
        column: "retried_failed_calls",
        counter: "retried_failed_calls",
        unit: Unit::Count,
        help: "Logical calls with more than one attempt whose last attempt failed: divided by stormglass_retried_calls_total, the share of retried calls the retries did not save.",
    },
    EdgeCount {
        column: "timed_out_served_attempts",
        counter: "timed_out_served_attempts",
        unit: Unit::Count,
        help: "Attempts ending in deadline whose callee sent a SERVER span.",
    },
    EdgeCount {
        column: "timed_out_server_ok_attempts",
        counter: "timed_out_server_ok_attempts",
        unit: Unit::Count,
        help: "Attempts ending in deadline whose callee's SERVER span ended ok, however long after: divided by stormglass_timed_out_served_attempts_total, the share of timeouts that threw finished work away.",
    },
    EdgeCount {
        column: "non_retryable_retries",
        counter: "non_retryable_retries",
        unit: Unit::Count,
        help: "Retries after an attempt that ended client_error (a 4xx but 408 and 429, a gRPC status the same request meets again, a non-zero err_code): they cannot succeed.",
    },
    EdgeCount {
        column: "retries_after_deadline",
        counter: "retries_after_deadline",
        unit: Unit::Count,
        help: "Retries started with the caller's budget already spent: they cannot be answered in time.",
    },
    EdgeCount {
        column: "unstable_key_retries",
        counter: "unstable_key_retries",
        unit: Unit::Count,
        help: "Retries whose idempotency key differs from their first attempt's (or only one carries a key): the callee cannot tell they repeat it. Counted in stormglass_unsafe_retries_total too.",
    },
    EdgeCount {
        column: "idempotency_hits",
        counter: "idempotency_hits",
        unit: Unit::Count,
        help: "Attempts whose callee's SERVER span answered from its idempotency store (idempotency.hit=true or idempotency.state=replayed): repeats the key made safe.",
    },
    EdgeCount {
        column: "served_attempts",
        counter: "served_attempts",
        unit: Unit::Count,
        help: "Attempts whose callee sent a SERVER span.",
    },
    EdgeCount {
        column: "unbudgeted_served_attempts",
        counter: "unbudgeted_served_attempts",
        unit: Unit::Count,
        help: "Attempts whose callee sent a SERVER span, with no deadline on either side: divided by stormglass_served_attempts_total, the share of calls that can wait forever.",
    },
    EdgeCount {
        column: "served_budgeted_attempts",
        counter: "served_budgeted_attempts",
        unit: Unit::Count,
        help: "Attempts that carry a budget and whose callee sent a SERVER span: the attempts the timeout kill share is a share of.",
    },
    EdgeCount {
        column: "timeout_killed_attempts",
        counter: "timeout_killed_attempts",
        unit: Unit::Count,
        help: "Attempts whose callee's SERVER span ran longer than the attempt's budget: calls, slow but answered, the timeout cut off.",
    },
    EdgeCount {
        column: "hidden_attempts",
        counter: "hidden_attempts",
        unit: Unit::Count,
        help: "Attempts read from SERVER spans that carry no attempt number: re-sends below the caller's CLIENT span (client library, proxy), calls from uninstrumented callers.",
    },
    EdgeCount {
        column: "inferred_attempts",
        counter: "inferred_attempts",
        unit: Unit::Count,
        help: "Attempts joined to their call as an application loop's retries (unnumbered sibling CLIENT spans after a retryable failure).",
    },
    EdgeCount {
        column: "hedged_attempts",
        counter: "hedged_attempts",
        unit: Unit::Count,
        help: "Hedged attempts: started before an earlier attempt of the call had ended (counted as attempts, not as retries).",
    },
    EdgeCount {
        column: "per_try_timeout_retries",
        counter: "per_try_timeout_retries",
        unit: Unit::Count,
        help: "Retries sent while an earlier attempt of their call still ran, read as sent after a per-try timeout (a proxy's or mesh's retry; the others overlapping are hedges).",
    },
    EdgeCount {
        column: "overlapping_retries",
        counter: "overlapping_retries",
        unit: Unit::Count,
        help: "Retries (hedges aside) that reached the callee while its SERVER span for the attempt before had not ended: the callee still worked on the call when it came again.",
    },
    EdgeCount {
        column: "overlapping_write_retries",
        counter: "overlapping_write_retries",
        unit: Unit::Count,
        help: "Overlapping retries of non-idempotent calls without a stable idempotency key: the write may run twice at once.",
    },
    EdgeCount {
        column: "rerun_writes",
        counter: "rerun_writes",
        unit: Unit::Count,
        help: "Write calls made for a retry of an upstream call that repeat a write made for an earlier attempt of it, without that write's idempotency key: the write ran again below a retry.",
    },
    EdgeCount {
        column: "duplicate_rejections",
        counter: "duplicate_rejections",
        unit: Unit::Count,
        help: "Retries of non-idempotent calls answered as a duplicate (HTTP 409, gRPC ALREADY_EXISTS, an error.type naming one): an earlier attempt had done the write and a unique index caught the repeat.",
    },
    EdgeCount {
        column: "retry_after_violations",
        counter: "retry_after_violations",
        unit: Unit::Count,
        help: "Retries started before the wait the previous answer asked for elapsed (HTTP Retry-After, gRPC grpc-retry-pushback-ms), or after a pushback that said not to retry.",
    },
    EdgeCount {
        column: "unknown_results",
        counter: "unknown_results",
        unit: Unit::Count,
        help: "Keyed writes the caller gave up on (deadline, cancelled): whether they applied is unknown until a later span with the key answers.",
    },
    EdgeCount {
        column: "unknown_resolved",
        counter: "unknown_results_answered",
        unit: Unit::Count,
        help: "Those a later span with the same key answered (ok, or a duplicate).",
    },
    EdgeCount {
        column: "unknown_result_ms_total",
        counter: "unknown_result_seconds",
        unit: Unit::Milliseconds,
        help: "Sum of the times from a given-up keyed write's end to the later answer with its key: divided by stormglass_unknown_results_answered_total, how long a result stays unknown.",
    },
    EdgeCount {
        column: "unknown_results_over_limit",
        counter: "unknown_results_over_limit",
        unit: Unit::Count,
        help: "Given-up keyed writes answered after more than idempotency.unknown_after, or not at all in their trace.",
    },
    EdgeCount {
        column: "key_writes",
        counter: "key_writes",
        unit: Unit::Count,
        help: "Writes (by method, or flagged idempotent=false) an idempotency key should protect.",
    },
    EdgeCount {
        column: "keyed_writes",
        counter: "keyed_writes",
        unit: Unit::Count,
        help: "Those writes that carried an idempotency key: with stormglass_key_writes_total, the share of writes sent without one.",
    },
    EdgeCount {
        column: "backoff_retries",
        counter: "backed_off_retries",
        unit: Unit::Count,
        help: "Retries (hedges aside) after an attempt that ended: those whose wait stormglass_retry_backoff_seconds_total sums.",
    },
    EdgeCount {
        column: "backoff_ms_total",
        counter: "retry_backoff_seconds",
        unit: Unit::Milliseconds,
        help: "Sum of the waits between an attempt's end and its retry's start (hedges aside, 0 for a retry sent before the attempt ended): divided by stormglass_backed_off_retries_total it is the edge's mean backoff.",
    },
    EdgeCount {
        column: "instance_retries",
        counter: "instance_retries",
        unit: Unit::Count,
        help: "Retries whose SERVER span's instance and the previous attempt's are both known (service.instance.id, else host.name).",
    },
    EdgeCount {
        column: "other_instance_retries",
        counter: "other_instance_retries",
        unit: Unit::Count,
        help: "Retries that reached another instance than the attempt before: divided by stormglass_instance_retries_total, the share of retries that moved.",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Columns and counters are unique, and each column is named in `partial_edges`.
    #[test]
    fn edge_counts_are_unique_columns_of_partial_edges() {
        let sql = crate::queries::PARTIALS
            .iter()
            .find(|q| q.name == "partial_edges")
            .map(|q| q.sql)
            .unwrap_or_default();
        let mut columns: Vec<&str> = EDGE_COUNTS.iter().map(|c| c.column).collect();
        let mut counters: Vec<&str> = EDGE_COUNTS.iter().map(|c| c.counter).collect();
        for c in &columns {
            assert!(sql.contains(c), "partial_edges lacks {c}");
        }
        columns.sort_unstable();
        columns.dedup();
        counters.sort_unstable();
        counters.dedup();
        assert_eq!(columns.len(), EDGE_COUNTS.len());
        assert_eq!(counters.len(), EDGE_COUNTS.len());
    }
}
