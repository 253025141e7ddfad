//! OTLP/gRPC receiver: the OTLP `TraceService` served by tonic, accepting gzip and zstd.
//!
//! The service is written here rather than taken from `opentelemetry_proto`'s generated
//! `TraceServiceServer` only to decode into [`stormglass_model::wire`]'s messages (strings
//! borrowed from the request buffer, unread fields skipped); it does what the generated
//! one does, with tonic's own `Grpc`, prost's encoder, and a decoder of ours ([`Codec`]).
//!
//! tonic decodes before our handler runs, and answers two request errors itself with codes
//! OTLP does not use: an undecodable message is `INTERNAL` and an uncompressed message over
//! the size limit is `OUT_OF_RANGE`. [`remap_status`] rewrites those trailers-only answers to
//! `INVALID_ARGUMENT` and `RESOURCE_EXHAUSTED` (what OTLP clients treat as not retryable /
//! too large) and counts them, since our handler never sees those requests.
//!
//! [`AdmissionLayer`] runs before tonic reads the message: it takes a request slot, reads
//! the body (bounded by the size limit), reserves memory for it, and only then lets tonic
//! decode. A refusal is answered there, trailers-only, without decoding anything.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::{BodyExt, Full, Limited};
use prost::bytes::Buf as _;
use stormglass_model::wire::ExportRequest;
use tonic::codec::CompressionEncoding;
use tonic::codegen::http::{self, HeaderValue};
use tonic::{Request, Response, Status};

use crate::admission::Admission;
use crate::error::IngestError;
use crate::metrics::{IngestMetrics, Transport};
use crate::sink::Pipeline;

/// The gRPC path of OTLP's one trace method.
const EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The OTLP trace service: decoding is tonic's, the rest is the shared pipeline.
#[derive(Clone)]
pub struct TraceService {
    pipeline: Pipeline,
    max_request_bytes: usize,
}

impl tonic::server::NamedService for TraceService {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

/// The service with compression and the size limit (which tonic applies to the
/// decompressed message as well).
pub fn service(pipeline: Pipeline, max_request_bytes: usize) -> TraceService {
    TraceService {
        pipeline,
        max_request_bytes,
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for TraceService {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != EXPORT {
            let status = Status::unimplemented(format!("no method {}", request.uri().path()));
            return Box::pin(ready(Ok(status.into_http())));
        }
        let export = Export(self.pipeline.clone());
        let max = self.max_request_bytes;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Codec)
                .accept_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Zstd)
                .max_decoding_message_size(max);
            Ok(grpc.unary(export, request).await)
        })
    }
}

/// tonic's prost codec, but for decoding the message from one `Bytes`.
///
/// tonic hands a decoder the message inside its `BytesMut` read buffer. prost's
/// `Message::decode` over that slices every string field out with `BytesMut::split_to`
/// and advances it varint by varint, and under load that bookkeeping was ~9% of the
/// server's CPU (`perf record` under `stormglass load --concurrency 64`: `copy_to_bytes`,
/// `split_to`, `advance_unchecked`). Split off once as a `Bytes`, the message decodes
/// with `Bytes`'s cheaper slicing; its strings still borrow the same buffer.
struct Codec;

impl tonic::codec::Codec for Codec {
    type Encode = ExportTraceServiceResponse;
    type Decode = ExportRequest;
    type Encoder = tonic_prost::ProstEncoder<ExportTraceServiceResponse>;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder
    }
}

/// See [`Codec`].
struct RequestDecoder;

impl tonic::codec::Decoder for RequestDecoder {
    type Item = ExportRequest;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<ExportRequest>, Status> {
        let message = src.copy_to_bytes(src.remaining());
        // As tonic's prost decoder answers (and `remap_status` rewrites).
        prost::Message::decode(message)
            .map(Some)
            .map_err(|e: prost::DecodeError| Status::internal(e.to_string()))
    }
}

/// One `Export` call.
struct Export(Pipeline);

impl tonic::server::UnaryService<ExportRequest> for Export {
    type Response = ExportTraceServiceResponse;
    type Future = Ready<Result<Response<ExportTraceServiceResponse>, Status>>;

    fn call(&mut self, request: Request<ExportRequest>) -> Self::Future {
        let request = request.get_ref();
        // prost reads string fields of these messages as bytes: check them as it would have.
        let checked = request.check_utf8().map_err(|e| {
            let error = IngestError::Undecodable {
                format: "gRPC",
                detail: e.to_string(),
                source: Some(Box::new(e)),
            };
            let metrics = self.0.metrics();
            metrics.refused_request(Transport::Grpc, error.reason(), &error.to_string());
            error
        });
        let answer = checked.and_then(|()| self.0.export(Transport::Grpc, request));
        ready(answer.map(Response::new).map_err(|e| e.grpc_status()))
    }
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

/// Admission before decoding: see the module doc.
#[derive(Clone)]
pub struct AdmissionLayer {
    admission: Admission,
    metrics: IngestMetrics,
}

impl AdmissionLayer {
    pub fn new(admission: Admission, metrics: IngestMetrics) -> Self {
        AdmissionLayer { admission, metrics }
    }
}

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AdmissionLayer`] wraps around tonic's.
#[derive(Clone)]
pub struct Admit<S> {
    inner: S,
    layer: AdmissionLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<tonic::body::Body>> for Admit<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        // The clone that was made ready is the one to call (tower's contract).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let refuse = |error: IngestError| {
                layer
                    .metrics
                    .refused_request(Transport::Grpc, error.reason(), &error.to_string());
                Ok(error.grpc_status().into_http())
            };
            if let Err(error) = layer
                .admission
                .authenticate(request.headers().get(http::header::AUTHORIZATION))
            {
                return refuse(error);
            }
            let mut admitted = match layer.admission.enter() {
                Ok(admitted) => admitted,
                Err(error) => return refuse(error),
            };
            let compressed = request
                .headers()
                .get("grpc-encoding")
                .is_some_and(|v| v.as_bytes() != b"identity");
            let (parts, body) = request.into_parts();
            // The 5-byte gRPC frame header rides on top of the message limit.
            let limit = layer.admission.max_request_bytes().saturating_add(5);
            let max = layer.admission.max_request_bytes();
            let read = async {
                match Limited::new(body, limit).collect().await {
                    Ok(collected) => Ok(collected.to_bytes()),
                    Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                        Err(IngestError::TooLarge { limit: max })
                    }
                    Err(e) => Err(IngestError::Undecodable {
                        format: "gRPC",
                        detail: format!("reading the request failed: {e}"),
                        source: Some(e),
                    }),
                }
            };
            let bytes = match layer.admission.read_body(read).await {
                Ok(bytes) => bytes,
                Err(error) => return refuse(error),
            };
            if let Err(error) = layer
                .admission
                .reserve(&mut admitted, bytes.len(), compressed)
            {
                return refuse(error);
            }
            let request =
                http::Request::from_parts(parts, tonic::body::Body::new(Full::new(bytes)));
            let response = inner.call(request).await;
            drop(admitted);
            response
        })
    }
}
