//! End-to-end: `stormglass analyze` and `stormglass query` on files in every supported
//! format, and the live report of `stormglass serve` against the offline one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use stormglass_testkit::fixtures;

use std::path::{Path, PathBuf};

use common::{Server, get, stormglass, temp_dir, write_jsonl};
use fixtures::Spans;
use prost::Message;
use serde_json::Value;

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
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

/// Send all of `spans` to `server` as one OTLP/HTTP request.
fn post_request(server: &Server, spans: &Spans) {
    let response = reqwest::blocking::Client::new()
        .post(format!("http://{}/v1/traces", server.http))
        .header("content-type", "application/x-protobuf")
        .body(spans.request().encode_to_vec())
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
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
    let scratch = temp_dir("analyze");
    let d = scratch.path();
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
    let scratch = temp_dir("unreadable");
    let d = scratch.path();
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
    let scratch = temp_dir("query");
    let d = scratch.path();
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
    let scratch = temp_dir("live");
    let d = scratch.path();
    let mut spans = Spans::default();
    fixtures::storm(&mut spans, 1);
    fixtures::unsafe_post(&mut spans, 2);
    fixtures::both_shapes(&mut spans, 3);
    fixtures::budgets(&mut spans, 5);
    fixtures::timeouts(&mut spans, 100);
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
    // The timeout figures are among those compared, not nulls on both sides.
    let pricing = live["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["callee"] == "pricing")
        .unwrap();
    assert_eq!(pricing["timeout_kill_share"], 0.25);
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
    let scratch = temp_dir("duplicates");
    let d = scratch.path();
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
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "200ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let (mut caller, mut callee) = (Spans::default(), Spans::default());
    let p = caller.server(1, "web", "GET /").at(0.0, 250.0).add();
    let c = caller
        .client(1, "web", "GET")
        .under(p)
        .at(1.0, 201.0)
        .with(vec![fixtures::peer("inv")])
        .add();
    callee
        .server(1, "inv", "GET /stock")
        .under(c)
        .at(2.0, 3002.0)
        .add();
    let post = |spans: &Spans| post_request(&server, spans);
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

/// Clock skew: with inv's clock 40 ms ahead of web's, or 35 ms behind, orphan pairs equal
/// those of the unskewed run and orphan work is within the estimate's error (half the
/// difference of request and answer network delays, 0.05 ms here), offline and live (the
/// estimate comes from the answered calls, live from those analysed earlier in the
/// window); the edge reports the skew and a clock_skew finding names it.
#[test]
fn clock_skew_is_corrected_before_orphan_checks() {
    let scratch = temp_dir("skew");
    let d = scratch.path();
    let offline = |skew_ms: f64| {
        let all = fixtures::skewed_calls(skew_ms, 1..=28);
        let file = d.join(format!("skew{skew_ms}.jsonl"));
        write_jsonl(&file, &all, None);
        analyze_json(&file).0
    };
    let truth = offline(0.0);
    let web_inv = edge(&truth, "web", "inv");
    assert_eq!(web_inv["orphan_pairs"], 4);
    assert!((web_inv["orphan_work_seconds"].as_f64().unwrap() - 0.24).abs() < 1e-9);
    assert_eq!(web_inv["clock_skew_ms"], 0.0);
    let skew_findings = |r: &Value| {
        r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "clock_skew")
            .count()
    };
    assert_eq!(skew_findings(&truth), 0);
    let same_orphans = |report: &Value| {
        let e = edge(report, "web", "inv");
        assert_eq!(e["orphan_pairs"], web_inv["orphan_pairs"]);
        let work = e["orphan_work_seconds"].as_f64().unwrap();
        assert!((work - 0.24).abs() < 4.0 * 0.1e-3, "orphan work {work}");
        let listed = report["orphans"].as_array().unwrap();
        assert_eq!(listed.len(), 4);
        for (orphan, truth) in listed.iter().zip(truth["orphans"].as_array().unwrap()) {
            assert_eq!(orphan["trace_id"], truth["trace_id"]);
        }
    };
    for skew_ms in [40.0, -35.0] {
        let skewed = offline(skew_ms);
        same_orphans(&skewed);
        let estimate = edge(&skewed, "web", "inv")["clock_skew_ms"]
            .as_f64()
            .unwrap();
        assert!((estimate - skew_ms).abs() < 0.1, "estimated {estimate}");
        assert_eq!(skew_findings(&skewed), 1);
    }

    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "200ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let (answered, timed_out) = (
        fixtures::skewed_calls(40.0, 1..=20),
        fixtures::skewed_calls(40.0, 21..=28),
    );
    let post = |spans: &Spans| post_request(&server, spans);
    post(&answered);
    server.wait_until("the answered calls analysed", |s| {
        s.metric("stormglass_analysis_spans_total", &[]) == answered.len() as f64
    });
    post(&timed_out);
    let report_url = format!("http://{}/api/v1/report", server.api);
    let mut live = Value::Null;
    server.wait_until("every call in the live report", |s| {
        live = serde_json::from_str(&get(&report_url).1).unwrap();
        s.metric("stormglass_analysis_spans_total", &[]) == 84.0 && live["window"]["spans"] == 84
    });
    same_orphans(&live);
    let gauge = server.metric(
        "stormglass_clock_skew_seconds",
        &["caller=\"web\"", "callee=\"inv\""],
    );
    assert!((gauge - 0.04).abs() < 0.0001, "gauge {gauge}");
}

