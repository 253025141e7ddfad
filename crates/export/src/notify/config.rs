//! `alerts.*`'s receiver half: where notifications go, how they authenticate, and what
//! setting them up can fail with.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use stormglass_runtime::Secret;
use stormglass_runtime::duration;

/// `alerts.basic_auth`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    pub password: Secret,
}

/// The receiver half of the `alerts.*` section (the thresholds are the other half).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// Alertmanager base URLs (`http://host:9093`); alerts go to `<url>/api/v2/alerts`.
    #[serde(deserialize_with = "urls")]
    pub alertmanagers: Vec<String>,
    /// URLs that receive a JSON document per notification (see
    /// [`WebhookPayload`](super::WebhookPayload)).
    #[serde(deserialize_with = "urls")]
    pub webhooks: Vec<String>,
    /// How often firing alerts are re-sent.
    #[serde(with = "duration")]
    pub resend_interval: Duration,
    /// Bound on one HTTP request to a receiver.
    #[serde(with = "duration")]
    pub send_timeout: Duration,
    /// Labels added to every alert stormglass sends (like Prometheus' external_labels).
    pub labels: BTreeMap<String, String>,
    /// Base of the runbook links; empty: this instance's own `/runbooks` page.
    pub runbook_base: String,
    /// PEM CA certificates trusted for `https://` receivers, beside the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Bearer token sent to every receiver.
    pub bearer_token: Option<Secret>,
    /// Basic auth sent to every receiver (not with `bearer_token`).
    pub basic_auth: Option<BasicAuth>,
    /// Retries of a notification that failed in a way that may pass.
    pub retries: u32,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            alertmanagers: Vec::new(),
            webhooks: Vec::new(),
            resend_interval: Duration::from_secs(60),
            send_timeout: Duration::from_secs(10),
            labels: BTreeMap::new(),
            runbook_base: String::new(),
            ca_file: None,
            bearer_token: None,
            basic_auth: None,
            retries: 3,
        }
    }
}

impl NotifyConfig {
    /// The keys of `alerts.*` that belong to this struct (the rest are thresholds).
    pub const KEYS: [&'static str; 10] = [
        "alertmanagers",
        "webhooks",
        "resend_interval",
        "send_timeout",
        "labels",
        "runbook_base",
        "ca_file",
        "bearer_token",
        "basic_auth",
        "retries",
    ];

    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        for (key, urls) in [
            ("alertmanagers", &self.alertmanagers),
            ("webhooks", &self.webhooks),
        ] {
            for (i, url) in urls.iter().enumerate() {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    problems.push((
                        format!("{prefix}.{key}.{i}"),
                        format!("{url:?} must be an http:// or https:// URL"),
                    ));
                }
            }
        }
        for (key, value) in [
            ("resend_interval", self.resend_interval),
            ("send_timeout", self.send_timeout),
        ] {
            if value.is_zero() {
                problems.push((
                    format!("{prefix}.{key}"),
                    "must be greater than 0 (e.g. 1m)".into(),
                ));
            }
        }
        if self.bearer_token.is_some() && self.basic_auth.is_some() {
            problems.push((
                format!("{prefix}.basic_auth"),
                "set alerts.bearer_token or alerts.basic_auth, not both".into(),
            ));
        }
        if self.retries > 10 {
            problems.push((
                format!("{prefix}.retries"),
                "must be at most 10 (default 3)".into(),
            ));
        }
        problems
    }
}

/// A list of URLs, or one string of comma-separated URLs (as an environment variable
/// writes it: `STORMGLASS_ALERTS__ALERTMANAGERS=http://a:9093,http://b:9093`).
fn urls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Urls {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Urls::deserialize(d)? {
        Urls::List(list) => list,
        Urls::Text(text) => text
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

/// Registering the evaluator failed.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("cannot register the alert metrics")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot set up TLS for alert receivers: {0}")]
    Tls(String),
    #[error(
        "alerts.bearer_token or alerts.basic_auth holds characters an HTTP header cannot carry"
    )]
    Credentials,
}
