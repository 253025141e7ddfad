//! What one analysed interval adds to the counter metrics, typed ([`Partials::counts`]).
//! Exporters read these rows, never the partial tables: which table holds a count and what
//! Arrow type its column has stay the analysis's business. Columns are read straight from
//! Arrow (cast to strings, integers or floats), without a detour through JSON.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type};

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use stormglass_model::hash::KeyedHash;

use crate::engine::Partials;
use crate::figures::EDGE_COUNTS;
use crate::histogram;
use crate::report::Report;

/// Column `name` of `batch` cast to `to`; a column the query's header promises.
fn column(batch: &RecordBatch, name: &str, to: &DataType) -> arrow::array::ArrayRef {
    let Some(column) = batch.column_by_name(name) else {
        unreachable!("a partial table lacks its column {name}");
    };
    match cast(column, to) {
        Ok(cast) => cast,
        Err(e) => unreachable!("column {name} cannot be read as {to}: {e}"),
    }
}

/// A label column as plain strings, for [`label`].
fn labels(batch: &RecordBatch, name: &str) -> arrow::array::ArrayRef {
    column(batch, name, &DataType::Utf8)
}

/// Row `i` of a [`labels`] column: null (an unnamed service or operation) is "unknown".
fn label(column: &arrow::array::ArrayRef, i: usize) -> &str {
    let strings = column.as_string::<i32>();
    if strings.is_null(i) {
        "unknown"
    } else {
        strings.value(i)
    }
}

/// A count column: null (a sum over nothing) is 0.
fn counts(batch: &RecordBatch, name: &str) -> Vec<f64> {
    let column = column(batch, name, &DataType::Float64);
    let values = column.as_primitive::<Float64Type>();
    (0..values.len())
        .map(|i| {
            if values.is_null(i) {
                0.0
            } else {
                values.value(i)
            }
        })
        .collect()
}

/// An index column (a histogram bucket); null is bucket 0.
fn indexes(batch: &RecordBatch, name: &str) -> Vec<i64> {
    let column = column(batch, name, &DataType::Int64);
    let values = column.as_primitive::<Int64Type>();
    (0..values.len())
        .map(|i| {
            if values.is_null(i) {
                0
            } else {
                values.value(i)
            }
        })
        .collect()
}

/// One row type per partial table: its labels (strings), bucket indexes and counts, read
/// column by column from every batch of the table, one row per distinct labels and
/// indexes with its counts summed. An interval's partials hold each chunk's rows, so at
/// width a key repeats across chunks: the strings are borrowed from the columns while
/// rows are summed, and owned once per key.
macro_rules! counts {
    ($(
        $(#[$doc:meta])*
        $name:ident from $table:literal {
            labels: $($label:ident),*;
            $(indexes: $($index:ident),*;)?
            counts: $($count:ident),*
        }
    )*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name {
            $(pub $label: String,)*
            $($(pub $index: i64,)*)?
            $(pub $count: f64,)*
        }

        impl $name {
            fn read(partials: &Partials) -> Vec<$name> {
                let Some(table) = partials.table($table) else {
                    debug_assert!(false, "partial {} is missing", $table);
                    return Vec::new();
                };
                struct Columns {
                    rows: usize,
                    $($label: arrow::array::ArrayRef,)*
                    $($($index: Vec<i64>,)*)?
                    $($count: Vec<f64>,)*
                }
                let columns: Vec<Columns> = table
                    .batches
                    .iter()
                    .map(|batch| Columns {
                        rows: batch.num_rows(),
                        $($label: labels(batch, stringify!($label)),)*
                        $($($index: indexes(batch, stringify!($index)),)*)?
                        $($count: counts(batch, stringify!($count)),)*
                    })
                    .collect();
                let mut rows: Vec<$name> = Vec::new();
                let mut positions = HashMap::with_hasher(KeyedHash::default());
                for c in &columns {
                    for i in 0..c.rows {
                        let key = ($(label(&c.$label, i),)* $($(c.$index[i],)*)?);
                        match positions.entry(key) {
                            Entry::Occupied(at) => {
                                let row: &mut $name = &mut rows[*at.get()];
                                $(row.$count += c.$count[i];)*
                            }
                            Entry::Vacant(at) => {
                                at.insert(rows.len());
                                rows.push($name {
                                    $($label: label(&c.$label, i).to_owned(),)*
                                    $($($index: c.$index[i],)*)?
                                    $($count: c.$count[i],)*
                                });
                            }
                        }
                    }
                }
                rows
            }
        }
    )*};
}

