//! End-to-end: the real `stormglass serve` binary fed by the real OpenTelemetry Rust SDK.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Server, get};
use opentelemetry::KeyValue;
use opentelemetry::trace::{Span, SpanKind, Tracer, TracerProvider};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::io::Write;

/// Emit `traces` traces of one SERVER span and two CLIENT attempts each (a retry), through
/// `provider`, then flush and shut it down. Returns the span count.
fn emit(provider: SdkTracerProvider, traces: usize) -> usize {
    let tracer = provider.tracer("stormglass-e2e");
    for _ in 0..traces {
        tracer.in_span("GET /checkout", |cx| {
            for attempt in 0..2i64 {
                let mut span = tracer
                    .span_builder("POST /orders")
                    .with_kind(SpanKind::Client)
                    .with_attributes([
                        KeyValue::new("retry", attempt),
                        KeyValue::new("deadline", "200ms"),
                        KeyValue::new("peer.service", "orders"),
                    ])
                    .start_with_context(&tracer, &cx);
                span.end();
            }
        });
    }
    provider.force_flush().unwrap();
    provider.shutdown().unwrap();
    traces * 3
}

fn resource(service: &str) -> Resource {
    Resource::builder()
        .with_service_name(service.to_owned())
        .build()
}

/// A tracer provider exporting to `server` over OTLP/HTTP with `protocol`.
fn http_provider(server: &Server, protocol: Protocol) -> SdkTracerProvider {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_endpoint(format!("http://{}/v1/traces", server.http))
        .build()
        .unwrap();
    SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource("gateway"))
        .build()
}

/// Spans exported by the SDK's OTLP exporters over gRPC (plain and gzip), HTTP/protobuf and
/// HTTP/JSON all arrive, are counted per transport, and assembled and released; at rest
/// accepted = released + late + open.
#[test]
fn real_sdk_exporters_over_every_transport() {
    let server = Server::start(&[("STORMGLASS_ASSEMBLY__IDLE", "300ms")]);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let grpc_spans: usize = [None, Some(opentelemetry_otlp::Compression::Gzip)]
        .into_iter()
        .map(|compression| {
            let provider = runtime.block_on(async {
                let mut builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(format!("http://{}", server.grpc));
                if let Some(c) = compression {
                    builder = builder.with_compression(c);
                }
                SdkTracerProvider::builder()
                    .with_batch_exporter(builder.build().unwrap())
                    .with_resource(resource("gateway"))
                    .build()
            });
            emit(provider, 10)
        })
        .sum();

    let proto_spans = emit(http_provider(&server, Protocol::HttpBinary), 7);
    let json_spans = emit(http_provider(&server, Protocol::HttpJson), 7);

    let accepted = |t: &str| server.metric("stormglass_receiver_accepted_spans_total", &[t]);
    assert_eq!(accepted("transport=\"grpc\"") as usize, grpc_spans);
    assert_eq!(
        accepted("transport=\"http_protobuf\"") as usize,
        proto_spans
    );
    assert_eq!(accepted("transport=\"http_json\"") as usize, json_spans);

    server.wait_until("every trace released", |s| {
        s.metric("stormglass_assembly_spans", &[]) == 0.0
            && s.metric("stormglass_assembly_released_spans_total", &[]) > 0.0
    });
    let total = (grpc_spans + proto_spans + json_spans) as f64;
    let released = server.metric("stormglass_assembly_released_spans_total", &[]);
    let late = server.metric("stormglass_assembly_late_spans_total", &[]);
    assert_eq!(
        server.metric("stormglass_receiver_accepted_spans_total", &[]),
        total
    );
    assert_eq!(released + late, total);
    assert_eq!(
        server.metric("stormglass_assembly_released_traces_total", &[]),
        (2 * 10 + 2 * 7) as f64
    );
    assert_eq!(
        server.metric("stormglass_receiver_refused_spans_total", &[]),
        0.0
    );
}

/// SIGTERM releases every open trace (none are lost to a long idle timeout) and exits 0.
#[test]
fn sigterm_releases_open_traces() {
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "1h"),
        ("STORMGLASS_ASSEMBLY__MAX_AGE", "2h"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ]);
    emit(http_provider(&server, Protocol::HttpBinary), 4);
    assert_eq!(server.metric("stormglass_assembly_traces", &[]), 4.0);
    let (ok, stderr) = server.terminate();
    assert!(ok, "non-zero exit: {stderr}");
    assert!(
        stderr.contains("released every open trace at shutdown traces=4"),
        "{stderr}"
    );
    assert!(stderr.contains("assembly drained open_spans=0"), "{stderr}");
}

