//! Every demo scenario, run briefly through the demo chain's real OpenTelemetry SDK exporters
//! (OTLP/gRPC and OTLP/HTTP) into a real `stormglass serve`, produces the figures and alert
//! conditions its failure mode must produce.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Server, get};
use stormglass_analytics::Report;
use stormglass_analytics::report::EdgeFigures;
use stormglass_demo::{Chain, Counts, Scenario};

/// Run `scenario` at `rate` requests/s for `seconds`, then wait until every request's trace
/// is in the report; returns the chain's own counts and the report.
fn run(scenario: Scenario, rate: f64, seconds: u64) -> (Counts, Report) {
    let (counts, report, _server) = run_on_server(scenario, rate, seconds, &[]);
    (counts, report)
}

/// [`run`] on a server with `env` added, keeping it running for the caller.
fn run_on_server(
    scenario: Scenario,
    rate: f64,
    seconds: u64,
    env: &[(&str, &str)],
) -> (Counts, Report, Server) {
    // Idle 3 s: a trace's spans come from four services' exporters, and gc-pause's paused
    // server spans end 1.4 s after the rest of their trace.
    let mut all = vec![
        ("STORMGLASS_ASSEMBLY__IDLE", "3s"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
    ];
    all.extend_from_slice(env);
    let server = Server::start(&all);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let counts = runtime.block_on(async {
        let chain = Chain::start(scenario, &server.grpc, &server.http)
            .await
            .unwrap();
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let counts = chain
            .run(rate, Duration::from_secs(seconds), 512, stopped)
            .await;
        chain.shutdown().await;
        counts
    });
    assert!(counts.requests > 0 && counts.skipped == 0, "{counts:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = get(&format!("http://{}/api/v1/report", server.api));
        let report: Report = serde_json::from_str(&body).unwrap();
        if report.window.traces >= counts.requests {
            assert_eq!(
                report.window.traces, counts.requests,
                "one trace per request"
            );
            let late = server.metric("stormglass_assembly_late_spans_total", &[]);
            assert_eq!(late, 0.0, "spans arrived after their trace was analysed");
            return (counts, report, server);
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} traces analysed",
            report.window.traces,
            counts.requests
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn edge<'r>(report: &'r Report, caller: &str, callee: &str) -> &'r EdgeFigures {
    report
        .edges
        .iter()
        .find(|e| e.caller == caller && e.callee == callee)
        .unwrap_or_else(|| panic!("no edge {caller} -> {callee} in {:#?}", report.edges))
}

fn holds(report: &Report, alert: &str, label: (&str, &str)) -> bool {
    report
        .alerts
        .iter()
        .any(|a| a.name == alert && a.labels.get(label.0).map(String::as_str) == Some(label.1))
}

fn finding_count(report: &Report, kind: &str) -> u64 {
    report
        .findings
        .iter()
        .filter(|f| f.kind == kind)
        .map(|f| f.count)
        .sum()
}

/// healthy: every request succeeds on its first attempt, nothing is amplified and no alert
/// condition holds. (Fewer than 100 calls per layer keep P99 = P99.9 = the maximum, so a
/// scheduling hiccup on a busy machine cannot fake a tail.)
#[test]
fn healthy_fires_nothing() {
    let (counts, report) = run(Scenario::Healthy, 15.0, 3);
    assert_eq!(counts.succeeded, counts.requests, "{counts:?}");
    assert!(report.alerts.is_empty(), "{:#?}", report.alerts);
    for layer in &report.layers {
        assert_eq!(layer.amplification, Some(1.0), "{layer:?}");
    }
    for e in &report.edges {
        assert_eq!(e.retry_attempts, 0, "{e:?}");
        assert_eq!(e.effective_success_rate, Some(1.0), "{e:?}");
    }
    // Nothing but the info that generous timeouts are far above what the chain needs.
    assert!(
        report
            .findings
            .iter()
            .all(|f| f.kind == "timeout_too_long" && f.severity == "info"),
        "{:#?}",
        report.findings
    );
    assert!(report.orphans.is_empty());
    // The gRPC hop is seen as one logical call per request, attempts and all.
    assert_eq!(
        edge(&report, "order", "inventory").logical_calls,
        counts.requests
    );
}

/// The storm's shape: 27 attempts at db per request, 9 at inventory, 3 at order, storm
/// potential 27 at the gateway, and StormglassRetryAmplificationHigh holding at db.
fn assert_storm(report: &Report) {
    for (service, expected) in [
        ("db", 27.0),
        ("inventory", 9.0),
        ("order", 3.0),
        ("gateway", 1.0),
    ] {
        let layer = report.layers.iter().find(|l| l.service == service).unwrap();
        assert_eq!(layer.amplification, Some(expected), "{:#?}", report.layers);
    }
    let entry = report
        .entries
        .iter()
        .find(|e| e.service == "gateway")
        .unwrap();
    assert_eq!(entry.storm_potential, 27.0);
    assert!(holds(
        report,
        "StormglassRetryAmplificationHigh",
        ("service", "db")
    ));
}

/// storm: the database stalls and each of three layers tries 3 times: exactly 27 attempts
/// reach the database per request (9 inventory, 3 order), storm potential 27, and
/// StormglassRetryAmplificationHigh holds.
#[test]
fn storm_amplifies_27x() {
    let (counts, report) = run(Scenario::Storm, 4.0, 3);
    assert_eq!(counts.failed, counts.requests);
    assert_storm(&report);
    assert_eq!(
        edge(&report, "inventory", "db").attempts,
        27 * counts.requests
    );
    assert!(holds(
        &report,
        "StormglassRetryStormPotential",
        ("service", "gateway")
    ));
    assert_eq!(report.traces.multi_layer_retry_traces, counts.requests);
}

/// hidden: the storm with gateway's and order's clients retrying below their tracing layer
/// (one CLIENT span per call, no attempt numbers): the callees' SERVER spans give the same
/// 3 / 9 / 27 amplification, storm potential and alert as `storm`, the attempts counted as
/// hidden.
#[test]
fn hidden_retries_show_the_storm() {
    let (counts, report) = run(Scenario::Hidden, 4.0, 3);
    assert_eq!(counts.failed, counts.requests);
    assert_storm(&report);
    let order = edge(&report, "gateway", "order");
    assert_eq!(order.attempts, 3 * counts.requests);
    assert_eq!(order.hidden_attempts, 3 * counts.requests);
    assert_eq!(order.logical_calls, counts.requests);
    let inventory = edge(&report, "order", "inventory");
    assert_eq!(inventory.hidden_attempts, 9 * counts.requests);
}

/// gc-pause: a 1.4 s pause of inventory against order's 25 ms timeout: inventory's P99.9
/// shows the pause, the timeout is below it, and the paused calls were retried for
/// `deadline`.
#[test]
fn gc_pause_puts_the_timeout_below_the_tail() {
    let (_, report) = run(Scenario::GcPause, 20.0, 5);
    let inventory = report
        .layers
        .iter()
        .find(|l| l.service == "inventory")
        .unwrap();
    assert!(inventory.p999_ms.unwrap() > 1000.0, "{inventory:?}");
    let e = edge(&report, "order", "inventory");
    assert_eq!(e.timeout_below_tail, Some(true), "{e:?}");
    assert!(
        e.retries_by_cause.get("deadline").copied().unwrap_or(0) > 0,
        "{e:?}"
    );
    assert!(holds(
        &report,
        "StormglassTimeoutBelowTail",
        ("callee", "inventory")
    ));
}

/// tail: 1 in 200 inventory calls takes 320 ms while order waits 200 ms: the timeout is
/// below P99.9 and the recommended timeout is P99.9 x 1.5.
#[test]
fn tail_timeout_below_p999() {
    let (_, report) = run(Scenario::Tail, 60.0, 5);
    let e = edge(&report, "order", "inventory");
    let timeout = e.timeout_ms.unwrap();
    assert!((timeout - 200.0).abs() <= 4.0, "{e:?}");
    let p999 = e.callee_p999_ms.unwrap();
    assert!(p999 >= 300.0, "{e:?}");
    assert_eq!(e.timeout_below_tail, Some(true));
    assert!((e.recommended_timeout_ms.unwrap() - 1.5 * p999).abs() < 1e-6);
    assert!(holds(
        &report,
        "StormglassTimeoutBelowTail",
        ("callee", "inventory")
    ));
}

/// budget: order has 800 ms and gives inventory 500 then payment 400 (overcommit); payment
/// drops the deadline (not propagated) and gives the database 900 ms (inversion): each
/// exactly once per request.
#[test]
fn budget_mistakes_counted_per_request() {
    let (counts, report) = run(Scenario::Budget, 15.0, 3);
    assert_eq!(
        finding_count(&report, "overcommit"),
        counts.requests,
        "{:#?}",
        report.findings
    );
    assert_eq!(finding_count(&report, "not_propagated"), counts.requests);
    assert_eq!(
        finding_count(&report, "deadline_inversion"),
        counts.requests
    );
    assert!(holds(
        &report,
        "StormglassDeadlineInversion",
        ("caller", "payment")
    ));
}

/// unsafe: every retry of POST /charge without an idempotency key is counted, exactly as
/// many as the chain sent.
#[test]
fn unsafe_retries_counted_exactly() {
    let (counts, report) = run(Scenario::Unsafe, 20.0, 4);
    assert!(counts.unsafe_retries > 0, "{counts:?}");
    assert_eq!(counts.unsafe_retries, counts.payment_unavailable);
    let e = edge(&report, "order", "payment");
    assert_eq!(e.unsafe_retries, counts.unsafe_retries, "{e:?}");
    assert_eq!(e.retry_attempts, counts.unsafe_retries);
    assert!(holds(
        &report,
        "StormglassUnsafeRetries",
        ("callee", "payment")
    ));
    // The gateway's retries carry a key: none of them is unsafe.
    assert_eq!(edge(&report, "gateway", "order").unsafe_retries, 0);
}

/// orphans: the gateway gives up on order after 150 ms, twice per request, while order
/// keeps working and succeeds: two orphan pairs per request, server outcome ok, with the
/// work after cancel summed.
#[test]
fn orphans_pair_every_abandoned_attempt() {
    let (counts, report) = run(Scenario::Orphans, 10.0, 3);
    let e = edge(&report, "gateway", "order");
    assert_eq!(e.orphan_pairs, 2 * counts.requests, "{e:?}");
    assert!(e.orphan_work_seconds > 0.1 * e.orphan_pairs as f64, "{e:?}");
    assert!(report.orphans.iter().all(|o| o.server_outcome == "ok"));
}

/// The built-in page (`GET /`) in a real headless Chromium, over the budget scenario: it
/// loads with no console error, failed request or script error, draws every service of the
/// report as a node and every edge, each coloured by its remaining budget against its
/// timeout as the legend says (the squeezed hop red), lists the alerts, and its what-if
/// control predicts a load for every layer. The screenshot is
/// kept in the target directory's test artifacts. Needs Debian's chromium and tests/js's
/// packages (tests/run.sh installs both).
#[test]
fn builtin_page_draws_the_budget_topology() {
    let (_, report, server) = run_on_server(
        Scenario::Budget,
        15.0,
        3,
        &[(
            "STORMGLASS_LINKS__TRACE_URL",
            "http://tempo:3200/trace/{trace_id}",
        )],
    );
    // Alerts hold once the window has enough traffic; the page lists what the API does.
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("builtin-page.png");
    let drawn = common::open_page(&format!("http://{}/", server.api), &screenshot);
    assert_eq!(drawn["errors"], serde_json::json!([]), "{drawn:#}");
    let mut services: Vec<&str> = report
        .edges
        .iter()
        .flat_map(|e| [e.caller.as_str(), e.callee.as_str()])
        .chain(report.layers.iter().map(|l| l.service.as_str()))
        .collect();
    services.sort_unstable();
    services.dedup();
    let mut nodes: Vec<&str> = drawn["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    nodes.sort_unstable();
    assert_eq!(nodes, services, "every service of the scenario is a node");
    // Every edge drawn, coloured from its figures; the report's edges may be drawn per
    // operation, so each (caller, callee, operation) is one path.
    assert_eq!(drawn["edges"].as_array().unwrap().len(), report.edges.len());
    let colour = |e: &EdgeFigures| match (e.remaining_budget_ms, e.timeout_ms) {
        (Some(left), Some(timeout)) if left < timeout => "#c62828",
        (Some(left), Some(timeout)) if left < 1.5 * timeout => "#ef8f00",
        (Some(_), Some(_)) => "#2e7d32",
        _ => "#9e9e9e",
    };
    let mut expected: Vec<(String, String, &str)> = report
        .edges
        .iter()
        .map(|e| (e.caller.clone(), e.callee.clone(), colour(e)))
        .collect();
    let mut got: Vec<(String, String, &str)> = drawn["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["caller"].as_str().unwrap().to_owned(),
                e["callee"].as_str().unwrap().to_owned(),
                e["stroke"].as_str().unwrap(),
            )
        })
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    assert!(
        got.iter().any(|(_, _, c)| *c == "#c62828"),
        "the budget scenario's squeezed hop is red: {got:?}"
    );
    assert!(drawn["alerts"].as_u64().unwrap() >= 1);
    // Each finding links to its example trace through links.trace_url.
    let links: Vec<&str> = drawn["trace_links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    // The advice panel lists the window's edges (and any budget it cannot fit in) and
    // its layers.
    let advised = drawn["advice"].as_array().unwrap();
    assert!(advised.len() >= report.edges.len(), "{drawn:#}");
    assert_eq!(drawn["advice_layers"], report.layers.len(), "{drawn:#}");
    // The what-if control answers for every layer of the window, none below 1.
    let whatif = drawn["whatif"].as_array().unwrap();
    assert_eq!(whatif.len(), report.layers.len(), "{drawn:#}");
    assert!(drawn["failed"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(
        whatif
            .iter()
            .all(|l| l["amplification"].as_f64().is_some_and(|a| a >= 1.0)),
        "{drawn:#}"
    );
    // Findings about an edge's settings (timeouts) have no example trace, and no link.
    let traced: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.example_trace_id.is_some())
        .collect();
    assert_eq!(links.len(), traced.len(), "{drawn:#}");
    for (link, finding) in links.iter().zip(traced) {
        let id = finding.example_trace_id.as_deref().unwrap();
        assert_eq!(*link, format!("http://tempo:3200/trace/{id}"));
    }
    assert!(screenshot.is_file());
    eprintln!("screenshot: {}", screenshot.display());
}
