//! The one Arrow schema for spans.
//!
//! Every span stormglass accepts becomes one row of [`SPANS_SCHEMA`]. The encoder fills it,
//! assembly buffers it, the SQL views read it and the Parquet archive stores it: all of them
//! name columns through the constants below, never through string literals.
//!
//! Ids are fixed-size binary (16 bytes for traces, 8 for spans) and times are Unix
//! nanoseconds in `Int64`, the OTLP units, so nothing is lost in encoding. The columns after
//! `status_message` are the normalised input contract of docs/instrumenting.md ("What stormglass reads from your spans"): they
//! are derived once at ingest so that every query reads one typed column instead of chasing
//! attribute aliases.

use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, MapArray, RecordBatch, StringArray, StructArray, new_null_array};
use arrow::buffer::OffsetBuffer;
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
/// Attempt number (0 = first try); null when the span carries no retry attribute;
/// [`UNREADABLE_ATTEMPT`] when it carries one that is not a non-negative integer.
pub const ATTEMPT: &str = "attempt";
/// The `attempt` of a span whose attempt attribute could not be read (negative, fractional,
/// text): a retry of unknown number, never a first attempt. The analysis numbers it after
/// the attempt before it in its call.
pub const UNREADABLE_ATTEMPT: i32 = -1;
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
/// Outcome class of docs/instrumenting.md: `ok`, `deadline`, `cancelled`, `unavailable`, `throttled`,
/// `server_error`, `client_error`.
pub const OUTCOME: &str = "outcome";
/// Span attributes not consumed by a normalised column, values rendered as strings.
pub const ATTRIBUTES: &str = "attributes";
/// How many spans this one stands for (the sampling adjusted count, 1 / probability): from
/// the W3C tracestate's OpenTelemetry threshold (`ot=th:...`), else the configured sampling
/// ratio of the span's service, else 1. Every count the analysis makes is a sum of it.
pub const WEIGHT: &str = "weight";
/// What a client span requested, as a hash of `url.full` (else `http.url`, else `url.path`
/// and `url.query`): equal on two attempts of one request, different on a loop over
/// several. Null without a URL. The hash is fixed (not per process), so archived spans
/// compare as live ones do.
pub const TARGET_HASH: &str = "target_hash";
/// The instance of the service that sent the span: resource `service.instance.id`, else
/// `host.name` (null without either): where each attempt landed.
pub const INSTANCE: &str = "instance";

/// A keyed hash of the span's idempotency key ([`crate::Conventions::idempotency_key_hash`]);
/// null without one. The key's value itself is kept nowhere.
pub const IDEMPOTENCY_KEY_HASH: &str = "idempotency_key_hash";
/// A SERVER span answered from its idempotency store: `idempotency.hit` true, or
/// `idempotency.state` `replayed` (false when `idempotency.hit` is false, null when the span
/// says neither).
pub const IDEMPOTENCY_HIT: &str = "idempotency_hit";
/// The response code kept raw: the HTTP status as its number (`409`), else the gRPC status
/// by its name (`ALREADY_EXISTS`); null without either.
pub const RESPONSE_CODE: &str = "response_code";
/// The answer says the request repeats one already done: HTTP 409, gRPC ALREADY_EXISTS, or
/// an `error.type` naming a duplicate (a unique index, "already exists").
pub const DUPLICATE: &str = "duplicate";
/// How long the answer asked the caller to wait before a retry, in ms: HTTP `Retry-After`
/// (seconds, or a date taken from the span's end) or gRPC `grpc-retry-pushback-ms`; -1
/// where a pushback said not to retry; null without either.
pub const RETRY_AFTER_MS: &str = "retry_after_ms";

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
        Field::new(WEIGHT, DataType::Float64, false),
        Field::new(TARGET_HASH, DataType::Int64, true),
        Field::new(INSTANCE, DataType::Utf8, true),
        Field::new(IDEMPOTENCY_KEY_HASH, DataType::Int64, true),
        Field::new(IDEMPOTENCY_HIT, DataType::Boolean, true),
        Field::new(RESPONSE_CODE, DataType::Utf8, true),
        Field::new(DUPLICATE, DataType::Boolean, true),
        Field::new(RETRY_AFTER_MS, DataType::Float64, true),
    ]))
});

