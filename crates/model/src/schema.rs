//! The one Arrow schema for spans.
//!
//! Every span stormglass accepts becomes one row of [`SPANS_SCHEMA`]. The encoder fills it,
//! assembly buffers it, the SQL views read it and the Parquet archive stores it: all of them
//! name columns through the constants below, never through string literals.
//!
//! Ids are fixed-size binary (16 bytes for traces, 8 for spans) and times are Unix
//! nanoseconds in `Int64`, the OTLP units, so nothing is lost in encoding. The columns after
//! `status_message` are the normalised input contract of DESIGN.md ("Input contract"): they
//! are derived once at ingest so that every query reads one typed column instead of chasing
//! attribute aliases.

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};

/// 16-byte trace id.
pub const TRACE_ID: &str = "trace_id";
/// 8-byte span id.
pub const SPAN_ID: &str = "span_id";
/// 8-byte parent span id; null for a root span.
pub const PARENT_SPAN_ID: &str = "parent_span_id";
/// Resource `service.name`, `unknown_service` when missing.
pub const SERVICE_NAME: &str = "service_name";
/// The span's name as sent.
pub const SPAN_NAME: &str = "span_name";
/// Span kind in lower case: `internal`, `server`, `client`, `producer`, `consumer`, `unspecified`.
pub const KIND: &str = "kind";
/// Start time, Unix nanoseconds.
pub const START_NS: &str = "start_ns";
/// End time, Unix nanoseconds.
pub const END_NS: &str = "end_ns";
/// `end_ns - start_ns`.
pub const DURATION_NS: &str = "duration_ns";
/// OTLP status code in lower case: `unset`, `ok`, `error`.
pub const STATUS_CODE: &str = "status_code";
/// OTLP status message; null when empty.
pub const STATUS_MESSAGE: &str = "status_message";
/// Attempt number (0 = first try); null when the span carries no retry attribute.
pub const ATTEMPT: &str = "attempt";
/// Why this attempt happens (`cause`, `retry.cause`); null when absent.
pub const RETRY_CAUSE: &str = "retry_cause";
/// Time budget of this span in milliseconds, from any deadline alias; null when absent.
pub const DEADLINE_MS: &str = "deadline_ms";
/// An idempotency key attribute is present.
pub const HAS_IDEMPOTENCY_KEY: &str = "has_idempotency_key";
/// The explicit `idempotent` flag; null when absent.
pub const IDEMPOTENT: &str = "idempotent";
/// Inferred non-idempotent write (HTTP POST/PATCH, DB INSERT/UPDATE).
pub const IS_WRITE: &str = "is_write";
/// Client-side callee name hint (`peer.service`, `server.address`, ...); null when absent.
pub const CALLEE_HINT: &str = "callee_hint";
/// Operation (`rpc.service/rpc.method`, `http.route`, `url.template`, DB operation, span name).
pub const OPERATION: &str = "operation";
/// Server side noticed cancellation (`ctx_cancelled` or `cancelled`).
pub const CTX_CANCELLED: &str = "ctx_cancelled";
/// Server side reports its work as still pending (`state` / `idempotency.state` = `pending`).
pub const PENDING: &str = "pending";
/// Outcome class of METRICS.md: `ok`, `deadline`, `cancelled`, `unavailable`, `throttled`,
/// `server_error`, `client_error`.
pub const OUTCOME: &str = "outcome";
/// Span attributes not consumed by a normalised column, values rendered as strings.
pub const ATTRIBUTES: &str = "attributes";

/// Length of a trace id in bytes.
pub const TRACE_ID_LEN: i32 = 16;
/// Length of a span id in bytes.
pub const SPAN_ID_LEN: i32 = 8;

/// The field layout of the `attributes` map column, shared by the encoder's builder.
pub fn attributes_entries_field() -> Arc<Field> {
    Arc::new(Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            Field::new("keys", DataType::Utf8, false),
            Field::new("values", DataType::Utf8, true),
        ])),
        false,
    ))
}

/// The span schema. Column order is part of the Parquet archive format: append, never reorder.
pub static SPANS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new(TRACE_ID, DataType::FixedSizeBinary(TRACE_ID_LEN), false),
        Field::new(SPAN_ID, DataType::FixedSizeBinary(SPAN_ID_LEN), false),
        Field::new(PARENT_SPAN_ID, DataType::FixedSizeBinary(SPAN_ID_LEN), true),
        Field::new(SERVICE_NAME, DataType::Utf8, false),
        Field::new(SPAN_NAME, DataType::Utf8, false),
        Field::new(KIND, DataType::Utf8, false),
        Field::new(START_NS, DataType::Int64, false),
        Field::new(END_NS, DataType::Int64, false),
        Field::new(DURATION_NS, DataType::Int64, false),
        Field::new(STATUS_CODE, DataType::Utf8, false),
        Field::new(STATUS_MESSAGE, DataType::Utf8, true),
        Field::new(ATTEMPT, DataType::Int32, true),
        Field::new(RETRY_CAUSE, DataType::Utf8, true),
        Field::new(DEADLINE_MS, DataType::Float64, true),
        Field::new(HAS_IDEMPOTENCY_KEY, DataType::Boolean, false),
        Field::new(IDEMPOTENT, DataType::Boolean, true),
        Field::new(IS_WRITE, DataType::Boolean, false),
        Field::new(CALLEE_HINT, DataType::Utf8, true),
        Field::new(OPERATION, DataType::Utf8, false),
        Field::new(CTX_CANCELLED, DataType::Boolean, false),
        Field::new(PENDING, DataType::Boolean, false),
        Field::new(OUTCOME, DataType::Utf8, false),
        Field::new(
            ATTRIBUTES,
            DataType::Map(attributes_entries_field(), false),
            false,
        ),
    ]))
});

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema names every column once, so SQL can address each unambiguously.
    #[test]
    fn column_names_are_unique() {
        let mut names: Vec<_> = SPANS_SCHEMA.fields().iter().map(|f| f.name()).collect();
        let total = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), total);
    }
}
