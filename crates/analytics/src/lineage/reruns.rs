//! Writes re-run under a retry: a retry of an upstream call that is safe at its own edge
//! (keyed, or idempotent) can still make its callee write again below it. A write call
//! made for a retry attempt of an upstream call, repeating (same edge) a write made for an
//! earlier attempt of that call without the earlier write's idempotency key, re-runs it:
//! the double charge that shows only as amplification one layer down.
//!
//! "Made for an attempt": the attempt is an ancestor of the write. Every retried call above
//! a write is compared (a write under nested retried calls may repeat one under each), to
//! [`MAX_LEVELS`] of them. Only a write call's first attempt takes part: its own retries
//! are its edge's unsafe retries.

use std::collections::{HashMap, HashSet};

use arrow::array::{Array, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::datatypes::Int64Type;
use stormglass_model::hash::KeyedHash;
use stormglass_model::schema as col;

use super::Node;
use super::calls::CallSlot;
use super::rows::column;

/// Retried calls above one write that are compared, nearest first: deeper nesting in bad
/// data must not make the pass grow with depth.
const MAX_LEVELS: usize = 8;

/// One write call's first attempt under one retried call: the attempt number of the
/// retried call it was made for, its key, its row.
struct Made {
    number: i32,
    key: Option<i64>,
    row: usize,
}

/// How an attempt writes, as `attempts.sql` reads it: non-idempotent when its `idempotent`
/// flag is false, or absent and the write inference says write (its call span's where it
/// has none); its key is its own, else its call span's.
pub(super) struct Writes<'a> {
    idempotent: &'a BooleanArray,
    is_write: &'a BooleanArray,
    key: &'a Int64Array,
    call_parent: &'a [Option<usize>],
}

impl<'a> Writes<'a> {
    pub(super) fn new(spans: &'a RecordBatch, call_parent: &'a [Option<usize>]) -> Writes<'a> {
        Writes {
            idempotent: column(spans, col::IDEMPOTENT).as_boolean(),
            is_write: column(spans, col::IS_WRITE).as_boolean(),
            key: column(spans, col::IDEMPOTENCY_KEY_HASH).as_primitive::<Int64Type>(),
            call_parent,
        }
    }

    /// The row itself, else its call span, where `valid`.
    fn of_call(&self, row: usize, valid: impl Fn(usize) -> bool) -> Option<usize> {
        std::iter::once(row)
            .chain(self.call_parent[row])
            .find(|&r| valid(r))
    }

    pub(super) fn non_idempotent(&self, row: usize) -> bool {
        match self.of_call(row, |r| self.idempotent.is_valid(r)) {
            Some(r) => !self.idempotent.value(r),
            None => {
                self.is_write.value(row)
                    || self.call_parent[row].is_some_and(|p| self.is_write.value(p))
            }
        }
    }

    pub(super) fn key(&self, row: usize) -> Option<i64> {
        self.of_call(row, |r| self.key.is_valid(r))
            .map(|r| self.key.value(r))
    }
}

/// Per row: the attempt is the first of a write call that re-runs a write made for an
/// earlier attempt of a retried call above it (see the module docs). `edge_of` gives each
/// attempt's edge.
pub(super) fn rerun_writes(
    spans: &RecordBatch,
    attempts: &[usize],
    calls: &[CallSlot],
    writes: &Writes,
    nodes: &[Node],
    edge_of: &[Option<usize>],
) -> Vec<bool> {
    let mut made: HashMap<(i64, usize), Vec<Made>, KeyedHash> = HashMap::default();
    for &row in attempts {
        let slot = &calls[row];
        if !slot.first || slot.id.is_none() || nodes[row].retried_attempt.is_none() {
            continue;
        }
        let Some(edge) = edge_of[row] else { continue };
        if !writes.non_idempotent(row) {
            continue;
        }
        let key = writes.key(row);
        let mut above = nodes[row].retried_attempt;
        for _ in 0..MAX_LEVELS {
            let Some(a) = above else { break };
            if let Some(id) = calls[a].id {
                made.entry((id, edge)).or_default().push(Made {
                    number: calls[a].number,
                    key,
                    row,
                });
            }
            above = nodes[a].retried_attempt;
        }
    }
    let mut rerun = vec![false; spans.num_rows()];
    for writes in made.values_mut() {
        if writes.len() < 2 {
            continue;
        }
        writes.sort_by_key(|w| w.number);
        // Whether writes were made for earlier attempts, and the keys they sent.
        let mut earlier = false;
        let mut earlier_keys: HashSet<i64, KeyedHash> = HashSet::default();
        let mut at = 0;
        while at < writes.len() {
            let number = writes[at].number;
            let block = at..at + writes[at..].partition_point(|w| w.number == number);
            for w in &writes[block.clone()] {
                if earlier && !w.key.is_some_and(|k| earlier_keys.contains(&k)) {
                    rerun[w.row] = true;
                }
            }
            earlier = true;
            earlier_keys.extend(writes[block.clone()].iter().filter_map(|w| w.key));
            at = block.end;
        }
    }
    rerun
}