/// Once input stops, the collector stops merging its window: the intervals after it reuse
/// the last report (`stormglass_analysis_report_builds_total` stays put while intervals go on),
/// which still holds the traces, until an interval with data leaves the window.
#[test]
fn an_idle_window_is_not_rebuilt() {
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "100ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "200ms"),
    ]);
    let spans = emit(http_provider(&server, Protocol::HttpBinary), 5);
    server.wait_until("the spans analysed", |s| {
        s.metric("stormglass_analysis_spans_total", &[]) == spans as f64
    });
    let intervals = |s: &Server| s.metric("stormglass_analysis_duration_seconds_count", &[]);
    let builds = |s: &Server| s.metric("stormglass_analysis_report_builds_total", &[]);
    // Bounded by wait_until: five intervals in a row without a build.
    let mut since = (intervals(&server), builds(&server));
    server.wait_until("five intervals without a rebuild", |s| {
        let now = (intervals(s), builds(s));
        if now.1 != since.1 {
            since = now;
        }
        now.0 >= since.0 + 5.0
    });
    let (_, report) = get(&format!("http://{}/api/v1/report", server.api));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["window"]["spans"], spans as u64, "{report}");
}

/// A graceful stop publishes the last interval: the counters of series first seen in it
/// (held back one interval so rate() sees them start at 0) reach /metrics, which keeps
/// answering for shutdown.drain, and the process then exits 0.
#[test]
fn sigterm_publishes_final_counters_during_drain() {
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "1h"),
        ("STORMGLASS_ASSEMBLY__MAX_AGE", "2h"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1h"),
        ("STORMGLASS_ANALYTICS__WINDOW", "1h"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "3s"),
    ]);
    emit(http_provider(&server, Protocol::HttpBinary), 4);
    assert_eq!(server.metric("stormglass_logical_calls_total", &[]), 0.0);
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    server.wait_until("the last interval's counters on /metrics", |s| {
        s.metric("stormglass_logical_calls_total", &[]) == 4.0
    });
    let (ok, stderr) = server.terminate();
    assert!(ok, "non-zero exit: {stderr}");
    assert!(stderr.contains("shutdown.drain"), "{stderr}");
}