/// `analyze` over `spans`, and the live report of `serve` fed the same spans; asserts the
/// two agree on every figure and returns the offline report.
fn offline_and_live(name: &str, spans: &Spans) -> Value {
    let scratch = temp_dir(name);
    let d = scratch.path();
    let file = d.join("spans.jsonl");
    write_jsonl(&file, spans, None);
    let (offline, _) = analyze_json(&file);
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "200ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let live = serve_and_report(&server, spans, 1, &offline);
    for key in [
        "edges", "layers", "entries", "traces", "orphans", "findings",
    ] {
        assert_eq!(live[key], offline[key], "{key}: live and offline differ");
    }
    offline
}

/// Uninstrumented callers: a proxy that sends no spans retried 10 calls to inv twice
/// (503, 503, 200: inv's root SERVER spans carry retry 0, 1, 2), and a gateway span with
/// no CLIENT child forwarded 5 calls twice (Envoy's attempt count 1, 2 on inv's SERVER
/// spans). Each hop gets its edge and inv its amplification, live and offline.
#[test]
fn uninstrumented_callers_retries_seen_on_the_callee() {
    use fixtures::{http_status, retry};
    use stormglass_testkit::otlp::kv;
    let mut spans = Spans::default();
    for t in 1..=10u32 {
        for (n, code) in [(0, 503), (1, 503), (2, 200)] {
            let at = n as f64 * 10.0;
            let attrs = vec![retry(n), http_status(code), fixtures::route("/stock")];
            spans
                .server(t, "inv", "GET /stock")
                .at(at, at + 5.0)
                .with(attrs)
                .add();
        }
    }
    for t in 11..=15u32 {
        let gw = spans.server(t, "gateway", "GET /").at(0.0, 50.0).add();
        for (n, code) in [("1", 503), ("2", 200)] {
            let at = if n == "1" { 1.0 } else { 20.0 };
            let attrs = vec![
                kv("http.request.header.x-envoy-attempt-count", n),
                http_status(code),
                fixtures::route("/stock"),
            ];
            spans
                .server(t, "inv", "GET /stock")
                .under(gw)
                .at(at, at + 5.0)
                .with(attrs)
                .add();
        }
    }
    let report = offline_and_live("uninstrumented", &spans);
    let proxy = edge(&report, "unknown", "inv");
    assert_eq!(proxy["logical_calls"], 10);
    assert_eq!(proxy["attempts"], 30);
    assert_eq!(proxy["raw_success_rate"], 1.0);
    assert_eq!(proxy["effective_success_rate"], 0.0);
    assert_eq!(proxy["max_attempt"], 2);
    let gateway = edge(&report, "gateway", "inv");
    assert_eq!(gateway["logical_calls"], 5);
    assert_eq!(gateway["attempts"], 10);
    assert_eq!(gateway["retry_attempts"], 5);
    let inv = layer(&report, "inv");
    assert_eq!(inv["requests"], 40);
    assert_eq!(inv["baseline_attempts"], 15);
    assert_eq!(report["traces"]["entry_requests"], 15);
}

/// Stacked retry layers in one service: an application loop (INTERNAL spans retry 0..3)
/// around an HTTP client that resends twice (CLIENT spans resend_count 0..2): 12 requests
/// reach llm; storm potential reads 4 x 3 = 12 and the trace is a multi-layer retry trace.
/// Unreadable attempt numbers (retry=-1, "3.5") are counted as malformed yet stay retries
/// of their call: a second trace's two-attempt call stays one call.
#[test]
fn stacked_retry_layers_and_unreadable_attempts() {
    use fixtures::{http_status, retry};
    use stormglass_testkit::otlp::{kv, kv_int};
    let mut spans = Spans::default();
    let root = spans.server(1, "api", "POST /ask").at(0.0, 1000.0).add();
    for loop_try in 0..4i64 {
        let at = loop_try as f64 * 200.0;
        let attempt = spans
            .internal(1, "api", "ask llm")
            .under(root)
            .at(at, at + 190.0)
            .with(vec![retry(loop_try)])
            .add();
        for resend in 0..3i64 {
            let t0 = at + resend as f64 * 60.0;
            let code = if loop_try == 3 && resend == 2 {
                200
            } else {
                503
            };
            let attrs = vec![
                kv_int("http.request.resend_count", resend),
                http_status(code),
                fixtures::peer("llm"),
            ];
            spans
                .client(1, "api", "POST")
                .under(attempt)
                .at(t0, t0 + 50.0)
                .with(attrs)
                .add();
        }
    }
    let web = spans.server(2, "web", "GET /").at(0.0, 100.0).add();
    spans
        .client(2, "web", "GET")
        .under(web)
        .at(1.0, 10.0)
        .with(vec![retry(0), http_status(503), fixtures::peer("inv")])
        .add();
    spans
        .client(2, "web", "GET")
        .under(web)
        .at(20.0, 30.0)
        .with(vec![
            kv_int("retry", -1),
            http_status(200),
            fixtures::peer("inv"),
        ])
        .add();
    spans
        .client(2, "web", "GET")
        .under(web)
        .at(40.0, 50.0)
        .with(vec![
            kv("retry", "3.5"),
            http_status(200),
            fixtures::peer("inv"),
        ])
        .add();
    let report = offline_and_live("stacked", &spans);
    let entry = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["service"] == "api")
        .unwrap();
    assert_eq!(entry["storm_potential"], 12.0);
    assert_eq!(report["traces"]["multi_layer_retry_traces"], 1);
    let llm = edge(&report, "api", "llm");
    assert_eq!(llm["attempts"], 12);
    assert_eq!(llm["max_outer_attempt"], 3);
    assert_eq!(layer(&report, "llm")["amplification"], 12.0);
    let inv = edge(&report, "web", "inv");
    assert_eq!(
        inv["logical_calls"], 1,
        "unreadable numbers never start a call"
    );
    assert_eq!(inv["retry_attempts"], 2);
    assert_eq!(inv["max_attempt"], 2);
    assert_eq!(inv["raw_success_rate"], 1.0);
    assert_eq!(inv["effective_success_rate"], 0.0);
}

