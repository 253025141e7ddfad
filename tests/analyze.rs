//! End-to-end: `stormglass analyze` and `stormglass query` on files in every supported
//! format, and the live report of `stormglass serve` against the offline one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "fixtures.rs"]
mod fixtures;

use std::path::{Path, PathBuf};

use common::{Server, get, stormglass};
use fixtures::Spans;
use prost::Message;
use serde_json::Value;

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stormglass-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// One OTLP/JSON request per line, as the Collector's file exporter writes.
fn write_jsonl(path: &Path, spans: &Spans, garbage_line: Option<&str>) {
    let mut lines: Vec<String> = spans
        .requests_by_trace()
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    if let Some(g) = garbage_line {
        lines.insert(1, g.to_owned());
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// `analyze --format json` over `file`.
fn analyze_json(file: &Path) -> (Value, String) {
    let (ok, stdout, stderr) = stormglass(&["analyze", "--format", "json", path(file)]);
    assert!(ok, "{stderr}");
    (serde_json::from_str(&stdout).unwrap(), stderr)
}

/// Send every trace of `spans` to `server` over OTLP/HTTP, `copies` times each, and wait
/// until the live report holds as many spans as `offline`; returns the live report.
fn serve_and_report(server: &Server, spans: &Spans, copies: usize, offline: &Value) -> Value {
    let client = reqwest::blocking::Client::new();
    for request in spans.requests_by_trace() {
        for _ in 0..copies {
            let response = client
                .post(format!("http://{}/v1/traces", server.http))
                .header("content-type", "application/x-protobuf")
                .body(request.encode_to_vec())
                .send()
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    }
    let report_url = format!("http://{}/api/v1/report", server.api);
    let mut live = Value::Null;
    server.wait_until("the live report covers every span", |s| {
        live = serde_json::from_str(&get(&report_url).1).unwrap();
        s.metric("stormglass_analysis_spans_total", &[]) == spans.len() as f64
            && live["window"]["spans"] == offline["window"]["spans"]
    });
    live
}

fn layer<'v>(report: &'v Value, service: &str) -> &'v Value {
    report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["service"] == service)
        .unwrap_or_else(|| panic!("no layer {service}"))
}

fn edge<'v>(report: &'v Value, caller: &str, callee: &str) -> &'v Value {
    report["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["caller"] == caller && e["callee"] == callee)
        .unwrap_or_else(|| panic!("no edge {caller}->{callee}"))
}

/// JSON lines (with one unreadable line, named and skipped), binary OTLP and Parquet are
/// read together; the JSON report carries the storm's and the unsafe retry's figures and
/// the alerts whose conditions hold.
#[test]
fn analyze_every_format_into_one_report() {
    let d = dir("analyze");
    let mut storm = Spans::default();
    fixtures::storm(&mut storm, 1);
    write_jsonl(&d.join("storm.jsonl"), &storm, Some("{not json"));

    let mut unsafe_post = Spans::default();
    fixtures::unsafe_post(&mut unsafe_post, 2);
    std::fs::write(d.join("unsafe.pb"), unsafe_post.request().encode_to_vec()).unwrap();

    let mut budgets = Spans::default();
    fixtures::budgets(&mut budgets, 3);
    let (batch, _) = stormglass_model::encode_request(&Default::default(), &budgets.request());
    let parquet = d.join("budgets.parquet");
    stormglass_analytics::files::write_parquet(&parquet, &batch).unwrap();

    let jsonl = d.join("storm.jsonl");
    let pb = d.join("unsafe.pb");
    let (ok, stdout, stderr) = stormglass(&[
        "analyze",
        "--format",
        "json",
        path(&jsonl),
        path(&pb),
        path(&parquet),
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("storm.jsonl:2: not an OTLP/JSON request"),
        "{stderr}"
    );
    assert!(stderr.contains("skipped 1 line"), "{stderr}");

    let report: Value = serde_json::from_str(&stdout).unwrap();
    let spans = (storm.len() + unsafe_post.len() + budgets.len()) as u64;
    assert_eq!(report["window"]["spans"], spans);
    assert_eq!(layer(&report, "db")["amplification"], 27.0);
    assert_eq!(edge(&report, "cart", "orders")["unsafe_retries"], 1);
    assert_eq!(
        edge(&report, "svc", "db")["retry_contribution"],
        Value::Null
    );
    let alerts: Vec<&str> = report["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    for expected in [
        "StormglassRetryAmplificationHigh",
        "StormglassRetryStormPotential",
        "StormglassUnsafeRetries",
        "StormglassDeadlineInversion",
    ] {
        assert!(
            alerts.contains(&expected),
            "{expected} missing from {alerts:?}"
        );
    }
    let kinds: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"overcommit") && kinds.contains(&"unsafe_retry"),
        "{kinds:?}"
    );
    for key in [
        "window", "edges", "layers", "entries", "traces", "orphans", "findings", "alerts",
    ] {
        assert!(report.get(key).is_some(), "report lacks {key}");
    }

    let (ok, table, _) = stormglass(&["analyze", path(&jsonl)]);
    assert!(ok);
    assert!(
        table.contains("Layers") && table.contains("27.00"),
        "{table}"
    );
}

