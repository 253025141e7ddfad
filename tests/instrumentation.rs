//! End-to-end: the instrumentation snippets of docs/instrumenting.md, run as written with
//! the real OpenTelemetry SDKs against `stormglass serve`. Each snippet below is the page's
//! text verbatim (a test checks it), so what users copy is what is proven to give the
//! figures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Server, get};
use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::Value;

/// The Python snippet of docs/instrumenting.md.
const PYTHON: &str = r#"from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

tracer = trace.get_tracer("checkout")

def call_with_retries(send, key, attempts=3, timeout_ms=250):
    """Call send(timeout_ms), retrying timeouts: one CLIENT span per attempt."""
    cause = None
    for attempt in range(attempts):
        with tracer.start_as_current_span("POST /orders", kind=SpanKind.CLIENT) as span:
            span.set_attribute("peer.service", "orders")
            span.set_attribute("http.request.method", "POST")
            span.set_attribute("retry", attempt)            # 0 = the first try
            span.set_attribute("deadline", timeout_ms)      # this attempt's budget, ms
            span.set_attribute("idempotency_key", key)      # makes retrying a POST safe
            if cause:
                span.set_attribute("cause", cause)          # why this attempt is a retry
            try:
                return send(timeout_ms)
            except TimeoutError:
                span.set_status(Status(StatusCode.ERROR))
                span.set_attribute("error.type", "timeout")
                cause = "deadline"
    raise TimeoutError("orders: every attempt timed out")
"#;

// docs snippet: rust begin
/// Call `send(timeout)`, retrying its timeouts (`Err`): one CLIENT span per attempt.
fn call_with_retries<T, E>(
    key: &str,
    mut send: impl FnMut(Duration) -> Result<T, E>,
) -> Result<T, E> {
    let tracer = global::tracer("checkout");
    let timeout = Duration::from_millis(250);
    let mut cause = None;
    for attempt in 0i64.. {
        let mut span = tracer
            .span_builder("POST /orders")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("peer.service", "orders"),
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("retry", attempt), // 0 = the first try
                KeyValue::new("deadline", timeout.as_millis() as i64), // this attempt's budget, ms
                KeyValue::new("idempotency_key", key.to_owned()), // makes retrying a POST safe
            ])
            .start(&tracer);
        if let Some(cause) = cause {
            span.set_attribute(KeyValue::new("cause", cause)); // why this attempt is a retry
        }
        match send(timeout) {
            Ok(answer) => return Ok(answer),
            Err(e) => {
                span.set_status(Status::error("timeout"));
                span.set_attribute(KeyValue::new("error.type", "timeout"));
                if attempt == 2 {
                    return Err(e);
                }
                cause = Some("deadline");
            }
        }
    }
    unreachable!("the loop returns")
}
// docs snippet: rust end

/// docs/instrumenting.md shows both snippets as they are here.
#[test]
fn docs_show_the_tested_snippets() {
    let docs = std::fs::read_to_string(common::repo_root().join("docs/instrumenting.md")).unwrap();
    let this =
        std::fs::read_to_string(common::repo_root().join("tests/instrumentation.rs")).unwrap();
    let rust = this
        .split("// docs snippet: rust begin\n")
        .nth(1)
        .and_then(|rest| rest.split("// docs snippet: rust end").next())
        .unwrap();
    assert!(
        docs.contains(&format!("```python\n{PYTHON}```")),
        "docs/instrumenting.md's Python snippet differs"
    );
    assert!(
        docs.contains(&format!("```rust\n{rust}```")),
        "docs/instrumenting.md's Rust snippet differs"
    );
}

/// Calls that time out twice and then succeed, `calls` times, each under an entry SERVER
/// span: what the snippets must turn into figures.
const CALLS: usize = 20;