/// Sampling: the same traces kept 1 in 4 by OpenTelemetry's probability sampler
/// (tracestate `ot=th:c`), or by an SDK that writes no threshold with
/// `sampling.ratios.<service>: 0.25` configured, count four times the kept traces: calls,
/// attempts, retries, layer requests, entry requests, orphan pairs and work, findings;
/// ratios stay as they are. Offline and live.
#[test]
fn sampled_traces_count_by_their_adjusted_count() {
    let mut spans = Spans::default();
    fixtures::storm(&mut spans, 1);
    fixtures::unsafe_post(&mut spans, 2);
    fixtures::pending_orphans(&mut spans, 3);
    let scratch = temp_dir("sampling");
    let d = scratch.path();
    let plain = d.join("plain.jsonl");
    write_jsonl(&plain, &spans, None);
    let (kept, _) = analyze_json(&plain);
    let sampled = offline_and_live("sampled", &spans.with_tracestate("ot=th:c"));

    let config = d.join("ratios.yaml");
    let ratios: String = spans
        .services()
        .iter()
        .map(|s| format!("    {s}: 0.25\n"))
        .collect();
    std::fs::write(&config, format!("sampling:\n  ratios:\n{ratios}")).unwrap();
    let (ok, stdout, stderr) = stormglass(&[
        "analyze",
        "--format",
        "json",
        "--config",
        path(&config),
        path(&plain),
    ]);
    assert!(ok, "{stderr}");
    let configured: Value = serde_json::from_str(&stdout).unwrap();

    for report in [&sampled, &configured] {
        for (k, s) in kept["edges"]
            .as_array()
            .unwrap()
            .iter()
            .zip(report["edges"].as_array().unwrap())
        {
            assert_eq!(k["caller"], s["caller"]);
            for count in [
                "logical_calls",
                "attempts",
                "retry_attempts",
                "orphan_pairs",
                "unsafe_retries",
            ] {
                assert_eq!(
                    s[count].as_u64().unwrap(),
                    4 * k[count].as_u64().unwrap(),
                    "{count}"
                );
            }
            let work = |r: &Value| r["orphan_work_seconds"].as_f64().unwrap();
            assert!((work(s) - 4.0 * work(k)).abs() < 1e-9);
            for ratio in [
                "raw_success_rate",
                "effective_success_rate",
                "retry_ratio",
                "edge_amplification",
            ] {
                assert_eq!(s[ratio], k[ratio], "{ratio}");
            }
        }
        for (k, s) in kept["layers"]
            .as_array()
            .unwrap()
            .iter()
            .zip(report["layers"].as_array().unwrap())
        {
            assert_eq!(
                s["requests"].as_u64().unwrap(),
                4 * k["requests"].as_u64().unwrap()
            );
            assert_eq!(s["amplification"], k["amplification"]);
            assert_eq!(s["p999_ms"], k["p999_ms"]);
        }
        let entries = |r: &Value| r["traces"]["entry_requests"].as_u64().unwrap();
        assert_eq!(entries(report), 4 * entries(&kept));
        let findings = |r: &Value| -> u64 {
            r["findings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["count"].as_u64().unwrap())
                .sum()
        };
        assert_eq!(findings(report), 4 * findings(&kept));
    }
}

/// Exactness, live and offline alike: a deadline on a gRPC call span is the call's budget
/// (900 ms under an 800 ms handler: an inversion; two of 500 ms: an overcommit); two calls
/// overlapping by half a millisecond are still sequential (another overcommit); a 201 ms
/// timeout is below a 203 ms P99.9 although both share a 2% bucket; retries that cannot fit
/// the budget left are counted over the window's median, not each interval's; idempotency
/// keys compare within a logical call, live (each span hashed as it arrives) as offline.
#[test]
fn exactness_agrees_live_and_offline() {
    let mut s = Spans::default();
    fixtures::grpc_call_budgets(&mut s, 1, "front", &[500, 500]);
    fixtures::grpc_call_budgets(&mut s, 2, "front", &[900]);
    fixtures::tick_overlap(&mut s, 3, "web");
    fixtures::tail_timeout(&mut s, 10..1010, "shop");
    fixtures::out_of_budget(&mut s, 2000);
    fixtures::idempotency_keys(&mut s, 2100);
    let report = offline_and_live("exactness", &s);
    let count = |kind: &str, caller: &str| -> u64 {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == kind && f["caller"] == caller)
            .map(|f| f["count"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(count("deadline_inversion", "front"), 1);
    assert_eq!(count("overcommit", "front"), 1);
    assert_eq!(count("overcommit", "web"), 1);
    let inv = edge(&report, "shop", "inv");
    assert_eq!(inv["timeout_ms"], 201.0);
    assert_eq!(inv["timeout_below_tail"], true);
    let stock = edge(&report, "shop", "stock");
    assert_eq!(stock["out_of_budget_retries"], 3);
    assert_eq!(stock["retries_after_deadline"], 1);
    assert_eq!(count("out_of_budget_retry", "shop"), 3);
    let pay = edge(&report, "app", "pay");
    assert_eq!(pay["unstable_key_retries"], 3);
    assert_eq!(pay["idempotency_hits"], 2);
}

/// The deploy gate: `--fail-on` exits 1 naming what holds at or above a level or by name,
/// 0 when nothing does, and 2 for a name it does not know or input it cannot read.
#[test]
fn fail_on_gates_a_deploy() {
    let scratch = temp_dir("gate");
    let d = scratch.path();
    let mut unsafe_spans = Spans::default();
    fixtures::unsafe_post(&mut unsafe_spans, 1);
    let unsafe_file = d.join("unsafe.jsonl");
    write_jsonl(&unsafe_file, &unsafe_spans, None);
    let mut healthy = Spans::default();
    fixtures::healthy(&mut healthy, 1);
    let healthy_file = d.join("healthy.jsonl");
    write_jsonl(&healthy_file, &healthy, None);

    let run = common::stormglass_exit;
    let (code, stdout, stderr) = run(&["analyze", path(&unsafe_file), "--fail-on", "critical"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stdout.contains("unsafe"),
        "the report is printed as usual: {stdout}"
    );
    assert!(
        stderr.contains("finding unsafe_retry (critical): cart -> orders"),
        "{stderr}"
    );
    assert!(
        stderr.contains("alert StormglassUnsafeRetries (critical)"),
        "{stderr}"
    );
    assert!(!stderr.contains("(warning)"), "{stderr}");

    // By name: a finding that holds fails, one that does not passes.
    let (code, _, stderr) = run(&[
        "analyze",
        path(&unsafe_file),
        "--fail-on",
        "timeout_below_tail,StormglassLatencyDrift",
        "--format",
        "json",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("finding timeout_below_tail (warning)"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["analyze", path(&unsafe_file), "--fail-on", "overcommit"]);
    assert_eq!(code, Some(0), "{stderr}");

    // The healthy chain holds nothing at warning or above; its 900 ms timeout over a 47 ms
    // P99.9 is an info finding.
    let (code, _, stderr) = run(&["analyze", path(&healthy_file), "--fail-on", "warning"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = run(&["analyze", path(&healthy_file), "--fail-on", "info"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("finding timeout_too_long (info): web -> api"),
        "{stderr}"
    );

    let (code, _, stderr) = run(&["analyze", path(&healthy_file), "--fail-on", "severe"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("expected info, warning, critical"),
        "{stderr}"
    );
    let missing = d.join("missing.jsonl");
    let (code, _, stderr) = run(&["analyze", path(&missing), "--fail-on", "info"]);
    assert_eq!(code, Some(2), "{stderr}");
}

/// What-if, offline and live: `stormglass whatif --fail db=1` over the storm's spans gives
/// 27 / 9 / 3, the same JSON as `/api/v1/whatif?fail=db:1` over the live window; a service
/// the traces do not have, or a malformed failure, is an error (exit 2, 400).
#[test]
fn what_if_offline_and_live() {
    let scratch = temp_dir("whatif");
    let d = scratch.path();
    let mut spans = Spans::default();
    fixtures::storm(&mut spans, 1);
    let file = d.join("storm.jsonl");
    write_jsonl(&file, &spans, None);

    let (code, stdout, stderr) =
        common::stormglass_exit(&["whatif", "--fail", "db=1", path(&file), "--format", "json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let offline: Value = serde_json::from_str(&stdout).unwrap();
    let amplification = |w: &Value, service: &str| {
        w["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["service"] == service)
            .unwrap()["amplification"]
            .as_f64()
            .unwrap()
    };
    for (service, expected) in [("api", 3.0), ("svc", 9.0), ("db", 27.0)] {
        assert_eq!(amplification(&offline, service), expected, "{service}");
    }
    let (code, table, _) = common::stormglass_exit(&["whatif", "--fail", "db=1", path(&file)]);
    assert_eq!(code, Some(0));
    assert!(table.contains("27.000"), "{table}");
    let (code, _, stderr) = common::stormglass_exit(&["whatif", "--fail", "nope=1", path(&file)]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("no such service"), "{stderr}");
    let (code, _, _) = common::stormglass_exit(&["whatif", "--fail", "db=2", path(&file)]);
    assert_eq!(code, Some(2));

    let (report, _) = analyze_json(&file);
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "200ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    serve_and_report(&server, &spans, 1, &report);
    let url = format!("http://{}/api/v1/whatif?fail=db:1", server.api);
    let (status, body) = get(&url);
    assert_eq!(status, 200, "{body}");
    let live: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(live["edges"], offline["edges"]);
    for (service, expected) in [("api", 3.0), ("svc", 9.0), ("db", 27.0)] {
        assert_eq!(amplification(&live, service), expected, "{service}");
    }
    let (status, body) = get(&format!("http://{}/api/v1/whatif?fail=db", server.api));
    assert_eq!(status, 400, "{body}");
    let (status, _) = get(&format!("http://{}/api/v1/whatif", server.api));
    assert_eq!(status, 400);
}

/// check-budget: the table (300 + 400 + 100 in 800) passes and 500 + 400 in 800
/// fails; against traffic, a declared timeout under the callee's P99.9 fails saying what it
/// kills and an undeclared edge warns (errors listed first, `--limit` counting the rest); a
/// budget emitted from traffic passes against that traffic; a bad file is every problem at
/// once, exit 2.
#[test]
fn check_budget_on_its_own_against_traffic_and_emitted() {
    let scratch = temp_dir("budget");
    let d = scratch.path();
    let write = |name: &str, text: &str| {
        let path = d.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let fits = write(
        "fits.yaml",
        "edges:
  - {caller: gateway, callee: order, timeout: 800ms}
  - {caller: order, callee: inventory, timeout: 300ms}
  - {caller: order, callee: payment, timeout: 400ms}
  - {caller: order, callee: user, timeout: 100ms}
sequential:
  order: [inventory, payment, user]
",
    );
    let (code, stdout, stderr) = common::stormglass_exit(&["check-budget", path(&fits)]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("4 edge(s) declared: 0 error(s), 0 warning(s)"),
        "{stdout}"
    );
    let over = write(
        "over.toml",
        "[[edges]]
caller = \"gateway\"
callee = \"order\"
timeout = \"800ms\"
[[edges]]
caller = \"order\"
callee = \"inventory\"
timeout = \"500ms\"
[[edges]]
caller = \"order\"
callee = \"payment\"
timeout = \"400ms\"
[sequential]
order = [\"inventory\", \"payment\"]
",
    );
    let (code, stdout, _) = common::stormglass_exit(&["check-budget", path(&over)]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("error overcommit: order calls inventory, payment one after another: 500 + 400 = 900 ms, more than its budget of 800 ms"),
        "{stdout}"
    );

    // Against traffic: basket's pricing calls take 180 ms a quarter of the time.
    let mut spans = Spans::default();
    fixtures::timeouts(&mut spans, 1);
    let traffic = d.join("timeouts.jsonl");
    write_jsonl(&traffic, &spans, None);
    let tight = write(
        "tight.yaml",
        "edges:\n  - {caller: basket, callee: pricing, timeout: 100ms}\n",
    );
    let (code, stdout, _) =
        common::stormglass_exit(&["check-budget", path(&tight), "--against", path(&traffic)]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("error timeout_below_tail: basket -> pricing: the declared 100 ms is below pricing's observed P99.9 of 178 ms and kills 25.0% of its calls"),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("warning undeclared_edge: basket -> tax is in the traffic but not declared"),
        "{stdout}"
    );
    // Cut to one, the error comes first and the rest are counted.
    let (code, stdout, _) = common::stormglass_exit(&[
        "check-budget",
        path(&tight),
        "--against",
        path(&traffic),
        "--limit",
        "1",
    ]);
    assert_eq!(code, Some(1), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("error timeout_below_tail"), "{stdout}");
    assert!(
        lines[1].starts_with("... and ") && lines[1].contains("more violation(s)"),
        "{stdout}"
    );

    // Emitted from healthy traffic, then checked against it: it passes.
    let mut healthy = Spans::default();
    fixtures::healthy(&mut healthy, 1);
    let traffic = d.join("healthy.jsonl");
    write_jsonl(&traffic, &healthy, None);
    let (code, emitted, stderr) =
        common::stormglass_exit(&["check-budget", "--emit", path(&traffic)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        emitted.contains("callee: api") && emitted.contains("timeout: 900ms"),
        "{emitted}"
    );
    let baseline = write("baseline.yaml", &emitted);
    let (code, stdout, _) =
        common::stormglass_exit(&["check-budget", path(&baseline), "--against", path(&traffic)]);
    assert_eq!(code, Some(0), "{emitted}\n{stdout}");

    let bad = write(
        "bad.yaml",
        "edges:\n  - {caller: a, callee: b, timeout: soon}\n  - {caller: a, timeout: 1s}\n",
    );
    let (code, _, stderr) = common::stormglass_exit(&["check-budget", path(&bad)]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("edges[0].timeout") && stderr.contains("edges[1].callee"),
        "{stderr}"
    );
}

/// Whether `edges` (a JSON array) are in (caller, callee, operation) order.
fn listed_by_name(edges: &Value) -> bool {
    let key = |e: &Value| {
        ["caller", "callee", "operation"].map(|k| e[k].as_str().unwrap_or_default().to_owned())
    };
    let keys: Vec<_> = edges.as_array().unwrap().iter().map(key).collect();
    keys.windows(2).all(|w| w[0] <= w[1])
}

/// The 400-service mesh of the width tests (3,000 traces, ~4,000 edges), written to a file
/// in the directory returned with it.
struct WideMesh {
    spans: Spans,
    mesh: stormglass_testkit::mesh::Mesh,
    file: PathBuf,
    dir: tempfile::TempDir,
}

fn wide_mesh_file(name: &str) -> WideMesh {
    let mut spans = Spans::default();
    let mesh = stormglass_testkit::mesh::wide_mesh(&mut spans, 400, 3000);
    let dir = temp_dir(name);
    let file = dir.path().join("mesh.jsonl");
    write_jsonl(&file, &spans, None);
    WideMesh {
        spans,
        mesh,
        file,
        dir,
    }
}

/// A mesh of 400 services as a user reads it: the report
/// lists at most `report.max_findings_per_kind` findings of a kind with every kind's total,
/// no alert has more than `alerts.max_instances_per_rule` instances (the inversions
/// summarised per caller), and no timeout is judged against a service's slow entry
/// operation (every service's layer tail) instead of the operation it guards.
#[test]
fn a_wide_mesh_stays_readable_and_judged_per_operation() {
    let WideMesh {
        mesh,
        file,
        dir: _dir,
        ..
    } = wide_mesh_file("wide-mesh");
    // By default, the worst 200 edges and layers, saying how many there are.
    let (shown, _) = analyze_json(&file);
    assert_eq!(shown["edges"].as_array().unwrap().len(), 200);
    assert_eq!(shown["layers"].as_array().unwrap().len(), 200);
    let listing = &shown["listing"];
    assert_eq!(listing["edges"], mesh.edges.len() as u64, "{listing}");
    assert_eq!(listing["layers"], 400, "{listing}");
    assert_eq!(listing["truncated"], true, "{listing}");
    // Listed by name, as the order says: the worst kept, not moved to the top.
    assert!(listed_by_name(&shown["edges"]), "{listing}");
    assert!(
        listing["order"]
            .as_str()
            .unwrap()
            .ends_with("listed by name"),
        "{listing}"
    );
    // Entry operations (one per service) the worst 200 too; coverage and trace counts per
    // service those of the listed edges' and layers' services.
    assert_eq!(shown["entries"].as_array().unwrap().len(), 200);
    assert_eq!(
        (&listing["entries"], &listing["entries_listed"]),
        (&400.into(), &200.into()),
        "{listing}"
    );
    let named: std::collections::HashSet<&str> = (shown["edges"].as_array().unwrap().iter())
        .flat_map(|e| [e["caller"].as_str().unwrap(), e["callee"].as_str().unwrap()])
        .chain(
            shown["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["service"].as_str().unwrap()),
        )
        .collect();
    let covered = shown["coverage"]["services"].as_array().unwrap();
    let counted = shown["traces"]["by_service"].as_array().unwrap();
    assert!(
        covered.len() < 400 && !covered.is_empty(),
        "{}",
        covered.len()
    );
    assert_eq!(
        listing["services_listed"],
        covered.len() as u64,
        "{listing}"
    );
    for s in covered.iter().chain(counted) {
        assert!(named.contains(s["service"].as_str().unwrap()), "{s}");
    }
    // Around one service: its calls in and out.
    let (ok, around, stderr) = stormglass(&[
        "analyze",
        "--format",
        "json",
        "--service",
        "svc-0007",
        path(&file),
    ]);
    assert!(ok, "{stderr}");
    let around: Value = serde_json::from_str(&around).unwrap();
    let touching = mesh
        .edges
        .iter()
        .filter(|(a, b)| a == "svc-0007" || b == "svc-0007")
        .count();
    assert_eq!(around["edges"].as_array().unwrap().len(), touching);
    assert_eq!(around["listing"]["truncated"], false);
    // Its coverage: of the service and the services it calls and is called by.
    let neighbours: std::collections::HashSet<&String> = (mesh.edges.iter())
        .filter(|(a, b)| a == "svc-0007" || b == "svc-0007")
        .flat_map(|(a, b)| [a, b])
        .collect();
    let around_services = around["coverage"]["services"].as_array().unwrap().len();
    assert_eq!(around_services, neighbours.len(), "{}", around["listing"]);

    let (ok, all, stderr) = stormglass(&["analyze", "--format", "json", "--all", path(&file)]);
    assert!(ok, "{stderr}");
    let r: Value = serde_json::from_str(&all).unwrap();
    let edges = r["edges"].as_array().unwrap();
    assert_eq!(edges.len(), mesh.edges.len());
    assert_eq!(r["entries"].as_array().unwrap().len(), 400);
    let all_covered = r["coverage"]["services"].as_array().unwrap().len() as u64;
    assert_eq!(listing["services"], all_covered, "{listing}");
    assert_eq!(r["listing"]["services_listed"], all_covered);
    assert_eq!(r["listing"]["truncated"], false);
    // Coverage listed by name, whatever order the query's partitions gave its rows.
    let services: Vec<&str> = (r["coverage"]["services"].as_array().unwrap().iter())
        .map(|s| s["service"].as_str().unwrap())
        .collect();
    assert!(services.is_sorted());
    let coverage = &r["coverage"]["edges"];
    assert_eq!(coverage.as_array().unwrap().len(), mesh.edges.len());
    assert!(listed_by_name(coverage));
    for e in edges {
        assert_eq!(e["callee_latency_source"], "edge", "{e}");
        let p999 = e["callee_p999_ms"].as_f64().unwrap();
        assert!((p999 - 20.0).abs() <= 0.4, "{e}");
        assert_eq!(e["timeout_below_tail"], false, "{e}");
    }
    let layer = r["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["service"] == "svc-0001")
        .unwrap();
    let operations: Vec<&str> = layer["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation"].as_str().unwrap())
        .collect();
    assert_eq!(operations, ["/entry", "/item"], "{layer}");

    let totals = r["finding_totals"].as_array().unwrap();
    let total = |kind: &str| totals.iter().find(|t| t["kind"] == kind);
    assert_eq!(
        total("not_propagated").unwrap()["findings"],
        mesh.edges.len() as u64
    );
    assert_eq!(
        total("deadline_inversion").unwrap()["findings"],
        mesh.inverted.len() as u64
    );
    assert!(total("timeout_below_tail").is_none(), "{totals:?}");
    for t in totals {
        let listed = r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == t["kind"])
            .count() as u64;
        assert_eq!(t["listed"], listed, "{t}");
        assert_eq!(listed, t["findings"].as_u64().unwrap().min(100), "{t}");
    }

    let alerts = r["alerts"].as_array().unwrap();
    let mut per_rule = std::collections::BTreeMap::<&str, usize>::new();
    for a in alerts {
        *per_rule.entry(a["name"].as_str().unwrap()).or_default() += 1;
    }
    assert!(per_rule.values().all(|n| *n <= 50), "{per_rule:?}");
    let inversions: Vec<&Value> = alerts
        .iter()
        .filter(|a| a["name"] == "StormglassDeadlineInversion")
        .collect();
    assert_eq!(inversions.len(), 50);
    for a in inversions {
        // One per caller service, naming how many of its pairs breach and the worst.
        let labels = a["labels"].as_object().unwrap();
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            ["caller", "instances"],
            "{a}"
        );
        assert_eq!(labels["instances"], "per_caller", "{a}");
        assert!(a["detail"].as_str().unwrap().contains("the worst"), "{a}");
        assert!(a["value"].as_f64().unwrap() >= 1.0, "{a}");
    }
}

/// Advice at width: the text lists the worst 200 edges and says so (as `analyze` does),
/// `--limit` lists fewer; the JSON (the policy `replay` reads) and the emitted
/// configurations keep every edge whatever the limit.
#[test]
fn advice_at_width_lists_the_worst_and_configures_all() {
    let WideMesh {
        mesh,
        file,
        dir: _dir,
        ..
    } = wide_mesh_file("wide-advice");
    let advise = |args: &[&str]| {
        let mut all = vec!["advise"];
        all.extend_from_slice(args);
        all.push(path(&file));
        let (ok, out, stderr) = stormglass(&all);
        assert!(ok, "{stderr}");
        out
    };
    let text = advise(&[]);
    let header = format!("The worst 200 of {} edges", mesh.edges.len());
    assert!(
        text.starts_with(&header),
        "{}",
        &text[..200.min(text.len())]
    );
    let rows = |t: &str| t.lines().filter(|l| l.contains(" -> ")).count();
    assert_eq!(rows(&text), 200);
    assert_eq!(rows(&advise(&["--limit", "10"])), 10);
    let json: Value =
        serde_json::from_str(&advise(&["--format", "json", "--limit", "10"])).unwrap();
    assert_eq!(json["edges"].as_array().unwrap().len(), mesh.edges.len());
    // The budget table: one entry per (caller, callee) pair, each edge of the mesh its own.
    let budget = advise(&["--format", "budget", "--limit", "10"]);
    let pairs = budget.lines().filter(|l| l.contains("caller:")).count();
    assert_eq!(
        pairs,
        mesh.edges.len(),
        "{}",
        &budget[..300.min(budget.len())]
    );
    // ... which check-budget passes: each service's calls fit the shortest timeout of its
    // callers, the budget check-budget reads.
    let table = file.with_file_name("budget.yaml");
    std::fs::write(&table, &budget).unwrap();
    let (code, out, err) = common::stormglass_exit(&["check-budget", path(&table)]);
    assert_eq!(code, Some(0), "{}{err}", &out[..2000.min(out.len())]);
}

/// Replay and what-if at width: each lists the worst 200 edges (and layers) by default,
/// saying how many there are and in which order, with totals over every edge; `--all`
/// lists every edge, `--caller` those of one caller; the what-if lists the failing
/// service and its callers, which fail only on the requests that call it; an unknown
/// `--fail` names a few services and counts the rest instead of listing all 400.
#[test]
fn replay_and_whatif_at_width_list_the_worst_with_totals() {
    let WideMesh {
        mesh, file, dir, ..
    } = wide_mesh_file("wide-replay");
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.push(path(&file));
        let (ok, out, stderr) = stormglass(&all);
        assert!(ok, "{args:?}: {stderr}");
        out
    };
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, run(&["advise", "--format", "json"])).unwrap();
    let replay = |args: &[&str]| -> Value {
        let mut all = vec!["replay", "--format", "json", "--policy", path(&policy)];
        all.extend_from_slice(args);
        serde_json::from_str(&run(&all)).unwrap()
    };
    let shown = replay(&[]);
    let everything = replay(&["--all"]);
    assert_eq!(shown["edges"].as_array().unwrap().len(), 200);
    assert_eq!(shown["listing"]["edges"], mesh.edges.len() as u64);
    assert_eq!(shown["listing"]["truncated"], true);
    assert!(
        shown["listing"]["order"]
            .as_str()
            .unwrap()
            .contains("successes lost, then attempts saved; listed by name")
    );
    assert!(listed_by_name(&shown["edges"]));
    let all_edges = everything["edges"].as_array().unwrap();
    assert_eq!(all_edges.len(), mesh.edges.len());
    assert_eq!(everything["listing"]["truncated"], false);
    // The totals are every edge's, listed or not.
    assert_eq!(shown["totals"], everything["totals"]);
    let calls: f64 = all_edges.iter().map(|e| e["calls"].as_f64().unwrap()).sum();
    let total = shown["totals"]["calls"].as_f64().unwrap();
    assert!(
        (calls - total).abs() < 1e-6 * calls.max(1.0),
        "{calls} vs {total}"
    );
    let one = replay(&["--caller", "svc-0007"]);
    let made = mesh.edges.iter().filter(|(a, _)| a == "svc-0007").count();
    assert_eq!(one["edges"].as_array().unwrap().len(), made);
    assert_eq!(one["listing"]["truncated"], false);
    let text = run(&["replay", "--policy", path(&policy)]);
    assert!(
        text.contains("The worst 200 of"),
        "{}",
        &text[..300.min(text.len())]
    );

    let whatif: Value = serde_json::from_str(&run(&[
        "whatif",
        "--format",
        "json",
        "--fail",
        "svc-0001=0.5",
    ]))
    .unwrap();
    assert_eq!(whatif["edges"].as_array().unwrap().len(), 200);
    assert_eq!(whatif["layers"].as_array().unwrap().len(), 200);
    assert_eq!(whatif["listing"]["layers"], 400);
    assert_eq!(whatif["listing"]["edges"], mesh.edges.len() as u64);
    // The failing service and its callers are listed, however quiet: the answer, not
    // the busiest layers it leaves alone. Each caller calls svc-0001 on a few of its
    // requests, and only those fail.
    let layer = |service: &str| -> &Value {
        let mut layers = whatif["layers"].as_array().unwrap().iter();
        layers
            .find(|l| l["service"] == service)
            .unwrap_or_else(|| panic!("{service} is not listed"))
    };
    assert_eq!(layer("svc-0001")["success_probability"], 0.5);
    let callers: std::collections::BTreeSet<&str> = (mesh.edges.iter())
        .filter(|(_, callee)| callee == "svc-0001")
        .map(|(caller, _)| caller.as_str())
        .collect();
    assert!(!callers.is_empty());
    for caller in callers {
        let success = layer(caller)["success_probability"].as_f64().unwrap();
        assert!((0.75..1.0).contains(&success), "{caller}: {success}");
    }
    let (ok, _, stderr) = stormglass(&["whatif", "--fail", "nowhere=1", path(&file)]);
    assert!(!ok);
    assert!(stderr.contains("and 380 more"), "{stderr}");
}

/// The built-in page at width: over a live window of the 400-service mesh it asks for the
/// worst 50 edges, draws them and their services in headless Chromium (no error), and says
/// how many edges the window holds. Needs Debian's chromium and tests/js's packages
/// (tests/run.sh installs both).
#[test]
fn the_page_shows_the_worst_of_a_wide_mesh() {
    let WideMesh {
        spans,
        mesh,
        file,
        dir: _dir,
    } = wide_mesh_file("wide-page");
    let (offline, _) = analyze_json(&file);
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "200ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let live = serve_and_report(&server, &spans, 1, &offline);
    assert_eq!(live["listing"]["edges"], mesh.edges.len() as u64);
    assert_eq!(live["listing"]["truncated"], true);
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("wide-page.png");
    let drawn = common::open_page(&format!("http://{}/", server.api), &screenshot);
    assert_eq!(drawn["errors"], serde_json::json!([]), "{drawn:#}");
    assert_eq!(drawn["edges"].as_array().unwrap().len(), 50, "{drawn:#}");
    let listing = drawn["listing"].as_str().unwrap();
    assert!(
        listing.contains(&format!("the worst 50 of {} edges", mesh.edges.len())),
        "{listing}"
    );
}