/// A file that cannot be read is named; with nothing readable the command fails.
#[test]
fn analyze_names_unreadable_files() {
    let d = dir("unreadable");
    let bad = d.join("bad.pb");
    std::fs::write(&bad, [0xff, 0xff, 0xff]).unwrap();
    let (ok, _, stderr) = stormglass(&["analyze", path(&bad), path(&d.join("missing.json"))]);
    assert!(!ok);
    assert!(stderr.contains("bad.pb: not a binary OTLP"), "{stderr}");
    assert!(stderr.contains("missing.json: cannot read"), "{stderr}");
}

/// Ad hoc SQL sees the span table, the derived tables and the report tables.
#[test]
fn query_reads_views() {
    let d = dir("query");
    let mut storm = Spans::default();
    fixtures::storm(&mut storm, 1);
    let file = d.join("storm.json");
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&storm.request()).unwrap(),
    )
    .unwrap();
    let sql = "SELECT l.service, l.amplification, COUNT(a.span_id) AS attempts \
               FROM layers l LEFT JOIN attempts a ON a.callee = l.service \
               GROUP BY l.service, l.amplification ORDER BY l.service";
    let (ok, stdout, stderr) =
        stormglass(&["query", sql, "--from", path(&file), "--format", "json"]);
    assert!(ok, "{stderr}");
    let rows: Value = serde_json::from_str(&stdout).unwrap();
    let services: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["service"].as_str().unwrap())
        .collect();
    assert_eq!(services, ["api", "db", "gateway", "svc"]);
    assert_eq!(rows[1]["amplification"], 27.0);
    assert_eq!(rows[1]["attempts"], 27);

    // Storm potential, a graph walk in Rust, is a table too.
    let sql = "SELECT service, operation, storm_potential FROM storm_potential";
    let (ok, stdout, stderr) =
        stormglass(&["query", sql, "--from", path(&file), "--format", "json"]);
    assert!(ok, "{stderr}");
    let rows: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(rows[0]["service"], "gateway", "{rows}");
    assert_eq!(rows[0]["storm_potential"], 27.0, "{rows}");

    let (ok, _, stderr) = stormglass(&["query", "SELECT nope FROM spans", "--from", path(&file)]);
    assert!(!ok);
    assert!(stderr.contains("nope"), "{stderr}");
}

