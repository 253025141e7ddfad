//! OTLP/HTTP receiver: `POST /v1/traces` with `application/x-protobuf` or `application/json`
//! bodies, optionally gzip- or zstd-compressed.
//!
//! Order of checks, cheapest first: content type and encoding (415), [`Admission`] (a
//! request slot, and memory reserved from `Content-Length` before the body is read; 503 with
//! `Retry-After`), the body as sent against the size limit (413), decompression through a reader capped at the limit, so a
//! decompression bomb stops at `limit + 1` bytes (413), decoding (400), then the shared
//! [`Pipeline`]. Answers use the request's encoding.

use std::io::Read;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use stormglass_model::wire::{self, ExportRequest};

use crate::admission::{Admission, Admitted};
use crate::error::{BodyEncoding, IngestError};
use crate::metrics::Transport;
use crate::sink::Pipeline;

/// Path of the OTLP/HTTP traces endpoint.
pub const TRACES_PATH: &str = "/v1/traces";

#[derive(Clone)]
struct HttpState {
    pipeline: Pipeline,
    admission: Admission,
}

/// The OTLP/HTTP router.
pub fn router(pipeline: Pipeline, admission: Admission) -> Router {
    Router::new()
        .route(TRACES_PATH, post(export))
        .with_state(HttpState {
            pipeline,
            admission,
        })
}

async fn export(State(state): State<HttpState>, headers: HeaderMap, body: Body) -> Response {
    let content_type = header_str(&headers, header::CONTENT_TYPE);
    let Some(encoding) = BodyEncoding::from_content_type(content_type) else {
        let error = IngestError::UnsupportedContentType {
            content_type: content_type.to_owned(),
        };
        return refuse(&state, Transport::Http, error, BodyEncoding::Json);
    };
    let transport = match encoding {
        BodyEncoding::Protobuf => Transport::HttpProtobuf,
        BodyEncoding::Json => Transport::HttpJson,
    };
    if let Err(error) = state
        .admission
        .authenticate(headers.get(header::AUTHORIZATION))
    {
        return refuse(&state, transport, error, encoding);
    }
    let mut admitted = match state.admission.enter() {
        Ok(admitted) => admitted,
        Err(error) => return refuse(&state, transport, error, encoding),
    };
    let compression = match Compression::from_header(header_str(&headers, header::CONTENT_ENCODING))
    {
        Ok(c) => c,
        Err(error) => return refuse(&state, transport, error, encoding),
    };
    let content_length = header_str(&headers, header::CONTENT_LENGTH)
        .parse::<usize>()
        .ok();
    if let Some(length) = content_length {
        let compressed = compression != Compression::Identity;
        if let Err(error) = state.admission.reserve(&mut admitted, length, compressed) {
            return refuse(&state, transport, error, encoding);
        }
    }
    let decoded = decode(&state, &mut admitted, compression, body, encoding).await;
    let answer = match decoded {
        Ok(request) => match state.pipeline.export(transport, &request) {
            Ok(response) => encoding.ok(encode_response(encoding, &response)),
            // Already counted per span by the pipeline.
            Err(error) => error.http_response(encoding),
        },
        Err(error) => refuse(&state, transport, error, encoding),
    };
    drop(admitted);
    answer
}

fn refuse(
    state: &HttpState,
    transport: Transport,
    error: IngestError,
    encoding: BodyEncoding,
) -> Response {
    state
        .pipeline
        .metrics()
        .refused_request(transport, error.reason(), &error.to_string());
    error.http_response(encoding)
}

/// Read (reserving memory first when the length was unknown), decompress and decode a body.
async fn decode(
    state: &HttpState,
    admitted: &mut Admitted,
    compression: Compression,
    body: Body,
    encoding: BodyEncoding,
) -> Result<ExportRequest, IngestError> {
    let limit = state.admission.max_request_bytes();
    let read = async {
        axum::body::to_bytes(body, limit).await.map_err(|e| {
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            {
                IngestError::TooLarge { limit }
            } else {
                IngestError::Undecodable {
                    format: "HTTP",
                    detail: format!("reading the body failed: {e}"),
                    source: Some(Box::new(e)),
                }
            }
        })
    };
    let raw = state.admission.read_body(read).await?;
    if !admitted.sized() {
        let compressed = compression != Compression::Identity;
        state.admission.reserve(admitted, raw.len(), compressed)?;
    }
    let bytes = compression.decompress(raw, limit)?;
    if bytes.is_empty() {
        return Ok(ExportRequest::default());
    }
    match encoding {
        BodyEncoding::Protobuf => wire::decode(bytes).map_err(|e| IngestError::Undecodable {
            format: "protobuf",
            detail: e.to_string(),
            source: Some(Box::new(e)),
        }),
        // OTLP/JSON is read with opentelemetry_proto's serde types, then takes the one
        // decoded form the encoder reads.
        BodyEncoding::Json => serde_json::from_slice::<ExportTraceServiceRequest>(&bytes)
            .map(|request| wire::from_proto(&request))
            .map_err(|e| IngestError::Undecodable {
                format: "JSON",
                detail: e.to_string(),
                source: Some(Box::new(e)),
            }),
    }
}

fn encode_response<M: Message + serde::Serialize>(encoding: BodyEncoding, message: &M) -> Vec<u8> {
    match encoding {
        BodyEncoding::Protobuf => message.encode_to_vec(),
        // Unset fields are omitted (`{}`), as protobuf's JSON mapping writes them, rather
        // than serialised as `null`. Serialising a generated message cannot fail.
        BodyEncoding::Json => {
            let mut value = serde_json::to_value(message).unwrap_or_default();
            if let serde_json::Value::Object(map) = &mut value {
                map.retain(|_, v| !v.is_null());
            }
            value.to_string().into_bytes()
        }
    }
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
}

/// `Content-Encoding` of a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    Identity,
    Gzip,
    Zstd,
}

impl Compression {
    fn from_header(value: &str) -> Result<Compression, IngestError> {
        match value.to_ascii_lowercase().as_str() {
            "" | "identity" => Ok(Compression::Identity),
            "gzip" | "x-gzip" => Ok(Compression::Gzip),
            "zstd" => Ok(Compression::Zstd),
            other => Err(IngestError::UnsupportedEncoding {
                encoding: other.to_owned(),
            }),
        }
    }

    /// Decompress, stopping as soon as the output would exceed `limit`.
    fn decompress(self, body: Bytes, limit: usize) -> Result<Bytes, IngestError> {
        let read_capped = |reader: &mut dyn Read, name: &'static str| {
            let mut out = Vec::new();
            reader
                .take(limit as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| IngestError::Undecodable {
                    format: name,
                    detail: format!("corrupt {name} body: {e}"),
                    source: Some(Box::new(e)),
                })?;
            if out.len() > limit {
                return Err(IngestError::TooLarge { limit });
            }
            Ok(Bytes::from(out))
        };
        match self {
            Compression::Identity => Ok(body),
            Compression::Gzip => {
                read_capped(&mut flate2::read::MultiGzDecoder::new(&body[..]), "gzip")
            }
            Compression::Zstd => {
                let mut decoder =
                    zstd::Decoder::new(&body[..]).map_err(|e| IngestError::Undecodable {
                        format: "zstd",
                        detail: e.to_string(),
                        source: Some(Box::new(e)),
                    })?;
                read_capped(&mut decoder, "zstd")
            }
        }
    }
}
