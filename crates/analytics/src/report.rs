//! The report of docs/commands.md (the JSON report), built from a window's merged partials.
//!
//! The figures are read from the report tables ([`crate::queries::REPORT`]) into typed rows;
//! storm potential (a walk over the call graph, see [`storm_potential`]) is added here. The
//! alerts whose conditions hold are evaluated over the finished report by
//! [`crate::alerts::evaluate`] (alerts read reports; reports do not know about alerts).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use arrow::array::{Array, AsArray, RecordBatch};
use datafusion::prelude::SessionContext;
use serde::{Deserialize, Serialize};
// Maps keyed by edge names: the keyed hash instead of SipHash.
use stormglass_model::hash::{KeyedMap as Fast, KeyedSet as FastSet};

use crate::engine::{AnalysisError, Engine, Partials, Table, into_rows, rows, run, table};
use crate::table::plain;

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
}

/// Edges and layers a report lists by default (`?limit=`, `analyze --limit`).
pub const DEFAULT_LIMIT: usize = 200;

/// The order a limited report lists edges and layers in (the report's `listing.order`).
pub const IMPACT_ORDER: &str = "edges by failed plus retried attempts, then attempts; \
    layers by requests above their baseline (retries from upstream), then requests; most first";

/// Which part of a window's report a reader asks for: the worst `limit` edges and layers
/// (all with `None`), around one `service` (its calls in and out, its layer) or one `caller`
/// or `callee`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    pub limit: Option<usize>,
    pub service: Option<String>,
    pub caller: Option<String>,
    pub callee: Option<String>,
}

/// What a selected report lists: per list, how many the window holds under the filters and
/// how many are listed, and whether any was left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Listing {
    pub order: String,
    pub edges: u64,
    pub edges_listed: u64,
    pub layers: u64,
    pub layers_listed: u64,
    pub truncated: bool,
}

impl Listing {
    /// In `order`, `(selected, listed)` edges and layers; truncated when fewer are listed.
    pub fn of(order: &str, (edges, edges_listed): (usize, usize), layers: (usize, usize)) -> Self {
        Listing {
            order: order.to_owned(),
            edges: edges as u64,
            edges_listed: edges_listed as u64,
            layers: layers.0 as u64,
            layers_listed: layers.1 as u64,
            truncated: edges_listed < edges || layers.1 < layers.0,
        }
    }
}

impl Selection {
    fn names(&self, caller: &str, callee: &str) -> bool {
        self.service
            .as_ref()
            .is_none_or(|s| caller == s || callee == s)
            && self.caller.as_ref().is_none_or(|c| caller == c)
            && self.callee.as_ref().is_none_or(|c| callee == c)
    }

    fn filtered(&self) -> bool {
        self.service.is_some() || self.caller.is_some() || self.callee.is_some()
    }

    /// Keep the edges of `items` this selection selects (`names` gives an item's caller and
    /// callee), at most its limit of them, the worst first by `worse` (`Less` for the worse
    /// of two), each kept in its place: returns how many it selected before the limit.
    pub fn keep_edges<T>(
        &self,
        items: &mut Vec<T>,
        names: impl Fn(&T) -> (&str, &str),
        worse: impl Fn(&T, &T) -> std::cmp::Ordering,
    ) -> usize {
        items.retain(|item| {
            let (caller, callee) = names(item);
            self.names(caller, callee)
        });
        let selected = items.len();
        keep_worst(items, self.limit, worse);
        selected
    }

    /// The services of the edges of `items` this selection selects (and the selected
    /// service), for the layers listed beside them; `None` when nothing is filtered (every
    /// layer).
    pub fn services<T>(
        &self,
        items: &[T],
        names: impl Fn(&T) -> (&str, &str),
    ) -> Option<HashSet<String>> {
        self.filtered().then(|| {
            items
                .iter()
                .map(&names)
                .filter(|&(caller, callee)| self.names(caller, callee))
                .flat_map(|(caller, callee)| [caller, callee])
                .chain(self.service.as_deref())
                .map(str::to_owned)
                .collect()
        })
    }
}

