//! The lineage's table names and schemas: `lineage`, `lineage_attempts`, `edge_names`,
//! `clock_pairs` (see the module docs of [`super`]).

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use stormglass_model::schema::{self as col, SPAN_ID_LEN};

/// Name of the registered table.
pub const LINEAGE: &str = "lineage";

/// Name of the registered table of the attempts' lineage.
pub const ATTEMPT_LINEAGE: &str = "lineage_attempts";

/// Span columns copied from the parent call span (prefix `call_`).
pub(super) const CALL_COLUMNS: [&str; 7] = [
    col::PARENT_SPAN_ID,
    col::ATTEMPT,
    col::DEADLINE_MS,
    col::IDEMPOTENT,
    col::HAS_IDEMPOTENCY_KEY,
    col::IS_WRITE,
    col::IDEMPOTENCY_KEY_HASH,
];

/// Span columns copied from the first SERVER child, and their names there.
pub(super) const SERVER_COLUMNS: [(&str, &str); 11] = [
    (col::SPAN_ID, "server_span_id"),
    (col::SERVICE_NAME, "server_service"),
    (col::START_NS, "server_start_ns"),
    (col::END_NS, "server_end_ns"),
    (col::OUTCOME, "server_outcome"),
    (col::PENDING, "server_pending"),
    (col::CTX_CANCELLED, "server_ctx_cancelled"),
    (col::DEADLINE_MS, "server_deadline_ms"),
    (col::IDEMPOTENCY_HIT, "server_idempotency_hit"),
    (col::DUPLICATE, "server_duplicate"),
    (col::RESPONSE_CODE, "server_response_code"),
];

/// A field of the span schema.
pub(super) fn span_field(name: &str) -> Field {
    match stormglass_model::SPANS_SCHEMA.field_with_name(name) {
        Ok(f) => f.clone(),
        Err(e) => unreachable!("{name} is a span column: {e}"),
    }
}

/// The span schema followed by the lineage columns every span has.
pub static LINEAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields: Vec<Field> = stormglass_model::SPANS_SCHEMA
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.extend([
        Field::new("upstream_retry", DataType::Boolean, false),
        Field::new("anchor_deadline_ms", DataType::Float64, true),
        Field::new("anchor_start_ns", DataType::Int64, true),
        Field::new(
            "upstream_attempt_span_id",
            DataType::FixedSizeBinary(SPAN_ID_LEN),
            true,
        ),
        Field::new(
            "root_span_id",
            DataType::FixedSizeBinary(SPAN_ID_LEN),
            false,
        ),
        Field::new("depth", DataType::Int32, false),
        Field::new("is_call_span", DataType::Boolean, false),
        Field::new("parent_is_call_span", DataType::Boolean, false),
        Field::new("is_attempt", DataType::Boolean, false),
        Field::new("logical_call_id", DataType::Int64, true),
        Field::new("is_first_attempt", DataType::Boolean, true),
        Field::new("is_last_attempt", DataType::Boolean, true),
        Field::new("row_id", DataType::Int64, false),
        Field::new("root_row", DataType::Int64, false),
        Field::new("upstream_attempt_row", DataType::Int64, true),
    ]);
    Arc::new(Schema::new(fields))
});

/// Which of `lineage`'s columns to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// The span's columns and [`ANALYSED_COLUMNS`]: what `queries/` read of `lineage` (the
    /// attempts' values are in `lineage_attempts`, built for the attempts alone): the other
    /// columns for every span have no reader in the analysis.
    Analysis,
    /// Every column of [`LINEAGE_SCHEMA`]: for `stormglass query`, whose users may read any.
    Query,
}

/// The lineage columns `queries/` read from `lineage` (the rest they read per attempt, from
/// `lineage_attempts`).
pub const ANALYSED_COLUMNS: [&str; 4] = ["depth", "is_attempt", "is_first_attempt", "row_id"];

/// [`LINEAGE_SCHEMA`] in [`Detail::Analysis`]: the span schema and [`ANALYSED_COLUMNS`].
pub static ANALYSED_LINEAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let wanted = |name: &str| {
        stormglass_model::SPANS_SCHEMA.field_with_name(name).is_ok()
            || ANALYSED_COLUMNS.contains(&name)
    };
    let fields: Vec<Field> = LINEAGE_SCHEMA
        .fields()
        .iter()
        .filter(|f| wanted(f.name()))
        .map(|f| f.as_ref().clone())
        .collect();
    Arc::new(Schema::new(fields))
});

