//! How the window keeps its partials small, and how the report reads them back.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use arrow::error::ArrowError;

use crate::table::recast;

/// The partial tables whose numbers the window keeps narrowed ([`narrowed`]): the merge
/// reads them at their own types ([`common_schema`]) and the interval's counts cast what
/// they read, so nothing else sees the narrow types. At width `partial_edges` is most of
/// the window: a row per edge and interval of ~55 counts, a few calls each, 8 bytes apiece.
pub(super) const NARROWED: &[&str] = &["partial_edges"];

/// How the rows of a partial table merge, as its header states: rows equal in `keys` are
/// one, its `maxima` and `minima` taken, every other column summed.
pub(super) struct Merge {
    pub table: &'static str,
    pub keys: &'static [&'static str],
    pub maxima: &'static [&'static str],
    pub minima: &'static [&'static str],
}

const EDGE: [&str; 3] = ["caller", "callee", "operation"];

/// Joins `EDGE` and `more` into one key list at compile time.
macro_rules! edge_and {
    ($($more:literal),*) => { &["caller", "callee", "operation", $($more),*] };
}

/// The partial tables an interval's chunks are merged in ([`Engine::merge_chunks`](super::Engine::merge_chunks))
/// before the window keeps them. A chunk's rows repeat every edge (and bucket) it saw, so at
/// width an interval held each edge once per chunk: ~2.5x what the merged interval holds.
/// Tables not listed (entries, traces, findings, orphans, backoff, sync) are small or
/// merge otherwise.
pub(super) const MERGED: &[Merge] = &[
    Merge {
        table: "partial_edges",
        keys: &EDGE,
        maxima: &["max_attempt", "max_outer_attempt"],
        minima: &[],
    },
    Merge {
        table: "partial_sequences",
        keys: &["caller", "sequence"],
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_links",
        keys: &[
            "entry_service",
            "entry_operation",
            "parent_caller",
            "parent_callee",
            "parent_operation",
            "caller",
            "callee",
            "operation",
        ],
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_attempts",
        keys: edge_and!("attempt", "outcome", "cause"),
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_calls",
        keys: edge_and!("first_outcome", "final_outcome"),
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_latency",
        keys: &["service", "operation", "bucket", "le"],
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_edge_latency",
        keys: edge_and!("bucket"),
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_budgets",
        keys: edge_and!("bucket", "le"),
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_retry_budgets",
        keys: edge_and!("bucket"),
        maxima: &[],
        minima: &["example_trace_id"],
    },
    Merge {
        table: "partial_tail",
        keys: edge_and!("deadline_ms"),
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_timeouts",
        keys: edge_and!("bucket"),
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_timeout_values",
        keys: edge_and!("deadline_ms"),
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_clock_skew",
        keys: &["caller", "callee"],
        maxima: &["low_ms"],
        minima: &["high_ms"],
    },
    Merge {
        table: "partial_layer_codes",
        keys: &["service", "status_code", "outcome"],
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_layers",
        keys: &["service"],
        maxima: &[],
        minima: &[],
    },
    Merge {
        table: "partial_entry_latency",
        keys: &["service", "operation", "bucket", "le"],
        maxima: &[],
        minima: &[],
    },
];

/// `batch` with each `Utf8` column dictionary-encoded when that takes less memory.
pub(super) fn dictionary_encoded(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    recast(batch, |field, column| {
        Ok((field.data_type() == &DataType::Utf8)
            .then(|| arrow::compute::cast(column, &dictionary))
            .transpose()?
            .filter(|e| e.get_array_memory_size() < column.get_array_memory_size()))
    })
}

/// `batch` with each `Float64` column of whole non-negative numbers stored as the smallest
/// unsigned integer that holds them, and each `Int64` column as the smallest signed one:
/// exact both ways, so a cast back gives the same values.
pub(super) fn narrowed(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    recast(batch, |field, column| {
        narrow_type(field.data_type(), column)
            .map(|to| arrow::compute::cast(column, &to))
            .transpose()
    })
}

