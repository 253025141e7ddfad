//! The counter families labelled by the edge alone (caller, callee, operation), stored
//! together.
//!
//! Every edge gets a series in each of them from its first interval (zeros included), so
//! their label sets are the same: one index, and one lookup (and at most one fold) per edge
//! and interval, serves all of them. Kept per family, that was a lookup, a key and a fold
//! per family and edge: millions an interval at 160,000 edges.

use std::collections::BTreeMap;

use super::{Folded, Key, Spec, fold};

/// One column per edge-labelled counter family; rows are the edges' series.
pub(super) struct EdgeSeries {
    /// Each series' row, in label order (what `/metrics` lists).
    rows: BTreeMap<Key, usize>,
    /// Rows at or past this one were created this interval: their increments wait in
    /// `waiting` until the next, so a series appears at 0 before it first grows.
    fresh: usize,
    columns: Vec<Column>,
}

struct Column {
    totals: Vec<f64>,
    waiting: Vec<f64>,
    /// Updates folded into an `__overflow__` row since the last [`EdgeSeries::take_folds`].
    folds: u64,
}

/// A row of [`EdgeSeries`], and whether the edge it was asked for was folded into it.
#[derive(Clone, Copy)]
pub(super) struct Row {
    index: usize,
    folded: bool,
}

impl EdgeSeries {
    pub(super) fn new(columns: usize) -> EdgeSeries {
        EdgeSeries {
            rows: BTreeMap::new(),
            fresh: 0,
            columns: (0..columns)
                .map(|_| Column {
                    totals: Vec::new(),
                    waiting: Vec::new(),
                    folds: 0,
                })
                .collect(),
        }
    }

    /// The row of the series `labels`, created (or folded, past `limit` rows) when new.
    pub(super) fn row(&mut self, spec: &Spec, labels: Key, limit: usize) -> Row {
        if let Some(&index) = self.rows.get(&labels) {
            return Row {
                index,
                folded: false,
            };
        }
        let (key, folded) = match fold(spec, &self.rows, labels, limit) {
            Folded::No(key) => (key, false),
            Folded::Yes(key) => (key, true),
        };
        let next = self.rows.len();
        let index = *self.rows.entry(key).or_insert(next);
        if index == next {
            for c in &mut self.columns {
                c.totals.push(0.0);
                c.waiting.push(0.0);
            }
        }
        Row { index, folded }
    }

    /// Whether `row` is an edge's own, new this interval: the first time the edge was seen
    /// with room for it.
    pub(super) fn introduced(&self, row: Row) -> bool {
        row.index >= self.fresh && !row.folded
    }

    /// Add `v` to `column` of `row`.
    pub(super) fn add(&mut self, column: usize, row: Row, v: f64) {
        let c = &mut self.columns[column];
        if row.index >= self.fresh {
            c.waiting[row.index] += v;
        } else {
            c.totals[row.index] += v;
        }
        c.folds += u64::from(row.folded);
    }

    /// Apply what waited: the rows created last interval grow from now on.
    pub(super) fn apply_waiting(&mut self) {
        for c in &mut self.columns {
            for i in self.fresh..c.totals.len() {
                c.totals[i] += std::mem::take(&mut c.waiting[i]);
            }
        }
        self.fresh = self.rows.len();
    }

    /// Per column, the updates folded since the last call.
    pub(super) fn take_folds(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.columns
            .iter_mut()
            .map(|c| std::mem::take(&mut c.folds))
    }

    /// `column`'s series in label order: labels and total.
    pub(super) fn series(&self, column: usize) -> impl Iterator<Item = (&Key, f64)> + '_ {
        let totals = &self.columns[column].totals;
        self.rows.iter().map(move |(key, &row)| (key, totals[row]))
    }
}