/// Keep at most `limit` of `items`, the worst first by `worse`, each in its place.
pub fn keep_worst<T>(
    items: &mut Vec<T>,
    limit: Option<usize>,
    worse: impl Fn(&T, &T) -> std::cmp::Ordering,
) {
    let limit = limit.unwrap_or(usize::MAX);
    if items.len() <= limit {
        return;
    }
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| worse(&items[a], &items[b]).then(a.cmp(&b)));
    let mut kept = vec![false; items.len()];
    for &i in &order[..limit] {
        kept[i] = true;
    }
    let mut kept = kept.into_iter();
    items.retain(|_| kept.next().unwrap_or(false));
}

/// An edge's impact: its failed attempts plus its retries, then its attempts.
fn edge_impact(e: &EdgeFigures) -> (u64, u64) {
    let ok = e
        .attempt_success_rate
        .map_or(0, |r| (r * e.attempts as f64).round() as u64);
    (e.attempts.saturating_sub(ok) + e.retry_attempts, e.attempts)
}

impl Report {
    /// The part of this report `selection` asks for: edges (with their coverage), findings
    /// and orphans of the selected calls, the layers of the selected services, the worst
    /// first ([`IMPACT_ORDER`]) up to the limit, with `listing` saying what was left out.
    /// Window figures, entries, traces and alerts stay whole.
    pub fn select(&self, selection: &Selection) -> Report {
        let mut edges: Vec<&EdgeFigures> = self.edges.iter().collect();
        // Around a service, its own layer; around a caller or callee, the layers the
        // selected calls reach (all of them, before the limit).
        let services = selection.services(&edges, |e| (&e.caller, &e.callee));
        let edge_total = selection.keep_edges(
            &mut edges,
            |e| (&e.caller, &e.callee),
            |a, b| edge_impact(b).cmp(&edge_impact(a)),
        );
        let listed: HashSet<(&str, &str, &str)> = edges
            .iter()
            .map(|e| (e.caller.as_str(), e.callee.as_str(), e.operation.as_str()))
            .collect();
        let mut layers: Vec<&LayerFigures> = self
            .layers
            .iter()
            .filter(|l| services.as_ref().is_none_or(|s| s.contains(&l.service)))
            .collect();
        let layer_total = layers.len();
        let excess =
            |l: &LayerFigures| (l.requests.saturating_sub(l.baseline_attempts), l.requests);
        keep_worst(&mut layers, selection.limit, |a, b| {
            excess(b).cmp(&excess(a))
        });
        let keep = |caller: &str, callee: &str| selection.names(caller, callee);
        let listing = Listing::of(
            IMPACT_ORDER,
            (edge_total, edges.len()),
            (layer_total, layers.len()),
        );
        Report {
            window: self.window.clone(),
            edges: edges.into_iter().cloned().collect(),
            layers: layers.into_iter().cloned().collect(),
            entries: self.entries.clone(),
            traces: self.traces.clone(),
            orphans: self
                .orphans
                .iter()
                .filter(|o| keep(&o.caller, &o.callee))
                .cloned()
                .collect(),
            findings: self
                .findings
                .iter()
                .filter(|f| keep(&f.caller, &f.callee))
                .cloned()
                .collect(),
            finding_totals: self.finding_totals.clone(),
            coverage: Coverage {
                services: self.coverage.services.clone(),
                edges: self
                    .coverage
                    .edges
                    .iter()
                    .filter(|c| {
                        listed.contains(&(
                            c.caller.as_str(),
                            c.callee.as_str(),
                            c.operation.as_str(),
                        ))
                    })
                    .cloned()
                    .collect(),
            },
            alerts: self.alerts.clone(),
            listing: Some(listing),
            figures: self.figures,
        }
    }
}