/// Columns of an older archive file brought to [`SPANS_SCHEMA`]: the schema only ever
/// grows at its end, so a file written before a column was appended has a prefix of the
/// columns, and each missing one is filled with what an old span means for it (`weight` 1:
/// unsampled; a nullable column: null). Anything else is not a span file.
pub fn upgrade(columns: Vec<ArrayRef>, rows: usize) -> Result<RecordBatch, String> {
    let fields = SPANS_SCHEMA.fields();
    if columns.len() > fields.len() {
        return Err(format!(
            "{} columns, more than the {} of the span schema (written by a newer stormglass?)",
            columns.len(),
            fields.len()
        ));
    }
    let mut columns = columns;
    for field in fields.iter().skip(columns.len()) {
        let filled: ArrayRef = if field.name() == WEIGHT {
            Arc::new(arrow::array::Float64Array::from(vec![1.0; rows]))
        } else if field.is_nullable() {
            new_null_array(field.data_type(), rows)
        } else {
            return Err(format!("column {} is missing", field.name()));
        };
        columns.push(filled);
    }
    RecordBatch::try_new(SPANS_SCHEMA.clone(), columns).map_err(|e| e.to_string())
}

/// Columns the analysis never reads: kept whole for files and the archive, emptied in the
/// spans the live path holds ([`lean`]).
pub const NOT_ANALYSED: [&str; 3] = [SPAN_NAME, STATUS_MESSAGE, ATTRIBUTES];

/// The same spans with the [`NOT_ANALYSED`] columns emptied (empty names, null messages,
/// empty attribute maps): still [`SPANS_SCHEMA`], so every query runs on it unchanged, at
/// a fraction of the memory (the attributes map alone is about half of an encoded span).
///
/// A column already in that form (the lean encoder's output) is kept as it is, so the live
/// path pays nothing here for batches `encode_request_lean` built.
pub fn lean(batch: &RecordBatch) -> RecordBatch {
    use arrow::array::{Array, AsArray};
    let rows = batch.num_rows();
    let columns: Vec<ArrayRef> = SPANS_SCHEMA
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, column)| match field.name().as_str() {
            SPAN_NAME if !column.as_string::<i32>().value_data().is_empty() => {
                emptied(SPAN_NAME, rows)
            }
            STATUS_MESSAGE if column.null_count() < rows => emptied(STATUS_MESSAGE, rows),
            ATTRIBUTES if !column.as_map().entries().is_empty() => emptied(ATTRIBUTES, rows),
            _ => column.clone(),
        })
        .collect();
    match RecordBatch::try_new(SPANS_SCHEMA.clone(), columns) {
        Ok(lean) => lean,
        Err(e) => unreachable!("emptied columns keep their types: {e}"),
    }
}

/// Columns held dictionary-encoded while a trace is open ([`hold`]): few distinct values
/// per request (one service per resource, a handful of operations and peers), so a key
/// per row replaces an offset and the string's bytes. Each with its key type: the first
/// three take their values from the encoder's fixed vocabularies (at most a few dozen);
/// the others are as open as the input, and 32-bit keys cannot overflow within one
/// batch or when batches are gathered at release.
const HELD_DICTIONARIES: [(&str, DataType); 8] = [
    (KIND, DataType::UInt8),
    (STATUS_CODE, DataType::UInt8),
    (OUTCOME, DataType::UInt8),
    (SERVICE_NAME, DataType::Int32),
    (OPERATION, DataType::Int32),
    (CALLEE_HINT, DataType::Int32),
    (RETRY_CAUSE, DataType::Int32),
    (INSTANCE, DataType::Int32),
];

