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
//!
//! Prometheus gets a second, coarser histogram of the same durations,
//! `stormglass_layer_duration_seconds`, whose bucket bounds ([`le_bounds`]) are fixed for
//! every instance so that buckets sum across instances. `sg_le(seconds DOUBLE) -> INT` is
//! the index of the first bound a value is less than or equal to (`le` semantics;
//! `le_bounds().len()` is +Inf), computed by comparison, so counts per `le` are exact.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Float64Array, Int32Array};
use arrow::compute::unary;
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

/// Number of finite Prometheus bucket bounds: 1 ms to 60 s in 50 equal log steps.
const LE_STEPS: i32 = 50;

/// The finite `le` bounds of `stormglass_layer_duration_seconds`, in seconds: 1 ms .. 60 s,
/// each 60000^(1/50) = 1.2461x the previous, rounded to 4 significant digits so the labels
/// read well (consecutive bounds stay within a factor of 1.25, as docs/metrics.md promises).
pub fn le_bounds() -> Vec<f64> {
    (0..=LE_STEPS)
        .map(|k| {
            let exact = 60_000f64.powf(f64::from(k) / f64::from(LE_STEPS)) / 1000.0;
            let scale = 10f64.powi(3 - exact.log10().floor() as i32);
            (exact * scale).round() / scale
        })
        .collect()
}

/// The `le` bucket index of a duration in seconds (`bounds.len()` for +Inf).
pub fn le_index(bounds: &[f64], seconds: f64) -> i32 {
    bounds.partition_point(|bound| *bound < seconds) as i32
}

/// Register `sg_bucket`, `sg_bucket_ms` and `sg_le` in a session. Each maps the values
/// with Arrow's `unary`, which keeps the input's nulls and maps every slot: collecting an
/// iterator of `Option`s built the array value by value (~3% of the live analysis's
/// samples, `perf record`).
pub fn register(ctx: &SessionContext) {
    let to_bucket = |args: &[ColumnarValue]| -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let values = arrays[0].as_primitive::<Float64Type>();
        let out: Int32Array = unary(values, bucket);
        Ok(ColumnarValue::Array(Arc::new(out) as ArrayRef))
    };
    let to_ms = |args: &[ColumnarValue]| -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let buckets = arrays[0].as_primitive::<Int32Type>();
        let out: Float64Array = unary(buckets, bucket_ms);
        Ok(ColumnarValue::Array(Arc::new(out) as ArrayRef))
    };
    ctx.register_udf(create_udf(
        "sg_bucket",
        vec![DataType::Float64],
        DataType::Int32,
        Volatility::Immutable,
        Arc::new(to_bucket),
    ));
    let bounds = le_bounds();
    let to_le = move |args: &[ColumnarValue]| -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let values = arrays[0].as_primitive::<Float64Type>();
        let out: Int32Array = unary(values, |v| le_index(&bounds, v));
        Ok(ColumnarValue::Array(Arc::new(out) as ArrayRef))
    };
    ctx.register_udf(create_udf(
        "sg_le",
        vec![DataType::Float64],
        DataType::Int32,
        Volatility::Immutable,
        Arc::new(to_le),
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

    /// The Prometheus bounds run 1 ms .. 60 s, increasing, each within 1.25x the previous.
    #[test]
    fn le_bounds_cover_one_ms_to_sixty_s() {
        let bounds = le_bounds();
        assert_eq!(bounds.first(), Some(&0.001));
        assert_eq!(bounds.last(), Some(&60.0));
        for pair in bounds.windows(2) {
            let factor = pair[1] / pair[0];
            assert!(factor > 1.0 && factor <= 1.25, "{pair:?}");
        }
    }

    /// `le` is inclusive: a value equal to a bound counts in that bound's bucket.
    #[test]
    fn le_index_is_inclusive() {
        let bounds = le_bounds();
        assert_eq!(le_index(&bounds, 0.0), 0);
        assert_eq!(le_index(&bounds, 0.001), 0);
        assert_eq!(le_index(&bounds, 0.0010001), 1);
        assert_eq!(le_index(&bounds, 60.0), 50);
        assert_eq!(le_index(&bounds, 61.0), 51);
    }

    /// Buckets are ordered like the values.
    #[test]
    fn monotone() {
        assert!(bucket(199.0) <= bucket(200.0));
        assert!(bucket(200.0) < bucket(320.0));
        assert_eq!(bucket(0.0), bucket(MIN_MS));
    }
}
