//! The alerts of docs/alerts.md, defined once for both engines.
//!
//! Each [`AlertDefinition`] carries the name, severity, `for:` duration, texts and the
//! condition the built-in evaluator checks on a window's [`Report`]; export holds each
//! alert's PromQL beside the metrics it reads, and `stormglass rules` renders the Prometheus
//! side from both. [`evaluate`] is the condition half of the built-in side (which series
//! breach their threshold in this window); `for:` applies only to an evaluator that watches
//! successive windows, so the offline report lists every condition that holds.
//!
//! Texts use `{label}` placeholders for the alert's labels, `{value}` for the value,
//! `{percent}` for a share's value as a percentage and `{threshold}` for the configured
//! threshold; each engine fills them in its own way (Go templates for Prometheus,
//! [`AlertDefinition::render`] here).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use stormglass_model::hash::KeyedMap as Fast;

mod definitions;

pub use crate::report::Alert;
use crate::report::Report;
pub use definitions::DEFINITIONS;

/// `alerts.*` thresholds, defaults from docs/alerts.md.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertThresholds {
    pub amplification: f64,
    pub storm_potential: f64,
    pub retry_contribution: f64,
    pub retry_ratio: f64,
    pub retry_success_rate: f64,
    /// `StormglassRetriedCallsFailing`: the share of retried logical calls whose last
    /// attempt still failed.
    pub retried_failed_share: f64,
    /// `StormglassRetriesOutOfBudget`: the share of an edge's retries that started with less
    /// of the caller's budget left than the callee's median duration.
    pub out_of_budget_retry_share: f64,
    pub retries_per_minute: f64,
    pub tail_ratio: f64,
    /// `StormglassTimeoutRateHigh`: the share of the attempts a layer receives that end in
    /// `deadline`.
    pub timeout_rate: f64,
    /// `StormglassLayerErrorRateHigh`: the share of the attempts a layer receives that are
    /// not `ok`, as an absolute line...
    pub layer_error_rate: f64,
    /// ...and as a jump: points above the same share a week earlier (Prometheus only).
    pub layer_error_jump: f64,
    /// `StormglassCallsWithoutDeadline`: the share of an edge's served attempts with no
    /// deadline on either side.
    pub without_deadline_share: f64,
    /// `StormglassWritesWithoutKey`: the share of an edge's writes sent without an
    /// idempotency key.
    pub writes_without_key_share: f64,
    pub orphan_work_seconds_per_minute: f64,
    /// The entry requests' service level objective, whose error budget the burn-rate
    /// alerts watch.
    pub entry_slo: EntrySlo,
    /// Minimum traffic of a ratio alert: its denominator (the events the ratio is a share
    /// of) per minute. Below it, a ratio of a handful of events is noise and never fires.
    pub min_events_per_minute: f64,
    /// At most this many instances of one alert fire at once; beyond it, the alert fires
    /// one summary instance per caller service instead (the count and the worst series).
    pub max_instances_per_rule: usize,
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
    /// `alerts.for`: per alert name, a `for:` that replaces the alert's own in both engines
    /// (`{StormglassRetryAmplificationHigh: 0s}` fires on the first window that breaches).
    /// Names match ignoring case: environment keys arrive in lower case.
    #[serde(rename = "for", deserialize_with = "holds")]
    pub hold: BTreeMap<String, Duration>,
}

/// `alerts.for`'s durations, written as everywhere else in the configuration (`30s`, `2m`).
fn holds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Duration>, D::Error> {
    BTreeMap::<String, String>::deserialize(d)?
        .into_iter()
        .map(|(name, text)| {
            humantime::parse_duration(text.trim())
                .map(|hold| (name.clone(), hold))
                .map_err(|e| serde::de::Error::custom(format!("{name}: {e} (found {text:?})")))
        })
        .collect()
}

