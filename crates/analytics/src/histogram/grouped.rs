//! `sg_bucket_quantile` as DataFusion calls it per group: one vector per group, filled by
//! index, where the generic adapter made an accumulator object per group and sliced the
//! input for each (most of a 178,000-edge report's quantiles).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int32Array, ListArray};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int32Type};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};

use super::{QuantileAccumulator, quantile_of_sorted};

/// The `sg_bucket_quantile(bucket INT, n DOUBLE, q DOUBLE)` aggregate.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct BucketQuantile {
    signature: Signature,
}

impl BucketQuantile {
    pub(super) fn new() -> BucketQuantile {
        BucketQuantile {
            signature: Signature::exact(
                vec![DataType::Int32, DataType::Float64, DataType::Float64],
                Volatility::Immutable,
            ),
        }
    }
}

/// `q`, the aggregate's third argument, which must be a constant in [0, 1].
fn q_of(args: &AccumulatorArgs) -> Result<f64> {
    use datafusion::common::ScalarValue;
    use datafusion::physical_expr::expressions::Literal;
    match args.exprs.get(2).and_then(|e| e.downcast_ref::<Literal>()) {
        Some(literal) => match literal.value() {
            ScalarValue::Float64(Some(q)) if (0.0..=1.0).contains(q) => Ok(*q),
            other => exec_err!("sg_bucket_quantile: q must be in [0, 1], got {other}"),
        },
        None => exec_err!("sg_bucket_quantile: q must be a constant"),
    }
}

fn list(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new_list_field(item, true)))
}

impl AggregateUDFImpl for BucketQuantile {
    fn name(&self) -> &str {
        "sg_bucket_quantile"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(QuantileAccumulator::new(q_of(&args)?)))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(
                format_state_name(args.name, "buckets"),
                list(DataType::Int32),
                true,
            )),
            Arc::new(Field::new(
                format_state_name(args.name, "counts"),
                list(DataType::Float64),
                true,
            )),
            Arc::new(Field::new(
                format_state_name(args.name, "unbucketed"),
                DataType::Float64,
                true,
            )),
        ])
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(QuantileGroups {
            q: q_of(&args)?,
            groups: Vec::new(),
            pairs: 0,
        }))
    }
}

/// One group's histogram: (bucket, count) pairs as they came, sorted and summed per bucket
/// when read or when they pile up; and the count of values without a bucket.
#[derive(Default)]
struct Group {
    buckets: Vec<(i32, f64)>,
    /// `buckets[..compacted]` is sorted with one entry per bucket.
    compacted: usize,
    unbucketed: f64,
}

impl Group {
    /// Add `n` values of `bucket` (none: values without a bucket); returns how many pairs
    /// the group holds more than before.
    fn add(&mut self, bucket: Option<i32>, n: f64) -> isize {
        match bucket {
            Some(b) => {
                self.buckets.push((b, n));
                // Keep a group's memory near its distinct buckets, whatever its rows.
                if self.buckets.len() >= 2 * self.compacted.max(32) {
                    return 1 - self.compact() as isize;
                }
                1
            }
            None => {
                self.unbucketed += n;
                0
            }
        }
    }

    /// Sort by bucket and sum each bucket's counts, in the order they came (a stable sort),
    /// as the per-group accumulator's map does; returns how many pairs it removed.
    fn compact(&mut self) -> usize {
        let before = self.buckets.len();
        self.buckets.sort_by_key(|&(b, _)| b);
        let mut out = 0;
        for i in 0..self.buckets.len() {
            if out > 0 && self.buckets[out - 1].0 == self.buckets[i].0 {
                self.buckets[out - 1].1 += self.buckets[i].1;
            } else {
                self.buckets[out] = self.buckets[i];
                out += 1;
            }
        }
        self.buckets.truncate(out);
        self.compacted = out;
        before - out
    }
}

struct QuantileGroups {
    q: f64,
    groups: Vec<Group>,
    /// Pairs held over all groups, for `size` (called per batch, so not a walk of the
    /// groups).
    pairs: isize,
}

impl QuantileGroups {
    fn resize(&mut self, total: usize) {
        if self.groups.len() < total {
            self.groups.resize_with(total, Group::default);
        }
    }
}