/// The narrow type [`narrowed`] stores `column` (of type `data_type`) at, if any.
fn narrow_type(data_type: &DataType, column: &ArrayRef) -> Option<DataType> {
    match data_type {
        DataType::Float64 => {
            let values = column.as_primitive::<Float64Type>();
            let whole = values
                .iter()
                .flatten()
                .all(|v| v >= 0.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX));
            let max = values.iter().flatten().fold(0.0, f64::max);
            whole.then(|| {
                if max <= f64::from(u8::MAX) {
                    DataType::UInt8
                } else if max <= f64::from(u16::MAX) {
                    DataType::UInt16
                } else {
                    DataType::UInt32
                }
            })
        }
        DataType::Int64 => {
            let values = column.as_primitive::<Int64Type>();
            let (min, max) = (arrow::compute::min(values), arrow::compute::max(values));
            let within = |lo: i64, hi: i64| min.unwrap_or(0) >= lo && max.unwrap_or(0) <= hi;
            if within(i8::MIN.into(), i8::MAX.into()) {
                Some(DataType::Int8)
            } else if within(i16::MIN.into(), i16::MAX.into()) {
                Some(DataType::Int16)
            } else if within(i32::MIN.into(), i32::MAX.into()) {
                Some(DataType::Int32)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// One batch of a narrowed table's chunks (`batches`, each [`narrowed`]), its strings
/// dictionary-encoded and its counts narrowed again. Column by column: a column the
/// chunks narrowed to different types is concatenated at its type in `schema` (the
/// query's), so no more than one column is ever wide at once.
pub(super) fn concat_narrowed(
    schema: &Schema,
    batches: &[RecordBatch],
) -> Result<RecordBatch, ArrowError> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (i, field) in schema.fields().iter().enumerate() {
        let mut arrays: Vec<ArrayRef> = batches.iter().map(|b| b.column(i).clone()).collect();
        if arrays
            .windows(2)
            .any(|w| w[0].data_type() != w[1].data_type())
        {
            arrays = (arrays.iter())
                .map(|a| arrow::compute::cast(a, field.data_type()))
                .collect::<Result<_, _>>()?;
        }
        let parts: Vec<&dyn Array> = arrays.iter().map(AsRef::as_ref).collect();
        let column = arrow::compute::concat(&parts)?;
        fields.push(
            field
                .as_ref()
                .clone()
                .with_data_type(column.data_type().clone()),
        );
        columns.push(column);
    }
    let one = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
    narrowed(&dictionary_encoded(&one)?)
}

/// The schema a narrowed table's batches across the window are merged at: per column, the
/// widest of the narrow types the batches hold (UInt8 < UInt16 < UInt32 < Float64, Int8 <
/// ... < Int64), the query's own type in `schema` where they differ otherwise. The merge
/// casts a column up to it only where a batch's is narrower, and the report reads the
/// merged table through a view at the query's types ([`Engine::merge`](super::Engine::merge)),
/// so the window's counts are never held wide.
pub(super) fn common_schema(schema: &Schema, batches: &[RecordBatch]) -> Schema {
    // A column's narrow types are of one family: its query's type is Float64 or Int64.
    const ORDER: [DataType; 8] = [
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::Float64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
    ];
    let fields: Vec<Field> = (schema.fields().iter().enumerate())
        .map(|(i, field)| {
            let types: Vec<DataType> = (batches.iter())
                .map(|b| b.schema().field(i).data_type().clone())
                .collect();
            let same = types.windows(2).all(|w| w[0] == w[1]);
            let widest = || {
                let ranks: Option<Vec<usize>> = types
                    .iter()
                    .map(|t| ORDER.iter().position(|o| o == t))
                    .collect();
                ranks?.into_iter().max().map(|r| ORDER[r].clone())
            };
            let to = match types.first() {
                Some(first) if same => first.clone(),
                _ => widest().unwrap_or_else(|| field.data_type().clone()),
            };
            field.as_ref().clone().with_data_type(to)
        })
        .collect();
    Schema::new(fields)
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, Int64Array};

    use super::super::planned::conform;
    use super::*;

    fn conformed(batch: &RecordBatch, schema: &arrow::datatypes::SchemaRef) -> RecordBatch {
        conform(schema, vec![batch.clone()]).unwrap().remove(0)
    }

    /// Whole counts narrow to the smallest integer and widen back to the same values;
    /// fractions (sampling weights), negatives and nulls keep their meaning.
    #[test]
    fn narrowing_is_exact_both_ways() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("small", DataType::Float64, true),
            Field::new("large", DataType::Float64, true),
            Field::new("weighted", DataType::Float64, true),
            Field::new("negative", DataType::Float64, true),
            Field::new("attempt", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Float64Array::from(vec![Some(0.0), None, Some(255.0)])),
                Arc::new(Float64Array::from(vec![Some(1.0), Some(70000.0), None])),
                Arc::new(Float64Array::from(vec![Some(1.5), Some(2.0), Some(3.0)])),
                Arc::new(Float64Array::from(vec![Some(-1.0), Some(2.0), Some(3.0)])),
                Arc::new(Int64Array::from(vec![Some(3), None, Some(-1)])),
            ],
        )
        .unwrap();
        let narrow = narrowed(&batch).unwrap();
        let types: Vec<DataType> = narrow
            .schema()
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(
            types,
            [
                DataType::UInt8,
                DataType::UInt32,
                DataType::Float64,
                DataType::Float64,
                DataType::Int8
            ]
        );
        let wide = conformed(&narrow, &schema);
        assert_eq!(wide.schema().fields(), batch.schema().fields());
        for (a, b) in wide.columns().iter().zip(batch.columns()) {
            assert_eq!(a.to_data(), b.to_data());
        }
        // Chunks narrowed to different types come together as one batch of the same values.
        let other = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Float64Array::from(vec![Some(300.0)])),
                Arc::new(Float64Array::from(vec![Some(1.0)])),
                Arc::new(Float64Array::from(vec![Some(1.0)])),
                Arc::new(Float64Array::from(vec![Some(1.0)])),
                Arc::new(Int64Array::from(vec![Some(1)])),
            ],
        )
        .unwrap();
        let one = concat_narrowed(&schema, &[narrow, narrowed(&other).unwrap()]).unwrap();
        assert_eq!(one.num_rows(), 4);
        let expected =
            arrow::compute::concat_batches(&schema, &[batch.clone(), other.clone()]).unwrap();
        let wide = conformed(&one, &schema);
        for (a, b) in wide.columns().iter().zip(expected.columns()) {
            assert_eq!(a.to_data(), b.to_data());
        }
        let two = [narrowed(&batch).unwrap(), narrowed(&other).unwrap()];
        let common = common_schema(&schema, &two);
        let types: Vec<&DataType> = common.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(
            types,
            [
                &DataType::UInt16,
                &DataType::UInt32,
                &DataType::Float64,
                &DataType::Float64,
                &DataType::Int8
            ]
        );
        let counts: Float64Array = (0..4096).map(|i| f64::from(i % 7)).collect();
        let one = Arc::new(Schema::new(vec![Field::new("n", DataType::Float64, false)]));
        let batch = RecordBatch::try_new(one, vec![Arc::new(counts)]).unwrap();
        let narrow = narrowed(&batch).unwrap();
        let (n, b) = (
            narrow.get_array_memory_size(),
            batch.get_array_memory_size(),
        );
        assert!(n * 4 < b, "{n} {b}");
    }
}
