//! The one error type of the receivers and its single mapping to both transports' answers,
//! so OTLP/gRPC and OTLP/HTTP cannot disagree about what a client is told.
//!
//! | error | HTTP | gRPC |
//! |---|---|---|
//! | undecodable body, corrupt compression | 400 | INVALID_ARGUMENT |
//! | over `limits.max_request_bytes` after decompression | 413 | RESOURCE_EXHAUSTED |
//! | unsupported content type or encoding | 415 | (n/a: gRPC negotiates) |
//! | over `limits.memory`, `assembly.max_spans` or `limits.max_concurrent_requests` | 503 + `Retry-After` | UNAVAILABLE + `RetryInfo` (retryable) |
//! | missing or wrong bearer token (`auth.token`) | 401 + `WWW-Authenticate: Bearer` | UNAUTHENTICATED |
//! | body not received within `limits.request_timeout` (a slow or stalled client) | 408 | DEADLINE_EXCEEDED |

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use stormglass_runtime::Overload;

/// Everything a receiver can refuse a request for.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("request body is not a valid OTLP {format} ExportTraceServiceRequest: {detail}")]
    Undecodable {
        format: &'static str,
        detail: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error(
        "request body is larger than the limit of {limit} bytes (measured after decompression)"
    )]
    TooLarge { limit: usize },
    #[error(
        "unsupported content type {content_type:?}: send application/x-protobuf or application/json"
    )]
    UnsupportedContentType { content_type: String },
    #[error("unsupported content encoding {encoding:?}: send gzip, zstd or identity")]
    UnsupportedEncoding { encoding: String },
    #[error("missing or wrong bearer token: send the header authorization: Bearer <auth.token>")]
    Unauthenticated,
    #[error("the request body did not arrive within {} ms (limits.request_timeout)", limit.as_millis())]
    Timeout { limit: Duration },
    #[error("the collector is over its {}; retry after {} s", limit.describe(), retry_after.as_secs().max(1))]
    Overloaded {
        retry_after: Duration,
        limit: Overload,
    },
}

impl IngestError {
    /// Label for `stormglass_receiver_refused_*_total{reason}`.
    /// Every `reason` label [`IngestError::reason`] gives, for series at 0 from the start.
    pub const REASONS: [&'static str; 9] = [
        "undecodable",
        "too_large",
        "unsupported_content_type",
        "unsupported_encoding",
        "memory_limit",
        "max_spans",
        "concurrency",
        "unauthenticated",
        "timeout",
    ];