impl Report {
    /// List at most `max_per_kind` findings of each kind, the highest counts first (ties in
    /// caller, callee, operation order), and count every kind's in `finding_totals`. Alerts
    /// are evaluated before, over every finding.
    pub fn bound_findings(&mut self, max_per_kind: usize) {
        let mut findings = std::mem::take(&mut self.findings);
        findings.sort_by(|a, b| {
            (
                a.kind.as_str(),
                std::cmp::Reverse(a.count),
                &a.caller,
                &a.callee,
                &a.operation,
            )
                .cmp(&(
                    b.kind.as_str(),
                    std::cmp::Reverse(b.count),
                    &b.caller,
                    &b.callee,
                    &b.operation,
                ))
        });
        let mut totals: Vec<FindingTotal> = Vec::new();
        for finding in findings {
            if totals.last().is_none_or(|t| t.kind != finding.kind) {
                totals.push(FindingTotal {
                    kind: finding.kind.clone(),
                    severity: finding.severity.clone(),
                    findings: 0,
                    listed: 0,
                    count: 0,
                });
            }
            let Some(total) = totals.last_mut() else {
                continue;
            };
            total.findings += 1;
            total.count += finding.count;
            if (total.listed as usize) < max_per_kind {
                total.listed += 1;
                self.findings.push(finding);
            }
        }
        self.finding_totals = totals;
    }
}

/// A merged window's report tables ([`crate::queries::REPORT`]) for [`Report::build`],
/// each run when first needed and held only while a later query or the build reads it: at
/// width they were ~700 MiB held at once, beside the rows made of them.
struct ReportTables {
    ctx: SessionContext,
}

impl ReportTables {
    /// Run the report query `name` and hold its table for the queries that read it.
    async fn hold(&self, name: &str) -> Result<(), AnalysisError> {
        let table = run(&self.ctx, Self::query(name)).await?;
        crate::engine::register_table(&self.ctx, name, table)
    }

    /// Report table `name`: the held one, no longer held, else run now.
    async fn take(&self, name: &str) -> Result<Table, AnalysisError> {
        if !self.ctx.table_exist(name).unwrap_or(false) {
            return run(&self.ctx, Self::query(name)).await;
        }
        let read = table(&self.ctx, name).await?;
        self.forget(name)?;
        Ok(read)
    }

    /// Stop holding `name` (a table no later query reads).
    fn forget(&self, name: &str) -> Result<(), AnalysisError> {
        self.ctx
            .deregister_table(name)
            .map(drop)
            .map_err(|e| AnalysisError::query(name, e))
    }

    fn query(name: &str) -> &'static crate::queries::Query {
        match crate::queries::REPORT.iter().find(|q| q.name == name) {
            Some(query) => query,
            None => unreachable!("{name} is a report query"),
        }
    }
}

/// Window bounds: given ones (live), else the analysed spans' range (offline).
#[derive(Clone, Copy, Debug, Default)]
pub struct WindowBounds {
    pub start_unix_ns: Option<i64>,
    pub end_unix_ns: Option<i64>,
}