impl GroupsAccumulator for QuantileGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        let buckets = values[0].as_primitive::<Int32Type>();
        let counts = values[1].as_primitive::<Float64Type>();
        for (row, &g) in group_indices.iter().enumerate() {
            if opt_filter.is_some_and(|f| !f.is_valid(row) || !f.value(row)) || counts.is_null(row)
            {
                continue;
            }
            let bucket = buckets.is_valid(row).then(|| buckets.value(row));
            self.pairs += self.groups[g].add(bucket, counts.value(row));
        }
        Ok(())
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        let (buckets, counts) = (values[0].as_list::<i32>(), values[1].as_list::<i32>());
        let unbucketed = values[2].as_primitive::<Float64Type>();
        let bucket_values = buckets.values().as_primitive::<Int32Type>();
        let count_values = counts.values().as_primitive::<Float64Type>();
        let (b_offsets, c_offsets) = (buckets.value_offsets(), counts.value_offsets());
        for (row, &g) in group_indices.iter().enumerate() {
            let group = &mut self.groups[g];
            let (b0, c0) = (b_offsets[row] as usize, c_offsets[row] as usize);
            let len = (b_offsets[row + 1] as usize - b0).min(c_offsets[row + 1] as usize - c0);
            for k in 0..len {
                if count_values.is_null(c0 + k) {
                    continue;
                }
                let bucket = bucket_values
                    .is_valid(b0 + k)
                    .then(|| bucket_values.value(b0 + k));
                self.pairs += group.add(bucket, count_values.value(c0 + k));
            }
            if unbucketed.is_valid(row) {
                group.add(None, unbucketed.value(row));
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let q = self.q;
        let groups = emit_to.take_needed(&mut self.groups);
        self.pairs -= groups
            .iter()
            .map(|g| g.buckets.len() as isize)
            .sum::<isize>();
        let values: Float64Array = groups
            .into_iter()
            .map(|mut g| {
                g.compact();
                quantile_of_sorted(&g.buckets, g.unbucketed, q)
            })
            .collect();
        Ok(Arc::new(values))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let groups = emit_to.take_needed(&mut self.groups);
        self.pairs -= groups
            .iter()
            .map(|g| g.buckets.len() as isize)
            .sum::<isize>();
        Ok(lists(groups))
    }

    /// Each row its own group's state, as `update_batch` would leave it.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let buckets = values[0].as_primitive::<Int32Type>();
        let counts = values[1].as_primitive::<Float64Type>();
        let groups = (0..buckets.len()).map(|row| {
            let mut g = Group::default();
            let kept = opt_filter.is_none_or(|f| f.is_valid(row) && f.value(row));
            if kept && counts.is_valid(row) {
                let bucket = buckets.is_valid(row).then(|| buckets.value(row));
                g.add(bucket, counts.value(row));
            }
            g
        });
        Ok(lists(groups))
    }

    fn size(&self) -> usize {
        size_of_val(self)
            + self.groups.capacity() * size_of::<Group>()
            + self.pairs.max(0) as usize * size_of::<(i32, f64)>()
    }
}

/// The state columns (buckets and counts as lists, values without a bucket) of `groups`.
fn lists(groups: impl IntoIterator<Item = Group>) -> Vec<ArrayRef> {
    let groups = groups.into_iter();
    let mut offsets = Vec::with_capacity(groups.size_hint().0 + 1);
    offsets.push(0i32);
    let mut buckets = Vec::new();
    let mut counts = Vec::new();
    let mut unbucketed = Vec::with_capacity(offsets.capacity());
    for mut g in groups {
        g.compact();
        buckets.extend(g.buckets.iter().map(|&(b, _)| b));
        counts.extend(g.buckets.iter().map(|&(_, n)| n));
        offsets.push(i32::try_from(buckets.len()).unwrap_or(i32::MAX));
        unbucketed.push(g.unbucketed);
    }
    let offsets = OffsetBuffer::new(offsets.into());
    let item = |t: DataType| Arc::new(Field::new_list_field(t, true));
    let buckets = ListArray::new(
        item(DataType::Int32),
        offsets.clone(),
        Arc::new(Int32Array::from(buckets)),
        None,
    );
    let counts = ListArray::new(
        item(DataType::Float64),
        offsets,
        Arc::new(Float64Array::from(counts)),
        None,
    );
    vec![
        Arc::new(buckets),
        Arc::new(counts),
        Arc::new(Float64Array::from(unbucketed)),
    ]
}
