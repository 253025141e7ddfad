//! The OTLP trace request as the receivers decode it: only the fields the encoder reads,
//! with every string and id a [`Bytes`] slice of the request buffer instead of its own
//! allocation.
//!
//! Decoding into `opentelemetry_proto`'s types allocated a `String` or `Vec<u8>` per id, name,
//! attribute key and value, and a struct per event and link nobody reads: allocation and the
//! copies it implies were the receivers' largest cost (`perf record` of `serve` under load:
//! `_mi_page_malloc_zero` 7.8% of all samples, almost all from prost's string merges, and
//! memmove 8.5%). These messages are the same protobuf messages with fewer fields (prost
//! skips the rest, events and links included, without allocating) and `bytes` fields where
//! the schema says `string`: the wire format of the two is the same.
//!
//! A string field is not checked for UTF-8 while decoding, so [`decode`] checks every one it
//! kept afterwards and refuses the request as prost would have. Fields it skips are not
//! checked: nothing reads them.

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ResourceSpans` without `schema_url`.
#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

/// `Resource`: its attributes.
#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `ScopeSpans`: its spans (the scope is not read).
#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

/// `Span` without events, links, flags and dropped counts.
#[derive(Clone, PartialEq, Message)]
pub struct Span {
    #[prost(bytes = "bytes", tag = "1")]
    pub trace_id: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub span_id: Bytes,
    /// A string in the schema.
    #[prost(bytes = "bytes", tag = "3")]
    pub trace_state: Bytes,
    #[prost(bytes = "bytes", tag = "4")]
    pub parent_span_id: Bytes,
    /// A string in the schema.
    #[prost(bytes = "bytes", tag = "5")]
    pub name: Bytes,
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
}

/// `Status`.
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    /// A string in the schema.
    #[prost(bytes = "bytes", tag = "2")]
    pub message: Bytes,
    #[prost(int32, tag = "3")]
    pub code: i32,
}

/// `KeyValue`.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    /// A string in the schema.
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `AnyValue`.
#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub value: Option<Value>,
}

/// `AnyValue.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    /// A string in the schema.
    #[prost(bytes = "bytes", tag = "1")]
    StringValue(Bytes),
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    #[prost(int64, tag = "3")]
    IntValue(i64),
    #[prost(double, tag = "4")]
    DoubleValue(f64),
    #[prost(message, tag = "5")]
    ArrayValue(ArrayValue),
    #[prost(message, tag = "6")]
    KvlistValue(KeyValueList),
    #[prost(bytes = "bytes", tag = "7")]
    BytesValue(Bytes),
}

/// `ArrayValue`.
#[derive(Clone, PartialEq, Message)]
pub struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<AnyValue>,
}

/// `KeyValueList`.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<KeyValue>,
}

/// A string field that [`decode`] checked: its text.
pub fn text(bytes: &Bytes) -> &str {
    // Checked once in `decode`: the fallback is never taken for a decoded request.
    std::str::from_utf8(bytes).unwrap_or("")
}

/// A request that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Protobuf(#[from] prost::DecodeError),
    #[error("invalid string value: {0} is not UTF-8")]
    NotUtf8(&'static str),
}

/// Decode a request and check that every string it kept is UTF-8.
pub fn decode(buf: impl bytes::Buf) -> Result<ExportRequest, DecodeError> {
    let request = ExportRequest::decode(buf)?;
    request.check_utf8()?;
    Ok(request)
}

/// `opentelemetry_proto`'s request in this form (through its protobuf encoding): the
/// OTLP/JSON receiver, the tests and the synthetic generator build that type.
pub fn from_proto(request: &ExportTraceServiceRequest) -> ExportRequest {
    match decode(Bytes::from(request.encode_to_vec())) {
        Ok(request) => request,
        // Its strings are Rust strings, and the two message sets share a wire format.
        Err(e) => unreachable!("a prost-encoded request decodes: {e}"),
    }
}

