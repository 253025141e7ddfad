//! Builders for OTLP requests by hand: spans with small numeric ids, a request per
//! service, and one complete retry fixture. Small on purpose: a test reads as the spans it
//! contains.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
pub use stormglass_model::attribute::{kv, kv_bool, kv_int, kv_strings};

/// A 16-byte trace id whose last byte is `n` (never all zeroes for n > 0).
pub fn trace_id(n: u8) -> Vec<u8> {
    let mut id = vec![0xa0; 16];
    id[15] = n;
    id
}

/// An 8-byte span id whose last byte is `n`.
pub fn span_id(n: u8) -> Vec<u8> {
    let mut id = vec![0xb0; 8];
    id[7] = n;
    id
}

/// A span of `kind` (OTLP enum value) from `start_ms` to `end_ms` (milliseconds after a
/// fixed epoch), with no parent.
pub fn span(
    trace: u8,
    id: u8,
    name: &str,
    kind: i32,
    start_ms: u64,
    end_ms: u64,
    attributes: Vec<KeyValue>,
) -> Span {
    const EPOCH_NS: u64 = 1_764_000_000_000_000_000;
    Span {
        trace_id: trace_id(trace),
        span_id: span_id(id),
        name: name.into(),
        kind,
        start_time_unix_nano: EPOCH_NS + start_ms * 1_000_000,
        end_time_unix_nano: EPOCH_NS + end_ms * 1_000_000,
        attributes,
        ..Default::default()
    }
}

/// Set a span's parent.
pub fn child_of(mut span: Span, parent: u8) -> Span {
    span.parent_span_id = span_id(parent);
    span
}

/// Set a span's status (OTLP enum value) and message.
pub fn with_status(mut span: Span, code: i32, message: &str) -> Span {
    span.status = Some(Status {
        code,
        message: message.into(),
    });
    span
}

/// One request holding, per service, that service's spans.
pub fn request(services: Vec<(&str, Vec<Span>)>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: services
            .into_iter()
            .map(|(service, spans)| ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", service)],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    }
}

/// A small but complete fixture: a gateway SERVER span calling `orders` twice (the first
/// attempt times out, the retry succeeds), and the `orders` SERVER spans under each attempt.
/// Exercises ids, parents, kinds, statuses, retry/cause/deadline attributes and the map.
pub fn retry_fixture() -> ExportTraceServiceRequest {
    const SERVER: i32 = 2;
    const CLIENT: i32 = 3;
    request(vec![
        (
            "gateway",
            vec![
                span(
                    1,
                    1,
                    "GET /checkout",
                    SERVER,
                    0,
                    400,
                    vec![
                        kv("http.route", "/checkout"),
                        kv_int("http.response.status_code", 200),
                    ],
                ),
                with_status(
                    child_of(
                        span(
                            1,
                            2,
                            "POST",
                            CLIENT,
                            5,
                            205,
                            vec![
                                kv("http.request.method", "POST"),
                                kv("peer.service", "orders"),
                                kv("url.template", "/orders"),
                                kv_int("retry", 0),
                                kv("deadline", "200ms"),
                                kv_int("http.response.status_code", 504),
                            ],
                        ),
                        1,
                    ),
                    2,
                    "deadline exceeded",
                ),
                child_of(
                    span(
                        1,
                        3,
                        "POST",
                        CLIENT,
                        215,
                        330,
                        vec![
                            kv("http.request.method", "POST"),
                            kv("peer.service", "orders"),
                            kv("url.template", "/orders"),
                            kv_int("retry", 1),
                            kv("cause", "deadline"),
                            kv("deadline", "185ms"),
                            kv("idempotency_key", "k-1"),
                            kv_int("http.response.status_code", 201),
                        ],
                    ),
                    1,
                ),
            ],
        ),
        (
            "orders",
            vec![
                child_of(
                    span(
                        1,
                        4,
                        "POST /orders",
                        SERVER,
                        8,
                        260,
                        vec![
                            kv("http.route", "/orders"),
                            kv_int("deadline", 195),
                            kv_bool("ctx_cancelled", true),
                            kv("state", "pending"),
                        ],
                    ),
                    2,
                ),
                child_of(
                    span(
                        1,
                        5,
                        "POST /orders",
                        SERVER,
                        218,
                        325,
                        vec![kv("http.route", "/orders"), kv("deadline", "180m")],
                    ),
                    3,
                ),
            ],
        ),
    ])
}
