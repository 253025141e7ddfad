//! The built-in evaluator against a real HTTP receiver on loopback standing in for
//! Alertmanager's v2 API and a webhook: `for:` is honoured, firing alerts are re-sent every
//! resend interval, resolved alerts are sent once, and payloads carry labels, texts and
//! runbook links.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::Uri;
use axum::routing::post;
use prometheus::Registry;
use serde_json::Value;
use stormglass_analytics::alerts::AlertThresholds;
use stormglass_analytics::counts::IntervalCounts;
use stormglass_analytics::report::{Finding, Orphan};
use stormglass_analytics::{Alert, IntervalObserver, Report};
use stormglass_export::notify::{AlertEvaluator, NotifyConfig};

type Received = Arc<Mutex<Vec<(String, Value)>>>;

/// An HTTP server on a free loopback port recording every POST (path, JSON body).
async fn receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let app = Router::new()
        .route(
            "/{*path}",
            post(
                |State(r): State<Received>, uri: Uri, body: String| async move {
                    r.lock()
                        .unwrap()
                        .push((uri.path().to_owned(), serde_json::from_str(&body).unwrap()));
                    "ok"
                },
            ),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), received)
}

/// Wait (bounded) until `n` requests arrived; returns them and clears the list.
async fn take(received: &Received, n: usize) -> Vec<(String, Value)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        {
            let mut r = received.lock().unwrap();
            if r.len() >= n {
                return std::mem::take(&mut *r);
            }
        }
        assert!(Instant::now() < deadline, "only {received:?} arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An evaluator with the default thresholds and a 10 s interval.
fn evaluator(config: NotifyConfig) -> Arc<AlertEvaluator> {
    evaluator_in(&Registry::new(), config)
}

fn evaluator_in(registry: &Registry, config: NotifyConfig) -> Arc<AlertEvaluator> {
    AlertEvaluator::register(
        registry,
        config,
        AlertThresholds::default(),
        Duration::from_secs(10),
    )
    .unwrap()
}

/// `stormglass_alert_notifications_total{result}`, summed over receivers.
fn notifications(registry: &Registry, result: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == "stormglass_alert_notifications_total")
        .flat_map(|f| f.get_metric().to_vec())
        .filter(|m| m.get_label().iter().any(|l| l.value() == result))
        .map(|m| m.get_counter().get_value())
        .sum::<f64>()
}

fn report_with(alerts: Vec<Alert>) -> Arc<Report> {
    Arc::new(Report {
        alerts,
        ..Report::default()
    })
}

fn amplification(value: f64) -> Alert {
    Alert {
        name: "StormglassRetryAmplificationHigh".into(),
        severity: "critical".into(),
        labels: BTreeMap::from([("service".to_owned(), "db".to_owned())]),
        value,
        detail: None,
    }
}

fn counts() -> IntervalCounts {
    IntervalCounts::default()
}

