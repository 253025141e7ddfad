//! The batch's rows as the lineage walks them: span kinds, traces grouped by id, each
//! span's parent row, and repeated spans.

use std::collections::HashMap;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeBinaryArray, RecordBatch};
use stormglass_model::hash::KeyedHash;
use stormglass_model::schema as col;

/// The span kinds the lineage tells apart.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Client,
    Server,
    Internal,
    Other,
}

/// Each row's kind, read from the `kind` column once: the walks above ask it several times
/// per span, and comparing an enum costs nothing next to comparing the text.
pub(super) fn kinds(spans: &RecordBatch) -> Vec<Kind> {
    let kind = column(spans, col::KIND).as_string::<i32>();
    (0..spans.num_rows())
        .map(|row| match kind.value(row) {
            "client" => Kind::Client,
            "server" => Kind::Server,
            "internal" => Kind::Internal,
            _ => Kind::Other,
        })
        .collect()
}

/// A column of a batch following the span schema.
pub(super) fn column<'a>(spans: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    match spans.column_by_name(name) {
        Some(c) => c,
        None => unreachable!("spans follow SPANS_SCHEMA, which has {name}"),
    }
}

/// Each span's parent row: the row of the same trace whose span id is the span's parent id
/// (the last such row, should one appear twice), `None` for a root or a parent not in the
/// batch. Each trace's parents are found in a sorted list of that trace's span ids (see
/// [`TraceGroups`]): a few cache lines per lookup.
pub(super) fn parent_rows(
    groups: &TraceGroups,
    span: &FixedSizeBinaryArray,
    parent: &FixedSizeBinaryArray,
) -> Vec<Option<usize>> {
    let mut parents = vec![None; span.len()];
    let mut ids: Vec<(u64, usize)> = Vec::new();
    for members in groups.traces() {
        ids.clear();
        ids.extend(members.iter().map(|&row| (span_int(span, row), row)));
        ids.sort_unstable();
        for &row in members {
            if parent.is_null(row) {
                continue;
            }
            let id = span_int(parent, row);
            // Past the last entry with this id: the highest row holding it.
            let end = ids.partition_point(|&(span, _)| span <= id);
            parents[row] = end
                .checked_sub(1)
                .map(|i| ids[i])
                .filter(|&(span, _)| span == id)
                .map(|(_, row)| row);
        }
    }
    parents
}

/// The rows holding a (trace id, span id) an earlier row already holds, in row order: what
/// de-duplicating a batch drops, keeping each span's first copy. Found per trace, as
/// [`parent_rows`] finds parents: one hash set of every span of a chunk misses the cache on
/// nearly every insert.
pub(crate) fn repeated_rows(
    trace: &FixedSizeBinaryArray,
    span: &FixedSizeBinaryArray,
) -> Vec<usize> {
    let mut repeated = Vec::new();
    let mut ids: Vec<(u64, usize)> = Vec::new();
    for members in TraceGroups::new(trace).traces() {
        ids.clear();
        ids.extend(members.iter().map(|&row| (span_int(span, row), row)));
        ids.sort_unstable();
        repeated.extend(
            ids.windows(2)
                .filter(|pair| pair[0].0 == pair[1].0)
                .map(|pair| pair[1].1),
        );
    }
    repeated.sort_unstable();
    repeated
}

/// A batch's rows grouped by trace: a map of the batch's trace ids numbers them, and a
/// counting sort groups the rows. One hash map of every span of the batch misses the cache
/// on nearly every insert and lookup; the map of trace ids is a tenth of its size. Any row
/// order works: OTLP requests group spans by service, so a file's traces are
/// interleaved.
pub(crate) struct TraceGroups {
    /// Trace t's rows are `rows[bounds[t]..bounds[t + 1]]`, in row order.
    bounds: Vec<usize>,
    rows: Vec<usize>,
}

impl TraceGroups {
    pub(crate) fn new(trace: &FixedSizeBinaryArray) -> TraceGroups {
        let len = trace.len();
        // Each row's trace, numbered in order of first appearance.
        let mut numbers: HashMap<u128, usize, KeyedHash> = HashMap::default();
        let mut trace_of = Vec::with_capacity(len);
        let mut last: Option<(u128, usize)> = None;
        for row in 0..len {
            let id = trace_int(trace, row);
            let number = match last {
                // Consecutive rows of one trace (released traces are whole): no lookup.
                Some((last_id, number)) if last_id == id => number,
                _ => {
                    let next = numbers.len();
                    *numbers.entry(id).or_insert(next)
                }
            };
            last = Some((id, number));
            trace_of.push(number);
        }
        let mut bounds = vec![0; numbers.len() + 1];
        for &t in &trace_of {
            bounds[t + 1] += 1;
        }
        for t in 0..numbers.len() {
            bounds[t + 1] += bounds[t];
        }
        let mut rows = vec![0; len];
        let mut next = bounds.clone();
        for (row, &t) in trace_of.iter().enumerate() {
            rows[next[t]] = row;
            next[t] += 1;
        }
        TraceGroups { bounds, rows }
    }

    /// How many traces.
    pub(super) fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Each trace's rows.
    pub(crate) fn traces(&self) -> impl Iterator<Item = &[usize]> {
        self.bounds.windows(2).map(|b| &self.rows[b[0]..b[1]])
    }
}

/// A trace id as an integer that orders like its bytes.
pub(super) fn trace_int(ids: &FixedSizeBinaryArray, row: usize) -> u128 {
    let mut bytes = [0u8; 16];
    let id = ids.value(row);
    let n = id.len().min(16);
    bytes[..n].copy_from_slice(&id[..n]);
    u128::from_be_bytes(bytes)
}

/// A span id as an integer that orders like its bytes.
pub(super) fn span_int(ids: &FixedSizeBinaryArray, row: usize) -> u64 {
    let mut bytes = [0u8; 8];
    let id = ids.value(row);
    let n = id.len().min(8);
    bytes[..n].copy_from_slice(&id[..n]);
    u64::from_be_bytes(bytes)
}
