//! One interval's partial aggregates: what a chunk's analysis keeps.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use stormglass_model::schema as col;

use serde::Deserialize;

use super::{Table, compact, rows};
use crate::clock::{self, ClockBounds};

/// One interval's partial aggregates, in [`PARTIALS`] order, with what was analysed.
///
/// [`PARTIALS`]: crate::queries::PARTIALS
#[derive(Clone, Debug)]
pub struct Partials {
    pub(crate) tables: Vec<(&'static str, Table)>,
    pub spans: usize,
    pub traces: usize,
    /// Earliest span start and latest span end analysed (Unix ns), when any.
    pub span_range: Option<(i64, i64)>,
}

impl Partials {
    /// The partial tables of one analysis of `spans`, with what it covered: the spans,
    /// their `traces` distinct trace ids (the lineage's trace grouping counts them; in SQL,
    /// `COUNT(DISTINCT trace_id)` was ~7% of a chunk's queries), and the earliest start and
    /// latest end as sent.
    pub(super) fn new(
        tables: Vec<(&'static str, Table)>,
        spans: &RecordBatch,
        traces: usize,
    ) -> Partials {
        let time = |name| {
            spans
                .column_by_name(name)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
        };
        let start = time(col::START_NS).and_then(arrow::compute::min);
        let end = time(col::END_NS).and_then(arrow::compute::max);
        Partials {
            tables,
            spans: spans.num_rows(),
            traces,
            span_range: start.zip(end),
        }
    }

    pub(crate) fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|(n, _)| *n == name).map(|(_, t)| t)
    }

    /// The rows partial table `name` holds (0 for none): what the window keeps of it.
    pub fn rows(&self, name: &str) -> usize {
        self.table(name).map_or(0, Table::rows)
    }

    /// Intersect this interval's clock bounds (`partial_clock_skew`) into `bounds`.
    pub fn clock_bounds_into(&self, bounds: &mut ClockBounds) {
        #[derive(Deserialize)]
        struct Row {
            caller: String,
            callee: String,
            low_ms: f64,
            high_ms: f64,
            pairs: u64,
        }
        let Some(table) = self.table("partial_clock_skew") else {
            return;
        };
        for r in rows::<Row>(table) {
            let bound = clock::Bound {
                low_ms: r.low_ms,
                high_ms: r.high_ms,
                pairs: r.pairs,
            };
            clock::add(bounds, (r.caller, r.callee), bound);
        }
    }

    /// The partials of several chunks as one: every partial is mergeable by union (the
    /// report sums or de-duplicates, as it does across a window's intervals), so this only
    /// collects the batches. `None` for no chunks.
    pub fn concat(chunks: Vec<Partials>) -> Option<Partials> {
        let mut chunks = chunks.into_iter();
        let mut merged = chunks.next()?;
        for chunk in chunks {
            for ((_, into), (_, from)) in merged.tables.iter_mut().zip(chunk.tables) {
                into.batches.extend(from.batches);
            }
            merged.spans += chunk.spans;
            merged.traces += chunk.traces;
            merged.span_range = match (merged.span_range, chunk.span_range) {
                (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
                (a, b) => a.or(b),
            };
        }
        Some(merged)
    }

    /// Each table as one batch with buffers of exact size (DataFusion's output batches
    /// carry spare capacity, a few hundred KiB per table, which a window of many chunks
    /// would otherwise hold for its whole length), and the counts of the tables in
    /// [`compact::NARROWED`] in the smallest integer type that holds them: done per chunk,
    /// as it is analysed, since an interval's chunks wait for its end.
    pub fn compact(self) -> Partials {
        self.compacted(false)
    }

    /// For what the window keeps, one interval's chunks ([`Partials::compact`]ed): each
    /// table as one batch again, its strings dictionary-encoded where that is smaller (at
    /// width its rows repeat each caller, callee and operation across the chunks). The
    /// tables in [`compact::NARROWED`] are put together column by column
    /// ([`compact::concat_narrowed`]), never widened whole.
    pub fn compact_for_window(self) -> Partials {
        self.compacted(true)
    }

    fn compacted(mut self, encode: bool) -> Partials {
        for (name, table) in &mut self.tables {
            let rows = table.rows();
            if rows == 0 {
                table.batches.clear();
                continue;
            }
            let narrowed = compact::NARROWED.contains(name);
            if encode && narrowed {
                if let Ok(one) = compact::concat_narrowed(&table.schema, &table.batches) {
                    table.batches = vec![one];
                }
                continue;
            }
            let plain: Result<Vec<RecordBatch>, _> =
                table.batches.iter().map(crate::table::plain).collect();
            let exact = plain.and_then(|batches| {
                let schema = batches
                    .first()
                    .map_or(table.schema.clone(), RecordBatch::schema);
                let one = arrow::compute::concat_batches(&schema, &batches)?;
                // `take` allocates exactly what the rows need (concat of one batch does not copy).
                let all = 0..u32::try_from(rows).unwrap_or(u32::MAX);
                let exact = arrow::compute::take_record_batch(
                    &one,
                    &arrow::array::UInt32Array::from_iter_values(all),
                )?;
                if encode {
                    compact::dictionary_encoded(&exact)
                } else if narrowed {
                    compact::narrowed(&exact)
                } else {
                    Ok(exact)
                }
            });
            if let Ok(one) = exact {
                table.batches = vec![one];
            }
        }
        self
    }

    /// Nothing was analysed and no table holds a row (an interval without input).
    pub fn is_empty(&self) -> bool {
        self.spans == 0 && self.tables.iter().all(|(_, t)| t.rows() == 0)
    }

    /// Arrow memory held by the partial tables.
    pub fn memory_bytes(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|(_, t)| &t.batches)
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }
}