/// The form assembly holds open spans in: [`SPANS_SCHEMA`] without the [`NOT_ANALYSED`]
/// columns, and with the [`HELD_DICTIONARIES`] columns dictionary-encoded. [`widen_rows`]
/// turns rows of it back into [`SPANS_SCHEMA`] (as [`lean`] gives it) when traces are
/// released.
pub static HELD_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let fields: Vec<Field> = SPANS_SCHEMA
        .fields()
        .iter()
        .filter(|f| !NOT_ANALYSED.contains(&f.name().as_str()))
        .map(
            |f| match HELD_DICTIONARIES.iter().find(|(name, _)| name == f.name()) {
                Some((_, key)) => Field::new(
                    f.name(),
                    DataType::Dictionary(Box::new(key.clone()), Box::new(DataType::Utf8)),
                    f.is_nullable(),
                ),
                None => f.as_ref().clone(),
            },
        )
        .collect();
    Arc::new(Schema::new(fields))
});

/// `batch` (in [`SPANS_SCHEMA`]) in the [`HELD_SCHEMA`] form: ~40% less memory per span
/// than [`lean`]'s.
pub fn hold(batch: &RecordBatch) -> RecordBatch {
    let columns: Vec<ArrayRef> = HELD_SCHEMA
        .fields()
        .iter()
        .map(|field| {
            let column = match batch.column_by_name(field.name()) {
                Some(column) => column,
                None => unreachable!("{} is a column of the span schema", field.name()),
            };
            if column.data_type() == field.data_type() {
                return column.clone();
            }
            match arrow::compute::cast(column, field.data_type()) {
                Ok(held) => tight_dictionary(held),
                Err(e) => unreachable!("{} holds the encoder's vocabulary: {e}", field.name()),
            }
        })
        .collect();
    match RecordBatch::try_new(HELD_SCHEMA.clone(), columns) {
        Ok(held) => held,
        Err(e) => unreachable!("held columns follow HELD_SCHEMA: {e}"),
    }
}

/// A string dictionary whose values take only the memory they need: Arrow's cast builds
/// them with room for a thousand values, kilobytes per column of a 600-span batch.
fn tight_dictionary(array: ArrayRef) -> ArrayRef {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int32Type, UInt8Type};
    fn tight<K: arrow::datatypes::ArrowDictionaryKeyType>(
        dictionary: &arrow::array::DictionaryArray<K>,
    ) -> ArrayRef {
        let values = dictionary.values().as_string::<i32>();
        let bytes = values.value_data().len();
        let mut tight = arrow::array::StringBuilder::with_capacity(values.len(), bytes);
        tight.extend(values.iter());
        let values = tight.finish();
        // The keys are sized to the batch already.
        match arrow::array::DictionaryArray::<K>::try_new(
            dictionary.keys().clone(),
            Arc::new(values),
        ) {
            Ok(tight) => Arc::new(tight),
            Err(e) => unreachable!("the same keys index the same values: {e}"),
        }
    }
    match array.data_type() {
        DataType::Dictionary(key, _) if **key == DataType::UInt8 => {
            tight(array.as_dictionary::<UInt8Type>())
        }
        DataType::Dictionary(key, _) if **key == DataType::Int32 => {
            tight(array.as_dictionary::<Int32Type>())
        }
        _ => array,
    }
}