impl Report {
    /// Merge `window` and build its report: every figure; `alerts` stays empty for
    /// [`crate::alerts::evaluate`] to fill.
    pub async fn build(
        engine: &Engine,
        window: &[Arc<Partials>],
        bounds: WindowBounds,
    ) -> Result<Report, AnalysisError> {
        let tables = ReportTables {
            ctx: engine.merge(window).await?,
        };
        // What later queries read first (`edges` reads the layers, clock skew and retry
        // budgets; `finding_counts` reads `edges`), then each table read into its rows
        // and dropped, the widest first.
        for name in [
            "layers",
            "layer_operations",
            "clock_skew",
            "retry_budgets",
            "edges",
            "finding_counts",
        ] {
            tables.hold(name).await?;
        }
        tables.forget("clock_skew")?;
        tables.forget("retry_budgets")?;
        let findings: Vec<Finding> = into_rows(tables.take("finding_counts").await?);
        let mut edges: Vec<EdgeFigures> = into_rows(tables.take("edges").await?);
        #[derive(Deserialize)]
        struct Cause {
            caller: String,
            callee: String,
            operation: String,
            cause: String,
            retries: u64,
        }
        let causes: Vec<Cause> = into_rows(tables.take("edge_causes").await?);
        #[derive(Deserialize)]
        struct Remaining {
            caller: String,
            callee: String,
            operation: String,
            remaining_budget_ms: Option<f64>,
        }
        let remaining: Vec<Remaining> = into_rows(tables.take("remaining_budgets").await?);
        let (causes, remaining) = {
            let index = EdgeIndex::new(&edges);
            let causes: Vec<(usize, Cause)> = causes
                .into_iter()
                .filter_map(|c| Some((index.get(&c.caller, &c.callee, &c.operation)?, c)))
                .collect();
            let remaining: Vec<(usize, Option<f64>)> = remaining
                .into_iter()
                .filter_map(|r| {
                    let i = index.get(&r.caller, &r.callee, &r.operation)?;
                    Some((i, r.remaining_budget_ms))
                })
                .collect();
            (causes, remaining)
        };
        for (i, cause) in causes {
            edges[i].retries_by_cause.insert(cause.cause, cause.retries);
        }
        for (i, ms) in remaining {
            edges[i].remaining_budget_ms = ms;
        }
        let mut layers: Vec<LayerFigures> = into_rows(tables.take("layers").await?);
        #[derive(Deserialize)]
        struct Operation {
            service: String,
            #[serde(flatten)]
            latency: OperationLatency,
        }
        let by_service: HashMap<String, usize> = layers
            .iter()
            .enumerate()
            .map(|(i, l)| (l.service.clone(), i))
            .collect();
        for row in into_rows::<Operation>(tables.take("layer_operations").await?) {
            if let Some(&i) = by_service.get(&row.service) {
                layers[i].operations.push(row.latency);
            }
        }
        for layer in &mut layers {
            layer.operations_total = layer.operations.len() as u64;
            if layer.operations.len() > MAX_LISTED_OPERATIONS {
                layer
                    .operations
                    .sort_by_key(|o| std::cmp::Reverse(o.requests));
                layer.operations.truncate(MAX_LISTED_OPERATIONS);
                layer
                    .operations
                    .sort_by(|a, b| a.operation.cmp(&b.operation));
            }
        }
        let mut entries: Vec<EntryFigures> = into_rows(tables.take("entry_operations").await?);
        let started = std::time::Instant::now();
        let links = plain_batches(&tables.take("p_links").await?);
        let potential = storm_potential(&Link::read(&links), &edges);
        drop(links);
        crate::table::timed("storm potential", started);
        for entry in &mut entries {
            entry.storm_potential = potential
                .get(&(entry.service.clone(), entry.operation.clone()))
                .copied()
                .unwrap_or(1.0);
        }
        let by_service: Vec<TraceCounts> = into_rows(tables.take("trace_counts").await?);
        let traces = Traces {
            entry_requests: by_service.iter().map(|t| t.entry_requests).sum(),
            multi_layer_retry_traces: by_service.iter().map(|t| t.multi_layer_retry_traces).sum(),
            broken: by_service.iter().map(|t| t.broken_traces).sum(),
            by_service,
        };
        let mut orphans: Vec<Orphan> = window
            .iter()
            .rev()
            .filter_map(|p| p.table("partial_orphan_list"))
            .flat_map(rows::<Orphan>)
            .take(MAX_LISTED_ORPHANS)
            .collect();
        orphans.sort_by(|a, b| a.trace_id.cmp(&b.trace_id));
        // The shares' fields spelled out, not `#[serde(flatten)]`: flattening buffers every
        // row into a map first, a tenth of the report at 178,000 edges.
        #[derive(Deserialize)]
        struct CoverageRow {
            level: String,
            service: String,
            callee: Option<String>,
            operation: Option<String>,
            attempts: u64,
            attempt_number: Option<f64>,
            cause: Option<f64>,
            deadline: Option<f64>,
            idempotency: Option<f64>,
            idempotency_key: Option<f64>,
            server_spans: Option<f64>,
            from_server_spans: Option<f64>,
            inferred: Option<f64>,
        }
        let covered = into_rows::<CoverageRow>(tables.take("coverage").await?);
        let mut coverage = Coverage {
            services: Vec::new(),
            edges: Vec::with_capacity(covered.len()),
        };
        for row in covered {
            let shares = CoverageShares {
                attempts: row.attempts,
                attempt_number: row.attempt_number,
                cause: row.cause,
                deadline: row.deadline,
                idempotency: row.idempotency,
                idempotency_key: row.idempotency_key,
                server_spans: row.server_spans,
                from_server_spans: row.from_server_spans,
                inferred: row.inferred,
            };
            match (row.level.as_str(), row.callee, row.operation) {
                ("edge", Some(callee), Some(operation)) => coverage.edges.push(EdgeCoverage {
                    caller: row.service,
                    callee,
                    operation,
                    shares,
                }),
                _ => coverage.services.push(ServiceCoverage {
                    service: row.service,
                    shares,
                }),
            }
        }
        // In the edges' order whatever order the query's partitions gave them.
        coverage.edges.sort_by(|a, b| {
            (&a.caller, &a.callee, &a.operation).cmp(&(&b.caller, &b.callee, &b.operation))
        });

        let mut report = Report {
            window: Report::window_of(window, bounds),
            edges,
            layers,
            entries,
            traces,
            orphans,
            findings,
            finding_totals: Vec::new(),
            coverage,
            alerts: Vec::new(),
            listing: None,
            figures: None,
        };
        report.bound_findings(usize::MAX);
        Ok(report)
    }
}

