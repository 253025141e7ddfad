//! End-to-end: the Parquet archive of `stormglass serve` (archive.dir), fed by the real
//! OpenTelemetry SDK's OTLP/gRPC exporter; read back by `stormglass analyze DIR` and by DuckDB
//! from PyPI; a `kill -9` and a restart on the same directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::SystemTime;

use common::scenario::Services;
use common::{Server, get, stormglass};
use serde_json::Value;

fn start(dir: &Path, flush: &str) -> Server {
    Server::start(&[
        ("STORMGLASS_ARCHIVE__DIR", dir.to_str().unwrap()),
        ("STORMGLASS_ARCHIVE__FLUSH", flush),
        ("STORMGLASS_ASSEMBLY__IDLE", "300ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ])
}

/// Spans of one storm: the gateway's SERVER span, 3 attempts to orders (CLIENT + SERVER
/// each), 9 to inventory (CLIENT + SERVER), 27 to db (CLIENT only: db is not instrumented).
const STORM: f64 = 1.0 + 2.0 * 3.0 + 2.0 * 9.0 + 27.0;

/// Send `storms` retry storms (3 layers x 3 attempts) and flush them.
fn storms(server: &Server, storms: usize) {
    let services = Services::new(&server.grpc);
    for _ in 0..storms {
        services.storm(SystemTime::now());
    }
    services.flush();
}

fn report(server: &Server) -> Value {
    serde_json::from_str(&get(&format!("http://{}/api/v1/report", server.api)).1).unwrap()
}

fn analyze(dir: &Path) -> Value {
    let (ok, stdout, stderr) = stormglass(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("skipped"), "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// The figures of a report that do not depend on when it was made.
fn figures(report: &Value) -> Value {
    serde_json::json!({
        "edges": report["edges"],
        "layers": report["layers"],
        "traces": report["traces"],
        "orphans": report["orphans"],
    })
}

fn logical_calls(report: &Value, caller: &str, callee: &str) -> f64 {
    report["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["caller"] == caller && e["callee"] == callee)
        .unwrap_or_else(|| panic!("no edge {caller} -> {callee}: {report}"))["logical_calls"]
        .as_f64()
        .unwrap()
}

/// DuckDB's answer to `sql` (one row, as JSON) over the archive's files, as a user runs it.
fn duckdb(dir: &Path, sql: &str) -> Value {
    let glob = dir.join("*.parquet");
    let script = format!(
        "import duckdb, json\nduckdb.sql(\"CREATE VIEW spans AS SELECT * FROM read_parquet('{}')\")\nprint(json.dumps(duckdb.sql(\"{sql}\").fetchall()[0], default=str))",
        glob.display()
    );
    serde_json::from_slice(&common::python(&script, &[])).unwrap()
}

/// Every accepted span reaches a visible archive file whole (its name, which the live path
/// does not keep, included); DuckDB reads the files as they are; and `stormglass analyze
/// DIR` over the archive gives the live window's figures.
#[test]
fn the_archive_holds_every_accepted_span_and_analyses_like_the_live_window() {
    let scratch = common::temp_dir("archive-whole");
    let dir = scratch.path();
    let server = start(dir, "500ms");
    storms(&server, 4);
    let accepted = 4.0 * STORM;
    server.wait_until("every span analysed and archived", |s| {
        s.metric("stormglass_receiver_accepted_spans_total", &[]) == accepted
            && s.metric("stormglass_analysis_spans_total", &[]) == accepted
            && s.metric("stormglass_archive_spans_total", &[]) == accepted
    });
    assert_eq!(
        server.metric("stormglass_archive_unflushed_spans", &[]),
        0.0
    );
    assert_eq!(
        server.metric("stormglass_archive_lost_spans_total", &[]),
        0.0
    );
    // The report follows at the end of the interval that analysed the last spans.
    server.wait_until("the report of every storm", |s| {
        report(s)["window"]["spans"].as_f64() == Some(accepted)
    });
    let live = report(&server);
    assert_eq!(logical_calls(&live, "inventory", "db"), 4.0 * 9.0);

    let offline = analyze(dir);
    assert_eq!(figures(&offline), figures(&live));
    let (ok, stdout, stderr) = stormglass(&[
        "query",
        "SELECT COUNT(*) AS n FROM logical_calls",
        "--from",
        dir.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let rows: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(rows[0]["n"], 4 * (1 + 3 + 9), "{rows}");

    let counts = duckdb(
        dir,
        "SELECT COUNT(*), COUNT(DISTINCT trace_id), COUNT(*) FILTER (WHERE span_name = 'GET /checkout'), COUNT(*) FILTER (WHERE service_name = 'inventory' AND kind = 'client' AND attempt = 2) FROM spans",
    );
    assert_eq!(counts, serde_json::json!([4 * 52, 4, 4, 4 * 3 * 3]));
    let (ok, stderr) = server.terminate();
    assert!(ok, "{stderr}");
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // Closed files only, beside the secret the idempotency keys are hashed with.
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".parquet") || n == "idempotency-key.secret"),
        "{names:?}"
    );
}

/// A `kill -9` with spans in an open file leaves the closed files readable (the open one is
/// torn: not visible, removed at the next start); `analyze` over the archive gives the
/// figures of the traces it holds; a restart on the directory rebuilds the window from it
/// (report and gauges as before the crash) while the counters restart from zero.
#[test]
fn after_a_crash_the_archive_is_readable_and_a_restart_restores_the_window() {
    let scratch = common::temp_dir("archive-crash");
    let dir = scratch.path();
    // Files close 3 s after their first span: the second batch is still open at the kill.
    let server = start(dir, "3s");
    storms(&server, 3);
    server.wait_until("the first storms archived", |s| {
        s.metric("stormglass_archive_spans_total", &[]) == 3.0 * STORM
            && s.metric("stormglass_analysis_spans_total", &[]) == 3.0 * STORM
    });
    storms(&server, 2);
    server.wait_until("the next storms accepted, not yet archived", |s| {
        s.metric("stormglass_archive_unflushed_spans", &[]) == 2.0 * STORM
    });
    server.crash();
    let torn: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert_eq!(torn.len(), 1, "the open file is left torn by the kill");

    // The archive after the crash: exactly the three storms of the closed files.
    let offline = analyze(dir);
    assert_eq!(logical_calls(&offline, "gateway", "orders"), 3.0);
    assert_eq!(logical_calls(&offline, "inventory", "db"), 3.0 * 9.0);

    let restarted = start(dir, "3s");
    let restored = report(&restarted);
    assert_eq!(
        figures(&restored),
        figures(&offline),
        "the window comes back"
    );
    assert!(
        std::fs::read_dir(dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")),
        "the torn file is removed at start"
    );
    // Gauges come back from the rebuilt window; counters start from zero, so Prometheus
    // sees a counter reset, not the same calls counted twice.
    assert_eq!(
        restarted.metric("stormglass_amplification_ratio", &["service=\"db\""]),
        27.0
    );
    assert_eq!(restarted.metric("stormglass_logical_calls_total", &[]), 0.0);
    assert_eq!(
        restarted.metric("stormglass_analysis_spans_total", &[]),
        0.0
    );

    // And it goes on: new spans are analysed and archived beside the restored ones.
    storms(&restarted, 1);
    restarted.wait_until("the new storm counted", |s| {
        s.metric("stormglass_logical_calls_total", &["caller=\"gateway\""]) == 1.0
    });
    let (ok, stderr) = restarted.terminate();
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("rebuilt the window from the archive"),
        "{stderr}"
    );
    assert_eq!(logical_calls(&analyze(dir), "gateway", "orders"), 4.0);
}

/// A `kill -9` in the middle of a load (`stormglass load`, OTLP/gRPC, 4 requests in flight)
/// leaves every visible file readable: `analyze DIR` skips nothing and reads at least every
/// span the archive had reported visible before the kill.
#[test]
fn a_kill_during_load_leaves_every_visible_file_readable() {
    let scratch = common::temp_dir("archive-kill-load");
    let dir = scratch.path();
    let server = start(dir, "200ms");
    let mut load = std::process::Command::new(env!("CARGO_BIN_EXE_stormglass"))
        .args(["load", "--endpoint", &server.grpc, "--duration", "20s"])
        .args([
            "--concurrency",
            "4",
            "--spans-per-request",
            "200",
            "--payloads",
            "3",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    server.wait_until("several files closed under load", |s| {
        s.metric("stormglass_archive_files", &[]) >= 3.0
    });
    let visible = server.metric("stormglass_archive_spans_total", &[]);
    server.crash();
    let _ = load.kill();
    let _ = load.wait();

    let offline = analyze(dir);
    let spans = offline["window"]["spans"].as_f64().unwrap();
    assert!(
        spans >= visible,
        "{spans} spans read, {visible} were visible"
    );
}

/// Archives written by two instances, each fed part of the traces (whole traces, as the
/// Collector's load-balancing exporter routes them), form one dataset: `query` and `analyze`
/// over both directories give exactly what they give over one archive of every trace.
#[test]
fn archives_of_several_instances_read_as_one() {
    let scratch = common::temp_dir("archive-shards");
    let root = scratch.path();
    let (one, two, all) = (root.join("one"), root.join("two"), root.join("all"));
    for (dir, count) in [(&one, 2), (&two, 3), (&all, 5)] {
        let server = start(dir, "200ms");
        storms(&server, count);
        server.wait_until("archived", |s| {
            s.metric("stormglass_archive_spans_total", &[]) == count as f64 * STORM
        });
        let (ok, stderr) = server.terminate();
        assert!(ok, "{stderr}");
    }
    let sql = "SELECT caller, callee, logical_calls, attempts, retry_attempts, effective_success_rate, raw_success_rate FROM edges ORDER BY caller, callee";
    let query = |from: &[&Path]| {
        let mut args = vec!["query", sql, "--format", "json"];
        for dir in from {
            args.extend(["--from", dir.to_str().unwrap()]);
        }
        let (ok, stdout, stderr) = stormglass(&args);
        assert!(ok, "{stderr}");
        serde_json::from_str::<Value>(&stdout).unwrap()
    };
    let sharded = query(&[&one, &two]);
    assert_eq!(sharded, query(&[&all]));
    assert_eq!(sharded.as_array().unwrap().len(), 3, "{sharded}");
    let (ok, stdout, stderr) = stormglass(&[
        "analyze",
        one.to_str().unwrap(),
        two.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let sharded: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(untimed(figures(&sharded)), untimed(figures(&analyze(&all))));
}

/// `figures` without `synchronised_retries`, which depends on when the traffic ran (whose
/// retries shared a 100 ms slot, against the window's mean): the archives compared above
/// hold the same traces sent in separate runs.
fn untimed(mut figures: Value) -> Value {
    for edge in figures["edges"].as_array_mut().into_iter().flatten() {
        edge.as_object_mut()
            .map(|e| e.remove("synchronised_retries"));
    }
    figures
}
