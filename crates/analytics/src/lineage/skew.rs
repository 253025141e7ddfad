//! Clock skew: the bounds each completed call puts on its callee's clock, the offsets
//! they give each service pair (see [`crate::clock`]), and the spans' times shifted into
//! the root's clock.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Int64Type;
use stormglass_model::hash::KeyedHash;
use stormglass_model::schema as col;

use super::Node;
use super::races::answering_children;
use super::rows::{Kind, TraceGroups, column, kinds, parent_rows};
use super::schema::CLOCK_PAIRS_SCHEMA;
use crate::clock::{self, Bound, ClockBounds};

/// The bounds of `spans`' own completed calls per service pair (see [`crate::clock`]): what
/// a file analysed in chunks gives every chunk as its `prior`, so each chunk corrects the
/// clocks as the whole file does (bounds merge by MAX and MIN, so a chunk's own pairs
/// change nothing that is already in them).
pub fn clock_bounds(spans: &RecordBatch) -> ClockBounds {
    let column = |name: &str| column(spans, name);
    let parent_rows = parent_rows(
        &TraceGroups::new(column(col::TRACE_ID).as_fixed_size_binary()),
        column(col::SPAN_ID).as_fixed_size_binary(),
        column(col::PARENT_SPAN_ID).as_fixed_size_binary(),
    );
    let (bounds, _) = own_bounds(spans, &kinds(spans), &parent_rows);
    bounds
        .into_iter()
        .map(|((caller, callee), bound)| ((caller.to_owned(), callee.to_owned()), bound))
        .collect()
}

/// Clock bounds keyed by a batch's own service names.
pub(super) type BorrowedBounds<'a> = HashMap<(&'a str, &'a str), Bound, KeyedHash>;

/// The offset (ns) to add to a callee's times, per (caller, callee), keyed by borrowed
/// names: looked up per SERVER span without allocating.
pub(super) type BorrowedOffsets<'a> = HashMap<(&'a str, &'a str), i64, KeyedHash>;

/// One completed call's clock pair: the caller's and the callee's rows, and the offsets
/// (ms) it allows, `client.start - server.start ..= client.end - server.end`.
pub(super) struct ClockPair {
    client: usize,
    server: usize,
    low_ms: f64,
    high_ms: f64,
}

/// The bounds of the batch's completed calls per (caller, callee) service pair, and the
/// pair of each call giving one.
pub(super) fn own_bounds<'a>(
    spans: &'a RecordBatch,
    kinds: &[Kind],
    parent_rows: &[Option<usize>],
) -> (BorrowedBounds<'a>, Vec<ClockPair>) {
    let column = |name: &str| column(spans, name);
    let service = column(col::SERVICE_NAME).as_string::<i32>();
    let outcome = column(col::OUTCOME).as_string::<i32>();
    let ctx_cancelled = column(col::CTX_CANCELLED).as_boolean();
    let pending = column(col::PENDING).as_boolean();
    let start = column(col::START_NS).as_primitive::<Int64Type>();
    let end = column(col::END_NS).as_primitive::<Int64Type>();
    // A call re-sent below its CLIENT span (a proxy, a client library, gRPC hedging) has
    // several SERVER children; only the one that answered it must end inside the call: the
    // others were abandoned (a per-try timeout, a hedge's loser) and may work on long after.
    let (answering, servers) = answering_children(kinds, parent_rows, service, start, end, outcome);
    let abandoned = |p: usize, row: usize| servers[p] > 1 && answering[p] != Some(row);
    let mut bounds = BorrowedBounds::default();
    let mut pairs = Vec::new();
    for (row, parent) in parent_rows.iter().enumerate() {
        let Some(p) = *parent else { continue };
        // Only an answered call must contain its callee's span.
        if kinds[row] != Kind::Server
            || service.value(p) == service.value(row)
            || abandoned(p, row)
            || matches!(outcome.value(p), "deadline" | "cancelled")
            || ctx_cancelled.value(p)
            || ctx_cancelled.value(row)
            || pending.value(p)
            || pending.value(row)
        {
            continue;
        }
        let low_ms = (start.value(p) - start.value(row)) as f64 / 1e6;
        let high_ms = (end.value(p) - end.value(row)) as f64 / 1e6;
        let bound = Bound {
            low_ms,
            high_ms,
            pairs: 1,
        };
        bounds
            .entry((service.value(p), service.value(row)))
            .and_modify(|b| *b = b.merge(bound))
            .or_insert(bound);
        pairs.push(ClockPair {
            client: p,
            server: row,
            low_ms,
            high_ms,
        });
    }
    (bounds, pairs)
}

