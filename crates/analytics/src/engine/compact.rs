//! How the window keeps its partials small, and how the report reads them back.

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int64Type, Schema};
use arrow::error::ArrowError;

/// The partial tables whose numbers the window keeps narrowed ([`narrowed`]): the merge
/// widens them back ([`widened`]) and the interval's counts cast what they read, so
/// nothing else sees the narrow types. At width `partial_edges` is most of the window: a
/// row per edge and interval of ~55 counts, a few calls each, 8 bytes apiece.
pub(super) const NARROWED: &[&str] = &["partial_edges"];

/// `batch` with each `Utf8` column dictionary-encoded when that takes less memory.
pub(super) fn dictionary_encoded(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let encoded = (field.data_type() == &DataType::Utf8)
            .then(|| arrow::compute::cast(column, &dictionary))
            .transpose()?
            .filter(|e| e.get_array_memory_size() < column.get_array_memory_size());
        match encoded {
            Some(encoded) => {
                columns.push(encoded);
                fields.push(field.as_ref().clone().with_data_type(dictionary.clone()));
            }
            None => {
                columns.push(column.clone());
                fields.push(field.as_ref().clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// `batch` with each `Float64` column of whole non-negative numbers stored as the smallest
/// unsigned integer that holds them, and each `Int64` column as the smallest signed one:
/// exact both ways, so [`widened`] gives back the same values.
pub(super) fn narrowed(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let to = match field.data_type() {
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
        };
        match to {
            Some(to) => {
                columns.push(arrow::compute::cast(column, &to)?);
                fields.push(field.as_ref().clone().with_data_type(to));
            }
            None => {
                columns.push(column.clone());
                fields.push(field.as_ref().clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// `batch` with the columns [`narrowed`] stored narrow back at their type in `schema`
/// (the query's own); other columns (strings, plain or dictionary) as they are.
pub(super) fn widened(batch: &RecordBatch, schema: &Schema) -> Result<RecordBatch, ArrowError> {
    let wide = |t: &DataType| matches!(t, DataType::Float64 | DataType::Int64);
    let differs = batch
        .schema()
        .fields()
        .iter()
        .zip(schema.fields())
        .any(|(a, b)| a.data_type() != b.data_type() && wide(b.data_type()));
    if !differs {
        return Ok(batch.clone());
    }
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for ((field, column), canonical) in batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .zip(schema.fields())
    {
        if field.data_type() != canonical.data_type() && wide(canonical.data_type()) {
            columns.push(arrow::compute::cast(column, canonical.data_type())?);
            fields.push(
                field
                    .as_ref()
                    .clone()
                    .with_data_type(canonical.data_type().clone()),
            );
        } else {
            columns.push(column.clone());
            fields.push(field.as_ref().clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, Float64Array, Int64Array};
    use arrow::datatypes::Field;

    use super::*;

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
        let wide = widened(&narrow, &schema).unwrap();
        assert_eq!(wide.schema().fields(), batch.schema().fields());
        for (a, b) in wide.columns().iter().zip(batch.columns()) {
            assert_eq!(a.to_data(), b.to_data());
        }
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