impl Report {
    /// The `window` of a report over `window`'s partials: `bounds` where given (live), else
    /// the analysed spans' range (offline).
    pub fn window_of(window: &[Arc<Partials>], bounds: WindowBounds) -> Window {
        let spans: usize = window.iter().map(|p| p.spans).sum();
        let traces: usize = window.iter().map(|p| p.traces).sum();
        let range =
            window
                .iter()
                .filter_map(|p| p.span_range)
                .fold(None, |acc, (s, e)| match acc {
                    None => Some((s, e)),
                    Some((a, b)) => Some((a.min(s), b.max(e))),
                });
        let start = bounds.start_unix_ns.or(range.map(|r| r.0));
        let end = bounds.end_unix_ns.or(range.map(|r| r.1));
        Window {
            start: start.map(rfc3339),
            end: end.map(rfc3339),
            seconds: start.zip(end).map(|(s, e)| (e - s).max(0) as f64 / 1e9),
            traces: traces as u64,
            spans: spans as u64,
        }
    }
}

/// The position of each edge (caller, callee, operation) in the report's `edges`, for the
/// figures a second query adds to them: one hash lookup per row, whatever the width.
struct EdgeIndex<'e> {
    positions: Fast<(&'e str, &'e str, &'e str), usize>,
}

impl<'e> EdgeIndex<'e> {
    fn new(edges: &[EdgeFigures]) -> EdgeIndex<'_> {
        let positions = edges
            .iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    (e.caller.as_str(), e.callee.as_str(), e.operation.as_str()),
                    i,
                )
            })
            .collect();
        EdgeIndex { positions }
    }

    fn get(&self, caller: &str, callee: &str, operation: &str) -> Option<usize> {
        self.positions.get(&(caller, callee, operation)).copied()
    }
}

fn rfc3339(unix_ns: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_nanos(u64::try_from(unix_ns).unwrap_or(0));
    humantime::format_rfc3339_millis(time).to_string()
}

/// One row of `p_links`: `edge` is called below `parent` (or directly by the entry),
/// borrowed from its batches: at width the links are ~250,000 rows of 8 names each.
#[derive(Clone, Copy, Debug)]
pub struct Link<'a> {
    entry_service: &'a str,
    entry_operation: &'a str,
    parent: Option<EdgeKey<'a>>,
    edge: EdgeKey<'a>,
}