/// Pending for `for: 2m`, then firing to Alertmanager and the webhook; re-sent after the
/// resend interval, not before; unchanged by an interval whose report failed to build;
/// resolved once when the condition stops holding.
#[tokio::test]
async fn for_resend_and_resolve() {
    let (url, received) = receiver().await;
    let config = NotifyConfig {
        alertmanagers: vec![url.clone()],
        webhooks: vec![format!("{url}/hook")],
        resend_interval: Duration::from_secs(60),
        labels: BTreeMap::from([("source".to_owned(), "stormglass".to_owned())]),
        ..NotifyConfig::default()
    };
    let evaluator = evaluator(config);
    evaluator.set_api_url("http://127.0.0.1:9464");
    let t0 = SystemTime::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let storm = report_with(vec![amplification(27.0)]);

    evaluator.interval(&counts(), Some(&storm), at(0));
    evaluator.interval(&counts(), Some(&storm), at(110));
    let listed = evaluator.alerts();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, "pending");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(received.lock().unwrap().is_empty(), "sent before for: 2m");

    evaluator.interval(&counts(), Some(&storm), at(120));
    assert_eq!(evaluator.alerts()[0].state, "firing");
    let mut sent = take(&received, 2).await;
    sent.sort_by(|a, b| a.0.cmp(&b.0));
    let (path, body) = &sent[0];
    assert_eq!(path, "/api/v2/alerts");
    let alert = &body[0];
    assert_eq!(
        alert["labels"]["alertname"],
        "StormglassRetryAmplificationHigh"
    );
    assert_eq!(alert["labels"]["severity"], "critical");
    assert_eq!(alert["labels"]["service"], "db");
    assert_eq!(alert["labels"]["source"], "stormglass");
    assert_eq!(
        alert["annotations"]["summary"],
        "db receives 27x the attempts it would without retries"
    );
    assert!(
        alert["annotations"]["runbook_url"].as_str().unwrap()
            == "http://127.0.0.1:9464/runbooks#stormglassretryamplificationhigh"
    );
    assert_eq!(alert["generatorURL"], "http://127.0.0.1:9464/api/v1/alerts");
    let ends: SystemTime = humantime::parse_rfc3339(alert["endsAt"].as_str().unwrap()).unwrap();
    assert!(ends > at(120), "a firing alert ends in the future");
    let (path, hook) = &sent[1];
    assert_eq!(path, "/hook");
    assert_eq!(hook["status"], "firing");
    assert_eq!(hook["alerts"][0]["value"], 27.0);

    // Still firing 30 s later: not re-sent yet; 60 s after the last send: re-sent.
    evaluator.interval(&counts(), Some(&storm), at(150));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(received.lock().unwrap().is_empty(), "re-sent too early");
    evaluator.interval(&counts(), Some(&storm), at(180));
    take(&received, 2).await;
    evaluator.interval(&counts(), None, at(185));
    assert_eq!(evaluator.alerts()[0].state, "firing");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        received.lock().unwrap().is_empty(),
        "nothing sent without a report"
    );

    // The condition stops holding: resolved once, with endsAt = now, then nothing.
    let calm = report_with(Vec::new());
    evaluator.interval(&counts(), Some(&calm), at(190));
    let sent = take(&received, 2).await;
    let (_, body) = sent.iter().find(|(p, _)| p == "/api/v2/alerts").unwrap();
    let ends: SystemTime = humantime::parse_rfc3339(body[0]["endsAt"].as_str().unwrap()).unwrap();
    assert_eq!(
        ends,
        humantime::parse_rfc3339(&humantime::format_rfc3339_millis(at(190)).to_string()).unwrap()
    );
    let (_, hook) = sent.iter().find(|(p, _)| p == "/hook").unwrap();
    assert_eq!(hook["status"], "resolved");
    assert!(evaluator.alerts().is_empty());
    evaluator.interval(&counts(), Some(&calm), at(300));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(received.lock().unwrap().is_empty());
}