/// Over assembly.max_spans: exporters are told to retry, /readyz reports not ready, and the
/// refusal is counted under its own reason.
#[test]
fn span_bound_is_retryable_and_visible() {
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__MAX_SPANS", "3"),
        ("STORMGLASS_ASSEMBLY__IDLE", "1h"),
        ("STORMGLASS_ASSEMBLY__MAX_AGE", "2h"),
    ]);
    assert_eq!(get(&format!("http://{}/readyz", server.api)).0, 200);
    let url = format!("http://{}/v1/traces", server.http);
    let body = |n: u8| -> String {
        let spans: Vec<String> = (1..=n)
            .map(|i| format!(r#"{{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"00000000000000{i:02x}","name":"x","startTimeUnixNano":"1","endTimeUnixNano":"2"}}"#))
            .collect();
        format!(
            r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
            spans.join(",")
        )
    };
    let client = reqwest::blocking::Client::new();
    let post = |n| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .body(body(n))
            .send()
            .unwrap()
    };
    let refused = post(4);
    assert_eq!(refused.status().as_u16(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(post(3).status().as_u16(), 200);
    assert_eq!(get(&format!("http://{}/readyz", server.api)).0, 503);
    assert_eq!(get(&format!("http://{}/healthz", server.api)).0, 200);
    assert_eq!(
        server.metric(
            "stormglass_receiver_refused_spans_total",
            &["reason=\"max_spans\""]
        ),
        4.0
    );
}

/// A bad configuration stops start-up with every problem named by its key.
#[test]
fn config_errors_name_the_key() {
    let scratch = common::temp_dir("e2e");
    let dir = scratch.path();
    let path = dir.join("bad.toml");
    let mut file = std::fs::File::create(&path).unwrap();
    writeln!(
        file,
        "[assembly]\nidle = \"soon\"\n[limits]\nmax_request_bytes = 0"
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stormglass"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("STORMGLASS_LISTEN__GRPC", "not-an-address")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for key in ["assembly.idle", "limits.max_request_bytes", "listen.grpc"] {
        assert!(stderr.contains(key), "{key} not named in: {stderr}");
    }
}

/// Coarse clocks: 100 calls of 2 attempts (503, then resend_count=1 and 200) whose attempts
/// start in the same millisecond, sent by the OpenTelemetry JS SDK through all three of its
/// OTLP exporters (HTTP/JSON, HTTP/protobuf, gRPC), read as 100 calls: effective success 0,
/// raw success 1, never 145-150 calls split by span id order. Needs tests/js's packages
/// (tests/run.sh installs them).
#[test]
fn js_sdk_coarse_clock_attempts_stay_one_call() {
    let js = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/js");
    assert!(
        js.join("node_modules").is_dir(),
        "run `npm ci` in tests/js (tests/run.sh does) for the JS exporter test"
    );
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "300ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "300ms"),
    ]);
    let http = format!("http://{}", server.http);
    let grpc = format!("http://{}", server.grpc);
    for (protocol, url, count) in [
        ("http/json", &http, "34"),
        ("http/protobuf", &http, "33"),
        ("grpc", &grpc, "33"),
    ] {
        let status = std::process::Command::new("node")
            .arg(js.join("coarse_clock.mjs"))
            .args([protocol, url.as_str(), count])
            .status()
            .expect("node runs");
        assert!(status.success(), "{protocol} exporter failed");
    }
    let report_url = format!("http://{}/api/v1/report", server.api);
    let mut report = serde_json::Value::Null;
    server.wait_until("300 spans analysed", |s| {
        report = serde_json::from_str(&get(&report_url).1).unwrap();
        s.metric("stormglass_analysis_spans_total", &[]) == 300.0
            && report["window"]["spans"] == 300
    });
    let edge = report["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["caller"] == "web" && e["callee"] == "inv")
        .unwrap();
    assert_eq!(edge["logical_calls"], 100, "{edge}");
    assert_eq!(edge["attempts"], 200);
    assert_eq!(edge["effective_success_rate"], 0.0);
    assert_eq!(edge["raw_success_rate"], 1.0);
}

/// A fresh instance, before any traffic, exports at 0 the counters of events it has not
/// seen yet (refusals by transport and reason, malformed fields, notification results,
/// folded series per metric, internal errors per task): a first refusal or failed
/// notification is then an increase Prometheus sees, not a series appearing at 1.
#[test]
fn fresh_instance_exports_event_counters_at_zero() {
    let server = Server::start(&[("STORMGLASS_SHUTDOWN__DRAIN", "0s")]);
    let metrics = server.metrics();
    let series = |name: &str, labels: &[&str]| {
        metrics.iter().any(|(s, v)| {
            s.split('{').next() == Some(name) && labels.iter().all(|l| s.contains(l)) && *v == 0.0
        })
    };
    for transport in ["grpc", "http_protobuf", "http_json", "http"] {
        for reason in [
            "undecodable",
            "too_large",
            "memory_limit",
            "concurrency",
            "timeout",
        ] {
            let labels = [
                format!("transport=\"{transport}\""),
                format!("reason=\"{reason}\""),
            ];
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            assert!(
                series("stormglass_receiver_refused_requests_total", &labels),
                "no refused_requests {labels:?} at 0"
            );
        }
    }
    for (name, labels) in [
        (
            "stormglass_alert_notifications_total",
            &["receiver=\"alertmanager\"", "result=\"failed\""][..],
        ),
        (
            "stormglass_alert_notifications_total",
            &["receiver=\"webhook\"", "result=\"retried\""],
        ),
        (
            "stormglass_export_overflow_total",
            &["metric=\"stormglass_attempts_total\""],
        ),
        (
            "stormglass_export_dropped_series",
            &["metric=\"stormglass_retry_ratio\""],
        ),
        (
            "stormglass_receiver_malformed_fields_total",
            &["field=\"attempt\""],
        ),
        ("stormglass_internal_errors_total", &["task=\"analysis\""]),
    ] {
        assert!(series(name, labels), "no {name} {labels:?} at 0");
    }
}