/// Rows of held batches ([`hold`], [`HELD_SCHEMA`]), `positions` as `(batch, row)` pairs,
/// back in [`SPANS_SCHEMA`] as one batch, in [`lean`]'s form: empty names, null status
/// messages, empty attribute maps, plain strings.
///
/// The dictionary columns are read straight into plain strings. Arrow's `interleave` of
/// dictionaries from different batches merges their dictionaries first, and marks the
/// values used by walking every position once per source batch: quadratic in a release
/// that gathers traces from many requests' batches, and ~3% of the server's CPU under
/// load (`perf record`, `stormglass load --concurrency 64`), before a cast turned the
/// merged result back into strings.
pub fn widen_rows(held: &[&RecordBatch], positions: &[(usize, usize)]) -> RecordBatch {
    use arrow::datatypes::{Int32Type, UInt8Type};
    let columns: Vec<ArrayRef> = SPANS_SCHEMA
        .fields()
        .iter()
        .map(|field| {
            let name = field.name().as_str();
            if NOT_ANALYSED.contains(&name) {
                return emptied(name, positions.len());
            }
            let Ok(index) = HELD_SCHEMA.index_of(name) else {
                unreachable!("{name} is a column of the held schema")
            };
            let columns: Vec<&dyn arrow::array::Array> =
                held.iter().map(|b| b.column(index).as_ref()).collect();
            match HELD_SCHEMA.field(index).data_type() {
                DataType::Dictionary(key, _) if **key == DataType::UInt8 => {
                    dictionary_strings::<UInt8Type>(&columns, positions)
                }
                DataType::Dictionary(key, _) if **key == DataType::Int32 => {
                    dictionary_strings::<Int32Type>(&columns, positions)
                }
                _ => match arrow::compute::interleave(&columns, positions) {
                    Ok(column) => column,
                    Err(e) => unreachable!("columns of one schema interleave: {e}"),
                },
            }
        })
        .collect();
    match RecordBatch::try_new(SPANS_SCHEMA.clone(), columns) {
        Ok(wide) => wide,
        Err(e) => unreachable!("widened columns follow SPANS_SCHEMA: {e}"),
    }
}

/// The strings at `positions` of string dictionaries with keys `K`.
fn dictionary_strings<K: arrow::datatypes::ArrowDictionaryKeyType>(
    columns: &[&dyn arrow::array::Array],
    positions: &[(usize, usize)],
) -> ArrayRef {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::ArrowNativeType;
    let dictionaries: Vec<_> = columns.iter().map(|c| c.as_dictionary::<K>()).collect();
    let values: Vec<&StringArray> = dictionaries
        .iter()
        .map(|d| d.values().as_string::<i32>())
        .collect();
    let string = |&(batch, row): &(usize, usize)| {
        let (keys, values) = (dictionaries[batch].keys(), values[batch]);
        let key = keys.values()[row].as_usize();
        (keys.is_valid(row) && values.is_valid(key)).then(|| values.value(key))
    };
    // Sized exactly: the batch waits for analysis, reserved by its size, so a buffer grown
    // by doubling would hold up to twice the memory its strings need.
    let bytes = positions.iter().filter_map(string).map(str::len).sum();
    let mut strings = arrow::array::StringBuilder::with_capacity(positions.len(), bytes);
    strings.extend(positions.iter().map(string));
    Arc::new(strings.finish())
}

/// What [`lean`] and [`widen_rows`] put in place of a [`NOT_ANALYSED`] column: empty names,
/// null status messages, empty attribute maps.
pub fn emptied(name: &str, rows: usize) -> ArrayRef {
    match name {
        SPAN_NAME => Arc::new(StringArray::from_iter_values(std::iter::repeat_n("", rows))),
        STATUS_MESSAGE => new_null_array(&DataType::Utf8, rows),
        ATTRIBUTES => Arc::new(empty_maps(rows)),
        other => unreachable!("{other} is not one of the columns the analysis never reads"),
    }
}

