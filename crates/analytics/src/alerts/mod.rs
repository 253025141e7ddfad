//! The alerts of docs/alerts.md, defined once for both engines.
//!
//! Each [`AlertDefinition`] carries what both engines need: the name, severity, `for:`
//! duration, texts, the PromQL expression Prometheus evaluates (over the exported metrics
//! and the [`RECORDING_RULES`]), and the condition the built-in evaluator checks on a
//! window's [`Report`]. `stormglass rules` renders the Prometheus side; [`evaluate`] is the
//! condition half of the built-in side (which series breach their threshold in this
//! window); `for:` applies only to an evaluator that watches successive windows, so the
//! offline report lists every condition that holds.
//!
//! Texts use `{label}` placeholders for the alert's labels, `{value}` for the value and
//! `{threshold}` for the configured threshold; each engine fills them in its own way (Go
//! templates for Prometheus, [`AlertDefinition::render`] here).
//!
//! Where the engines read different data, by design:
//! * Ratio alerts read counters in Prometheus (rates over 5 minutes, summed over every
//!   stormglass instance) and the window's exact counts in the evaluator (one instance).
//! * `StormglassRetryContributionHigh` in Prometheus counts calls whose first attempt failed
//!   and whose last succeeded (the labels of `stormglass_logical_calls_total`); the report
//!   counts successful calls with more than one attempt. They differ only for calls that
//!   succeeded first and were still re-sent (hedging).
//! * Tail ratio and timeout-below-tail read the layer histogram in Prometheus (quantiles of
//!   the buckets summed over instances, within the buckets' 25%) and the mean budget
//!   (`stormglass_attempt_deadline_seconds_total / stormglass_budgeted_attempts_total`: the
//!   configured timeout when an edge has one); the evaluator reads the window's 2% quantiles
//!   and the median budget.
//! * Storm potential reads the gauge with `max by`: a walk along call chains cannot be
//!   summed, and each instance sees the same retry policies, so the largest is the figure.
//! * Values are in base units, as in Prometheus: the timeout alert's value is seconds.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;

pub use crate::report::Alert;
use crate::report::Report;

/// `alerts.*` thresholds, defaults from docs/alerts.md.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertThresholds {
    pub amplification: f64,
    pub storm_potential: f64,
    pub retry_contribution: f64,
    pub retry_ratio: f64,
    pub retry_success_rate: f64,
    pub retries_per_minute: f64,
    pub tail_ratio: f64,
    pub orphan_work_seconds_per_minute: f64,
    /// Minimum traffic of a ratio alert: its denominator (the events the ratio is a share
    /// of) per minute. Below it, a ratio of a handful of events is noise and never fires.
    pub min_events_per_minute: f64,
    /// `StormglassLatencyDrift`: how far (a share) a layer's P99.9 may move from its
    /// baseline before timeouts and budgets need recomputing.
    pub latency_drift: f64,
    /// A JSON report (`stormglass analyze --format json` of a load test) whose layers' P99.9 are
    /// the baseline of `StormglassLatencyDrift`; without it, Prometheus compares with the
    /// same time a week earlier and the built-in evaluator does not check drift.
    pub baseline: Option<std::path::PathBuf>,
    /// The baseline's P99.9 per service, in milliseconds (read from `baseline`).
    #[serde(skip)]
    pub baseline_p999_ms: BTreeMap<String, f64>,
}

/// The layers' P99.9 (milliseconds, by service) of a JSON report: a drift baseline.
pub fn read_baseline(path: &std::path::Path) -> Result<BTreeMap<String, f64>, String> {
    #[derive(Deserialize)]
    struct Layer {
        service: String,
        p999_ms: Option<f64>,
    }
    #[derive(Deserialize)]
    struct Baseline {
        layers: Vec<Layer>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let report: Baseline = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: not a stormglass JSON report (analyze --format json): {e}",
            path.display()
        )
    })?;
    Ok(report
        .layers
        .into_iter()
        .filter_map(|l| Some((l.service, l.p999_ms.filter(|ms| *ms > 0.0)?)))
        .collect())
}

impl Default for AlertThresholds {
    fn default() -> Self {
        AlertThresholds {
            amplification: 2.0,
            storm_potential: 8.0,
            retry_contribution: 0.20,
            retry_ratio: 0.10,
            retry_success_rate: 0.70,
            retries_per_minute: 50.0,
            tail_ratio: 2.0,
            orphan_work_seconds_per_minute: 1.0,
            min_events_per_minute: 10.0,
            latency_drift: 0.2,
            baseline: None,
            baseline_p999_ms: BTreeMap::new(),
        }
    }
}

