//! Storm potential: the amplification each entry operation could reach if every edge below
//! it retried as its policy allows, a walk over the call graph of `p_links`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};

// Maps keyed by edge names: the keyed hash instead of SipHash.
use stormglass_model::hash::{KeyedMap as Fast, KeyedSet as FastSet};

use super::{EdgeFigures, EntryFigures};
use crate::engine::{AnalysisError, Table, rows, table};
use crate::table::plain;

/// One row of `p_links`: `edge` is called below `parent` (or directly by the entry),
/// borrowed from its batches: at width the links are ~250,000 rows of 8 names each.
#[derive(Clone, Copy, Debug)]
pub struct Link<'a> {
    entry_service: &'a str,
    entry_operation: &'a str,
    parent: Option<EdgeKey<'a>>,
    edge: EdgeKey<'a>,
}

impl<'a> Link<'a> {
    /// The rows of `p_links` batches whose strings are plain ([`plain_batches`]).
    pub fn read(batches: &'a [RecordBatch]) -> Vec<Link<'a>> {
        let mut links = Vec::with_capacity(batches.iter().map(RecordBatch::num_rows).sum());
        for batch in batches {
            let column = |name: &str| match batch.column_by_name(name) {
                Some(c) => c.as_string::<i32>(),
                None => unreachable!("p_links has {name}"),
            };
            let [
                service,
                operation,
                parent_caller,
                parent_callee,
                parent_operation,
            ] = [
                "entry_service",
                "entry_operation",
                "parent_caller",
                "parent_callee",
                "parent_operation",
            ]
            .map(column);
            let [caller, callee, edge_operation] = ["caller", "callee", "operation"].map(column);
            for row in 0..batch.num_rows() {
                let parent = [parent_caller, parent_callee, parent_operation]
                    .map(|c| c.is_valid(row).then(|| c.value(row)));
                links.push(Link {
                    entry_service: service.value(row),
                    entry_operation: operation.value(row),
                    parent: match parent {
                        [Some(a), Some(b), Some(c)] => Some((a, b, c)),
                        _ => None,
                    },
                    edge: (
                        caller.value(row),
                        callee.value(row),
                        edge_operation.value(row),
                    ),
                });
            }
        }
        links
    }
}

/// `table`'s batches with plain strings, for rows borrowed from them.
pub(super) fn plain_batches(table: &Table) -> Vec<RecordBatch> {
    (table.batches.iter())
        .map(|b| plain(b).unwrap_or_else(|e| unreachable!("strings cast to plain strings: {e}")))
        .collect()
}

/// An edge by (caller, callee, operation), borrowed from the report's rows.
type EdgeKey<'a> = (&'a str, &'a str, &'a str);

/// Register `storm_potential` (service, operation, storm_potential: one row per entry
/// operation) in a session holding the report tables, so `stormglass query` reads the
/// figure the report gives. It is a walk over the call graph, done in Rust (see
/// [`storm_potential`]); this is its SQL face.
pub async fn register_storm_potential(
    ctx: &datafusion::prelude::SessionContext,
) -> Result<(), AnalysisError> {
    use arrow::array::{Float64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    let edges: Vec<EdgeFigures> = rows(&table(ctx, "edges").await?);
    let links = plain_batches(&table(ctx, "p_links").await?);
    let entries: Vec<EntryFigures> = rows(&table(ctx, "entry_operations").await?);
    let potential = storm_potential(&Link::read(&links), &edges);
    let value = |e: &EntryFigures| {
        potential
            .get(&(e.service.clone(), e.operation.clone()))
            .copied()
            .unwrap_or(1.0)
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("service", DataType::Utf8, false),
        Field::new("operation", DataType::Utf8, false),
        Field::new("storm_potential", DataType::Float64, false),
    ]));
    let columns: Vec<arrow::array::ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            entries.iter().map(|e| &e.service),
        )),
        Arc::new(StringArray::from_iter_values(
            entries.iter().map(|e| &e.operation),
        )),
        Arc::new(Float64Array::from_iter_values(entries.iter().map(value))),
    ];
    let failed = |source| AnalysisError::query("storm_potential", source);
    let batch = RecordBatch::try_new(schema, columns)
        .map_err(|e| AnalysisError::query("storm_potential", e))?;
    ctx.register_batch("storm_potential", batch)
        .map_err(failed)?;
    Ok(())
}