impl AlertThresholds {
    /// How long `d`'s condition must hold before it fires: `alerts.for` if it names `d`,
    /// else the definition's own.
    pub fn hold(&self, d: &AlertDefinition) -> Duration {
        self.hold
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(d.name))
            .map_or(d.hold, |(_, hold)| *hold)
    }

    /// Configuration errors under `prefix` (`alerts`): `alerts.for` naming no alert.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        self.hold
            .keys()
            .filter(|name| definition_ignoring_case(name).is_none())
            .map(|name| {
                (
                    format!("{prefix}.for.{name}"),
                    format!(
                        "no such alert; expected one of {}",
                        DEFINITIONS
                            .iter()
                            .map(|d| d.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
            .collect()
    }
}

fn definition_ignoring_case(name: &str) -> Option<&'static AlertDefinition> {
    DEFINITIONS
        .iter()
        .find(|d| d.name.eq_ignore_ascii_case(name))
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
        #[serde(default)]
        listing: Option<crate::report::Listing>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let report: Baseline = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: not a stormglass JSON report (analyze --format json): {e}",
            path.display()
        )
    })?;
    if let Some(listing) = report.listing.filter(|l| l.layers_listed < l.layers) {
        return Err(format!(
            "{}: lists {} of the window's {} layers; write the baseline with \
             `stormglass analyze --all --format json`",
            path.display(),
            listing.layers_listed,
            listing.layers
        ));
    }
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
            retried_failed_share: 0.5,
            out_of_budget_retry_share: 0.1,
            retries_per_minute: 50.0,
            tail_ratio: 2.0,
            timeout_rate: 0.05,
            layer_error_rate: 0.05,
            layer_error_jump: 0.02,
            without_deadline_share: 0.1,
            writes_without_key_share: 0.1,
            orphan_work_seconds_per_minute: 1.0,
            entry_slo: EntrySlo::default(),
            min_events_per_minute: 10.0,
            max_instances_per_rule: 50,
            latency_drift: 0.2,
            baseline: None,
            baseline_p999_ms: BTreeMap::new(),
            hold: BTreeMap::new(),
        }
    }
}

/// `alerts.entry_slo.*`: what each entry operation promises its users. The budget is what
/// it may miss: `1 - latency_share` of its requests slower than `latency_ms`, `error_rate`
/// of them failed.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EntrySlo {
    /// Requests answered within this are good.
    pub latency_ms: f64,
    /// The share of requests promised within `latency_ms`.
    pub latency_share: f64,
    /// The share of requests that may fail.
    pub error_rate: f64,
}

impl Default for EntrySlo {
    fn default() -> Self {
        EntrySlo {
            latency_ms: 1200.0,
            latency_share: 0.95,
            error_rate: 0.05,
        }
    }
}

impl EntrySlo {
    /// How fast an error budget may burn before it pages: 2% of a 30-day budget in an
    /// hour (14.4x), or 5% in six hours (6x), each confirmed over a window a twelfth as
    /// long (the multiwindow rule of Google's SRE workbook).
    pub const FAST_BURN: f64 = 14.4;
    pub const SLOW_BURN: f64 = 6.0;
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
            .replace("{percent}", &format_percent(value))
            .replace("{threshold}", &format_value((self.threshold)(thresholds)));
        for (name, label) in labels {
            out = out.replace(&format!("{{{name}}}"), label);
        }
        out
    }

    /// The summary and description of one instance: the definition's texts filled in, or
    /// for a summary instance ([`bounded`]: `detail` set) its own.
    pub fn texts(
        &self,
        labels: &BTreeMap<String, String>,
        value: f64,
        detail: Option<&str>,
        thresholds: &AlertThresholds,
    ) -> (String, String) {
        match detail {
            Some(detail) => {
                let whose = labels
                    .get("caller")
                    .map(|c| format!("{c}: "))
                    .unwrap_or_default();
                (
                    format!("{whose}{} series breach {}", format_value(value), self.name),
                    detail.to_owned(),
                )
            }
            None => (
                self.render(self.summary, labels, value, thresholds),
                self.render(self.description, labels, value, thresholds),
            ),
        }
    }

    /// A text as a Prometheus template: labels and value filled in by Prometheus.
    pub fn template(&self, text: &str, thresholds: &AlertThresholds) -> String {
        let mut out = text
            .replace("{value}", "{{ $value | printf \"%.3g\" }}")
            .replace("{percent}", "{{ $value | humanizePercentage }}")
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
    significant(v, 3)
}