/// `rows` empty attribute maps.
fn empty_maps(rows: usize) -> MapArray {
    let entries = attributes_entries_field();
    let DataType::Struct(fields) = entries.data_type() else {
        unreachable!("map entries are a struct");
    };
    let empty = StructArray::new(
        fields.clone(),
        vec![
            Arc::new(StringArray::from(Vec::<&str>::new())) as ArrayRef,
            Arc::new(StringArray::from(Vec::<Option<&str>>::new())) as ArrayRef,
        ],
        None,
    );
    let offsets = OffsetBuffer::new_zeroed(rows);
    match MapArray::try_new(entries, offsets, empty, None, false) {
        Ok(maps) => maps,
        Err(e) => unreachable!("empty maps are valid: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lean batch keeps every analysed column as it was, empties the others, and holds
    /// much less memory.
    #[test]
    fn lean_keeps_what_the_analysis_reads() {
        use stormglass_testkit::otlp::retry_fixture;
        // One secret for both encodings: the fixture's idempotency keys hash alike.
        let conventions = crate::Conventions::default();
        let (batch, _) = crate::encode_request(&conventions, &retry_fixture());
        let thin = lean(&batch);
        assert_eq!(thin.schema(), *SPANS_SCHEMA);
        for (field, (a, b)) in SPANS_SCHEMA
            .fields()
            .iter()
            .zip(batch.columns().iter().zip(thin.columns()))
        {
            if NOT_ANALYSED.contains(&field.name().as_str()) {
                assert_eq!(b.len(), a.len());
            } else {
                assert_eq!(a.to_data(), b.to_data(), "{}", field.name());
            }
        }
        let maps = thin.column_by_name(ATTRIBUTES).unwrap();
        assert_eq!(maps.null_count(), 0);
        assert!(thin.get_array_memory_size() < batch.get_array_memory_size());
        // The lean encoder writes that form directly.
        let (direct, report) = crate::encode_request_lean(&conventions, &retry_fixture());
        assert_eq!(report.accepted, batch.num_rows() as u64);
        for (field, (a, b)) in SPANS_SCHEMA
            .fields()
            .iter()
            .zip(thin.columns().iter().zip(direct.columns()))
        {
            assert_eq!(a.to_data(), b.to_data(), "{}", field.name());
        }
    }

    /// Held spans come back as lean() gives them, for full and lean encoder output alike,
    /// in well under lean()'s memory.
    #[test]
    fn held_spans_widen_to_the_lean_form() {
        use stormglass_testkit::otlp::retry_fixture;
        let conventions = crate::Conventions::default();
        let (full, _) = crate::encode_request(&conventions, &retry_fixture());
        let (direct, _) = crate::encode_request_lean(&conventions, &retry_fixture());
        for batch in [full, direct] {
            let held = hold(&batch);
            assert_eq!(held.schema(), *HELD_SCHEMA);
            let all: Vec<(usize, usize)> = (0..held.num_rows()).map(|row| (0, row)).collect();
            let wide = widen_rows(&[&held], &all);
            assert_eq!(wide.schema(), *SPANS_SCHEMA);
            let expected = lean(&batch);
            for (field, (a, b)) in SPANS_SCHEMA
                .fields()
                .iter()
                .zip(expected.columns().iter().zip(wide.columns()))
            {
                assert_eq!(a.as_ref(), b.as_ref(), "{}", field.name());
            }
        }
        // Rows of several held batches, each with its own dictionaries (other services, or
        // the same in another order), come back as the same rows of the spans would.
        let mut generator = crate::synth::Generator::new(crate::synth::Shape::default(), 7);
        let (first, _) = crate::encode_request_lean(&conventions, &generator.request(40));
        let reversed =
            arrow::array::UInt32Array::from_iter_values((0..first.num_rows() as u32).rev());
        let batches = [
            crate::encode_request_lean(&conventions, &retry_fixture()).0,
            arrow::compute::take_record_batch(&first, &reversed).unwrap(),
            first,
        ];
        let held: Vec<RecordBatch> = batches.iter().map(hold).collect();
        let positions: Vec<(usize, usize)> = (0..60)
            .map(|i| (i % 3, (i * 7) % batches[i % 3].num_rows()))
            .collect();
        let wide = widen_rows(&held.iter().collect::<Vec<_>>(), &positions);
        let spans: Vec<&RecordBatch> = batches.iter().collect();
        let expected = match arrow::compute::interleave_record_batch(&spans, &positions) {
            Ok(rows) => lean(&rows),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(wide, expected);
        // Per span, on SDK-shaped traces (600 spans, as exporters batch them).
        let mut generator = crate::synth::Generator::new(crate::synth::Shape::default(), 1);
        let (batch, _) = crate::encode_request_lean(&conventions, &generator.request(600));
        let (lean_bytes, held_bytes) = (
            lean(&batch).get_array_memory_size(),
            hold(&batch).get_array_memory_size(),
        );
        assert!(
            held_bytes * 10 < lean_bytes * 7,
            "held {held_bytes} B vs lean {lean_bytes} B for 600 spans"
        );
    }

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
