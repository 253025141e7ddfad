//! The log-bucketed latency histogram, defined once and exposed to SQL.
//!
//! A value `x` (milliseconds) falls in bucket `ceil(ln x / ln γ)` with γ = (1 + α) / (1 - α)
//! and α = 0.02; reading bucket `i` back as `2 γ^i / (γ + 1)` is within α (2%) of every
//! value in it (the DDSketch construction). Buckets are integers, so a histogram is a set of
//! (bucket, count) rows that SQL groups and merges by summing counts: the partial aggregate
//! the window is built from. Values below 1 µs share the 1 µs bucket.
//!
//! SQL sees two functions: `sg_bucket(ms DOUBLE) -> INT` and `sg_bucket_ms(bucket INT) ->
//! DOUBLE`; and one aggregate, `sg_bucket_quantile(bucket INT, n DOUBLE, q DOUBLE) -> DOUBLE`,
//! the one definition of a quantile read from a histogram (see [`quantile`]).
//!
//! Prometheus gets a second, coarser histogram of the same durations,
//! `stormglass_layer_duration_seconds`, whose bucket bounds ([`le_bounds`]) are fixed for
//! every instance so that buckets sum across instances. `sg_le(seconds DOUBLE) -> INT` is
//! the index of the first bound a value is less than or equal to (`le` semantics;
//! `le_bounds().len()` is +Inf), computed by comparison, so counts per `le` are exact.

use std::sync::Arc;