/// A condition that stops holding before its `for:` never notifies; a receiver that is down
/// is counted as a failed notification, not an error of the analysis.
#[tokio::test]
async fn short_blips_and_dead_receivers() {
    let (url, received) = receiver().await;
    let registry = Registry::new();
    let config = NotifyConfig {
        alertmanagers: vec![url, "http://127.0.0.1:1".into()],
        ..NotifyConfig::default()
    };
    let evaluator = evaluator_in(&registry, config);
    let t0 = SystemTime::now();
    evaluator.interval(&counts(), Some(&report_with(vec![amplification(3.0)])), t0);
    evaluator.interval(
        &counts(),
        Some(&report_with(Vec::new())),
        t0 + Duration::from_secs(60),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(received.lock().unwrap().is_empty());

    // StormglassUnsafeRetries has for: 1m.
    let unsafe_retry = Alert {
        name: "StormglassUnsafeRetries".into(),
        severity: "critical".into(),
        labels: BTreeMap::from([
            ("caller".to_owned(), "a".to_owned()),
            ("callee".to_owned(), "b".to_owned()),
            ("operation".to_owned(), "POST /orders".to_owned()),
        ]),
        value: 1.0,
        detail: None,
    };
    let report = report_with(vec![unsafe_retry]);
    evaluator.interval(&counts(), Some(&report), t0 + Duration::from_secs(100));
    evaluator.interval(&counts(), Some(&report), t0 + Duration::from_secs(160));
    take(&received, 1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while notifications(&registry, "failed") < 1.0 {
        assert!(Instant::now() < deadline, "the failed send was not counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// At shutdown every firing alert is sent once as resolved (endsAt = now), a pending one is
/// dropped silently, and shutdown can wait until the notifications are out.
#[tokio::test]
async fn shutdown_resolves_firing_alerts() {
    let (url, received) = receiver().await;
    let config = NotifyConfig {
        webhooks: vec![format!("{url}/hook")],
        ..NotifyConfig::default()
    };
    let evaluator = evaluator(config);
    let t0 = SystemTime::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    evaluator.interval(
        &counts(),
        Some(&report_with(vec![amplification(27.0)])),
        at(0),
    );
    evaluator.interval(
        &counts(),
        Some(&report_with(vec![amplification(27.0)])),
        at(120),
    );
    take(&received, 1).await;
    evaluator.shutdown(at(130));
    evaluator.finish_sending().await;
    let sent = received.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "sent before finish_sending returned");
    assert_eq!(sent[0].1["status"], "resolved");
    assert!(evaluator.alerts().is_empty());
}

/// Alerts go to an `https://` webhook whose certificate a private CA signed (`alerts.ca_file`)
/// with the configured bearer token or basic auth; a 503 is retried after a backoff and
/// the retry is counted; a 401 is not retried.
#[tokio::test]
async fn https_receivers_with_auth_and_retries() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use stormglass_runtime::{Secret, Tls, TlsConfig};

    let scratch = tempfile::Builder::new()
        .prefix("stormglass-notify-tls-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    for (name, text) in [
        ("ca.pem", ca.pem()),
        ("server.pem", cert.pem()),
        ("server.key", key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let tls = Tls::from_config(
        &TlsConfig {
            cert_file: Some(dir.join("server.pem")),
            key_file: Some(dir.join("server.key")),
            client_ca_file: None,
        },
        &Registry::new(),
    )
    .unwrap()
    .unwrap();

    // Answers 503 to the first request, 401 to a wrong token, 200 otherwise; records the
    // authorization header of each.
    type Seen = Arc<Mutex<Vec<String>>>;
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/hook",
            post(
                |State(seen): State<Seen>, headers: axum::http::HeaderMap| async move {
                    let auth = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    let mut seen = seen.lock().unwrap();
                    seen.push(auth.clone());
                    if seen.len() == 1 {
                        axum::http::StatusCode::SERVICE_UNAVAILABLE
                    } else if auth.contains("wrong") {
                        axum::http::StatusCode::UNAUTHORIZED
                    } else {
                        axum::http::StatusCode::OK
                    }
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/hook", listener.local_addr().unwrap());
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let listener = tls.listen(listener, "test", shutdown).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let fire = |config: NotifyConfig| {
        let registry = Registry::new();
        let evaluator = evaluator_in(&registry, config);
        let t0 = SystemTime::now();
        let report = report_with(vec![amplification(3.0)]);
        evaluator.interval(&counts(), Some(&report), t0);
        evaluator.interval(&counts(), Some(&report), t0 + Duration::from_secs(130));
        (registry, evaluator)
    };
    let base = NotifyConfig {
        webhooks: vec![url],
        ca_file: Some(dir.join("ca.pem")),
        ..NotifyConfig::default()
    };

    let (registry, evaluator) = fire(NotifyConfig {
        bearer_token: Some(Secret::new("s3cret")),
        ..base.clone()
    });
    evaluator.finish_sending().await;
    assert_eq!(notifications(&registry, "retried"), 1.0);
    assert_eq!(notifications(&registry, "sent"), 1.0);
    assert_eq!(
        std::mem::take(&mut *seen.lock().unwrap()),
        ["Bearer s3cret", "Bearer s3cret"]
    );

    let (registry, evaluator) = fire(NotifyConfig {
        basic_auth: Some(stormglass_export::notify::BasicAuth {
            username: "am".into(),
            password: Secret::new("pw"),
        }),
        ..base.clone()
    });
    evaluator.finish_sending().await;
    assert_eq!(notifications(&registry, "sent"), 1.0);
    // "am:pw" in base64.
    assert_eq!(seen.lock().unwrap().last().unwrap(), "Basic YW06cHc=");

    let (registry, evaluator) = fire(NotifyConfig {
        bearer_token: Some(Secret::new("wrong")),
        ..base
    });
    evaluator.finish_sending().await;
    assert_eq!(
        notifications(&registry, "failed"),
        1.0,
        "a 401 fails at once"
    );
    assert_eq!(notifications(&registry, "retried"), 0.0);
}

/// With `links.trace_url`, a firing alert links to an example trace of its subject: a
/// finding's example for an edge, an orphan pair into the layer for a service; without an
/// example, or without the template, there is no link.
#[tokio::test]
async fn alerts_link_to_an_example_trace() {
    let evaluator = evaluator(NotifyConfig::default());
    evaluator.set_trace_url(Some("http://tempo:3200/trace/{trace_id}".into()));
    let unsafe_retries = Alert {
        name: "StormglassUnsafeRetries".into(),
        severity: "critical".into(),
        labels: BTreeMap::from([
            ("caller".to_owned(), "cart".to_owned()),
            ("callee".to_owned(), "orders".to_owned()),
            ("operation".to_owned(), "POST /orders".to_owned()),
        ]),
        value: 2.0,
        detail: None,
    };
    let mut report = Report {
        alerts: vec![unsafe_retries, amplification(27.0)],
        ..Report::default()
    };
    report.findings.push(Finding {
        kind: "unsafe_retry".into(),
        severity: "critical".into(),
        caller: "cart".into(),
        callee: "orders".into(),
        operation: "POST /orders".into(),
        count: 2,
        detail: None,
        example_trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
    });
    let t0 = SystemTime::now();
    evaluator.evaluate(&report, t0);
    let fired = evaluator.evaluate(&report, t0 + Duration::from_secs(180));
    let link = |name: &str| {
        fired
            .iter()
            .find(|a| a.labels["alertname"] == name)
            .map(|a| a.annotations.get("trace_url").cloned())
            .unwrap_or_else(|| panic!("{name} did not fire: {fired:?}"))
    };
    assert_eq!(
        link("StormglassUnsafeRetries").as_deref(),
        Some("http://tempo:3200/trace/4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(
        link("StormglassRetryAmplificationHigh"),
        None,
        "no example into db"
    );
    let listed = evaluator.alerts();
    assert!(listed.iter().any(|a| a.trace_url.is_some()), "{listed:?}");

    report.orphans.push(Orphan {
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        caller: "inventory".into(),
        callee: "db".into(),
        operation: "SELECT".into(),
        work_after_cancel_ms: Some(120.0),
        server_outcome: "ok".into(),
    });
    evaluator.set_trace_url(None);
    let quiet = evaluator.evaluate(&report, t0 + Duration::from_secs(400));
    assert!(
        quiet
            .iter()
            .all(|a| !a.annotations.contains_key("trace_url"))
    );
    evaluator.set_trace_url(Some("http://tempo:3200/trace/{trace_id}".into()));
    let fired = evaluator.evaluate(&report, t0 + Duration::from_secs(600));
    assert_eq!(
        link_of(&fired, "StormglassRetryAmplificationHigh").as_deref(),
        Some("http://tempo:3200/trace/0af7651916cd43dd8448eb211c80319c")
    );
}

fn link_of(fired: &[stormglass_export::notify::WebhookAlert], name: &str) -> Option<String> {
    fired
        .iter()
        .find(|a| a.labels["alertname"] == name)
        .and_then(|a| a.annotations.get("trace_url").cloned())
}

/// The configured thresholds are exported, one series per alert, for the dashboards'
/// threshold lines: a changed threshold moves the line.
#[test]
fn thresholds_are_exported_from_the_configuration() {
    let registry = Registry::new();
    let thresholds = AlertThresholds {
        amplification: 3.0,
        ..AlertThresholds::default()
    };
    AlertEvaluator::register(
        &registry,
        NotifyConfig::default(),
        thresholds,
        Duration::from_secs(10),
    )
    .unwrap();
    let exported: BTreeMap<String, f64> = registry
        .gather()
        .iter()
        .filter(|f| f.name() == "stormglass_alert_threshold")
        .flat_map(|f| f.get_metric().to_vec())
        .map(|m| {
            (
                m.get_label()[0].value().to_owned(),
                m.get_gauge().get_value(),
            )
        })
        .collect();
    assert_eq!(
        exported.len(),
        stormglass_analytics::alerts::DEFINITIONS.len()
    );
    assert_eq!(exported["StormglassRetryAmplificationHigh"], 3.0);
    assert_eq!(exported["StormglassRetriesFailing"], 0.7);
}