counts! {
    /// Logical calls by how their first and final attempts ended.
    CallCount from "partial_calls" {
        labels: caller, callee, operation, first_outcome, final_outcome;
        counts: calls
    }
    /// Attempts by kind (`first`, `retry`, ...), outcome and retry cause.
    AttemptCount from "partial_attempts" {
        labels: caller, callee, operation, attempt, outcome, cause;
        counts: attempts
    }
    /// Requests per entry operation.
    EntryCount from "partial_entries" {
        labels: service, operation;
        counts: requests, failed
    }
    /// Attempts a layer received, and what it would have received with no retry upstream.
    LayerCount from "partial_layers" {
        labels: service;
        counts: received, baseline
    }
    /// Attempts a layer received by the response code kept raw and the outcome class.
    LayerResponses from "partial_layer_codes" {
        labels: service, status_code, outcome;
        counts: n
    }
    /// Orphan pairs (work after the caller gave up) by how the callee's SERVER span ended.
    OrphanCount from "partial_orphans" {
        labels: caller, callee, operation, server_outcome;
        counts: pairs, work_ms
    }
    /// Findings by kind and edge.
    FindingCount from "partial_findings" {
        labels: kind, caller, callee;
        counts: count
    }
    /// Traces with retries at more than one layer, and broken traces, by entry service.
    TraceCount from "partial_traces" {
        labels: service;
        counts: multi_layer_retry_traces, broken_traces
    }
    /// SERVER span durations per layer: count `n` and sum `seconds` in bucket `le`
    /// ([`crate::histogram::le_bounds`]).
    LatencyBuckets from "partial_latency" {
        labels: service;
        indexes: le;
        counts: n, seconds
    }
    /// Entry request durations per entry operation, bucketed as the layers' are.
    EntryLatencyBuckets from "partial_entry_latency" {
        labels: service, operation;
        indexes: le;
        counts: n, seconds
    }
    /// Remaining budgets at attempt start per edge, bucketed as the latencies are.
    BudgetBuckets from "partial_budgets" {
        labels: caller, callee, operation;
        indexes: le;
        counts: n, seconds
    }
    /// Per edge and log bucket ([`crate::histogram::bucket`]): the retries whose remaining
    /// budget falls in it.
    RetryBudgetBuckets from "partial_retry_budgets" {
        labels: caller, callee, operation;
        indexes: bucket;
        counts: retries
    }
}

/// An edge's retries that started with less budget left than the callee's median.
#[derive(Clone, Debug, PartialEq)]
pub struct OutOfBudget {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    pub retries: f64,
}

/// Deadline budget violations of one kind between two services.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadlineViolations {
    pub caller: String,
    pub callee: String,
    /// One of [`DEADLINE_VIOLATION_KINDS`].
    pub kind: &'static str,
    pub count: f64,
}

/// The kinds of deadline violation, each counted from the findings of its kind.
pub const DEADLINE_VIOLATION_KINDS: [(&str, &str); 3] = [
    ("inversion", "deadline_inversion"),
    ("overcommit", "overcommit"),
    ("not_propagated", "not_propagated"),
];

/// The deadline findings of `rows` by the violation kind they count as.
fn deadline_violations(rows: Vec<FindingCount>) -> Vec<DeadlineViolations> {
    rows.into_iter()
        .filter_map(|r| {
            let (kind, _) = DEADLINE_VIOLATION_KINDS
                .iter()
                .find(|(_, finding)| *finding == r.kind)?;
            Some(DeadlineViolations {
                caller: r.caller,
                callee: r.callee,
                kind,
                count: r.count,
            })
        })
        .collect()
}

/// The retries of `rows` that started with less budget left than their edge's
/// `callee_median_ms` in `report`, per edge: retry_budgets.sql's rule (the remaining
/// budget's bucket lies below the median's), for one interval's rows against a window's
/// median. Edges without a median count none.
fn out_of_budget(rows: &[RetryBudgetBuckets], report: Option<&Report>) -> Vec<OutOfBudget> {
    let medians: BTreeMap<(&str, &str, &str), i64> = (report.iter())
        .flat_map(|r| &r.edges)
        .filter_map(|e| {
            let median = e.callee_median_ms?;
            let edge = (e.caller.as_str(), e.callee.as_str(), e.operation.as_str());
            Some((edge, i64::from(histogram::bucket(median))))
        })
        .collect();
    let mut counted = BTreeMap::new();
    for r in rows.iter().filter(|r| r.retries > 0.0) {
        let edge = (r.caller.as_str(), r.callee.as_str(), r.operation.as_str());
        if medians.get(&edge).is_some_and(|median| r.bucket < *median) {
            let key = (r.caller.clone(), r.callee.clone(), r.operation.clone());
            *counted.entry(key).or_default() += r.retries;
        }
    }
    counted
        .into_iter()
        .map(|((caller, callee, operation), retries)| OutOfBudget {
            caller,
            callee,
            operation,
            retries,
        })
        .collect()
}

/// An edge's counts ([`EDGE_COUNTS`]: safety, provenance, budgets), one value per entry
/// in the catalogue's order, in the column's own unit.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeCounts {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    pub values: Vec<f64>,
}

