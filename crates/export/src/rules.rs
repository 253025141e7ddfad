//! `stormglass rules`: the Prometheus recording and alerting rules, rendered from the alert
//! definitions of [`stormglass_analytics::alerts`]. The shipped
//! `dashboards/prometheus/stormglass-rules.yml` is this output for the default thresholds.

use std::collections::BTreeMap;

use serde::Serialize;
use stormglass_analytics::AlertThresholds;
use stormglass_analytics::alerts::{DEFINITIONS, SUMMARY_INSTANCES};

use crate::promql::{alert_expr, recording_rules};

/// Where the runbooks are when `alerts.runbook_base` is not set: the `/runbooks` page of a
/// stormglass instance of the alert's own job and cluster, found by Prometheus when it
/// renders the annotation (every instance serves the same page). `scheme` is `https` when
/// the API is served over TLS.
pub fn default_runbook_base(scheme: &str) -> String {
    format!(
        "{scheme}://{{{{ with printf \"up{{job=%q,cluster=%q}} == 1\" $labels.job $labels.cluster | query }}}}\
         {{{{ . | first | label \"instance\" }}}}{{{{ end }}}}/runbooks"
    )
}

#[derive(Serialize)]
struct File {
    groups: Vec<Group>,
}

/// The Prometheus Operator's `PrometheusRule` (monitoring.coreos.com/v1): the same groups
/// as its `spec`, for clusters whose Prometheus picks rules up from the API.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PrometheusRule {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata,
    spec: File,
}

#[derive(Serialize)]
struct Metadata {
    name: &'static str,
    labels: BTreeMap<&'static str, &'static str>,
}

/// How `stormglass rules` writes the rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RulesFormat {
    /// A Prometheus rule file (`rule_files:`).
    #[default]
    File,
    /// A Kubernetes `PrometheusRule` object for the Prometheus Operator.
    PrometheusRule,
}

