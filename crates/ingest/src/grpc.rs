//! OTLP/gRPC receiver: the generated `TraceService` served by tonic, accepting gzip and zstd.
//!
//! tonic decodes before our handler runs, and answers two request errors itself with codes
//! OTLP does not use: an undecodable message is `INTERNAL` and an uncompressed message over
//! the size limit is `OUT_OF_RANGE`. [`remap_status`] rewrites those trailers-only answers to
//! `INVALID_ARGUMENT` and `RESOURCE_EXHAUSTED` (what OTLP clients treat as not retryable /
//! too large) and counts them, since our handler never sees those requests.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::codegen::http::{self, HeaderValue};
use tonic::{Request, Response, Status};

use crate::metrics::{IngestMetrics, Transport};
use crate::sink::Pipeline;

/// The gRPC handler: decoding is tonic's, the rest is the shared pipeline.
pub struct TraceReceiver {
    pipeline: Pipeline,
}

#[tonic::async_trait]
impl TraceService for TraceReceiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.pipeline
            .export(Transport::Grpc, request.get_ref())
            .map(Response::new)
            .map_err(|e| e.grpc_status())
    }
}

/// The tonic service with compression and the size limit (which tonic applies to the
/// decompressed message as well).
pub fn service(pipeline: Pipeline, max_request_bytes: usize) -> TraceServiceServer<TraceReceiver> {
    TraceServiceServer::new(TraceReceiver { pipeline })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .max_decoding_message_size(max_request_bytes)
}

/// Rewrite tonic's own decode-error answers to OTLP's codes, counting each.
pub fn remap_status<B>(
    metrics: &IngestMetrics,
    mut response: http::Response<B>,
) -> http::Response<B> {
    let headers = response.headers_mut();
    let code = headers.get("grpc-status").and_then(|v| v.to_str().ok());
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .replace("%20", " ");
    let remapped = match code {
        // Only decoding and decompression produce INTERNAL: the handler never does.
        Some("13") => Some(("3", "undecodable")),
        Some("11") if message.contains("too large") => Some(("8", "too_large")),
        Some("8") if message.contains("size limit") => Some(("8", "too_large")),
        _ => None,
    };
    if let Some((new_code, reason)) = remapped {
        metrics.refused_request(Transport::Grpc, reason, &message);
        headers.insert("grpc-status", HeaderValue::from_static(new_code));
    }
    response
}
