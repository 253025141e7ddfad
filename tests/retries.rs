//! End-to-end: retries that carry no attempt number, made by real client libraries under
//! the OpenTelemetry Python contrib instrumentations (tests/python/unnumbered_retries.py:
//! urllib3's Retry below `requests`, grpcio's retryPolicy, a tenacity loop, and gRPC from a
//! client that forwards the context but records no span), sent over OTLP/HTTP to
//! `stormglass serve`, give the true figures live, and the same offline from the server's
//! Parquet archive.
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
    report["edges"]
        .as_array()?
        .iter()
        .find(|e| e["caller"] == "shop" && e["callee"] == callee && e["operation"] == operation)
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

/// The report once every stack's calls are analysed.
fn complete_report(server: &Server) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = get(&format!("http://{}/api/v1/report", server.api));
        let report: Value = serde_json::from_str(&body).unwrap();
        let done = STACKS.iter().all(|(callee, operation, ..)| {
            edge(&report, callee, operation)
                .is_some_and(|e| e["attempts"].as_u64() >= Some(2 * CALLS))
        });
        if done {
            return report;
        }
        assert!(Instant::now() < deadline, "incomplete report: {report:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The four stacks through OTLP into `serve`: exact figures live, and the same from its
/// archive with `stormglass analyze`.
#[test]
fn unnumbered_retries_of_real_libraries_count() {
    let dir = common::temp_dir("unnumbered-retries");
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "300ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
        ("STORMGLASS_ARCHIVE__DIR", dir.to_str().unwrap()),
        ("STORMGLASS_ARCHIVE__FLUSH", "1s"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ]);
    let script =
        std::fs::read_to_string(common::repo_root().join("tests/python/unnumbered_retries.py"))
            .unwrap();
    let endpoint = format!("http://{}/v1/traces", server.http);
    let out = common::python(&script, &[&endpoint, &CALLS.to_string()]);
    assert_eq!(String::from_utf8_lossy(&out).trim(), "sent");

    let live = complete_report(&server);
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
