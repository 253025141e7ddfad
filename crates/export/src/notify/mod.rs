//! The built-in alert evaluator and its notifiers.
//!
//! After every analysed interval the evaluator reads which alert conditions hold on the new
//! window ([`Report::alerts`], from the definitions in `stormglass_analytics::alerts`). A
//! condition that starts holding is *pending*; once it has held for the definition's `for:`
//! it is *firing*, and is posted to every configured Alertmanager (`POST /api/v2/alerts`)
//! and webhook. Firing alerts are re-sent every `alerts.resend_interval` with an `endsAt`
//! far enough ahead that Alertmanager keeps them while we run and resolves them by itself if
//! we stop; when the condition no longer holds, the alert is sent once more as resolved
//! (`endsAt` = now). This is Prometheus' own protocol with Alertmanager.
//!
//! Sending runs on spawned tasks, each request bounded by `alerts.send_timeout`. Receivers
//! may be `http://` or `https://` (system roots plus `alerts.ca_file`), with a bearer token
//! or basic auth. A failure that may pass (no connection, a timeout, 429, 5xx) is retried
//! `alerts.retries` times with exponential backoff from [`FIRST_BACKOFF`]; every outcome is
//! counted in `stormglass_alert_notifications_total{receiver,result}` (`sent`, `retried`,
//! `failed`) and failures are logged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::{Deserialize, Serialize};
use stormglass_analytics::alerts::{AlertDefinition, definition};
use stormglass_analytics::counts::IntervalCounts;
use stormglass_analytics::{AlertThresholds, IntervalObserver, Report};

mod config;
mod post;

use crate::rules::runbook_url;
pub use config::{BasicAuth, NotifyConfig, NotifyError};
use post::Poster;

/// The wait before the first retry of a failed notification; doubled for each next one.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// An alert as the evaluator holds it: pending or firing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AlertStatus {
    pub name: String,
    pub severity: String,
    /// `pending` (condition holds, not yet for `for:`) or `firing`.
    pub state: &'static str,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
    /// RFC 3339: when the condition started holding.
    pub active_since: String,
    /// RFC 3339: when it started firing.
    pub firing_since: Option<String>,
    pub summary: String,
    pub description: String,
    pub runbook_url: String,
    /// An example trace of the alert's edge or service (`links.trace_url`), when one is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_url: Option<String>,
}

/// An alert series: its name and labels.
type AlertKey = (String, BTreeMap<String, String>);

struct Active {
    definition: &'static AlertDefinition,
    labels: BTreeMap<String, String>,
    value: f64,
    /// A summary instance's text ([`stormglass_analytics::alerts::bounded`]).
    detail: Option<String>,
    active_since: SystemTime,
    firing_since: Option<SystemTime>,
    last_sent: Option<SystemTime>,
    /// The latest example trace of the alert's edge or service seen in a window.
    example_trace: Option<String>,
}

/// A trace showing what an alert is about: a finding's example or an orphan pair of the
/// alert's edge (`caller`, `callee`, and `operation` when the alert has it), or for a
/// layer's alert (`service`) of a call into that layer.
fn example_trace(report: &Report, labels: &BTreeMap<String, String>) -> Option<String> {
    let label = |name: &str| labels.get(name).map(String::as_str);
    let matches = |caller: &str, callee: &str, operation: &str| match label("service") {
        Some(service) => callee == service,
        None => {
            label("caller") == Some(caller)
                && label("callee") == Some(callee)
                && label("operation").is_none_or(|op| op == operation)
        }
    };
    report
        .findings
        .iter()
        .filter(|f| matches(&f.caller, &f.callee, &f.operation))
        .find_map(|f| f.example_trace_id.clone())
        .or_else(|| {
            report
                .orphans
                .iter()
                .find(|o| matches(&o.caller, &o.callee, &o.operation))
                .map(|o| o.trace_id.clone())
        })
}

/// One alert in Alertmanager's v2 API (`postableAlert`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostableAlert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub starts_at: String,
    pub ends_at: String,
    #[serde(rename = "generatorURL")]
    pub generator_url: String,
}

/// What a webhook receives: Alertmanager's webhook shape, reduced to what stormglass knows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WebhookPayload {
    pub version: String,
    pub receiver: String,
    /// `firing` if any alert in this notification fires, else `resolved`.
    pub status: String,
    pub alerts: Vec<WebhookAlert>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAlert {
    pub status: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub starts_at: String,
    pub ends_at: String,
    pub value: f64,
}

