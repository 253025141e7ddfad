//! The log-bucketed latency histogram, defined once and exposed to SQL.
//!
//! A value `x` (milliseconds) falls in bucket `ceil(ln x / ln γ)` with γ = (1 + α) / (1 - α)
//! and α = 0.02; reading bucket `i` back as `2 γ^i / (γ + 1)` is within α (2%) of every
//! value in it (the DDSketch construction). Buckets are integers, so a histogram is a set of
//! (bucket, count) rows that SQL groups and merges by summing counts: the partial aggregate
//! the window is built from. Values below 1 µs share the 1 µs bucket.
//!
//! SQL sees two functions: `sg_bucket(ms DOUBLE) -> INT` and `sg_bucket_ms(bucket INT) ->
//! DOUBLE`.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Float64Array, Int32Array};
use arrow::datatypes::{DataType, Float64Type, Int32Type};
use datafusion::common::Result;
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::prelude::SessionContext;

/// Relative accuracy of every quantile read from a histogram.
pub const RELATIVE_ERROR: f64 = 0.02;
const GAMMA: f64 = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR);
const MIN_MS: f64 = 0.001;

/// The bucket of a value in milliseconds.
pub fn bucket(ms: f64) -> i32 {
    (ms.max(MIN_MS).ln() / GAMMA.ln()).ceil() as i32
}

/// The value a bucket stands for, in milliseconds.
pub fn bucket_ms(bucket: i32) -> f64 {
    2.0 * GAMMA.powi(bucket) / (GAMMA + 1.0)
}

/// Register `sg_bucket` and `sg_bucket_ms` in a session.
pub fn register(ctx: &SessionContext) {
    let to_bucket = |args: &[ColumnarValue]| -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let values = arrays[0].as_primitive::<Float64Type>();
        let out: Int32Array = values.iter().map(|v| v.map(bucket)).collect();
        Ok(ColumnarValue::Array(Arc::new(out) as ArrayRef))
    };
    let to_ms = |args: &[ColumnarValue]| -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let buckets = arrays[0].as_primitive::<Int32Type>();
        let out: Float64Array = buckets.iter().map(|b| b.map(bucket_ms)).collect();
        Ok(ColumnarValue::Array(Arc::new(out) as ArrayRef))
    };
    ctx.register_udf(create_udf(
        "sg_bucket",
        vec![DataType::Float64],
        DataType::Int32,
        Volatility::Immutable,
        Arc::new(to_bucket),
    ));
    ctx.register_udf(create_udf(
        "sg_bucket_ms",
        vec![DataType::Int32],
        DataType::Float64,
        Volatility::Immutable,
        Arc::new(to_ms),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value reads back within 2% through its bucket, from 1 µs to an hour.
    #[test]
    fn relative_error_bound() {
        let mut ms = MIN_MS;
        while ms < 3_600_000.0 {
            let back = bucket_ms(bucket(ms));
            assert!(
                ((back - ms) / ms).abs() <= RELATIVE_ERROR + 1e-12,
                "{ms} -> {back}"
            );
            ms *= 1.013;
        }
    }

    /// Buckets are ordered like the values.
    #[test]
    fn monotone() {
        assert!(bucket(199.0) <= bucket(200.0));
        assert!(bucket(200.0) < bucket(320.0));
        assert_eq!(bucket(0.0), bucket(MIN_MS));
    }
}