impl<'a> Link<'a> {
    /// The rows of `p_links` batches whose strings are plain ([`plain_batches`]).
    pub fn read(batches: &'a [RecordBatch]) -> Vec<Link<'a>> {
        let mut links = Vec::with_capacity(batches.iter().map(RecordBatch::num_rows).sum());
        for batch in batches {
            let column = |name: &str| match batch.column_by_name(name) {
                Some(c) => c.as_string::<i32>(),
                None => unreachable!("p_links has {name}"),
            };
            let [
                service,
                operation,
                parent_caller,
                parent_callee,
                parent_operation,
            ] = [
                "entry_service",
                "entry_operation",
                "parent_caller",
                "parent_callee",
                "parent_operation",
            ]
            .map(column);
            let [caller, callee, edge_operation] = ["caller", "callee", "operation"].map(column);
            for row in 0..batch.num_rows() {
                let parent = [parent_caller, parent_callee, parent_operation]
                    .map(|c| c.is_valid(row).then(|| c.value(row)));
                links.push(Link {
                    entry_service: service.value(row),
                    entry_operation: operation.value(row),
                    parent: match parent {
                        [Some(a), Some(b), Some(c)] => Some((a, b, c)),
                        _ => None,
                    },
                    edge: (
                        caller.value(row),
                        callee.value(row),
                        edge_operation.value(row),
                    ),
                });
            }
        }
        links
    }
}

/// `table`'s batches with plain strings, for rows borrowed from them.
fn plain_batches(table: &Table) -> Vec<RecordBatch> {
    (table.batches.iter())
        .map(|b| plain(b).unwrap_or_else(|e| unreachable!("strings cast to plain strings: {e}")))
        .collect()
}

/// An edge by (caller, callee, operation), borrowed from the report's rows.
type EdgeKey<'a> = (&'a str, &'a str, &'a str);

/// Register `storm_potential` (service, operation, storm_potential: one row per entry
/// operation) in a session holding the report tables, so `stormglass query` reads the
/// figure the report gives. It is a walk over the call graph, done in Rust (see
/// [`storm_potential`]); this is its SQL face.
pub async fn register_storm_potential(
    ctx: &datafusion::prelude::SessionContext,
) -> Result<(), AnalysisError> {
    use arrow::array::{Float64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    let edges: Vec<EdgeFigures> = rows(&table(ctx, "edges").await?);
    let links = plain_batches(&table(ctx, "p_links").await?);
    let entries: Vec<EntryFigures> = rows(&table(ctx, "entry_operations").await?);
    let potential = storm_potential(&Link::read(&links), &edges);
    let value = |e: &EntryFigures| {
        potential
            .get(&(e.service.clone(), e.operation.clone()))
            .copied()
            .unwrap_or(1.0)
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("service", DataType::Utf8, false),
        Field::new("operation", DataType::Utf8, false),
        Field::new("storm_potential", DataType::Float64, false),
    ]));
    let columns: Vec<arrow::array::ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            entries.iter().map(|e| &e.service),
        )),
        Arc::new(StringArray::from_iter_values(
            entries.iter().map(|e| &e.operation),
        )),
        Arc::new(Float64Array::from_iter_values(entries.iter().map(value))),
    ];
    let failed = |source| AnalysisError::query("storm_potential", source);
    let batch = RecordBatch::try_new(schema, columns)
        .map_err(|e| AnalysisError::query("storm_potential", e))?;
    ctx.register_batch("storm_potential", batch)
        .map_err(failed)?;
    Ok(())
}