#[derive(Clone)]
struct NotifyMetrics {
    notifications: IntCounterVec,
    alerts: IntGaugeVec,
}

/// The built-in evaluator: an [`IntervalObserver`] of the live analysis.
pub struct AlertEvaluator {
    config: NotifyConfig,
    thresholds: AlertThresholds,
    /// How long a firing alert stays valid in Alertmanager without being re-sent.
    lifetime: Duration,
    generator_url: Mutex<String>,
    /// Where runbook links point: `alerts.runbook_base`, else the API's `/runbooks`.
    runbook_base: Mutex<String>,
    /// `links.trace_url`: a trace's page, `{trace_id}` replaced.
    trace_url: Mutex<Option<String>>,
    poster: Poster,
    active: Mutex<BTreeMap<AlertKey, Active>>,
    metrics: NotifyMetrics,
    /// Notifications being sent, so shutdown can wait for them.
    in_flight: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl AlertEvaluator {
    /// `interval` is the analysis interval: alerts are evaluated (and re-sent) that often.
    pub fn register(
        registry: &Registry,
        config: NotifyConfig,
        thresholds: AlertThresholds,
        interval: Duration,
    ) -> Result<Arc<Self>, NotifyError> {
        let notifications = IntCounterVec::new(
            Opts::new(
                "stormglass_alert_notifications_total",
                "Alert notifications posted by the built-in evaluator, by receiver type and result.",
            ),
            &["receiver", "result"],
        )?;
        let alerts = IntGaugeVec::new(
            Opts::new(
                "stormglass_alerts",
                "Alerts of the built-in evaluator, by state (pending, firing).",
            ),
            &["state"],
        )?;
        registry.register(Box::new(notifications.clone()))?;
        registry.register(Box::new(alerts.clone()))?;
        for state in ["pending", "firing"] {
            alerts.with_label_values(&[state]).set(0);
        }
        // At 0 from the start: StormglassNotificationsFailing's increase() sees a first
        // failed notification (a series that appears at 1 is not an increase).
        for receiver in ["alertmanager", "webhook"] {
            for result in ["sent", "retried", "failed"] {
                notifications.with_label_values(&[receiver, result]);
            }
        }
        // The drift baseline, so Prometheus' StormglassLatencyDrift compares with the same
        // values as this evaluator.
        let baseline = GaugeVec::new(
            Opts::new(
                "stormglass_layer_latency_p999_baseline_seconds",
                "The P99.9 layer latency of the alerts.baseline report, what StormglassLatencyDrift compares with.",
            ),
            &["service"],
        )?;
        registry.register(Box::new(baseline.clone()))?;
        for (service, ms) in &thresholds.baseline_p999_ms {
            baseline.with_label_values(&[service]).set(ms / 1e3);
        }
        // The thresholds, so dashboards draw the lines this configuration (and the rules
        // `stormglass rules` renders from it) alert at, not numbers of their own.
        let threshold = GaugeVec::new(
            Opts::new(
                "stormglass_alert_threshold",
                "The configured threshold of each alert (alerts.*), in the unit of the alert's value.",
            ),
            &["alert"],
        )?;
        registry.register(Box::new(threshold.clone()))?;
        for d in stormglass_analytics::alerts::DEFINITIONS {
            threshold
                .with_label_values(&[d.name])
                .set((d.threshold)(&thresholds));
        }
        let poster = Poster::new(&config)?;
        let runbook_base = config.runbook_base.clone();
        Ok(Arc::new(AlertEvaluator {
            lifetime: 4 * config.resend_interval.max(interval),
            config,
            thresholds,
            generator_url: Mutex::new(String::new()),
            runbook_base: Mutex::new(runbook_base),
            trace_url: Mutex::new(None),
            poster,
            active: Mutex::new(BTreeMap::new()),
            metrics: NotifyMetrics {
                notifications,
                alerts,
            },
            in_flight: Mutex::new(Vec::new()),
        }))
    }

    /// The URL alerts link back to (the API's alert list), known once the API is bound.
    /// The API's base URL (`http://host:port`), known once it is bound: alerts link back to
    /// its alert list, and to its `/runbooks` unless `alerts.runbook_base` says otherwise.
    pub fn set_api_url(&self, base: &str) {
        *self.generator_url.lock().unwrap_or_else(|p| p.into_inner()) =
            format!("{base}/api/v1/alerts");
        if self.config.runbook_base.is_empty() {
            *self.runbook_base.lock().unwrap_or_else(|p| p.into_inner()) =
                format!("{base}/runbooks");
        }
    }

    /// `links.trace_url`: alerts carry a link to an example trace of their edge or service.
    pub fn set_trace_url(&self, template: Option<String>) {
        *self.trace_url.lock().unwrap_or_else(|p| p.into_inner()) = template;
    }

    fn trace_url(&self, a: &Active) -> Option<String> {
        let template = self.trace_url.lock().unwrap_or_else(|p| p.into_inner());
        Some(
            template
                .as_ref()?
                .replace("{trace_id}", a.example_trace.as_ref()?),
        )
    }

    fn runbook_url(&self, d: &AlertDefinition) -> String {
        let base = self.runbook_base.lock().unwrap_or_else(|p| p.into_inner());
        runbook_url(&base, &d.runbook_anchor())
    }

    /// Pending and firing alerts, firing first.
    pub fn alerts(&self) -> Vec<AlertStatus> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<AlertStatus> = active.values().map(|a| self.status(a)).collect();
        out.sort_by_key(|a| a.state != "firing");
        out
    }

