//! One OpenTelemetry tracer provider per demo service, each with its own `service.name`,
//! exporting to stormglass with the real OTLP exporters: the gateway and order services over
//! OTLP/gRPC, inventory and payment over OTLP/HTTP (protobuf). W3C trace context travels in
//! HTTP headers and gRPC metadata through the SDK's propagator.

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

/// The demo's services, in call order.
pub const SERVICES: [&str; 4] = ["gateway", "order", "inventory", "payment"];

#[derive(Debug, thiserror::Error)]
#[error("cannot build the OTLP exporter for {service}")]
pub struct ExporterError {
    service: &'static str,
    #[source]
    source: opentelemetry_otlp::ExporterBuildError,
}

/// The tracers of the demo services.
pub struct Telemetry {
    providers: Vec<SdkTracerProvider>,
    pub gateway: SdkTracer,
    pub order: SdkTracer,
    pub inventory: SdkTracer,
    pub payment: SdkTracer,
}

impl Telemetry {
    /// Exporters to stormglass at `grpc` (OTLP/gRPC `host:port`) and `http` (OTLP/HTTP
    /// `host:port`). Must be called inside a tokio runtime (the gRPC exporter needs one).
    pub fn new(grpc: &str, http: &str) -> Result<Telemetry, ExporterError> {
        let mut providers = Vec::new();
        for service in SERVICES {
            let built = if matches!(service, "gateway" | "order") {
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(format!("http://{grpc}"))
                    .build()
            } else {
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(format!("http://{http}/v1/traces"))
                    .build()
            };
            let exporter = built.map_err(|source| ExporterError { service, source })?;
            // Export often (traces are assembled from four services' exports) and queue
            // generously, so a burst is not dropped by the SDK.
            let processor = BatchSpanProcessor::builder(exporter)
                .with_batch_config(
                    BatchConfigBuilder::default()
                        .with_scheduled_delay(Duration::from_millis(200))
                        .with_max_queue_size(1 << 16)
                        .with_max_export_batch_size(2048)
                        .build(),
                )
                .build();
            providers.push(
                SdkTracerProvider::builder()
                    .with_span_processor(processor)
                    .with_resource(Resource::builder().with_service_name(service).build())
                    .build(),
            );
        }
        let tracer = |i: usize| providers[i].tracer("stormglass-demo");
        Ok(Telemetry {
            gateway: tracer(0),
            order: tracer(1),
            inventory: tracer(2),
            payment: tracer(3),
            providers,
        })
    }

    /// Export every span ended so far.
    pub fn flush(&self) {
        for p in &self.providers {
            if let Err(e) = p.force_flush() {
                tracing::warn!(error = %e, "flushing demo spans failed");
            }
        }
    }

    pub fn shutdown(&self) {
        for p in &self.providers {
            let _ = p.shutdown();
        }
    }
}

/// Write `cx`'s trace context (W3C `traceparent`) into `headers`.
pub fn inject(cx: &Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// The trace context of an incoming request.
pub fn extract(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}
