//! The report of docs/commands.md (the JSON report), built from a window's merged partials.
//!
//! The figures are read from the report tables ([`crate::queries::REPORT`]) into typed rows;
//! storm potential (a walk over the call graph, see [`storm_potential`]) is added here. The
//! alerts whose conditions hold are evaluated over the finished report by
//! [`crate::alerts::evaluate`] (alerts read reports; reports do not know about alerts).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One alert whose condition holds (the report's `alerts`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub name: String,
    pub severity: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
    /// A summary instance's text (more series breached than `alerts.max_instances_per_rule`:
    /// how many, and the worst); absent on an ordinary instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// At most this many orphan pairs are listed (the most recent); all are counted.
pub const MAX_LISTED_ORPHANS: usize = 100;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// RFC 3339; null when nothing was analysed.
    pub start: Option<String>,
    pub end: Option<String>,
    /// Length in seconds (per-minute alert rates divide by it).
    pub seconds: Option<f64>,
    pub traces: u64,
    pub spans: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EdgeFigures {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    pub logical_calls: u64,
    pub attempts: u64,
    pub retry_attempts: u64,
    pub raw_success_rate: Option<f64>,
    pub effective_success_rate: Option<f64>,
    pub attempt_success_rate: Option<f64>,
    pub retry_contribution: Option<f64>,
    pub retry_success_rate: Option<f64>,
    /// Logical calls with more than one attempt.
    #[serde(default)]
    pub retried_calls: u64,
    /// Of the retried logical calls, the share whose last attempt failed: retries that did
    /// not save the call. Null without retried calls.
    #[serde(default)]
    pub retried_failed_share: Option<f64>,
    pub retry_ratio: Option<f64>,
    /// Hedged attempts / first attempts: the load hedging adds.
    #[serde(default)]
    pub hedge_ratio: Option<f64>,
    #[serde(default)]
    pub retries_by_cause: BTreeMap<String, u64>,
    pub edge_amplification: Option<f64>,
    /// Attempts ending in `deadline` / attempts.
    #[serde(default)]
    pub timeout_rate: Option<f64>,
    /// Of the attempts ending in `deadline` whose callee sent a SERVER span, the share
    /// whose SERVER span ended ok, however long after: work done and thrown away. Null
    /// without such attempts.
    #[serde(default)]
    pub timed_out_server_ok_share: Option<f64>,
    pub max_attempt: Option<i64>,
    /// The highest attempt number of an in-process retry loop around this edge's calls
    /// (an INTERNAL span carrying `retry` over CLIENT attempts); null when there is none.
    #[serde(default)]
    pub max_outer_attempt: Option<i64>,
    pub timeout_ms: Option<f64>,
    /// The P99.9 of the operation the timeout guards: see `callee_latency_source`.
    pub callee_p999_ms: Option<f64>,
    /// Whose durations `callee_p999_ms` is: `edge` (the callee's SERVER spans under this
    /// edge's attempts), `operation` (the callee operation's, from every caller), `layer`
    /// (the callee service's); null without any.
    #[serde(default)]
    pub callee_latency_source: Option<String>,
    pub timeout_below_tail: Option<bool>,
    pub recommended_timeout_ms: Option<f64>,
    /// Of the attempts with a budget whose callee sent a SERVER span, the share whose SERVER
    /// span ran longer than the budget: the calls, slow but answered, that the timeout cuts
    /// off. Null without such attempts.
    #[serde(default)]
    pub timeout_kill_share: Option<f64>,
    /// The timeout is not below the callee's P99.9 but below `recommended_timeout_ms`.
    #[serde(default)]
    pub timeout_without_margin: Option<bool>,
    /// The timeout is more than 10 x `recommended_timeout_ms`.
    #[serde(default)]
    pub timeout_too_long: Option<bool>,
    /// Of the attempts whose callee sent a SERVER span, the share with no deadline on either
    /// side (the attempt's, the SERVER span's): calls that can wait forever. Null without
    /// such attempts.
    #[serde(default)]
    pub attempts_without_deadline: Option<f64>,
    pub orphan_pairs: u64,
    pub orphan_work_seconds: f64,
    pub unsafe_retries: u64,
    pub timeout_retries_on_writes: u64,
    pub immediate_retries: u64,
    /// Retries after an attempt that ended `client_error`: the same request meets it again.
    #[serde(default)]
    pub non_retryable_retries: u64,
    /// Retries (hedges aside) started with the caller's budget already spent.
    #[serde(default)]
    pub retries_after_deadline: u64,
    /// The median of the callee's durations on this edge (ms, within 2%): its SERVER spans',
    /// else the attempts' as the caller saw them.
    #[serde(default)]
    pub callee_median_ms: Option<f64>,
    /// Retries that started with less of the caller's budget left than `callee_median_ms`
    /// (`retries_after_deadline` among them): retries that cannot fit.
    #[serde(default)]
    pub out_of_budget_retries: u64,
    /// Retries whose idempotency key is not their first attempt's (one of them carrying
    /// none included): the callee cannot tell they repeat it. In `unsafe_retries` too.
    #[serde(default)]
    pub unstable_key_retries: u64,
    /// Attempts whose callee's SERVER span says it answered from its idempotency store
    /// (`idempotency.hit=true`, `idempotency.state=replayed`).
    #[serde(default)]
    pub idempotency_hits: u64,
    pub deadline_inversions: u64,
    /// How far the callee's clock reads ahead of the caller's (ms), estimated from their
    /// answered calls; null when no call was answered.
    #[serde(default)]
    pub clock_skew_ms: Option<f64>,
    /// The caller's median remaining budget when the edge's attempts start (ms): the
    /// deadline of the nearest budgeted ancestor minus the time already spent; null when no
    /// attempt has a budgeted ancestor (`remaining_budgets.sql`).
    #[serde(default)]
    pub remaining_budget_ms: Option<f64>,
    /// Attempts read from SERVER spans that carry no number (re-sends below the CLIENT
    /// span, calls from uninstrumented callers).
    #[serde(default)]
    pub hidden_attempts: u64,
    /// Attempts started before an earlier attempt of their call had ended: in `attempts`,
    /// not in the retry figures.
    #[serde(default)]
    pub hedged_attempts: u64,
    /// Retries sent while an earlier attempt of their call still ran, read as sent after a
    /// per-try timeout (a proxy's or mesh's): with `hedged_attempts`, how the edge's
    /// overlapping re-sends were read.
    #[serde(default)]
    pub per_try_timeout_retries: u64,
    /// Retries (hedges aside) that reached the callee while it still worked on the attempt
    /// before: its SERVER span had not ended (the window where duplicates are made).
    #[serde(default)]
    pub overlapping_retries: u64,
    /// Those of writes without a stable idempotency key: `overlapping_retry` findings.
    #[serde(default)]
    pub overlapping_write_retries: u64,
    /// Write calls made for a retry of an upstream call that repeat a write made for an
    /// earlier attempt of it without its idempotency key: `rerun_write` findings.
    #[serde(default)]
    pub rerun_writes: u64,
    /// Retries of writes answered as a duplicate (HTTP 409, gRPC ALREADY_EXISTS, an
    /// `error.type` naming one): `duplicate_rejection` findings.
    #[serde(default)]
    pub duplicate_rejections: u64,
    /// Retries started before the wait the previous answer asked for (HTTP Retry-After,
    /// gRPC pushback) elapsed, or after a pushback saying not to: `retry_after_violation`
    /// findings.
    #[serde(default)]
    pub retry_after_violations: u64,
    /// Keyed writes the caller gave up on (deadline, cancelled): their result unknown.
    #[serde(default)]
    pub unknown_results: u64,
    /// The mean time until a later span with the key answered (ok, or a duplicate), over
    /// those answered.
    #[serde(default)]
    pub unknown_result_seconds: Option<f64>,
    /// Those answered after more than `idempotency.unknown_after`, or not at all.
    #[serde(default)]
    pub unknown_results_over_limit: u64,
    /// How the edge's retries wait: `none`, `constant`, `exponential` or
    /// `exponential_jitter`; null below `retries.backoff_min_calls` retried calls.
    #[serde(default)]
    pub backoff: Option<String>,
    /// The median gap between an attempt's end and its retry's start (ms).
    #[serde(default)]
    pub backoff_median_ms: Option<f64>,
    /// Each retry number's mean gap against the number before's.
    #[serde(default)]
    pub backoff_growth: Option<f64>,
    /// The coefficient of variation of the gaps at one retry number.
    #[serde(default)]
    pub backoff_jitter: Option<f64>,
    /// The wait a retried call spent in all, on average (ms).
    #[serde(default)]
    pub backoff_per_call_ms: Option<f64>,
    /// The share of the edge's retries sent in a 100 ms slot in which retries of many calls
    /// reached its callee (`retries.synchronised_min_calls`, and 3 times the callee's mean
    /// per slot): retries on one schedule; null without retries.
    #[serde(default)]
    pub synchronised_retries: Option<f64>,
    /// Attempts joined to their call as an application loop's retries.
    #[serde(default)]
    pub inferred_attempts: u64,
    /// The share of retries that reached another instance than the attempt before (where
    /// both are known); null without such retries.
    #[serde(default)]
    pub retries_to_other_instance: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerFigures {
    pub service: String,
    pub requests: u64,
    pub baseline_attempts: u64,
    pub amplification: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub tail_ratio: Option<f64>,
    /// Of the attempts this layer received (entry requests aside), those ending in
    /// `deadline`; null when it received none.
    #[serde(default)]
    pub timeout_rate: Option<f64>,
    /// Of the attempts this layer received (entry requests aside), those not `ok`; the
    /// counters keep their raw status codes (`stormglass_layer_responses_total`).
    #[serde(default)]
    pub error_rate: Option<f64>,
    /// The layer's latency per operation it served (`layer_operations.sql`): its
    /// [`MAX_LISTED_OPERATIONS`] busiest, by name.
    #[serde(default)]
    pub operations: Vec<OperationLatency>,
    /// How many operations the layer served (`operations` lists at most
    /// [`MAX_LISTED_OPERATIONS`]).
    #[serde(default)]
    pub operations_total: u64,
}

/// At most this many operations are listed per layer (the most requested); all are counted.
pub const MAX_LISTED_OPERATIONS: usize = 50;

/// One operation of a layer: its requests and latency quantiles (ms, within 2%).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationLatency {
    pub operation: String,
    pub requests: u64,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryFigures {
    pub service: String,
    pub operation: String,
    pub requests: u64,
    /// Failed entry requests (the entry span's outcome is not ok) / requests.
    #[serde(default)]
    pub error_rate: Option<f64>,
    /// P99 and P99.9 of the entry requests' durations (within 2%).
    #[serde(default)]
    pub p99_ms: Option<f64>,
    #[serde(default)]
    pub p999_ms: Option<f64>,
    /// The share of the entry requests within the entry SLO's latency target
    /// (`alerts.entry_slo.latency_ms`, within 2%).
    #[serde(default)]
    pub latency_slo_share: Option<f64>,
    #[serde(default)]
    pub storm_potential: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceCounts {
    pub service: String,
    pub entry_requests: u64,
    pub multi_layer_retry_traces: u64,
    /// Traces with a span whose parent never arrived (counted under their first such span).
    #[serde(default)]
    pub broken_traces: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Traces {
    pub entry_requests: u64,
    pub multi_layer_retry_traces: u64,
    /// Traces with a span whose parent never arrived.
    #[serde(default)]
    pub broken: u64,
    pub by_service: Vec<TraceCounts>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Orphan {
    pub trace_id: String,
    pub caller: String,
    pub callee: String,
    pub operation: String,
    pub work_after_cancel_ms: Option<f64>,
    pub server_outcome: String,
}

/// Every finding kind with its severity, as `finding_counts.sql` assigns them (a test
/// holds the two together): what `analyze --fail-on` accepts by name.
pub const FINDING_KINDS: &[(&str, &str)] = &[
    ("unsafe_retry", "critical"),
    ("overlapping_retry", "critical"),
    ("rerun_write", "critical"),
    ("deadline_inversion", "warning"),
    ("overcommit", "warning"),
    ("duplicate_rejection", "warning"),
    ("retry_after_violation", "warning"),
    ("timeout_retry_on_write", "warning"),
    ("non_retryable_retry", "warning"),
    ("out_of_budget_retry", "warning"),
    ("timeout_below_tail", "warning"),
    ("clock_skew", "warning"),
    ("not_propagated", "info"),
    ("immediate_retry", "info"),
    ("unbudgeted_call", "info"),
    ("write_without_key", "info"),
    ("multi_layer_retry", "info"),
    ("timeout_without_margin", "info"),
    ("timeout_too_long", "info"),
];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: String,
    pub severity: String,
    pub caller: String,
    pub callee: String,
    pub operation: String,
    pub count: u64,
    pub detail: Option<String>,
    pub example_trace_id: Option<String>,
}

/// How many findings of one kind the window holds, beside the ones the report lists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FindingTotal {
    pub kind: String,
    pub severity: String,
    /// Findings of this kind (one per caller, callee and operation).
    pub findings: u64,
    /// Of them, those listed in `findings` (the most impactful: highest `count` first).
    pub listed: u64,
    /// The sum of their counts.
    pub count: u64,
}

/// `report.*`: how much detail a report lists. Every figure still counts everything; the
/// lists a person reads stay readable however wide the fleet.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportConfig {
    /// Findings listed per kind (the highest counts); `finding_totals` counts them all.
    pub max_findings_per_kind: usize,
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            max_findings_per_kind: 100,
        }
    }
}