    fn status(&self, a: &Active) -> AlertStatus {
        let d = a.definition;
        let (summary, description) =
            d.texts(&a.labels, a.value, a.detail.as_deref(), &self.thresholds);
        AlertStatus {
            name: d.name.to_owned(),
            severity: d.severity.to_owned(),
            state: if a.firing_since.is_some() {
                "firing"
            } else {
                "pending"
            },
            labels: a.labels.clone(),
            value: a.value,
            active_since: rfc3339(a.active_since),
            firing_since: a.firing_since.map(rfc3339),
            summary,
            description,
            runbook_url: self.runbook_url(d),
            trace_url: self.trace_url(a),
        }
    }

    /// Step the alerts to the conditions holding on `report` at `now`; returns the
    /// notifications due (firing, then resolved), already marked as sent.
    pub fn evaluate(&self, report: &Report, now: SystemTime) -> Vec<WebhookAlert> {
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        let mut due = Vec::new();
        let mut holding = std::collections::BTreeSet::new();
        for alert in &report.alerts {
            let Some(d) = definition(&alert.name) else {
                continue;
            };
            let key = (alert.name.clone(), alert.labels.clone());
            holding.insert(key.clone());
            let a = active.entry(key).or_insert_with(|| Active {
                definition: d,
                labels: alert.labels.clone(),
                value: alert.value,
                detail: alert.detail.clone(),
                active_since: now,
                firing_since: None,
                last_sent: None,
                example_trace: None,
            });
            a.value = alert.value;
            a.detail.clone_from(&alert.detail);
            if let Some(trace) = example_trace(report, &alert.labels) {
                a.example_trace = Some(trace);
            }
            let held = now.duration_since(a.active_since).unwrap_or_default();
            if a.firing_since.is_none() && held >= self.thresholds.hold(d) {
                a.firing_since = Some(now);
                tracing::warn!(alert = d.name, labels = ?a.labels, value = a.value, "alert firing");
            }
            let resend_due = a.last_sent.is_none_or(|sent| {
                now.duration_since(sent).unwrap_or_default() >= self.config.resend_interval
            });
            if a.firing_since.is_some() && resend_due {
                a.last_sent = Some(now);
                due.push(self.notification(a, "firing", now + self.lifetime));
            }
        }
        let ended: Vec<_> = active
            .keys()
            .filter(|k| !holding.contains(*k))
            .cloned()
            .collect();
        for key in ended {
            if let Some(a) = active.remove(&key)
                && a.firing_since.is_some()
            {
                tracing::info!(alert = a.definition.name, labels = ?a.labels, "alert resolved");
                due.push(self.notification(&a, "resolved", now));
            }
        }
        let firing = active.values().filter(|a| a.firing_since.is_some()).count();
        self.metrics
            .alerts
            .with_label_values(&["firing"])
            .set(firing as i64);
        self.metrics
            .alerts
            .with_label_values(&["pending"])
            .set((active.len() - firing) as i64);
        due
    }

    fn notification(&self, a: &Active, status: &str, ends_at: SystemTime) -> WebhookAlert {
        let d = a.definition;
        let mut labels = self.config.labels.clone();
        labels.extend(a.labels.clone());
        labels.insert("alertname".into(), d.name.into());
        labels.insert("severity".into(), d.severity.into());
        let (summary, description) =
            d.texts(&a.labels, a.value, a.detail.as_deref(), &self.thresholds);
        let annotations = [
            ("summary", summary),
            ("description", description),
            ("runbook_url", self.runbook_url(d)),
        ]
        .into_iter()
        .chain(self.trace_url(a).map(|url| ("trace_url", url)))
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        WebhookAlert {
            status: status.to_owned(),
            labels,
            annotations,
            starts_at: rfc3339(a.firing_since.unwrap_or(a.active_since)),
            ends_at: rfc3339(ends_at),
            value: a.value,
        }
    }