/// Storm potential per entry operation: over the call chains observed below it, the largest
/// product of (max attempt number observed on the edge + 1), an in-process retry loop around
/// an edge's calls multiplying by its own (max outer attempt + 1): 4 loop tries around an
/// HTTP client that tries 3 times is 12. For the usual call tree that
/// is the product along the deepest chain (27 for three layers retrying 3x each); where two
/// chains differ, the worse one is what a full outage would do, so it is the one reported.
/// A cycle in the call graph is cut where it closes. Entries without calls have 1.
pub fn storm_potential<'a>(
    links: &[Link<'a>],
    edges: &'a [EdgeFigures],
) -> HashMap<(String, String), f64> {
    // Each edge named once as an integer, its factor at that index: the walk then hashes
    // integers, not three names per step (at width, ~250,000 links).
    let mut ids: Fast<EdgeKey, u32> = Fast::default();
    ids.reserve(edges.len());
    let mut factor: Vec<f64> = Vec::with_capacity(edges.len());
    for e in edges {
        let tries = |n: Option<i64>| n.unwrap_or(0).max(0) as f64 + 1.0;
        let key = (e.caller.as_str(), e.callee.as_str(), e.operation.as_str());
        ids.entry(key).or_insert_with(|| {
            factor.push(tries(e.max_attempt) * tries(e.max_outer_attempt));
            (factor.len() - 1) as u32
        });
    }
    // Per entry (service, operation), its links as (parent, edge) ids.
    type Linked = Vec<(Option<u32>, u32)>;
    let mut by_entry: Fast<(&str, &str), Linked> = Fast::default();
    for link in links {
        // An edge of the links the report does not list counts as one try.
        let mut id = |key: EdgeKey<'a>| {
            *ids.entry(key).or_insert_with(|| {
                factor.push(1.0);
                (factor.len() - 1) as u32
            })
        };
        let pair = (link.parent.map(&mut id), id(link.edge));
        by_entry
            .entry((link.entry_service, link.entry_operation))
            .or_default()
            .push(pair);
    }
    by_entry
        .into_iter()
        .map(|((service, operation), links)| {
            // Each parent's child edges once, in the order first met (a set beside the
            // lists: a search of the list per link grew with the children of a parent).
            let mut children: Fast<Option<u32>, Vec<u32>> = Fast::default();
            let mut seen: FastSet<(Option<u32>, u32)> = FastSet::default();
            for &(parent, edge) in &links {
                if seen.insert((parent, edge)) {
                    children.entry(parent).or_default().push(edge);
                }
            }
            let mut memo = Fast::default();
            let mut on_path = FastSet::default();
            let best = children
                .get(&None)
                .map(|tops| {
                    tops.iter()
                        .map(|e| chain_product(*e, &children, &factor, &mut memo, &mut on_path))
                        .fold(1.0, f64::max)
                })
                .unwrap_or(1.0);
            ((service.to_owned(), operation.to_owned()), best)
        })
        .collect()
}

fn chain_product(
    edge: u32,
    children: &Fast<Option<u32>, Vec<u32>>,
    factor: &[f64],
    memo: &mut Fast<u32, f64>,
    on_path: &mut FastSet<u32>,
) -> f64 {
    if let Some(v) = memo.get(&edge) {
        return *v;
    }
    if !on_path.insert(edge) {
        return 1.0;
    }
    let below = children
        .get(&Some(edge))
        .map(|kids| {
            kids.iter()
                .map(|k| chain_product(*k, children, factor, memo, on_path))
                .fold(1.0, f64::max)
        })
        .unwrap_or(1.0);
    on_path.remove(&edge);
    let value = factor[edge as usize] * below;
    memo.insert(edge, value);
    value
}