/// Columns of `lineage` that `lineage_attempts` carries for each attempt: what `attempts`
/// reads.
pub(super) const ATTEMPT_COLUMNS: [&str; 28] = [
    col::TRACE_ID,
    col::SPAN_ID,
    col::PARENT_SPAN_ID,
    col::OPERATION,
    col::ATTEMPT,
    col::RETRY_CAUSE,
    col::OUTCOME,
    col::START_NS,
    col::END_NS,
    col::DEADLINE_MS,
    col::IDEMPOTENT,
    col::HAS_IDEMPOTENCY_KEY,
    col::IS_WRITE,
    col::IDEMPOTENCY_KEY_HASH,
    col::WEIGHT,
    col::DUPLICATE,
    col::RESPONSE_CODE,
    "upstream_retry",
    "anchor_deadline_ms",
    "anchor_start_ns",
    "upstream_attempt_span_id",
    "root_span_id",
    "logical_call_id",
    "is_first_attempt",
    "is_last_attempt",
    "row_id",
    "root_row",
    "upstream_attempt_row",
];

/// The attempts' columns of `lineage` ([`ATTEMPT_COLUMNS`]), then the columns copied
/// from the spans an attempt is linked to (see the module docs).
pub static ATTEMPT_LINEAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields: Vec<Field> = ATTEMPT_COLUMNS
        .iter()
        .map(|name| match LINEAGE_SCHEMA.field_with_name(name) {
            Ok(f) => f.clone(),
            Err(e) => unreachable!("{name} is a lineage column: {e}"),
        })
        .collect();
    let nullable = |name: &str, to: &str| span_field(name).with_name(to).with_nullable(true);
    fields.extend([
        nullable(col::OUTCOME, "prev_outcome"),
        nullable(col::END_NS, "prev_end_ns"),
        Field::new("logical_attempts", DataType::Int64, false),
        Field::new("logical_max_attempt", DataType::Int32, false),
        Field::new("logical_start_ns", DataType::Int64, false),
        Field::new("logical_end_ns", DataType::Int64, false),
        nullable(col::OUTCOME, "logical_final_outcome"),
        nullable(col::IDEMPOTENCY_KEY_HASH, "logical_first_key_hash"),
        Field::new("caller", DataType::Utf8, false),
        Field::new("callee", DataType::Utf8, false),
        Field::new("edge", DataType::Int64, false),
        Field::new("upstream_edge", DataType::Int64, true),
        Field::new("call_anchor_deadline_ms", DataType::Float64, true),
        Field::new("call_anchor_start_ns", DataType::Int64, true),
    ]);
    fields.extend(
        CALL_COLUMNS
            .iter()
            .map(|name| nullable(name, &format!("call_{name}"))),
    );
    fields.extend(SERVER_COLUMNS.iter().map(|(from, to)| nullable(from, to)));
    fields.extend([
        Field::new("numbered", DataType::Boolean, false),
        Field::new("hidden", DataType::Boolean, false),
        Field::new("hedged", DataType::Boolean, false),
        Field::new("overlapped", DataType::Boolean, false),
        Field::new("inferred", DataType::Boolean, false),
        Field::new("other_instance", DataType::Boolean, true),
        Field::new("overlapping", DataType::Boolean, false),
        Field::new("rerun_write", DataType::Boolean, false),
        Field::new("unknown_result_ms", DataType::Float64, true),
        Field::new("unknown_unresolved", DataType::Boolean, false),
        nullable(col::RETRY_AFTER_MS, "prev_retry_after_ms"),
        Field::new("retry_after_violation", DataType::Boolean, false),
    ]);
    Arc::new(Schema::new(fields))
});

/// Name of the registered table of the attempts' edges.
pub const EDGE_NAMES: &str = "edge_names";

/// The schema of `edge_names`: one row per edge of this analysis's attempts.
pub static EDGE_NAMES_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("edge", DataType::Int64, false),
        Field::new("caller", DataType::Utf8, false),
        Field::new("callee", DataType::Utf8, false),
        span_field(col::OPERATION).with_nullable(true),
    ]))
});

/// The schema of `clock_pairs`: one row per completed attempt with a SERVER child on
/// another service.
pub static CLOCK_PAIRS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("caller", DataType::Utf8, false),
        Field::new("callee", DataType::Utf8, false),
        Field::new("low_ms", DataType::Float64, false),
        Field::new("high_ms", DataType::Float64, false),
    ]))
});