/// A share as a percentage with four significant digits: Prometheus' `humanizePercentage`.
fn format_percent(v: f64) -> String {
    format!("{}%", significant(v * 100.0, 4))
}

/// `v` with `digits` significant digits (whole numbers above 10^digits), trailing zeros
/// trimmed.
fn significant(v: f64, digits: i32) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (digits - 1 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
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

/// The definition of an alert, by name.
pub fn definition(name: &str) -> Option<&'static AlertDefinition> {
    DEFINITIONS.iter().find(|d| d.name == name)
}

/// Every alert whose condition holds on `report`, in [`DEFINITIONS`] order, each bounded
/// by [`bounded`]. The definitions are evaluated on the analysis's threads: at width each
/// walks every edge.
pub fn evaluate(report: &Report, t: &AlertThresholds) -> Vec<Alert> {
    let definitions: Vec<&AlertDefinition> = DEFINITIONS.iter().collect();
    crate::parallel::parallel_map(definitions, |d| {
        bounded(d, (d.condition)(report, t), t.max_instances_per_rule)
    })
    .into_iter()
    .flatten()
    .collect()
}

/// The `instances` label of a summary instance ([`bounded`]), in both engines: it tells a
/// route or a silence that one instance stands for many series.
pub const SUMMARY_INSTANCES: &str = "per_caller";

/// How many of the worst series a summary instance names.
const NAMED_IN_SUMMARY: usize = 3;

/// One alert's breaches as its instances: each breach while there are at most `max`;
/// beyond that, one summary instance per caller service (labels `caller` and `instances`
/// ([`SUMMARY_INSTANCES`]); `instances` alone for alerts without callers), its value the
/// number of breaching series, its `detail`
/// naming the worst of them, the callers with the most breaches first, at most `max`.
/// The same rule as the Prometheus rules' (see `stormglass rules`).
pub fn bounded(d: &AlertDefinition, mut breaches: Vec<Breach>, max: usize) -> Vec<Alert> {
    let alert = |labels, value, detail| Alert {
        name: d.name.to_owned(),
        severity: d.severity.to_owned(),
        labels,
        value,
        detail,
    };
    if breaches.len() <= max {
        return breaches
            .into_iter()
            .map(|(labels, value)| alert(labels, value, None))
            .collect();
    }
    let total = breaches.len();
    // Worst first: the highest value, then the labels for a stable order.
    breaches.sort_by(|(la, a), (lb, b)| b.total_cmp(a).then_with(|| la.cmp(lb)));
    let mut by_caller: BTreeMap<Option<String>, Vec<Breach>> = BTreeMap::new();
    for breach in breaches {
        let caller = breach.0.get("caller").cloned();
        by_caller.entry(caller).or_default().push(breach);
    }
    let mut groups: Vec<(Option<String>, Vec<Breach>)> = by_caller.into_iter().collect();
    groups.sort_by(|(ca, a), (cb, b)| b.len().cmp(&a.len()).then_with(|| ca.cmp(cb)));
    groups
        .into_iter()
        .take(max)
        .map(|(caller, series)| {
            let worst: Vec<String> = series
                .iter()
                .take(NAMED_IN_SUMMARY)
                .map(|(labels, value)| {
                    let names: Vec<&str> = ["caller", "callee", "operation", "service"]
                        .iter()
                        .filter_map(|k| labels.get(*k).map(String::as_str))
                        .collect();
                    format!("{} ({})", names.join(" "), format_value(*value))
                })
                .collect();
            let detail = format!(
                "{} of the {total} series breaching {}{} (more than \
                 alerts.max_instances_per_rule {max}); the worst: {}",
                series.len(),
                d.name,
                caller
                    .as_ref()
                    .map(|c| format!(" have caller {c}"))
                    .unwrap_or_default(),
                worst.join(", ")
            );
            let mut labels = caller
                .map(|c| labels(&[("caller", &c)]))
                .unwrap_or_default();
            labels.insert("instances".to_owned(), SUMMARY_INSTANCES.to_owned());
            alert(labels, series.len() as f64, Some(detail))
        })
        .collect()
}

#[cfg(test)]
mod tests;