/// The report's `checkout -> orders` edge and its coverage once all `CALLS` calls are
/// analysed.
fn orders_edge(server: &Server) -> (Value, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = get(&format!("http://{}/api/v1/report", server.api));
        let report: Value = serde_json::from_str(&body).unwrap();
        let edge = report["edges"].as_array().unwrap().iter().find(|e| {
            e["caller"] == "checkout" && e["callee"] == "orders" && e["operation"] == "POST /orders"
        });
        if let Some(edge) = edge.filter(|e| e["logical_calls"] == CALLS as u64) {
            let coverage = report["coverage"]["edges"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["caller"] == "checkout" && c["callee"] == "orders")
                .cloned()
                .unwrap_or_default();
            return (edge.clone(), coverage);
        }
        assert!(Instant::now() < deadline, "no complete edge in {report:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What both snippets guarantee: every retry counted with its cause and budget, the retried
/// POST safe thanks to its key, and first-try success told apart from final success; the
/// coverage says every attempt carries what the figures need (the callee, not instrumented
/// here, sends no SERVER spans), in the report and as gauges.
fn assert_figures(server: &Server, (edge, coverage): &(Value, Value)) {
    let n = CALLS as u64;
    assert_eq!(edge["attempts"], 3 * n, "{edge:#}");
    assert_eq!(edge["retry_attempts"], 2 * n, "{edge:#}");
    assert_eq!(edge["retries_by_cause"]["deadline"], 2 * n, "{edge:#}");
    assert_eq!(edge["timeout_ms"], 250.0, "{edge:#}");
    assert_eq!(edge["effective_success_rate"], 0.0, "{edge:#}");
    assert_eq!(edge["raw_success_rate"], 1.0, "{edge:#}");
    assert_eq!(edge["retry_contribution"], 1.0, "{edge:#}");
    assert_eq!(edge["unsafe_retries"], 0, "{edge:#}");
    for (field, share) in [
        ("attempt_number", 1.0),
        ("cause", 1.0),
        ("deadline", 1.0),
        ("idempotency", 1.0),
        ("server_spans", 0.0),
    ] {
        assert_eq!(coverage[field], share, "{field}: {coverage:#}");
        let label = format!("field=\"{field}\"");
        server.wait_until(&format!("the {field} gauge at {share}"), |s| {
            let labels = ["caller=\"checkout\"", "callee=\"orders\"", &label];
            s.metric("stormglass_instrumentation_coverage_ratio", &labels) == share
        });
    }
}

fn fast_server() -> Server {
    Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "300ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "500ms"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ])
}

/// The docs' Python snippet, run by the Python SDK (OTLP/HTTP), gives the figures.
#[test]
fn python_snippet_gives_the_figures() {
    let server = fast_server();
    let script = format!(
        r#"import sys
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
provider = TracerProvider(resource=Resource.create({{"service.name": "checkout"}}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
trace.set_tracer_provider(provider)

{PYTHON}
for n in range({CALLS}):
    failures = [2]
    def send(timeout_ms):
        if failures[0]:
            failures[0] -= 1
            raise TimeoutError()
        return "created"
    with tracer.start_as_current_span("GET /checkout", kind=SpanKind.SERVER):
        assert call_with_retries(send, key=f"order-{{n}}") == "created"
provider.shutdown()
"#
    );
    common::python(&script, &[&format!("http://{}/v1/traces", server.http)]);
    assert_figures(&server, &orders_edge(&server));
}

/// The docs' Rust snippet, run by the Rust SDK (OTLP/gRPC), gives the figures.
#[test]
fn rust_snippet_gives_the_figures() {
    let server = fast_server();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let provider = runtime.block_on(async {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(format!("http://{}", server.grpc))
            .build()
            .unwrap();
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name("checkout").build())
            .build()
    });
    global::set_tracer_provider(provider.clone());
    let tracer = provider.tracer("checkout");
    for n in 0..CALLS {
        let entry = tracer
            .span_builder("GET /checkout")
            .with_kind(SpanKind::Server)
            .start(&tracer);
        let cx = Context::current_with_span(entry);
        let guard = cx.clone().attach();
        let mut failures = 2;
        let answer = call_with_retries(&format!("order-{n}"), |_timeout| {
            if failures > 0 {
                failures -= 1;
                Err("timed out")
            } else {
                Ok("created")
            }
        });
        assert_eq!(answer, Ok("created"));
        drop(guard);
        cx.span().end();
    }
    provider.force_flush().unwrap();
    assert_figures(&server, &orders_edge(&server));
    let _ = provider.shutdown();
}
