//! Clock skew between the hosts of a caller and of its callee.
//!
//! A completed attempt (it got an answer: not timed out, not cancelled) contains its callee's
//! SERVER span in real time: the server started after the request left and ended before the
//! answer arrived. With the callee's clock `d` ahead of the caller's, the callee's times read
//! `d` late, so the offset `o = -d` that corrects them satisfies, for every such pair,
//! `client.start - server.start <= o <= client.end - server.end`. Over a window the offsets
//! consistent with every pair of a (caller service, callee service) are the intersection of
//! those intervals: `[low, high]` with `low` the greatest lower bound and `high` the least
//! upper one (mergeable: MAX and MIN).
//!
//! The correction is 0 when 0 lies in `[low - tolerance, high + tolerance]`: the clocks agree
//! within `clocks.tolerance_ms` (which also absorbs millisecond-resolution timestamps), so
//! an unskewed run is left exactly as it is. Otherwise it is the middle of `[low, high]`:
//! `low` is off the true offset by the quickest request's network delay, `high` by the
//! quickest answer's, so the middle is exact when the two are alike (NTP's assumption) and
//! off by half their difference otherwise. When the pairs contradict each other (`low >
//! high`: the skew drifted within the window, or one service's hosts disagree with each
//! other) the middle is still the least wrong single offset.
//! Cancelled and timed-out attempts never enter the estimate, so a callee that really kept
//! working after its caller gave up (an orphan) is not shifted back inside its caller, as
//! Jaeger's adjuster would do.
//!
//! SQL sees the rule as `sg_clock_offset_ms(low_ms, high_ms, tolerance_ms)`; the analysis
//! applies it to the callee's subtree before every cross-host time comparison (orphans,
//! orphan work, deadlines); the report shows `clock_skew_ms = -offset` per edge.

use std::sync::Arc;

use arrow::array::{Array, AsArray, Float64Array};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::prelude::SessionContext;
use stormglass_model::hash::KeyedMap;

/// The offsets consistent with one service pair's completed calls (milliseconds, added to
/// the callee's times), and how many calls gave them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    pub low_ms: f64,
    pub high_ms: f64,
    pub pairs: u64,
}

impl Bound {
    /// The intersection of two windows' bounds.
    pub fn merge(self, other: Bound) -> Bound {
        Bound {
            low_ms: self.low_ms.max(other.low_ms),
            high_ms: self.high_ms.min(other.high_ms),
            pairs: self.pairs + other.pairs,
        }
    }
}

/// Bounds per (caller service, callee service), with the keyed hash (at width a file's
/// are ~160,000 pairs, gathered from every chunk).
pub type ClockBounds = KeyedMap<(String, String), Bound>;

/// Add `bound` for `pair` to `bounds`, intersecting with what is there.
pub fn add(bounds: &mut ClockBounds, pair: (String, String), bound: Bound) {
    bounds
        .entry(pair)
        .and_modify(|b| *b = b.merge(bound))
        .or_insert(bound);
}

/// The correction (ms, added to the callee's times) for bounds `[low, high]`; see the
/// module docs.
pub fn offset_ms(low_ms: f64, high_ms: f64, tolerance_ms: f64) -> f64 {
    if !(low_ms.is_finite() && high_ms.is_finite()) {
        return 0.0;
    }
    if low_ms - tolerance_ms <= 0.0 && 0.0 <= high_ms + tolerance_ms {
        0.0
    } else {
        (low_ms + high_ms) / 2.0
    }
}

/// Register `sg_clock_offset_ms(low DOUBLE, high DOUBLE, tolerance DOUBLE) -> DOUBLE`.
pub fn register(ctx: &SessionContext) {
    let offset = |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let (low, high, tolerance) = (
            arrays[0].as_primitive::<Float64Type>(),
            arrays[1].as_primitive::<Float64Type>(),
            arrays[2].as_primitive::<Float64Type>(),
        );
        let out: Float64Array = (0..low.len())
            .map(|i| {
                (low.is_valid(i) && high.is_valid(i) && tolerance.is_valid(i))
                    .then(|| offset_ms(low.value(i), high.value(i), tolerance.value(i)))
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    };
    ctx.register_udf(create_udf(
        "sg_clock_offset_ms",
        vec![DataType::Float64, DataType::Float64, DataType::Float64],
        DataType::Float64,
        Volatility::Immutable,
        Arc::new(offset),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Agreeing clocks (0 inside the bounds, or within the tolerance) are not corrected;
    /// a callee 40 ms ahead is moved back by the middle of the offsets that fit every pair.
    #[test]
    fn smallest_consistent_shift() {
        assert_eq!(offset_ms(-0.3, 0.2, 1.0), 0.0);
        assert_eq!(offset_ms(0.6, -0.4, 1.0), 0.0, "ms-resolution clocks");
        assert_eq!(offset_ms(-40.3, -39.7, 1.0), -40.0);
        assert_eq!(offset_ms(25.1, 25.9, 1.0), 25.5);
        assert_eq!(offset_ms(-30.0, -50.0, 1.0), -40.0, "contradicting pairs");
        assert_eq!(offset_ms(f64::NEG_INFINITY, 3.0, 1.0), 0.0);
    }

    /// Merging intersects and adds the pair counts.
    #[test]
    fn merge_intersects() {
        let a = Bound {
            low_ms: -41.0,
            high_ms: -38.0,
            pairs: 2,
        };
        let b = Bound {
            low_ms: -40.5,
            high_ms: -39.0,
            pairs: 3,
        };
        assert_eq!(
            a.merge(b),
            Bound {
                low_ms: -40.5,
                high_ms: -39.0,
                pairs: 5
            }
        );
    }
}