    /// Post `due` to every receiver, on a spawned task.
    fn send(&self, due: Vec<WebhookAlert>) {
        if due.is_empty()
            || (self.config.alertmanagers.is_empty() && self.config.webhooks.is_empty())
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!("alert notifications need a tokio runtime; not sent");
            return;
        };
        let generator_url = self
            .generator_url
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let postable: Vec<PostableAlert> = due
            .iter()
            .map(|a| PostableAlert {
                labels: a.labels.clone(),
                annotations: a.annotations.clone(),
                starts_at: a.starts_at.clone(),
                ends_at: a.ends_at.clone(),
                generator_url: generator_url.clone(),
            })
            .collect();
        let webhook = WebhookPayload {
            version: "1".into(),
            receiver: "stormglass".into(),
            status: if due.iter().any(|a| a.status == "firing") {
                "firing".into()
            } else {
                "resolved".into()
            },
            alerts: due,
        };
        let mut posts = Vec::new();
        for base in &self.config.alertmanagers {
            let url = format!("{}/api/v2/alerts", base.trim_end_matches('/'));
            posts.push(("alertmanager", url, serde_json::to_vec(&postable)));
        }
        for url in &self.config.webhooks {
            posts.push(("webhook", url.clone(), serde_json::to_vec(&webhook)));
        }
        for (receiver, url, body) in posts {
            let body = match body {
                Ok(body) => bytes::Bytes::from(body),
                Err(e) => unreachable!("alerts serialise to JSON: {e}"),
            };
            let poster = self.poster.clone();
            let retries = self.config.retries;
            let counter = self.metrics.notifications.clone();
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            in_flight.retain(|task| !task.is_finished());
            in_flight.push(runtime.spawn(async move {
                let mut backoff = FIRST_BACKOFF;
                for attempt in 0..=retries {
                    match poster.post_json(&url, body.clone()).await {
                        Ok(()) => {
                            counter.with_label_values(&[receiver, "sent"]).inc();
                            return;
                        }
                        Err(error) if attempt < retries && error.may_pass() => {
                            counter.with_label_values(&[receiver, "retried"]).inc();
                            tracing::debug!(receiver, url, %error, ?backoff, "alert notification failed; retrying");
                            tokio::time::sleep(backoff).await;
                            backoff *= 2;
                        }
                        Err(error) => {
                            counter.with_label_values(&[receiver, "failed"]).inc();
                            tracing::warn!(receiver, url, %error, "alert notification failed");
                            return;
                        }
                    }
                }
            }));
        }
    }
}

impl AlertEvaluator {
    /// Resolve every firing alert (stormglass stops evaluating them) and send the
    /// resolved notifications.
    pub fn resolve_all(&self, now: SystemTime) {
        let ended: Vec<Active> = {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *active).into_values().collect()
        };
        let due: Vec<WebhookAlert> = ended
            .iter()
            .filter(|a| a.firing_since.is_some())
            .map(|a| {
                tracing::info!(alert = a.definition.name, labels = ?a.labels, "alert resolved at shutdown");
                self.notification(a, "resolved", now)
            })
            .collect();
        for state in ["firing", "pending"] {
            self.metrics.alerts.with_label_values(&[state]).set(0);
        }
        self.send(due);
    }

    /// Wait for the notifications being sent, each bounded by `alerts.send_timeout`.
    pub async fn finish_sending(&self) {
        let tasks = std::mem::take(&mut *self.in_flight.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl IntervalObserver for AlertEvaluator {
    /// Without a report (its build failed) the alerts stay as they are: not resolved for
    /// want of a figure, nor re-sent.
    fn interval(&self, _counts: &IntervalCounts, report: Option<&Arc<Report>>, now: SystemTime) {
        if let Some(report) = report {
            let due = self.evaluate(report, now);
            self.send(due);
        }
    }

    fn shutdown(&self, now: SystemTime) {
        self.resolve_all(now);
    }

    /// Alerts that held before the restart fire again from the rebuilt window.
    fn restored(&self, report: &Arc<Report>, now: SystemTime) {
        let due = self.evaluate(report, now);
        self.send(due);
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
