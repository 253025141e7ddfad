//! End-to-end: `stormglass load` against the real collector over OTLP/gRPC and OTLP/HTTP,
//! its refusal accounting, and its Parquet output through `stormglass analyze`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Server, stormglass};
use serde_json::Value;

/// A short, small load run against `endpoint`, as JSON.
fn load(protocol: &str, endpoint: &str, pid: u32, extra: &[&str]) -> Value {
    let pid = pid.to_string();
    let mut args = vec![
        "load",
        "--protocol",
        protocol,
        "--endpoint",
        endpoint,
        "--duration",
        "1s",
        "--concurrency",
        "4",
        "--spans-per-request",
        "100",
        "--payloads",
        "3",
        "--pid",
        &pid,
        "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = stormglass(&args);
    assert!(ok, "load failed: {stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// Load over both transports is accepted in full, every send's traces are new to the
/// collector (no span is late, every span is released), and the server's CPU and memory
/// are read from /proc.
#[test]
fn load_over_grpc_and_http_is_fully_accounted() {
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "500ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
    ]);
    let mut accepted = 0.0;
    for (protocol, endpoint) in [("grpc", &server.grpc), ("http", &server.http)] {
        let report = load(protocol, endpoint, server.pid(), &[]);
        let spans = report["accepted_spans"].as_f64().unwrap();
        assert!(spans > 0.0, "{protocol}: {report}");
        for field in ["refused_spans", "rejected_spans", "failed_spans"] {
            assert_eq!(report[field], 0, "{protocol}: {report}");
        }
        let usage = &report["server"];
        assert!(usage["cpu_seconds"].as_f64().unwrap() > 0.0, "{report}");
        assert!(usage["rss_bytes"].as_u64().unwrap() > 0, "{report}");
        assert!(usage["peak_rss_bytes"].as_u64() >= usage["rss_bytes"].as_u64());
        accepted += spans;
    }
    assert_eq!(
        server.metric("stormglass_receiver_accepted_spans_total", &[]),
        accepted
    );
    server.wait_until("every accepted span released", |s| {
        s.metric("stormglass_assembly_released_spans_total", &[]) == accepted
    });
    assert_eq!(
        server.metric("stormglass_assembly_late_spans_total", &[]),
        0.0
    );
}

/// When the collector's memory bound refuses requests, the load generator counts their
/// spans as refused and the two sides agree on what was accepted.
#[test]
fn refusals_are_counted_not_hidden() {
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__MAX_SPANS", "1000"),
        ("STORMGLASS_ASSEMBLY__IDLE", "1h"),
        ("STORMGLASS_ASSEMBLY__MAX_AGE", "2h"),
    ]);
    let report = load("grpc", &server.grpc, server.pid(), &[]);
    let accepted = report["accepted_spans"].as_f64().unwrap();
    assert!(accepted > 0.0 && accepted <= 1000.0, "{report}");
    assert!(report["refused_spans"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        report["first_error"]
            .as_str()
            .unwrap()
            .contains("navailable"),
        "{report}"
    );
    assert_eq!(
        server.metric("stormglass_receiver_accepted_spans_total", &[]),
        accepted
    );
}

/// The synthetic traces written as Parquet analyse into the shape they were generated
/// with: a gateway -> orders -> inventory -> pricing chain where ~10% of calls are retried
/// once, with backoff, after a failure, and every logical call ends in success.
#[test]
fn synthetic_parquet_analyses_into_its_shape() {
    let dir = common::temp_dir("load-parquet");
    let file = dir.join("spans.parquet");
    let (ok, _, stderr) = stormglass(&[
        "load",
        "--write-parquet",
        file.to_str().unwrap(),
        "--spans",
        "20000",
    ]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = stormglass(&["analyze", file.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let edges = report["edges"].as_array().unwrap();
    for (caller, callee) in [
        ("gateway", "orders"),
        ("orders", "inventory"),
        ("inventory", "pricing"),
    ] {
        let edge = edges
            .iter()
            .find(|e| e["caller"] == caller && e["callee"] == callee)
            .unwrap_or_else(|| panic!("no edge {caller} -> {callee} in {edges:?}"));
        let calls = edge["logical_calls"].as_f64().unwrap();
        let retries = edge["retry_attempts"].as_f64().unwrap();
        assert!(calls > 2000.0, "{edge}");
        assert!((0.07..0.13).contains(&(retries / calls)), "{edge}");
        assert_eq!(edge["raw_success_rate"], 1.0, "{edge}");
        let first_ok = edge["effective_success_rate"].as_f64().unwrap();
        assert!((first_ok - (1.0 - retries / calls)).abs() < 1e-9, "{edge}");
        assert_eq!(edge["immediate_retries"], 0, "{edge}");
        assert_eq!(edge["retries_by_cause"]["unavailable"], retries, "{edge}");
    }
}

/// A query that reads only `spans` skips the analysis and scans the Parquet file itself
/// (DataFusion's view types accepted as the span schema), and gives what the same SQL gives
/// over the fully analysed spans.
#[test]
fn spans_only_query_scans_parquet_without_analysing() {
    let dir = common::temp_dir("load-query");
    let file = dir.join("spans.parquet");
    let file = file.to_str().unwrap();
    let (ok, _, stderr) = stormglass(&["load", "--write-parquet", file, "--spans", "5000"]);
    assert!(ok, "{stderr}");
    let query = |sql: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_stormglass"))
            .args(["query", sql, "--from", file, "--format", "json"])
            .env("STORMGLASS_QUERY_TIMINGS", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(output.status.success(), "{stderr}");
        let rows: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(!stderr.contains("differ from the span schema"), "{stderr}");
        (rows, stderr.contains("lineage"))
    };
    let per_service = "SELECT service_name, COUNT(*) AS n, SUM(duration_ns) AS d FROM spans";
    let (direct, analysed) = query(&format!(
        "WITH s AS ({per_service} GROUP BY 1) SELECT * FROM s ORDER BY 1"
    ));
    assert!(!analysed, "a spans-only query ran the analysis");
    let (full, analysed) = query(&format!(
        "{per_service} WHERE (SELECT COUNT(*) FROM lineage) > 0 GROUP BY 1 ORDER BY 1"
    ));
    assert!(analysed);
    assert_eq!(direct, full);
    assert_eq!(direct.as_array().unwrap().len(), 4, "{direct}");
    // DataFusion's own Parquet scan reads strings as Utf8View; a loaded batch has Utf8.
    let (types, _) = query("SELECT DISTINCT arrow_typeof(service_name) AS t FROM spans");
    assert_eq!(
        types[0]["t"], "Utf8View",
        "the file was loaded, not scanned: {types}"
    );
}