/// An alert's labels (without `alertname` and `severity`) and value, for one series.
pub type Breach = (BTreeMap<String, String>, f64);

/// One alert of docs/alerts.md, for both engines.
pub struct AlertDefinition {
    pub name: &'static str,
    pub severity: &'static str,
    /// How long the condition must hold before the alert fires.
    pub hold: Duration,
    pub summary: &'static str,
    pub description: &'static str,
    /// The threshold the condition compares with (shown as `{threshold}`).
    pub threshold: fn(&AlertThresholds) -> f64,
    /// The PromQL condition, over exported metrics and [`RECORDING_RULES`].
    pub expr: fn(&AlertThresholds) -> String,
    /// The same condition on a window's report.
    pub condition: fn(&Report, &AlertThresholds) -> Vec<Breach>,
}

impl AlertDefinition {
    /// The docs/alerts.md heading this alert's runbook is under (a GitHub heading anchor).
    pub fn runbook_anchor(&self) -> String {
        self.name.to_ascii_lowercase()
    }

    /// Fill a text's placeholders for one breach.
    pub fn render(
        &self,
        text: &str,
        labels: &BTreeMap<String, String>,
        value: f64,
        thresholds: &AlertThresholds,
    ) -> String {
        let mut out = text
            .replace("{value}", &format_value(value))
            .replace("{threshold}", &format_value((self.threshold)(thresholds)));
        for (name, label) in labels {
            out = out.replace(&format!("{{{name}}}"), label);
        }
        out
    }

    /// A text as a Prometheus template: labels and value filled in by Prometheus.
    pub fn template(&self, text: &str, thresholds: &AlertThresholds) -> String {
        let mut out = text
            .replace("{value}", "{{ $value | printf \"%.3g\" }}")
            .replace("{threshold}", &format_value((self.threshold)(thresholds)));
        for name in ["service", "operation", "caller", "callee"] {
            out = out.replace(&format!("{{{name}}}"), &format!("{{{{ $labels.{name} }}}}"));
        }
        out
    }
}