#[derive(Serialize)]
struct Group {
    name: &'static str,
    rules: Vec<Rule>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Rule {
    Record {
        record: &'static str,
        expr: String,
    },
    Alert {
        alert: &'static str,
        expr: String,
        #[serde(rename = "for")]
        hold: String,
        labels: BTreeMap<&'static str, &'static str>,
        annotations: BTreeMap<&'static str, String>,
    },
}

/// An alert about stormglass itself (meta-monitoring): Prometheus evaluates these, as the
/// built-in evaluator cannot report its own absence.
struct SelfAlert {
    name: &'static str,
    expr: &'static str,
    hold: &'static str,
    severity: &'static str,
    summary: &'static str,
    description: &'static str,
}

/// The meta-monitoring alerts; each has a runbook in docs/alerts.md under its name.
const SELF_ALERTS: [SelfAlert; 6] = [
    SelfAlert {
        name: "StormglassDown",
        expr: "up{job=\"stormglass\"} == 0",
        hold: "5m",
        severity: "critical",
        summary: "stormglass {{ $labels.instance }} is not being scraped",
        description: "Prometheus cannot scrape {{ $labels.instance }}: its figures and alerts are stale, and exporters pointed at it may be losing spans.",
    },
    SelfAlert {
        name: "StormglassRefusingSpans",
        expr: "sum by (cluster, job, instance, reason) (rate(stormglass_receiver_refused_requests_total{reason!=\"invalid\"}[5m])) > 0",
        hold: "10m",
        severity: "warning",
        summary: "stormglass {{ $labels.instance }} refuses export requests ({{ $labels.reason }})",
        description: "{{ $labels.instance }} has told exporters to retry for 10 minutes ({{ $labels.reason }}): they queue and eventually drop spans, and the figures miss them.",
    },
    SelfAlert {
        name: "StormglassAnalysisFailing",
        expr: "sum by (cluster, job, instance) (increase(stormglass_analysis_failures_total[10m])) > 0 or sum by (cluster, job, instance) (increase(stormglass_internal_errors_total[10m])) > 0",
        hold: "0m",
        severity: "critical",
        summary: "stormglass {{ $labels.instance }} fails to analyse",
        description: "An analysis or an internal task of {{ $labels.instance }} failed in the last 10 minutes; /healthz names the task and the error.",
    },
    SelfAlert {
        name: "StormglassAnalysisLagging",
        expr: "stormglass_analysis_pending_spans > 300 * rate(stormglass_analysis_spans_total[5m])",
        hold: "10m",
        severity: "warning",
        summary: "stormglass {{ $labels.instance }} falls behind its input",
        description: "More than five minutes of analysis throughput has been waiting on {{ $labels.instance }} for 10 minutes: figures lag, and the memory budget will soon refuse spans.",
    },
    SelfAlert {
        name: "StormglassSeriesOverflow",
        expr: "sum by (cluster, job, instance, metric) (increase(stormglass_export_overflow_total[15m])) > 0",
        hold: "0m",
        severity: "warning",
        summary: "{{ $labels.metric }} folds new series into __overflow__",
        description: "{{ $labels.metric }} on {{ $labels.instance }} reached limits.max_series_per_metric: new caller/callee/operation series are folded together and their per-series figures are lost.",
    },
    SelfAlert {
        name: "StormglassNotificationsFailing",
        expr: "sum by (cluster, job, instance, receiver) (increase(stormglass_alert_notifications_total{result=\"failed\"}[15m])) > 0",
        hold: "0m",
        severity: "warning",
        summary: "stormglass {{ $labels.instance }} cannot notify its {{ $labels.receiver }}",
        description: "Alert notifications from {{ $labels.instance }} to its {{ $labels.receiver }} failed in the last 15 minutes: nobody may hear about a storm.",
    },
];

/// Labels every aggregation keeps, so that the figures of different environments (one
/// Prometheus scraping production and staging) and of different jobs never merge, whatever
/// the number of instances inside each: the convention of the Prometheus monitoring mixins.
/// Series without them (a single environment) aggregate as before.
pub const SCOPE: &str = "cluster, job";

/// `expr` with [`SCOPE`] added to each `sum by` / `max by` grouping and `on` matching.
pub fn scoped(expr: &str) -> String {
    expr.replace("sum by (", &format!("sum by ({SCOPE}, "))
        .replace("max by (", &format!("max by ({SCOPE}, "))
        .replace("on (", &format!("on ({SCOPE}, "))
}

/// An alert's condition `expr` as two rules, as the built-in evaluator bounds it
/// ([`stormglass_analytics::alerts::bounded`]): each breaching series while they number at
/// most `alerts.max_instances_per_rule` in a scope, and beyond that one series per caller
/// service (none for layer alerts) counting its breaching series, the callers with the most
/// first, at most the bound.
fn bounded(expr: &str, thresholds: &AlertThresholds) -> (String, String) {
    let max = thresholds.max_instances_per_rule;
    let total = format!("count by ({SCOPE}) ({expr})");
    (
        format!("({expr}) and on ({SCOPE}) ({total} <= {max})"),
        format!(
            "topk by ({SCOPE}) ({max}, count by ({SCOPE}, caller) ({expr})) \
             and on ({SCOPE}) ({total} > {max})"
        ),
    )
}

/// The runbook link of an alert.
pub fn runbook_url(base: &str, anchor: &str) -> String {
    format!("{base}#{anchor}")
}

/// The anchor GitHub gives a Markdown heading (lower case, spaces as dashes, other
/// punctuation dropped): what runbook links and the docs' links point at.
pub fn heading_anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The names of the meta-monitoring alerts (for tests and docs).
pub fn self_alert_names() -> impl Iterator<Item = &'static str> {
    SELF_ALERTS.iter().map(|a| a.name)
}

/// The rules file for `thresholds`, with runbook links under `runbook_base`.
pub fn render(thresholds: &AlertThresholds, runbook_base: &str) -> String {
    render_as(RulesFormat::File, thresholds, runbook_base)
}

