//! Retry scenarios sent through the real OpenTelemetry SDK and OTLP/gRPC exporter, one
//! tracer provider per service (each with its own `service.name` and one instance), with
//! explicit span timestamps so the figures they produce are known exactly.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// One provider per instrumented service, exporting to stormglass' OTLP/gRPC address.
pub struct Services {
    runtime: tokio::runtime::Runtime,
    providers: Vec<SdkTracerProvider>,
    gateway: SdkTracer,
    orders: SdkTracer,
    inventory: SdkTracer,
}

const MS: Duration = Duration::from_millis(1);

impl Services {
    pub fn new(grpc: &str) -> Services {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let providers: Vec<SdkTracerProvider> = ["gateway", "orders", "inventory"]
            .iter()
            .map(|service| {
                runtime.block_on(async {
                    let exporter = opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_endpoint(format!("http://{grpc}"))
                        .build()
                        .unwrap();
                    SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_resource(
                            Resource::builder()
                                .with_service_name((*service).to_owned())
                                .with_attribute(KeyValue::new(
                                    "service.instance.id",
                                    format!("{service}-0"),
                                ))
                                .build(),
                        )
                        .build()
                })
            })
            .collect();
        Services {
            gateway: providers[0].tracer("stormglass-e2e"),
            orders: providers[1].tracer("stormglass-e2e"),
            inventory: providers[2].tracer("stormglass-e2e"),
            providers,
            runtime,
        }
    }

    /// Export everything emitted so far.
    pub fn flush(&self) {
        for p in &self.providers {
            p.force_flush().unwrap();
        }
    }

    /// The storm: gateway -> orders -> inventory -> db, every layer tries 3 times (two
    /// deadline failures, then success), so db receives 27 attempts per request
    /// (amplification 27, storm potential 27).
    pub fn storm(&self, t0: SystemTime) {
        let root = self.span(
            &self.gateway,
            "GET /checkout",
            SpanKind::Server,
            None,
            t0,
            900,
            &[deadline(1000)],
            true,
        );
        for i in 0..3u64 {
            let start = t0 + MS * (1 + 300 * i as u32);
            let ok = i == 2;
            let call = self.span(
                &self.gateway,
                "GET /orders",
                SpanKind::Client,
                Some(&root),
                start,
                250,
                &attempt("orders", i, 250, ok),
                ok,
            );
            let server = self.span(
                &self.orders,
                "GET /orders",
                SpanKind::Server,
                Some(&call),
                start + MS * 2,
                240,
                &[deadline(248)],
                ok,
            );
            for j in 0..3u64 {
                let start = start + MS * (3 + 75 * j as u32);
                let ok = j == 2;
                let call = self.span(
                    &self.orders,
                    "GET /stock",
                    SpanKind::Client,
                    Some(&server),
                    start,
                    70,
                    &attempt("inventory", j, 70, ok),
                    ok,
                );
                let server = self.span(
                    &self.inventory,
                    "GET /stock",
                    SpanKind::Server,
                    Some(&call),
                    start + MS,
                    66,
                    &[deadline(69)],
                    ok,
                );
                for k in 0..3u64 {
                    let start = start + MS * (2 + 20 * k as u32);
                    let ok = k == 2;
                    self.span(
                        &self.inventory,
                        "SELECT stock",
                        SpanKind::Client,
                        Some(&server),
                        start,
                        18,
                        &attempt("db", k, 18, ok),
                        ok,
                    );
                }
            }
        }
    }

    /// A healthy chain: one attempt per layer, generous deadlines, no retries.
    pub fn healthy(&self, t0: SystemTime) {
        let root = self.span(
            &self.gateway,
            "GET /checkout",
            SpanKind::Server,
            None,
            t0,
            50,
            &[deadline(1000)],
            true,
        );
        let call = self.span(
            &self.gateway,
            "GET /orders",
            SpanKind::Client,
            Some(&root),
            t0 + MS,
            44,
            &attempt("orders", 0, 800, true),
            true,
        );
        let server = self.span(
            &self.orders,
            "GET /orders",
            SpanKind::Server,
            Some(&call),
            t0 + MS * 2,
            42,
            &[deadline(799)],
            true,
        );
        let call = self.span(
            &self.orders,
            "GET /stock",
            SpanKind::Client,
            Some(&server),
            t0 + MS * 3,
            37,
            &attempt("inventory", 0, 500, true),
            true,
        );
        let server = self.span(
            &self.inventory,
            "GET /stock",
            SpanKind::Server,
            Some(&call),
            t0 + MS * 4,
            35,
            &[deadline(499)],
            true,
        );
        self.span(
            &self.inventory,
            "SELECT stock",
            SpanKind::Client,
            Some(&server),
            t0 + MS * 5,
            30,
            &attempt("db", 0, 200, true),
            true,
        );
    }

    /// Start and end one span; returns its context for children.
    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        tracer: &SdkTracer,
        name: &'static str,
        kind: SpanKind,
        parent: Option<&SpanContext>,
        start: SystemTime,
        duration_ms: u32,
        attributes: &[KeyValue],
        ok: bool,
    ) -> SpanContext {
        let parent = match parent {
            Some(p) => Context::new().with_remote_span_context(p.clone()),
            None => Context::new(),
        };
        let mut span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_start_time(start)
            .with_attributes(attributes.to_vec())
            .start_with_context(tracer, &parent);
        if !ok {
            span.set_status(Status::error("deadline exceeded"));
        }
        let context = span.span_context().clone();
        span.end_with_timestamp(start + MS * duration_ms);
        context
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        let _guard = self.runtime.enter();
        for p in &self.providers {
            let _ = p.shutdown();
        }
    }
}

fn deadline(ms: i64) -> KeyValue {
    KeyValue::new("deadline", format!("{ms}ms"))
}

/// A client attempt: the callee, the attempt number, its budget and outcome (504 when it
/// timed out).
fn attempt(callee: &'static str, n: u64, budget_ms: i64, ok: bool) -> Vec<KeyValue> {
    vec![
        KeyValue::new("peer.service", callee),
        KeyValue::new("retry", n as i64),
        deadline(budget_ms),
        KeyValue::new("http.request.method", "GET"),
        KeyValue::new("http.response.status_code", if ok { 200 } else { 504 }),
    ]
}