/// Three significant digits (whole numbers above 100), trailing zeros trimmed: what the
/// Prometheus templates print with `printf "%.3g"` for the values alerts carry.
fn format_value(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

const EDGE: &str = "caller, callee, operation";

/// Prometheus recording rules the alert expressions and dashboards read: each figure of
/// docs/alerts.md that is a ratio of counters, over the last 5 minutes (the default window),
/// summed over instances. Empty denominators give no series (`> 0` filters), never NaN; an
/// absent numerator series counts as 0 (`or ... * 0`).
pub fn recording_rules() -> Vec<(&'static str, String)> {
    let calls = |selector: &str| {
        format!("sum by ({EDGE}) (rate(stormglass_logical_calls_total{selector}[5m]))")
    };
    let attempts =
        |selector: &str| format!("sum by ({EDGE}) (rate(stormglass_attempts_total{selector}[5m]))");
    let ratio = |numerator: String, denominator: &str| {
        format!("({numerator} or {denominator} * 0) / ({denominator} > 0)")
    };
    vec![
        (
            "stormglass:layer_amplification:ratio_rate5m",
            "sum by (service) (rate(stormglass_layer_attempts_total[5m])) / \
             (sum by (service) (rate(stormglass_layer_baseline_attempts_total[5m])) > 0)"
                .to_owned(),
        ),
        ("stormglass:edge_logical_calls:rate5m", calls("")),
        (
            "stormglass:edge_final_ok_calls:rate5m",
            calls("{final_outcome=\"ok\"}"),
        ),
        (
            "stormglass:edge_first_attempts:rate5m",
            attempts("{attempt=\"first\"}"),
        ),
        (
            "stormglass:edge_retry_attempts:rate5m",
            attempts("{attempt=\"retry\"}"),
        ),
        (
            "stormglass:edge_effective_success:ratio_rate5m",
            ratio(
                calls("{first_outcome=\"ok\"}"),
                "stormglass:edge_logical_calls:rate5m",
            ),
        ),
        (
            "stormglass:edge_raw_success:ratio_rate5m",
            ratio(
                calls("{final_outcome=\"ok\"}"),
                "stormglass:edge_logical_calls:rate5m",
            ),
        ),
        (
            "stormglass:edge_retry_contribution:ratio_rate5m",
            ratio(
                calls("{first_outcome=\"failed\",final_outcome=\"ok\"}"),
                "stormglass:edge_final_ok_calls:rate5m",
            ),
        ),
        (
            "stormglass:edge_retry_success:ratio_rate5m",
            ratio(
                attempts("{attempt=\"retry\",outcome=\"ok\"}"),
                "stormglass:edge_retry_attempts:rate5m",
            ),
        ),
        (
            "stormglass:edge_retry:ratio_rate5m",
            ratio(
                "stormglass:edge_retry_attempts:rate5m".to_owned(),
                "stormglass:edge_first_attempts:rate5m",
            ),
        ),
        (
            "stormglass:caller_callee_retries:per_minute_rate5m",
            "sum by (caller, callee) (rate(stormglass_attempts_total{attempt=\"retry\"}[5m])) * 60"
                .to_owned(),
        ),
        (
            "stormglass:edge_orphan_work_seconds:per_minute_rate5m",
            format!("sum by ({EDGE}) (rate(stormglass_orphan_work_seconds_total[5m])) * 60"),
        ),
        (
            "stormglass:layer_latency_p99:seconds_rate5m",
            "histogram_quantile(0.99, sum by (service, le) \
             (rate(stormglass_layer_duration_seconds_bucket[5m])))"
                .to_owned(),
        ),
        (
            "stormglass:layer_latency_p999:seconds_rate5m",
            "histogram_quantile(0.999, sum by (service, le) \
             (rate(stormglass_layer_duration_seconds_bucket[5m])))"
                .to_owned(),
        ),
        (
            "stormglass:layer_tail:ratio_rate5m",
            "stormglass:layer_latency_p999:seconds_rate5m / \
             (stormglass:layer_latency_p99:seconds_rate5m > 0)"
                .to_owned(),
        ),
        (
            "stormglass:edge_timeout:mean_seconds_rate5m",
            format!(
                "sum by ({EDGE}) (rate(stormglass_attempt_deadline_seconds_total[5m])) / \
                 (sum by ({EDGE}) (rate(stormglass_budgeted_attempts_total[5m])) > 0)"
            ),
        ),
        (
            "stormglass:callee_latency_p999:seconds_rate5m",
            "max by (callee) (label_replace(stormglass:layer_latency_p999:seconds_rate5m, \
             \"callee\", \"$1\", \"service\", \"(.*)\"))"
                .to_owned(),
        ),
        (
            "stormglass:edge_retries_to_other_instance:ratio_rate5m",
            format!(
                "sum by ({EDGE}) (rate(stormglass_other_instance_retries_total[5m])) / \
                 (sum by ({EDGE}) (rate(stormglass_instance_retries_total[5m])) > 0)"
            ),
        ),
    ]
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn edge_labels(e: &crate::report::EdgeFigures) -> BTreeMap<String, String> {
    labels(&[
        ("caller", &e.caller),
        ("callee", &e.callee),
        ("operation", &e.operation),
    ])
}

/// Edges whose figure (as `figure` reads it) satisfies `breach`.
fn edges_where(
    report: &Report,
    figure: impl Fn(&crate::report::EdgeFigures) -> Option<f64>,
    breach: impl Fn(f64) -> bool,
) -> Vec<Breach> {
    report
        .edges
        .iter()
        .filter_map(|e| {
            figure(e)
                .filter(|v| breach(*v))
                .map(|v| (edge_labels(e), v))
        })
        .collect()
}

/// Layers whose figure (as `figure` reads it) satisfies `breach`.
fn layers_where(
    report: &Report,
    figure: impl Fn(&crate::report::LayerFigures) -> Option<f64>,
    breach: impl Fn(f64) -> bool,
) -> Vec<Breach> {
    report
        .layers
        .iter()
        .filter_map(|l| {
            figure(l)
                .filter(|v| breach(*v))
                .map(|v| (labels(&[("service", &l.service)]), v))
        })
        .collect()
}

fn window_minutes(report: &Report) -> Option<f64> {
    report.window.seconds.filter(|s| *s > 0.0).map(|s| s / 60.0)
}

/// The minimum-traffic guard of a ratio alert in the evaluator: `events` (the ratio's
/// denominator in the window) reach `min_events_per_minute`. A report without a window
/// length (no spans) has nothing to guard.
fn busy(report: &Report, events: f64, t: &AlertThresholds) -> bool {
    window_minutes(report).is_none_or(|minutes| events / minutes >= t.min_events_per_minute)
}

/// Edges whose figure breaches, among those with `events` (the ratio's denominator) busy
/// enough: the ratio alerts' condition.
fn busy_edges(
    r: &Report,
    t: &AlertThresholds,
    figure: impl Fn(&crate::report::EdgeFigures) -> Option<f64>,
    events: impl Fn(&crate::report::EdgeFigures) -> f64,
    breach: impl Fn(f64) -> bool,
) -> Vec<Breach> {
    edges_where(r, |e| figure(e).filter(|_| busy(r, events(e), t)), breach)
}

/// Layers whose figure breaches, among those with `events` busy enough.
fn busy_layers(
    r: &Report,
    t: &AlertThresholds,
    figure: impl Fn(&crate::report::LayerFigures) -> Option<f64>,
    events: impl Fn(&crate::report::LayerFigures) -> f64,
    breach: impl Fn(f64) -> bool,
) -> Vec<Breach> {
    layers_where(r, |l| figure(l).filter(|_| busy(r, events(l), t)), breach)
}

/// The same guard in PromQL: `condition` holds and `events` (a per-second rate with the
/// condition's labels) reaches the minimum per minute.
fn guarded(condition: String, events: &str, t: &AlertThresholds) -> String {
    format!(
        "{condition} and {events} * 60 >= {}",
        t.min_events_per_minute
    )
}

/// Every alert of docs/alerts.md, in its order.
pub static DEFINITIONS: &[AlertDefinition] = &[
    AlertDefinition {
        name: "StormglassRetryAmplificationHigh",
        severity: "critical",
        hold: Duration::from_secs(120),
        summary: "{service} receives {value}x the attempts it would without retries",
        description: "Retries above {service} multiply its load: it received {value} times the \
            attempts it would have received with no retry anywhere upstream (threshold \
            {threshold}). When it slows down, the retries become a storm.",
        threshold: |t| t.amplification,
        expr: |t| {
            guarded(
                format!(
                    "stormglass:layer_amplification:ratio_rate5m > {}",
                    t.amplification
                ),
                "sum by (service) (rate(stormglass_layer_baseline_attempts_total[5m]))",
                t,
            )
        },
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| l.amplification,
                |l| l.baseline_attempts as f64,
                |v| v > t.amplification,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetryStormPotential",
        severity: "warning",
        hold: Duration::from_secs(15 * 60),
        summary: "A full outage below {service} {operation} would multiply load by {value}",
        description: "The retry policies along the deepest call chain below entry operation \
            {operation} of {service} multiply to {value} (threshold {threshold}): if the \
            bottom fails, it receives that many attempts per request. Retry at one layer only.",
        threshold: |t| t.storm_potential,
        expr: |t| {
            format!(
                "max by (service, operation) (stormglass_storm_potential_ratio) >= {}",
                t.storm_potential
            )
        },
        condition: |r, t| {
            r.entries
                .iter()
                .filter(|e| e.storm_potential >= t.storm_potential)
                .map(|e| {
                    (
                        labels(&[("service", &e.service), ("operation", &e.operation)]),
                        e.storm_potential,
                    )
                })
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassRetryContributionHigh",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: {value} of successes needed a retry",
        description: "A share of {value} of the successful calls from {caller} to {callee} \
            ({operation}) succeeded only after a retry (threshold {threshold}; healthy is 5-15%). \
            The raw success rate hides how often the first try fails.",
        threshold: |t| t.retry_contribution,
        expr: |t| {
            guarded(
                format!(
                    "stormglass:edge_retry_contribution:ratio_rate5m > {}",
                    t.retry_contribution
                ),
                "stormglass:edge_final_ok_calls:rate5m",
                t,
            )
        },
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.retry_contribution,
                |e| e.raw_success_rate.unwrap_or(0.0) * e.logical_calls as f64,
                |v| v > t.retry_contribution,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetryBudgetExceeded",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: {value} retries per first attempt",
        description: "{caller} sends {value} retries per first attempt to {callee} \
            ({operation}), over the retry budget of {threshold}. Retries beyond a budget add \
            load when the callee can least take it.",
        threshold: |t| t.retry_ratio,
        expr: |t| {
            guarded(
                format!("stormglass:edge_retry:ratio_rate5m > {}", t.retry_ratio),
                "stormglass:edge_first_attempts:rate5m",
                t,
            )
        },
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.retry_ratio,
                |e| e.attempts.saturating_sub(e.retry_attempts) as f64,
                |v| v > t.retry_ratio,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetriesFailing",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: only {value} of retries succeed",
        description: "Only {value} of the retry attempts from {caller} to {callee} \
            ({operation}) succeed (threshold {threshold}). Retries that fail add load, not \
            availability.",
        threshold: |t| t.retry_success_rate,
        expr: |t| {
            guarded(
                format!(
                    "stormglass:edge_retry_success:ratio_rate5m < {}",
                    t.retry_success_rate
                ),
                "stormglass:edge_retry_attempts:rate5m",
                t,
            )
        },
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.retry_success_rate,
                |e| e.retry_attempts as f64,
                |v| v < t.retry_success_rate,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetryConcentration",
        severity: "critical",
        hold: Duration::from_secs(60),
        summary: "{caller} retries {callee} {value} times per minute",
        description: "{caller} sends {value} retries per minute to {callee} (threshold \
            {threshold}): one caller is hammering one callee.",
        threshold: |t| t.retries_per_minute,
        expr: |t| {
            format!(
                "stormglass:caller_callee_retries:per_minute_rate5m > {}",
                t.retries_per_minute
            )
        },
        condition: |r, t| {
            let Some(minutes) = window_minutes(r) else {
                return Vec::new();
            };
            let mut by_pair: HashMap<(&str, &str), u64> = HashMap::new();
            for e in &r.edges {
                *by_pair.entry((&e.caller, &e.callee)).or_default() += e.retry_attempts;
            }
            let mut pairs: Vec<_> = by_pair.into_iter().collect();
            pairs.sort();
            pairs
                .into_iter()
                .map(|((caller, callee), retries)| {
                    (
                        labels(&[("caller", caller), ("callee", callee)]),
                        retries as f64 / minutes,
                    )
                })
                .filter(|(_, per_minute)| *per_minute > t.retries_per_minute)
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassTailRatioHigh",
        severity: "warning",
        hold: Duration::from_secs(10 * 60),
        summary: "{service}: P99.9 is {value}x P99",
        description: "The P99.9 latency of {service} is {value} times its P99 (threshold \
            {threshold}): the tail is deteriorating, and timeouts set at P99 cut it off.",
        threshold: |t| t.tail_ratio,
        expr: |t| {
            guarded(
                format!("stormglass:layer_tail:ratio_rate5m > {}", t.tail_ratio),
                "sum by (service) (rate(stormglass_layer_attempts_total[5m]))",
                t,
            )
        },
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| l.tail_ratio,
                |l| l.requests as f64,
                |v| v > t.tail_ratio,
            )
        },
    },
    AlertDefinition {
        name: "StormglassLatencyDrift",
        severity: "warning",
        hold: Duration::from_secs(30 * 60),
        summary: "{service}: P99.9 is {value}x its baseline",
        description: "The P99.9 latency of {service} is {value} times its baseline (the \
            load-test report in alerts.baseline, else the same time a week earlier), more \
            than {threshold} away: the timeouts and deadline budgets derived from the \
            baseline no longer fit. Recompute them from the current P99.9.",
        threshold: |t| t.latency_drift,
        expr: |t| {
            let ratio = "stormglass:layer_latency_p999:seconds_rate5m / \
                (max by (service) (stormglass_layer_latency_p999_baseline_seconds) \
                or stormglass:layer_latency_p999:seconds_rate5m offset 1w)";
            guarded(
                format!(
                    "({ratio} > {} or {ratio} < {})",
                    1.0 + t.latency_drift,
                    1.0 - t.latency_drift
                ),
                "sum by (service) (rate(stormglass_layer_attempts_total[5m]))",
                t,
            )
        },
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| Some(l.p999_ms? / t.baseline_p999_ms.get(&l.service)?),
                |l| l.requests as f64,
                |v| (v - 1.0).abs() > t.latency_drift,
            )
        },
    },
    AlertDefinition {
        name: "StormglassTimeoutBelowTail",
        severity: "warning",
        hold: Duration::from_secs(15 * 60),
        summary: "{caller} -> {callee} {operation}: timeout below the callee's P99.9",
        description: "{caller} gives {callee} ({operation}) a timeout of {value} s, below \
            {callee}'s P99.9 latency: slow but healthy requests are cut off and retried. Set it \
            to P99.9 x 1.5 (stormglass_recommended_timeout_seconds).",
        threshold: |_| 0.0,
        expr: |t| {
            guarded(
                "stormglass:edge_timeout:mean_seconds_rate5m < on (callee) group_left () \
                 stormglass:callee_latency_p999:seconds_rate5m"
                    .to_owned(),
                &format!("sum by ({EDGE}) (rate(stormglass_attempts_total[5m]))"),
                t,
            )
        },
        condition: |r, t| {
            r.edges
                .iter()
                .filter(|e| e.timeout_below_tail == Some(true) && busy(r, e.attempts as f64, t))
                .map(|e| (edge_labels(e), e.timeout_ms.unwrap_or(0.0) / 1e3))
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassDeadlineInversion",
        severity: "warning",
        // Not docs/alerts.md's 5m: a single inversion keeps `increase[5m] > 0` (and the 5-minute
        // window's findings) for just 5 minutes, so a 5m hold never fired for it. 1m fires
        // for any inversion, in Prometheus and in the built-in evaluator.
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee}: {value} deadline inversions or overcommits",
        description: "{caller} gives {callee} more time than it has left itself ({value} \
            inversions or overcommitted budgets): the callee keeps working after the caller \
            has given up.",
        threshold: |_| 0.0,
        expr: |_| {
            "sum by (caller, callee) (increase(stormglass_deadline_violations_total\
             {kind=~\"inversion|overcommit\"}[5m])) > 0"
                .to_owned()
        },
        condition: |r, _| {
            let mut budget: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            for f in &r.findings {
                if f.kind == "deadline_inversion" || f.kind == "overcommit" {
                    *budget.entry((&f.caller, &f.callee)).or_default() += f.count;
                }
            }
            budget
                .into_iter()
                .map(|((caller, callee), count)| {
                    (
                        labels(&[("caller", caller), ("callee", callee)]),
                        count as f64,
                    )
                })
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassUnsafeRetries",
        severity: "critical",
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee} {operation}: {value} unsafe retries",
        description: "{caller} retried the non-idempotent {operation} on {callee} without an \
            idempotency key {value} times: each may have applied the write twice.",
        threshold: |_| 0.0,
        expr: |_| format!("sum by ({EDGE}) (increase(stormglass_unsafe_retries_total[5m])) > 0"),
        condition: |r, _| {
            r.edges
                .iter()
                .filter(|e| e.unsafe_retries > 0)
                .map(|e| (edge_labels(e), e.unsafe_retries as f64))
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassOrphanWork",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{callee} works {value} s per minute for callers of {operation} that gave up",
        description: "{callee} keeps working on {operation} after {caller} cancelled or timed \
            out: {value} seconds of orphan work per minute (threshold {threshold}). Propagate \
            cancellation and deadlines.",
        threshold: |t| t.orphan_work_seconds_per_minute,
        expr: |t| {
            format!(
                "stormglass:edge_orphan_work_seconds:per_minute_rate5m > {}",
                t.orphan_work_seconds_per_minute
            )
        },
        condition: |r, t| {
            let Some(minutes) = window_minutes(r) else {
                return Vec::new();
            };
            edges_where(
                r,
                |e| Some(e.orphan_work_seconds / minutes),
                |v| v > t.orphan_work_seconds_per_minute,
            )
        },
    },
];

/// The definition of an alert, by name.
pub fn definition(name: &str) -> Option<&'static AlertDefinition> {
    DEFINITIONS.iter().find(|d| d.name == name)
}