/// Storm potential per entry operation: over the call chains observed below it, the largest
/// product of (max attempt number observed on the edge + 1), an in-process retry loop around
/// an edge's calls multiplying by its own (max outer attempt + 1): 4 loop tries around an
/// HTTP client that tries 3 times is 12. For the usual call tree that
/// is the product along the deepest chain (27 for three layers retrying 3x each); where two
/// chains differ, the worse one is what a full outage would do, so it is the one reported.
/// A cycle in the call graph is cut where it closes. Entries without calls have 1.
pub fn storm_potential<'a>(
    links: &[Link<'a>],
    edges: &'a [EdgeFigures],
) -> HashMap<(String, String), f64> {
    // Each edge named once as an integer, its factor at that index: the walk then hashes
    // integers, not three names per step (at width, ~250,000 links).
    let mut ids: Fast<EdgeKey, u32> = Fast::default();
    let mut factor: Vec<f64> = Vec::with_capacity(edges.len());
    for e in edges {
        let tries = |n: Option<i64>| n.unwrap_or(0).max(0) as f64 + 1.0;
        let key = (e.caller.as_str(), e.callee.as_str(), e.operation.as_str());
        ids.entry(key).or_insert_with(|| {
            factor.push(tries(e.max_attempt) * tries(e.max_outer_attempt));
            (factor.len() - 1) as u32
        });
    }
    // Per entry (service, operation), its links as (parent, edge) ids.
    type Linked = Vec<(Option<u32>, u32)>;
    let mut by_entry: Fast<(&str, &str), Linked> = Fast::default();
    for link in links {
        // An edge of the links the report does not list counts as one try.
        let mut id = |key: EdgeKey<'a>| {
            *ids.entry(key).or_insert_with(|| {
                factor.push(1.0);
                (factor.len() - 1) as u32
            })
        };
        let pair = (link.parent.map(&mut id), id(link.edge));
        by_entry
            .entry((link.entry_service, link.entry_operation))
            .or_default()
            .push(pair);
    }
    by_entry
        .into_iter()
        .map(|((service, operation), links)| {
            // Each parent's child edges once, in the order first met (a set beside the
            // lists: a search of the list per link grew with the children of a parent).
            let mut children: Fast<Option<u32>, Vec<u32>> = Fast::default();
            let mut seen: FastSet<(Option<u32>, u32)> = FastSet::default();
            for &(parent, edge) in &links {
                if seen.insert((parent, edge)) {
                    children.entry(parent).or_default().push(edge);
                }
            }
            let mut memo = Fast::default();
            let mut on_path = FastSet::default();
            let best = children
                .get(&None)
                .map(|tops| {
                    tops.iter()
                        .map(|e| chain_product(*e, &children, &factor, &mut memo, &mut on_path))
                        .fold(1.0, f64::max)
                })
                .unwrap_or(1.0);
            ((service.to_owned(), operation.to_owned()), best)
        })
        .collect()
}

fn chain_product(
    edge: u32,
    children: &Fast<Option<u32>, Vec<u32>>,
    factor: &[f64],
    memo: &mut Fast<u32, f64>,
    on_path: &mut FastSet<u32>,
) -> f64 {
    if let Some(v) = memo.get(&edge) {
        return *v;
    }
    if !on_path.insert(edge) {
        return 1.0;
    }
    let below = children
        .get(&Some(edge))
        .map(|kids| {
            kids.iter()
                .map(|k| chain_product(*k, children, factor, memo, on_path))
                .fold(1.0, f64::max)
        })
        .unwrap_or(1.0);
    on_path.remove(&edge);
    let value = factor[edge as usize] * below;
    memo.insert(edge, value);
    value
}

#[cfg(test)]
mod tests {
    use super::{FINDING_KINDS, Selection, keep_worst};

    /// The worst are kept in their places, ties to the first; a selection filters by
    /// caller and callee before its limit and counts what it selected.
    #[test]
    fn the_worst_are_kept_in_place() {
        let mut items = vec![3, 9, 1, 9, 4, 7];
        keep_worst(&mut items, Some(3), |a, b| b.cmp(a));
        assert_eq!(items, [9, 9, 7]);
        let mut items = vec![3, 9, 1];
        keep_worst(&mut items, None, |a, b| b.cmp(a));
        assert_eq!(items, [3, 9, 1]);

        let mut edges = vec![("a", "b", 5), ("a", "c", 1), ("b", "c", 9), ("a", "d", 3)];
        let selection = Selection {
            limit: Some(2),
            caller: Some("a".into()),
            ..Selection::default()
        };
        let services = selection.services(&edges, |e| (e.0, e.1)).unwrap();
        assert_eq!(services.len(), 4, "{services:?}");
        let selected = selection.keep_edges(&mut edges, |e| (e.0, e.1), |x, y| y.2.cmp(&x.2));
        assert_eq!(selected, 3);
        assert_eq!(edges, [("a", "b", 5), ("a", "d", 3)]);
    }

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