impl ExportRequest {
    /// Check that every string field kept is UTF-8 (prost checks `String` fields while
    /// decoding; these are `Bytes`).
    pub fn check_utf8(&self) -> Result<(), DecodeError> {
        for resource_spans in &self.resource_spans {
            if let Some(resource) = &resource_spans.resource {
                check_attributes(&resource.attributes)?;
            }
            for span in resource_spans.scope_spans.iter().flat_map(|s| &s.spans) {
                utf8(&span.trace_state, "Span.trace_state")?;
                utf8(&span.name, "Span.name")?;
                if let Some(status) = &span.status {
                    utf8(&status.message, "Status.message")?;
                }
                check_attributes(&span.attributes)?;
            }
        }
        Ok(())
    }
}

fn utf8(bytes: &Bytes, field: &'static str) -> Result<(), DecodeError> {
    match std::str::from_utf8(bytes) {
        Ok(_) => Ok(()),
        Err(_) => Err(DecodeError::NotUtf8(field)),
    }
}

fn check_attributes(attributes: &[KeyValue]) -> Result<(), DecodeError> {
    for kv in attributes {
        utf8(&kv.key, "KeyValue.key")?;
        if let Some(value) = &kv.value {
            check_value(value)?;
        }
    }
    Ok(())
}

fn check_value(value: &AnyValue) -> Result<(), DecodeError> {
    match &value.value {
        Some(Value::StringValue(s)) => utf8(s, "AnyValue.string_value"),
        Some(Value::ArrayValue(array)) => array.values.iter().try_for_each(check_value),
        Some(Value::KvlistValue(list)) => check_attributes(&list.values),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormglass_testkit::otlp::{kv, request, span};

    /// A request decodes into these messages as into `opentelemetry_proto`'s, field by field
    /// for everything the encoder reads, and its strings borrow the request buffer.
    #[test]
    fn decodes_what_opentelemetry_proto_decodes() {
        let mut s = span(
            1,
            2,
            "GET /orders",
            2,
            1,
            2,
            vec![kv("http.route", "/orders")],
        );
        s.trace_state = "ot=th:8".into();
        s.events.push(Default::default());
        let full = request(vec![("svc", vec![s.clone()])]);
        let buffer = Bytes::from(full.encode_to_vec());
        let lean = match decode(buffer.clone()) {
            Ok(lean) => lean,
            Err(e) => panic!("decodes: {e}"),
        };
        let got = &lean.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(got.trace_id[..], s.trace_id[..]);
        assert_eq!(got.span_id[..], s.span_id[..]);
        assert_eq!(text(&got.name), "GET /orders");
        assert_eq!(text(&got.trace_state), "ot=th:8");
        assert_eq!(got.start_time_unix_nano, s.start_time_unix_nano);
        assert_eq!(got.end_time_unix_nano, s.end_time_unix_nano);
        assert_eq!(got.kind, 2);
        let route = &got.attributes[0];
        assert_eq!(text(&route.key), "http.route");
        // Zero-copy: the name points into the request buffer.
        let inside = buffer.as_ptr_range();
        assert!(inside.contains(&got.name.as_ptr()));
    }

    /// A string that is not UTF-8 refuses the request, as prost's own decoding did.
    #[test]
    fn refuses_a_string_that_is_not_utf8() {
        let named =
            request(vec![("svc", vec![span(1, 2, "\u{00e9}", 2, 1, 2, vec![])])]).encode_to_vec();
        // The same request with the name's two bytes of UTF-8 broken.
        let at = named
            .windows(2)
            .position(|w| w == "\u{00e9}".as_bytes())
            .unwrap_or_else(|| panic!("the name is in the encoding"));
        let mut bytes = named.clone();
        bytes[at + 1] = 0xff;
        assert!(matches!(
            decode(Bytes::from(bytes)),
            Err(DecodeError::NotUtf8("Span.name"))
        ));
        assert!(decode(Bytes::from(named)).is_ok());
    }
}