/// Every alert whose condition holds on `report`, in [`DEFINITIONS`] order.
pub fn evaluate(report: &Report, t: &AlertThresholds) -> Vec<Alert> {
    DEFINITIONS
        .iter()
        .flat_map(|d| {
            (d.condition)(report, t)
                .into_iter()
                .map(|(labels, value)| Alert {
                    name: d.name.to_owned(),
                    severity: d.severity.to_owned(),
                    labels,
                    value,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::LayerFigures;

    /// Values print with three significant digits, whole above 100.
    #[test]
    fn values_format_with_three_significant_digits() {
        assert_eq!(format_value(27.0), "27");
        assert_eq!(format_value(2.3456), "2.35");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(0.1), "0.1");
        assert_eq!(format_value(1234.0), "1234");
    }

    /// Every placeholder of every text is filled for the alert's own labels.
    #[test]
    fn texts_render_completely() {
        let t = AlertThresholds::default();
        let all: BTreeMap<String, String> = ["service", "operation", "caller", "callee"]
            .iter()
            .map(|k| ((*k).to_owned(), format!("<{k}>")))
            .collect();
        for d in DEFINITIONS {
            for text in [d.summary, d.description] {
                let rendered = d.render(text, &all, 3.0, &t);
                assert!(!rendered.contains('{'), "{}: {rendered}", d.name);
                let template = d.template(text, &t);
                assert!(
                    !template.replace("{{", "").replace("}}", "").contains('{'),
                    "{}: {template}",
                    d.name
                );
            }
        }
    }

    fn layer(service: &str, requests: u64, p99_ms: f64, p999_ms: f64) -> LayerFigures {
        LayerFigures {
            service: service.to_owned(),
            requests,
            baseline_attempts: requests,
            amplification: Some(1.0),
            p99_ms: Some(p99_ms),
            p999_ms: Some(p999_ms),
            tail_ratio: Some(p999_ms / p99_ms),
        }
    }

    fn names_and_services(report: &Report, t: &AlertThresholds) -> Vec<(String, String)> {
        evaluate(report, t)
            .into_iter()
            .map(|a| (a.name, a.labels["service"].clone()))
            .collect()
    }

    /// A ratio alert needs `min_events_per_minute` of its denominator: three slow requests
    /// a minute do not make a tail, three thousand do.
    #[test]
    fn ratio_alerts_need_minimum_traffic() {
        let mut report = Report::default();
        report.window.seconds = Some(60.0);
        report.layers = vec![
            layer("quiet", 3, 100.0, 300.0),
            layer("busy", 3000, 100.0, 300.0),
        ];
        let t = AlertThresholds::default();
        assert_eq!(
            names_and_services(&report, &t),
            [("StormglassTailRatioHigh".to_owned(), "busy".to_owned())]
        );
        let t = AlertThresholds {
            min_events_per_minute: 1.0,
            ..t
        };
        assert_eq!(names_and_services(&report, &t).len(), 2);
    }

    /// Drift compares each layer's P99.9 with the baseline report's, both ways, beyond
    /// `latency_drift`; layers without a baseline are not judged.
    #[test]
    fn latency_drift_against_the_baseline() {
        let mut report = Report::default();
        report.window.seconds = Some(60.0);
        report.layers = vec![
            layer("slower", 1000, 100.0, 150.0),
            layer("faster", 1000, 100.0, 150.0),
            layer("same", 1000, 100.0, 150.0),
            layer("new", 1000, 100.0, 150.0),
        ];
        let t = AlertThresholds {
            baseline_p999_ms: [("slower", 100.0), ("faster", 200.0), ("same", 130.0)]
                .map(|(s, ms)| (s.to_owned(), ms))
                .into(),
            ..AlertThresholds::default()
        };
        let drift: Vec<(String, f64)> = evaluate(&report, &t)
            .into_iter()
            .filter(|a| a.name == "StormglassLatencyDrift")
            .map(|a| (a.labels["service"].clone(), a.value))
            .collect();
        assert_eq!(
            drift,
            [("slower".to_owned(), 1.5), ("faster".to_owned(), 0.75)]
        );
    }

    /// The baseline is read from a JSON report's layers.
    #[test]
    fn baseline_reads_a_report() {
        let dir = std::env::temp_dir().join(format!("sg-baseline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("baseline.json");
        std::fs::write(
            &path,
            r#"{"layers": [{"service": "db", "p999_ms": 120.5}, {"service": "idle", "p999_ms": null}]}"#,
        )
        .unwrap();
        assert_eq!(
            read_baseline(&path).unwrap(),
            [("db".to_owned(), 120.5)].into()
        );
        std::fs::write(&path, "{}").unwrap();
        assert!(
            read_baseline(&path)
                .unwrap_err()
                .contains("not a stormglass JSON report")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Names are unique and follow docs/alerts.md's table.
    #[test]
    fn twelve_unique_alerts() {
        let mut names: Vec<_> = DEFINITIONS.iter().map(|d| d.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 12);
    }
}
