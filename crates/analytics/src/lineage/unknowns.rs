//! How long a write's result stays unknown: a keyed, non-idempotent attempt its caller gave
//! up on (it ended `deadline` or `cancelled` as the caller saw it) may or may not have
//! applied the write, until a later attempt or span with the same key answers (ends `ok`,
//! or is answered as a duplicate: either says the write is done). Matched by key hash
//! within the trace (its retries, a later request in it), in order of end: one sort of the
//! keyed writes, no scan per row. Across traces the answer may sit in another interval or
//! file chunk than the write, so matching there would make the figure depend on how the
//! spans were cut; within a trace it cannot.

use std::collections::HashMap;

use stormglass_model::hash::KeyedHash;

use super::reruns::Writes;

/// A keyed write as this pass reads it: when the caller saw it end, and how.
#[derive(Clone, Copy)]
pub(super) struct Seen {
    pub(super) row: usize,
    pub(super) trace: u128,
    pub(super) end_ns: i64,
    /// The caller gave up on it: its result is unknown.
    pub(super) gave_up: bool,
    /// It answered: the write is done.
    pub(super) answered: bool,
}

/// Per row, for attempts whose result went unknown: `Some(Some(ms))` when a later span of
/// its trace with the same key answered `ms` after it ended, `Some(None)` when none did; `None` for every
/// other row.
pub(super) fn unknown_results(
    rows: usize,
    attempts: &[usize],
    writes: &Writes,
    seen: impl Fn(usize) -> Seen,
) -> Vec<Option<Option<f64>>> {
    let mut by_key: HashMap<(u128, i64), Vec<Seen>, KeyedHash> = HashMap::default();
    for &row in attempts {
        let Some(key) = writes.key(row) else { continue };
        if !writes.non_idempotent(row) {
            continue;
        }
        let s = seen(row);
        if s.gave_up || s.answered {
            by_key.entry((s.trace, key)).or_default().push(s);
        }
    }
    let mut out = vec![None; rows];
    for events in by_key.values_mut() {
        if !events.iter().any(|e| e.gave_up) {
            continue;
        }
        events.sort_by_key(|e| e.end_ns);
        let mut pending: Vec<Seen> = Vec::new();
        for e in events.iter() {
            if e.answered {
                for p in pending.drain(..) {
                    out[p.row] = Some(Some((e.end_ns - p.end_ns) as f64 / 1e6));
                }
            } else {
                pending.push(*e);
            }
        }
        for p in pending {
            out[p.row] = Some(None);
        }
    }
    out
}