    pub fn reason(&self) -> &'static str {
        match self {
            IngestError::Undecodable { .. } => "undecodable",
            IngestError::TooLarge { .. } => "too_large",
            IngestError::UnsupportedContentType { .. } => "unsupported_content_type",
            IngestError::UnsupportedEncoding { .. } => "unsupported_encoding",
            IngestError::Overloaded { limit, .. } => limit.reason(),
            IngestError::Unauthenticated => "unauthenticated",
            IngestError::Timeout { .. } => "timeout",
        }
    }

    /// True when the client should retry the same request later.
    pub fn retryable(&self) -> bool {
        matches!(self, IngestError::Overloaded { .. })
    }

    /// The OTLP/HTTP status code.
    pub fn http_status(&self) -> StatusCode {
        match self {
            IngestError::Undecodable { .. } => StatusCode::BAD_REQUEST,
            IngestError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            IngestError::UnsupportedContentType { .. }
            | IngestError::UnsupportedEncoding { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            IngestError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            IngestError::Unauthenticated => StatusCode::UNAUTHORIZED,
            IngestError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The OTLP/gRPC status. A retryable refusal carries a `google.rpc.RetryInfo` with the
    /// delay, which OTLP exporters honour as they honour HTTP's `Retry-After`.
    pub fn grpc_status(&self) -> tonic::Status {
        let message = self.to_string();
        match self {
            IngestError::Undecodable { .. }
            | IngestError::UnsupportedContentType { .. }
            | IngestError::UnsupportedEncoding { .. } => tonic::Status::invalid_argument(message),
            IngestError::TooLarge { .. } => tonic::Status::resource_exhausted(message),
            IngestError::Unauthenticated => tonic::Status::unauthenticated(message),
            IngestError::Timeout { .. } => tonic::Status::deadline_exceeded(message),
            IngestError::Overloaded { retry_after, .. } => {
                use tonic_types::{ErrorDetails, StatusExt};
                tonic::Status::with_error_details(
                    tonic::Code::Unavailable,
                    message,
                    ErrorDetails::with_retry_info(Some(*retry_after)),
                )
            }
        }
    }

    /// The OTLP/HTTP response: the status code, `Retry-After` when retryable, and a
    /// `google.rpc.Status` body in the request's encoding (JSON when it has none we speak).
    pub fn http_response(&self, encoding: BodyEncoding) -> Response {
        let grpc_code = self.grpc_status().code() as i32;
        let mut response = encoding.status_body(grpc_code, &self.to_string());
        *response.status_mut() = self.http_status();
        if let IngestError::Overloaded { retry_after, .. } = self {
            let secs = retry_after.as_secs().max(1);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let IngestError::Unauthenticated = self {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// `google.rpc.Status`, the body of OTLP/HTTP error responses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// The two OTLP/HTTP body encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyEncoding {
    Protobuf,
    Json,
}

impl BodyEncoding {
    pub const PROTOBUF_CONTENT_TYPE: &'static str = "application/x-protobuf";
    pub const JSON_CONTENT_TYPE: &'static str = "application/json";

    /// The encoding named by a `Content-Type` header, ignoring parameters and case.
    pub fn from_content_type(content_type: &str) -> Option<BodyEncoding> {
        let media_type = content_type.split(';').next().unwrap_or("").trim();
        if media_type.eq_ignore_ascii_case(Self::PROTOBUF_CONTENT_TYPE) {
            Some(BodyEncoding::Protobuf)
        } else if media_type.eq_ignore_ascii_case(Self::JSON_CONTENT_TYPE) {
            Some(BodyEncoding::Json)
        } else {
            None
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            BodyEncoding::Protobuf => Self::PROTOBUF_CONTENT_TYPE,
            BodyEncoding::Json => Self::JSON_CONTENT_TYPE,
        }
    }

    /// A 200 response carrying `body` (already encoded) with this content type.
    pub fn ok(self, body: Vec<u8>) -> Response {
        ([(header::CONTENT_TYPE, self.content_type())], body).into_response()
    }

    fn status_body(self, code: i32, message: &str) -> Response {
        let body = match self {
            BodyEncoding::Protobuf => prost::Message::encode_to_vec(&RpcStatus {
                code,
                message: message.to_owned(),
            }),
            BodyEncoding::Json => serde_json::json!({ "code": code, "message": message })
                .to_string()
                .into_bytes(),
        };
        self.ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal maps to the HTTP status and gRPC code the OTLP spec names.
    #[test]
    fn both_transports_agree() {
        let cases = [
            (
                IngestError::Undecodable {
                    format: "protobuf",
                    detail: "x".into(),
                    source: None,
                },
                400,
                tonic::Code::InvalidArgument,
            ),
            (
                IngestError::TooLarge { limit: 1 },
                413,
                tonic::Code::ResourceExhausted,
            ),
            (
                IngestError::UnsupportedContentType {
                    content_type: "text/plain".into(),
                },
                415,
                tonic::Code::InvalidArgument,
            ),
            (
                IngestError::Overloaded {
                    retry_after: Duration::from_secs(2),
                    limit: Overload::Memory,
                },
                503,
                tonic::Code::Unavailable,
            ),
            (
                IngestError::Timeout {
                    limit: Duration::from_secs(1),
                },
                408,
                tonic::Code::DeadlineExceeded,
            ),
            (
                IngestError::Unauthenticated,
                401,
                tonic::Code::Unauthenticated,
            ),
        ];
        for (error, http, grpc) in cases {
            assert_eq!(error.http_status().as_u16(), http, "{error}");
            assert_eq!(error.grpc_status().code(), grpc, "{error}");
        }
        let overloaded = IngestError::Overloaded {
            retry_after: Duration::from_secs(2),
            limit: Overload::Spans,
        };
        let response = overloaded.http_response(BodyEncoding::Json);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        use tonic_types::StatusExt;
        let retry = overloaded.grpc_status().get_details_retry_info();
        assert_eq!(
            retry.and_then(|r| r.retry_delay),
            Some(Duration::from_secs(2))
        );
    }

    /// Content types are matched on the media type alone.
    #[test]
    fn content_type_parameters_are_ignored() {
        assert_eq!(
            BodyEncoding::from_content_type("Application/JSON; charset=utf-8"),
            Some(BodyEncoding::Json)
        );
        assert_eq!(BodyEncoding::from_content_type("text/plain"), None);
    }
}