impl EdgeCounts {
    /// One row per edge, its counts summed over the interval's chunks (see [`counts!`]).
    fn read(partials: &Partials) -> Vec<EdgeCounts> {
        let Some(table) = partials.table("partial_edges") else {
            debug_assert!(false, "partial partial_edges is missing");
            return Vec::new();
        };
        let columns: Vec<([arrow::array::ArrayRef; 3], Vec<Vec<f64>>)> = table
            .batches
            .iter()
            .map(|batch| {
                let edge = ["caller", "callee", "operation"].map(|name| labels(batch, name));
                let values = EDGE_COUNTS
                    .iter()
                    .map(|c| counts(batch, c.column))
                    .collect();
                (edge, values)
            })
            .collect();
        let mut rows: Vec<EdgeCounts> = Vec::new();
        let mut positions = HashMap::with_hasher(KeyedHash::default());
        for (edge, values) in &columns {
            for i in 0..edge[0].len() {
                let key = (label(&edge[0], i), label(&edge[1], i), label(&edge[2], i));
                match positions.entry(key) {
                    Entry::Occupied(at) => {
                        let row: &mut EdgeCounts = &mut rows[*at.get()];
                        for (sum, column) in row.values.iter_mut().zip(values) {
                            *sum += column[i];
                        }
                    }
                    Entry::Vacant(at) => {
                        at.insert(rows.len());
                        rows.push(EdgeCounts {
                            caller: key.0.to_owned(),
                            callee: key.1.to_owned(),
                            operation: key.2.to_owned(),
                            values: values.iter().map(|column| column[i]).collect(),
                        });
                    }
                }
            }
        }
        rows
    }
}

/// Everything one interval adds to the counters and histograms, complete: what an
/// observer exports needs no table, query or rule of the analysis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IntervalCounts {
    pub calls: Vec<CallCount>,
    pub attempts: Vec<AttemptCount>,
    pub entries: Vec<EntryCount>,
    pub layers: Vec<LayerCount>,
    pub layer_responses: Vec<LayerResponses>,
    pub edges: Vec<EdgeCounts>,
    pub orphans: Vec<OrphanCount>,
    pub deadline_violations: Vec<DeadlineViolations>,
    pub traces: Vec<TraceCount>,
    pub latency: Vec<LatencyBuckets>,
    pub entry_latency: Vec<EntryLatencyBuckets>,
    pub budgets: Vec<BudgetBuckets>,
    /// Retries out of budget, set against the window's medians (`report`).
    pub out_of_budget: Vec<OutOfBudget>,
}

impl Partials {
    /// This interval's counts, typed, with what depends on the window set against
    /// `report`: the window's report once this interval joined it, or where that failed to
    /// build, the last one built (none: no retry is out of budget).
    pub(crate) fn counts(&self, report: Option<&Report>) -> IntervalCounts {
        IntervalCounts {
            calls: CallCount::read(self),
            attempts: AttemptCount::read(self),
            entries: EntryCount::read(self),
            layers: LayerCount::read(self),
            layer_responses: LayerResponses::read(self),
            edges: EdgeCounts::read(self),
            orphans: OrphanCount::read(self),
            deadline_violations: deadline_violations(FindingCount::read(self)),
            traces: TraceCount::read(self),
            latency: LatencyBuckets::read(self),
            entry_latency: EntryLatencyBuckets::read(self),
            budgets: BudgetBuckets::read(self),
            out_of_budget: out_of_budget(&RetryBudgetBuckets::read(self), report),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, Int64Array, StringViewArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;
    use crate::table::Table;

    /// Columns are read whatever their Arrow type (string views, integer sums), across
    /// batches; a null label is "unknown" and a null count 0; a key that repeats (one
    /// row per chunk of an interval) is one row with its counts summed.
    #[test]
    fn columns_are_cast_and_nulls_have_their_meaning() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("service", DataType::Utf8View, true),
            Field::new("le", DataType::Int32, true),
            Field::new("n", DataType::Int64, true),
            Field::new("seconds", DataType::Float64, true),
        ]));
        let batch = |service: Option<&str>, le: i32, n: Option<i64>, seconds: f64| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringViewArray::from(vec![service])),
                    Arc::new(Int32Array::from(vec![le])),
                    Arc::new(Int64Array::from(vec![n])),
                    Arc::new(arrow::array::Float64Array::from(vec![seconds])),
                ],
            )
            .unwrap()
        };
        let table = Table {
            schema: schema.clone(),
            batches: vec![
                batch(Some("db"), 3, Some(2), 0.5),
                batch(None, 7, None, 0.0),
                batch(Some("db"), 3, Some(1), 0.25),
                batch(Some("db"), 4, Some(1), 0.25),
            ],
        };
        let partials = Partials {
            tables: vec![("partial_latency", table)],
            spans: 0,
            traces: 0,
            span_range: None,
        };
        assert_eq!(
            LatencyBuckets::read(&partials),
            vec![
                LatencyBuckets {
                    service: "db".into(),
                    le: 3,
                    n: 3.0,
                    seconds: 0.75
                },
                LatencyBuckets {
                    service: "unknown".into(),
                    le: 7,
                    n: 0.0,
                    seconds: 0.0
                },
                LatencyBuckets {
                    service: "db".into(),
                    le: 4,
                    n: 1.0,
                    seconds: 0.25
                },
            ]
        );
    }
}