/// The same spans sent over OTLP to `serve` give, at `/api/v1/report`, the figures
/// `analyze` computes from a file.
#[test]
fn live_report_matches_offline() {
    let d = dir("live");
    let mut spans = Spans::default();
    fixtures::storm(&mut spans, 1);
    fixtures::unsafe_post(&mut spans, 2);
    fixtures::both_shapes(&mut spans, 3);
    fixtures::budgets(&mut spans, 5);
    let file = d.join("all.jsonl");
    write_jsonl(&file, &spans, None);
    let (offline, _) = analyze_json(&file);
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "200ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let live = serve_and_report(&server, &spans, 1, &offline);
    for key in ["edges", "layers", "entries", "traces", "findings"] {
        assert_eq!(
            live[key], offline[key],
            "{key} differs between live and offline"
        );
    }
    assert_eq!(
        server.metric("stormglass_analysis_spans_total", &[]),
        spans.len() as f64
    );
}

/// Duplicates, as exporters retrying a request whose answer was lost produce them: every
/// request sent twice to `serve`, and a file holding every request twice, give exactly
/// the figures of one copy; live, each copy is counted as a duplicate.
#[test]
fn duplicated_requests_give_the_figures_of_one() {
    let d = dir("duplicates");
    let mut spans = Spans::default();
    fixtures::storm(&mut spans, 1);
    fixtures::unsafe_post(&mut spans, 2);
    fixtures::pending_orphans(&mut spans, 3);
    fixtures::both_shapes(&mut spans, 4);
    let once = d.join("once.jsonl");
    write_jsonl(&once, &spans, None);
    let (offline, _) = analyze_json(&once);
    let twice = d.join("twice.jsonl");
    let text = std::fs::read_to_string(&once).unwrap();
    std::fs::write(&twice, format!("{text}{text}")).unwrap();
    let (doubled, stderr) = analyze_json(&twice);
    let kept = format!("kept {} duplicate", spans.len());
    assert!(stderr.contains(&kept), "{stderr}");
    for key in [
        "window", "edges", "layers", "entries", "traces", "orphans", "findings",
    ] {
        assert_eq!(doubled[key], offline[key], "offline {key}");
    }
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "500ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let live = serve_and_report(&server, &spans, 2, &offline);
    for key in [
        "edges", "layers", "entries", "traces", "orphans", "findings",
    ] {
        assert_eq!(live[key], offline[key], "live {key}");
    }
    assert_eq!(
        server.metric("stormglass_assembly_duplicate_spans_total", &[]),
        spans.len() as f64
    );
}

/// A callee stalled longer than assembly.idle, live: its caller's spans arrive and the
/// trace is released; its SERVER span (3 s) arrives after that. The span is counted late,
/// yet its duration reaches the callee's latency, so the layer's P99.9 shows the stall
/// rather than the caller's client-observed time.
#[test]
fn stalled_callee_shows_its_tail() {
    use fixtures::{CLIENT, SERVER};
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "200ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let (mut caller, mut callee) = (Spans::default(), Spans::default());
    let p = caller.add(1, None, "web", "GET /", SERVER, 0.0, 250.0, vec![]);
    let c = caller.add(
        1,
        Some(p),
        "web",
        "GET",
        CLIENT,
        1.0,
        201.0,
        vec![fixtures::peer("inv")],
    );
    callee.add(1, Some(c), "inv", "GET /stock", SERVER, 2.0, 3002.0, vec![]);
    let client = reqwest::blocking::Client::new();
    let post = |spans: &Spans| {
        let response = client
            .post(format!("http://{}/v1/traces", server.http))
            .header("content-type", "application/x-protobuf")
            .body(spans.request().encode_to_vec())
            .send()
            .unwrap();
        assert_eq!(response.status(), 200);
    };
    post(&caller);
    server.wait_until("the caller's trace analysed", |s| {
        s.metric("stormglass_analysis_spans_total", &[]) == 2.0
    });
    post(&callee);
    let report_url = format!("http://{}/api/v1/report", server.api);
    server.wait_until("the stall in inv's latency", |_| {
        let live: Value = serde_json::from_str(&get(&report_url).1).unwrap();
        live["layers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["service"] == "inv" && l["p999_ms"].as_f64().unwrap_or(0.0) > 2900.0)
    });
    assert_eq!(
        server.metric("stormglass_assembly_late_spans_total", &[]),
        1.0
    );
}