impl ReportConfig {
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        if self.max_findings_per_kind == 0 {
            return vec![(
                format!("{prefix}.max_findings_per_kind"),
                "must be at least 1 (e.g. 100)".into(),
            )];
        }
        Vec::new()
    }
}

/// Instrumentation coverage of one edge or one calling service (`coverage.sql`): the share
/// of attempts carrying what each figure needs; null where the denominator is empty.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoverageShares {
    pub attempts: u64,
    pub attempt_number: Option<f64>,
    pub cause: Option<f64>,
    pub deadline: Option<f64>,
    pub idempotency: Option<f64>,
    /// Of the writes (by method, or flagged `idempotent=false`), the share carrying an
    /// idempotency key: a flag alone counts as none.
    #[serde(default)]
    pub idempotency_key: Option<f64>,
    pub server_spans: Option<f64>,
    /// How attempts were found, besides their own numbers (`attempt_number`): read from
    /// SERVER spans without a number, and inferred from sibling CLIENT spans.
    #[serde(default)]
    pub from_server_spans: Option<f64>,
    #[serde(default)]
    pub inferred: Option<f64>,
}

impl CoverageShares {
    /// The shares by name, as the gauges and tables label them.
    pub fn named(&self) -> [(&'static str, Option<f64>); 8] {
        [
            ("attempt_number", self.attempt_number),
            ("cause", self.cause),
            ("deadline", self.deadline),
            ("idempotency", self.idempotency),
            ("idempotency_key", self.idempotency_key),
            ("server_spans", self.server_spans),
            ("from_server_spans", self.from_server_spans),
            ("inferred", self.inferred),
        ]
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceCoverage {
    pub service: String,
    #[serde(flatten)]
    pub shares: CoverageShares,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EdgeCoverage {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    #[serde(flatten)]
    pub shares: CoverageShares,
}

/// `coverage` of the report: per calling service, and per edge.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    pub services: Vec<ServiceCoverage>,
    pub edges: Vec<EdgeCoverage>,
}

/// The whole report; its JSON form is the contract of docs/commands.md.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub window: Window,
    pub edges: Vec<EdgeFigures>,
    pub layers: Vec<LayerFigures>,
    pub entries: Vec<EntryFigures>,
    pub traces: Traces,
    pub orphans: Vec<Orphan>,
    pub findings: Vec<Finding>,
    /// Per kind found, how many findings there are and how many `findings` lists
    /// ([`Report::bound_findings`]).
    #[serde(default)]
    pub finding_totals: Vec<FindingTotal>,
    /// Instrumentation coverage (absent from reports written before it existed).
    #[serde(default)]
    pub coverage: Coverage,
    pub alerts: Vec<Alert>,
    /// What a selection ([`Report::select`]) lists of the window; absent from a whole report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing: Option<Listing>,
    /// Which build of the live window's figures this is: two reports with the same number
    /// hold the same figures (an idle window reuses its last build), so observers can skip
    /// what they derived from them already. `None` offline.
    #[serde(skip)]
    pub figures: Option<u64>,
    /// Per calling service, the callees most of its requests called one after another
    /// (`partial_sequences.sql`): the calls whose timeouts the advice fits into its budget
    /// together. Not part of the report's JSON, nor of a selection ([`Report::select`]).
    #[serde(skip)]
    pub sequential_calls: BTreeMap<String, Vec<String>>,
}

impl Report {
    /// About the bytes this report holds: its rows per edge (figures and coverage) and per
    /// finding with their names, which are nearly all of it at width (~1.3 KiB an edge).
    pub fn held_bytes(&self) -> usize {
        let names = |a: &str, b: &str, c: &str| a.len() + b.len() + c.len();
        let edges: usize = (self.edges.iter())
            .map(|e| size_of::<EdgeFigures>() + names(&e.caller, &e.callee, &e.operation))
            .sum();
        let coverage: usize = (self.coverage.edges.iter())
            .map(|e| size_of::<EdgeCoverage>() + names(&e.caller, &e.callee, &e.operation))
            .sum();
        let findings: usize = (self.findings.iter())
            .map(|f| {
                size_of::<Finding>()
                    + names(&f.caller, &f.callee, &f.operation)
                    + f.detail.as_ref().map_or(0, String::len)
            })
            .sum();
        edges + coverage + findings
    }
}

mod build;
mod listing;
mod storm;

pub use build::WindowBounds;
pub use listing::{DEFAULT_LIMIT, IMPACT_ORDER, Listing, Selection, keep_worst};
pub use storm::{Link, register_storm_potential, storm_potential};

#[cfg(test)]
impl EdgeFigures {
    /// An edge with no traffic, every figure at its default, for a test to fill the figures
    /// it is about.
    pub(crate) fn named(caller: &str, callee: &str, operation: &str) -> EdgeFigures {
        serde_json::from_value(serde_json::json!({
            "caller": caller, "callee": callee, "operation": operation,
            "logical_calls": 0, "attempts": 0, "retry_attempts": 0, "orphan_pairs": 0,
            "orphan_work_seconds": 0.0, "unsafe_retries": 0, "timeout_retries_on_writes": 0,
            "immediate_retries": 0, "deadline_inversions": 0,
        }))
        .unwrap_or_else(|e| unreachable!("a minimal edge: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::FINDING_KINDS;

    fn sql(name: &str) -> &'static str {
        crate::queries::DERIVED
            .iter()
            .chain(crate::queries::REPORT)
            .find(|q| q.name == name)
            .map(|q| q.sql)
            .unwrap_or_default()
    }

    /// FINDING_KINDS lists every kind the queries emit, with the severity finding_counts
    /// gives it (`ELSE 'info'` for those it does not name).
    #[test]
    fn finding_kinds_match_the_queries() {
        let counts = sql("finding_counts");
        let emitted = |kind: &str| {
            [sql("findings"), counts]
                .iter()
                .any(|q| q.contains(&format!("SELECT '{kind}'")))
        };
        for (kind, severity) in FINDING_KINDS {
            assert!(emitted(kind), "{kind} is emitted by no query");
            let named = counts.contains(&format!("WHEN '{kind}' THEN '{severity}'"));
            assert!(named || *severity == "info", "{kind}: {severity}");
            assert!(
                !counts.contains(&format!("WHEN '{kind}' THEN")) || named,
                "{kind}"
            );
        }
        let selected = [sql("findings"), counts]
            .iter()
            .map(|q| q.matches("SELECT '").count())
            .sum::<usize>();
        // deadline_inversion is selected twice (its attempt and its gRPC call span shape).
        assert_eq!(selected, FINDING_KINDS.len() + 1);
    }
}