use std::collections::BTreeMap;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int32Array};
use arrow::compute::unary;
use arrow::datatypes::{DataType, Float64Type, Int32Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{Accumulator, AggregateUDF, ColumnarValue, Volatility, create_udf};
use datafusion::prelude::SessionContext;

mod grouped;

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

/// The nearest-rank `q`-quantile of a histogram given as (bucket, count) pairs, read back at
/// the bucket's value: the first bucket, ascending, whose cumulative count reaches
/// `ceil(q * total)`. `unbucketed` counts values without a bucket: they are part of the
/// total but never the answer. `None` when no bucket reaches the rank.
pub fn quantile(buckets: &BTreeMap<i32, f64>, unbucketed: f64, q: f64) -> Option<f64> {
    quantile_of(buckets.iter().map(|(b, n)| (*b, *n)), unbucketed, q)
}

/// [`quantile`] over (bucket, count) pairs sorted by bucket, one per bucket.
fn quantile_of_sorted(buckets: &[(i32, f64)], unbucketed: f64, q: f64) -> Option<f64> {
    quantile_of(buckets.iter().copied(), unbucketed, q)
}

fn quantile_of(
    buckets: impl Iterator<Item = (i32, f64)> + Clone,
    unbucketed: f64,
    q: f64,
) -> Option<f64> {
    let total = buckets.clone().map(|(_, n)| n).sum::<f64>() + unbucketed;
    let rank = (q * total).ceil();
    let mut cumulative = 0.0;
    buckets.into_iter().find_map(|(bucket, n)| {
        cumulative += n;
        (cumulative >= rank).then(|| bucket_ms(bucket))
    })
}

/// `sg_bucket_quantile`'s state: the histogram of one group, merged by adding counts.
#[derive(Debug)]
struct QuantileAccumulator {
    q: f64,
    buckets: BTreeMap<i32, f64>,
    unbucketed: f64,
}

impl QuantileAccumulator {
    fn new(q: f64) -> QuantileAccumulator {
        QuantileAccumulator {
            q,
            buckets: BTreeMap::new(),
            unbucketed: 0.0,
        }
    }

    fn add(&mut self, bucket: Option<i32>, n: Option<f64>) {
        let Some(n) = n else { return };
        match bucket {
            Some(bucket) => *self.buckets.entry(bucket).or_default() += n,
            None => self.unbucketed += n,
        }
    }
}

impl Accumulator for QuantileAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let buckets = values[0].as_primitive::<Int32Type>();
        let counts = values[1].as_primitive::<Float64Type>();
        for (bucket, n) in buckets.iter().zip(counts.iter()) {
            self.add(bucket, n);
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let buckets = states[0].as_list::<i32>();
        let counts = states[1].as_list::<i32>();
        let unbucketed = states[2].as_primitive::<Float64Type>();
        for row in 0..states[0].len() {
            let (b, n) = (buckets.value(row), counts.value(row));
            for (bucket, n) in b
                .as_primitive::<Int32Type>()
                .iter()
                .zip(n.as_primitive::<Float64Type>())
            {
                self.add(bucket, n);
            }
            self.add(
                None,
                unbucketed.is_valid(row).then(|| unbucketed.value(row)),
            );
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let buckets: Vec<ScalarValue> = self
            .buckets
            .keys()
            .map(|b| ScalarValue::Int32(Some(*b)))
            .collect();
        let counts: Vec<ScalarValue> = self
            .buckets
            .values()
            .map(|n| ScalarValue::Float64(Some(*n)))
            .collect();
        Ok(vec![
            ScalarValue::List(ScalarValue::new_list_nullable(&buckets, &DataType::Int32)),
            ScalarValue::List(ScalarValue::new_list_nullable(&counts, &DataType::Float64)),
            ScalarValue::Float64(Some(self.unbucketed)),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(quantile(
            &self.buckets,
            self.unbucketed,
            self.q,
        )))
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.buckets.len() * (size_of::<i32>() + size_of::<f64>() + 32)
    }
}

/// Register `sg_bucket`, `sg_bucket_ms`, `sg_le` and `sg_bucket_quantile` in a session. The
/// scalar functions map the values with Arrow's `unary`, which keeps the input's nulls and
/// maps every slot (collecting an iterator of `Option`s builds the array value by value).
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
    ctx.register_udaf(AggregateUDF::from(grouped::BucketQuantile::new()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;

    /// The aggregate merges partial histograms from several partitions, counts unbucketed
    /// values in the total only, and is null when no bucket reaches the rank.
    #[tokio::test]
    async fn bucket_quantile_is_nearest_rank_over_merged_partitions() {
        use arrow::array::{RecordBatch, StringArray};
        use arrow::datatypes::Schema;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::SessionConfig;

        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Utf8, false),
            Field::new("bucket", DataType::Int32, true),
            Field::new("n", DataType::Float64, true),
        ]));
        let batch = |g: &[&str], b: &[Option<i32>], n: &[Option<f64>]| {
            let columns: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from(g.to_vec())),
                Arc::new(Int32Array::from(b.to_vec())),
                Arc::new(Float64Array::from(n.to_vec())),
            ];
            RecordBatch::try_new(schema.clone(), columns).unwrap()
        };
        // Group a: buckets 10 (1), 20 (0.5 + 1.5), 30 (1) and 1 unbucketed: total 5.
        let first = batch(
            &["a", "a", "a"],
            &[Some(10), Some(20), None],
            &[Some(1.0), Some(0.5), Some(1.0)],
        );
        let second = batch(
            &["a", "a", "b"],
            &[Some(20), Some(30), Some(7)],
            &[Some(1.5), Some(1.0), None],
        );
        let table = MemTable::try_new(schema.clone(), vec![vec![first], vec![second]]).unwrap();
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        register(&ctx);
        ctx.register_table("h", Arc::new(table)).unwrap();
        let sql = "SELECT g, sg_bucket_quantile(bucket, n, 0.0) AS q0, \
                   sg_bucket_quantile(bucket, n, 0.5) AS q50, \
                   sg_bucket_quantile(bucket, n, 0.9) AS q90 FROM h GROUP BY g ORDER BY g";
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
        let column = |i: usize| -> Vec<Option<f64>> {
            batch
                .column(i)
                .as_primitive::<Float64Type>()
                .iter()
                .collect()
        };
        // a: rank ceil(0.5 x 5) = 3 is reached at bucket 20; ceil(0.9 x 5) = 5 only with
        // the unbucketed value, so null. b: no counted value.
        assert_eq!(column(1), [Some(bucket_ms(10)), None]);
        assert_eq!(column(2), [Some(bucket_ms(20)), None]);
        assert_eq!(column(3), [None, None]);

        let varying = ctx
            .sql("SELECT sg_bucket_quantile(bucket, n, n) FROM h")
            .await
            .unwrap();
        let err = varying.collect().await.unwrap_err();
        assert!(err.to_string().contains("q must be a constant"), "{err}");
    }

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

    /// A bucket's value falls in that bucket: a quantile read back (retry_budgets.sql
    /// compares buckets with `sg_bucket` of a median) names the bucket it came from.
    #[test]
    fn a_bucket_value_is_in_its_bucket() {
        for b in bucket(MIN_MS)..=bucket(3_600_000.0) {
            assert_eq!(bucket(bucket_ms(b)), b, "{b}");
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