/// The chunk's clock pairs, and the offset (ns) to add to each service pair's callee times:
/// the chunk's bounds intersected with those of each part of `prior` (see [`crate::clock`]).
pub(super) fn clock_offsets<'a>(
    spans: &'a RecordBatch,
    kinds: &[Kind],
    parent_rows: &[Option<usize>],
    prior: &[Arc<ClockBounds>],
    tolerance_ms: f64,
) -> (RecordBatch, BorrowedOffsets<'a>) {
    let service = column(spans, col::SERVICE_NAME).as_string::<i32>();
    let (chunk, calls) = own_bounds(spans, kinds, parent_rows);
    let pairs = RecordBatch::try_new(
        CLOCK_PAIRS_SCHEMA.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(
                calls.iter().map(|c| service.value(c.client)),
            )),
            Arc::new(StringArray::from_iter_values(
                calls.iter().map(|c| service.value(c.server)),
            )),
            Arc::new(Float64Array::from_iter_values(
                calls.iter().map(|c| c.low_ms),
            )),
            Arc::new(Float64Array::from_iter_values(
                calls.iter().map(|c| c.high_ms),
            )),
        ],
    );
    let pairs = match pairs {
        Ok(batch) => batch,
        Err(e) => unreachable!("clock pair columns follow CLOCK_PAIRS_SCHEMA: {e}"),
    };
    // Only the pairs the chunk's SERVER spans are called over (what the lineage asks),
    // keyed by the chunk's names: each chunk going over the window's every pair (~160,000
    // at width) cost more than its own spans did.
    let mut offsets = BorrowedOffsets::default();
    for (row, parent) in parent_rows.iter().enumerate() {
        let Some(p) = *parent else { continue };
        let pair = (service.value(p), service.value(row));
        if kinds[row] != Kind::Server || pair.0 == pair.1 || offsets.contains_key(&pair) {
            continue;
        }
        let owned = (pair.0.to_owned(), pair.1.to_owned());
        let bound = (prior.iter().filter_map(|part| part.get(&owned)))
            .chain(chunk.get(&pair))
            .copied()
            .reduce(Bound::merge);
        let ns = bound.map_or(0, |b| {
            (clock::offset_ms(b.low_ms, b.high_ms, tolerance_ms) * 1e6).round() as i64
        });
        offsets.insert(pair, ns);
    }
    offsets.retain(|_, ns| *ns != 0);
    (pairs, offsets)
}

/// `spans` with `start_ns` and `end_ns` shifted into the root's clock, or `None` when no
/// span needs it.
pub(super) fn in_root_clock(spans: &RecordBatch, nodes: &[Node]) -> Option<RecordBatch> {
    let offset = |row: usize| nodes[row].offset_ns;
    if (0..spans.num_rows()).all(|row| offset(row) == 0) {
        return None;
    }
    let mut columns = spans.columns().to_vec();
    for name in [col::START_NS, col::END_NS] {
        let index = spans.schema().index_of(name).ok()?;
        let times = columns[index].as_primitive::<Int64Type>();
        let shifted: Int64Array = (0..times.len())
            .map(|row| times.value(row) + offset(row))
            .collect::<Vec<i64>>()
            .into();
        columns[index] = Arc::new(shifted);
    }
    RecordBatch::try_new(spans.schema(), columns).ok()
}