/// The rules in `format`: a rule file, or the same groups as a `PrometheusRule`.
pub fn render_as(format: RulesFormat, thresholds: &AlertThresholds, runbook_base: &str) -> String {
    let file = groups(thresholds, runbook_base);
    let (body, target) = match format {
        RulesFormat::File => (
            serde_saphyr::to_string(&file),
            "rules > dashboards/prometheus/stormglass-rules.yml",
        ),
        RulesFormat::PrometheusRule => (
            serde_saphyr::to_string(&PrometheusRule {
                api_version: "monitoring.coreos.com/v1",
                kind: "PrometheusRule",
                metadata: Metadata {
                    name: "stormglass",
                    // kube-prometheus-stack selects rules by its release label: add yours.
                    labels: [("app.kubernetes.io/name", "stormglass")].into(),
                },
                spec: file,
            }),
            "rules --format prometheusrule > dashboards/kubernetes/prometheusrule.yaml",
        ),
    };
    let body = match body {
        Ok(body) => body,
        Err(e) => unreachable!("the rules are plain strings and maps: {e}"),
    };
    format!(
        "# Prometheus rules for stormglass, generated by `stormglass rules` from the alert\n\
         # definitions in crates/analytics/src/alerts/definitions.rs and their PromQL in\n\
         # crates/export/src/promql.rs. Do not edit: regenerate with\n\
         #   cargo run -p stormglass -- {target}\n\
         {body}"
    )
}

/// The recording, alerting and self-monitoring groups.
fn groups(thresholds: &AlertThresholds, runbook_base: &str) -> File {
    let recording = recording_rules()
        .into_iter()
        .map(|(record, expr)| Rule::Record {
            record,
            expr: scoped(&expr),
        })
        .collect();
    let alerting = DEFINITIONS
        .iter()
        .flat_map(|d| {
            let hold = humantime::format_duration(thresholds.hold(d)).to_string();
            let runbook = runbook_url(runbook_base, &d.runbook_anchor());
            let (each, summary) = bounded(&scoped(&alert_expr(d, thresholds)), thresholds);
            [
                Rule::Alert {
                    alert: d.name,
                    expr: each,
                    hold: hold.clone(),
                    labels: [("severity", d.severity)].into(),
                    annotations: [
                        ("summary", d.template(d.summary, thresholds)),
                        ("description", d.template(d.description, thresholds)),
                        ("runbook_url", runbook.clone()),
                    ]
                    .into(),
                },
                Rule::Alert {
                    alert: d.name,
                    expr: summary,
                    hold,
                    labels: [("severity", d.severity), ("instances", SUMMARY_INSTANCES)].into(),
                    annotations: [
                        (
                            "summary",
                            format!(
                                "{{{{ with $labels.caller }}}}{{{{ . }}}}: {{{{ end }}}}\
                                 {{{{ $value }}}} series breach {}",
                                d.name
                            ),
                        ),
                        (
                            "description",
                            format!(
                                "{{{{ $value }}}} series breach {}{{{{ with $labels.caller }}}} \
                                 with caller {{{{ . }}}}{{{{ end }}}}: more than \
                                 alerts.max_instances_per_rule ({}) breach in all, so it fires \
                                 once per caller service. The worst are in stormglass' \
                                 /api/v1/alerts and report.",
                                d.name, thresholds.max_instances_per_rule
                            ),
                        ),
                        ("runbook_url", runbook),
                    ]
                    .into(),
                },
            ]
        })
        .collect();
    let meta = SELF_ALERTS
        .iter()
        .map(|a| Rule::Alert {
            alert: a.name,
            expr: a.expr.to_owned(),
            hold: a.hold.to_owned(),
            labels: [("severity", a.severity)].into(),
            annotations: [
                ("summary", a.summary.to_owned()),
                ("description", a.description.to_owned()),
                (
                    "runbook_url",
                    runbook_url(runbook_base, &a.name.to_ascii_lowercase()),
                ),
            ]
            .into(),
        })
        .collect();
    File {
        groups: vec![
            Group {
                name: "stormglass.recording",
                rules: recording,
            },
            Group {
                name: "stormglass.alerts",
                rules: alerting,
            },
            Group {
                name: "stormglass.self",
                rules: meta,
            },
        ],
    }
}
