//! The output batches: each attempt's edge, its call as a whole, and the `lineage`,
//! `lineage_attempts` and `edge_names` columns gathered from the rows they link to.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray, UInt32Array,
};
use arrow::compute::take;
use arrow::datatypes::{Float64Type, Int32Type, Int64Type, SchemaRef};
use stormglass_model::hash::KeyedHash;
use stormglass_model::schema as col;

use super::Node;
use super::calls::{CallSlot, callee_hint};
use super::reruns::{Writes, rerun_writes};
use super::rows::{column, trace_int};
use super::schema::{
    ANALYSED_LINEAGE_SCHEMA, ATTEMPT_COLUMNS, ATTEMPT_LINEAGE_SCHEMA, CALL_COLUMNS, Detail,
    EDGE_NAMES_SCHEMA, LINEAGE_SCHEMA, SERVER_COLUMNS,
};
use super::unknowns::{Seen, unknown_results};
use crate::table::timed;

/// The attempts' edges: each attempt's (caller, callee, operation) as one integer, numbered
/// from 0 in the order first met, and each edge's names. The partials group by the
/// integer and join the names once per edge: grouping every attempt by three strings, in
/// every partial, would be most of their work.
///
/// caller: the service that made the attempt (its own, or a SERVER attempt's parent's),
/// else `unknown`; callee: the service of a SERVER span under any attempt of the call,
/// else the service SERVER spans most often have for the attempt's callee hint
/// ([`hint_servers`]), else the hint (the attempt's own, else its call span's), else
/// `unknown`.
///
/// [`hint_servers`]: super::calls::hint_servers
pub(super) struct Edges<'a> {
    /// Per attempt, in [`Links::attempts`] order: its edge.
    of_attempt: Vec<usize>,
    /// Per row of the batch: its edge, for attempts.
    of_row: Vec<Option<usize>>,
    /// Per edge: caller, callee, operation.
    names: Vec<(&'a str, &'a str, Option<&'a str>)>,
}

impl<'a> Edges<'a> {
    fn new(spans: &'a RecordBatch, links: &Links, calls: &[CallSlot]) -> Edges<'a> {
        let text = |name| column(spans, name).as_string::<i32>();
        let service = text(col::SERVICE_NAME);
        let operation = text(col::OPERATION);
        let hint = text(col::CALLEE_HINT);
        let service_of = |row: Option<usize>| {
            row.filter(|&r| service.is_valid(r))
                .map(|r| service.value(r))
        };
        let mut ids: HashMap<(&str, &str, Option<&str>), usize, KeyedHash> = HashMap::default();
        let mut names = Vec::new();
        let mut of_row = vec![None; spans.num_rows()];
        let mut of_attempt = Vec::with_capacity(links.attempts.len());
        for &row in links.attempts {
            let caller = service_of(links.caller_of[row]).unwrap_or("unknown");
            // A re-sent attempt is named as its CLIENT span: the edge a single send has.
            let sender = links.sender[row];
            let callee = service_of(calls[row].server)
                .or_else(|| service_of(links.hint_server[row]))
                .or_else(|| callee_hint(hint, links.call_parent, sender))
                .unwrap_or("unknown");
            let key = (
                caller,
                callee,
                operation.is_valid(sender).then(|| operation.value(sender)),
            );
            let edge = *ids.entry(key).or_insert_with(|| {
                names.push(key);
                names.len() - 1
            });
            of_row[row] = Some(edge);
            of_attempt.push(edge);
        }
        Edges {
            of_attempt,
            of_row,
            names,
        }
    }

    /// The `edge_names` table.
    fn batch(&self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                (0..self.names.len()).map(int_key),
            )),
            Arc::new(StringArray::from_iter_values(
                self.names.iter().map(|n| n.0),
            )),
            Arc::new(StringArray::from_iter_values(
                self.names.iter().map(|n| n.1),
            )),
            Arc::new(StringArray::from_iter(self.names.iter().map(|n| n.2))),
        ];
        match RecordBatch::try_new(EDGE_NAMES_SCHEMA.clone(), columns) {
            Ok(batch) => batch,
            Err(e) => unreachable!("edge columns follow EDGE_NAMES_SCHEMA: {e}"),
        }
    }
}

/// One logical call over all its attempts.
#[derive(Clone, Copy)]
pub(super) struct WholeCall {
    attempts: i64,
    max_attempt: i32,
    start_ns: i64,
    end_ns: i64,
    /// The attempt it ended with: the one whose answer the caller took where attempts
    /// raced (`decided`), else its last.
    last: usize,
    decided: bool,
    /// The row of its first attempt.
    first: usize,
}

/// Every logical call's [`WholeCall`], by id (ids are dense from 1): what `logical_calls`
/// reads from each call's first attempt, where it aggregated and joined the attempts of
/// every retried call in SQL (its largest part).
pub(super) struct WholeCalls {
    calls: Vec<Option<WholeCall>>,
}

impl WholeCalls {
    /// Over `spans` as `build` reads them (times in the root's clock). A call starts when
    /// its first attempt's sender did (a re-sending CLIENT span, before its first SERVER
    /// child) and ends, and ends how, as its last attempt was seen by the caller.
    fn new(
        spans: &RecordBatch,
        attempts: &[usize],
        calls: &[CallSlot],
        sender: &[usize],
        seen_end: &dyn Fn(usize) -> i64,
    ) -> WholeCalls {
        let start = column(spans, col::START_NS).as_primitive::<Int64Type>();
        let count = attempts
            .iter()
            .filter_map(|&r| calls[r].id)
            .max()
            .map_or(0, |id| usize::try_from(id).unwrap_or(0));
        let mut whole: Vec<Option<WholeCall>> = vec![None; count];
        for &row in attempts {
            let Some(id) = calls[row].id else { continue };
            let Some(slot) = whole.get_mut(Self::index(id)) else {
                continue;
            };
            let started = start.value(row).min(start.value(sender[row]));
            let slot = slot.get_or_insert(WholeCall {
                attempts: 0,
                max_attempt: calls[row].number,
                start_ns: started,
                end_ns: seen_end(row),
                last: row,
                decided: false,
                first: row,
            });
            slot.attempts += 1;
            slot.max_attempt = slot.max_attempt.max(calls[row].number);
            slot.start_ns = slot.start_ns.min(started);
            slot.end_ns = slot.end_ns.max(seen_end(row));
            // The attempt whose answer the caller took, where attempts raced; else the last.
            if calls[row].decides {
                slot.last = row;
                slot.decided = true;
            } else if calls[row].last && !slot.decided {
                slot.last = row;
            }
            if calls[row].first {
                slot.first = row;
            }
        }
        WholeCalls { calls: whole }
    }

    fn index(id: i64) -> usize {
        usize::try_from(id - 1).unwrap_or(usize::MAX)
    }

    fn get(&self, id: i64) -> Option<&WholeCall> {
        self.calls.get(Self::index(id))?.as_ref()
    }
}

/// An index (an edge's, a row's) as the `Int64` key the SQL joins on.
pub(super) fn int_key(index: usize) -> i64 {
    i64::try_from(index).unwrap_or(i64::MAX)
}

/// Row links as Arrow indices (null where there is no row), built once per link and
/// shared by every column gathered through it.
pub(super) fn indices(rows: impl IntoIterator<Item = Option<usize>>) -> UInt32Array {
    rows.into_iter()
        .map(|i| i.map(|i| u32::try_from(i).unwrap_or(u32::MAX)))
        .collect()
}

/// Rows `indices` of `column` (null where the index is), via Arrow's `take`.
pub(super) fn gather(column: &ArrayRef, indices: &UInt32Array) -> ArrayRef {
    // No link at all (a batch without gRPC-style call spans): nothing to look up per row.
    if indices.null_count() == indices.len() {
        return arrow::array::new_null_array(column.data_type(), indices.len());
    }
    match take(column.as_ref(), indices, None) {
        Ok(array) => array,
        Err(e) => unreachable!("indices come from the same batch: {e}"),
    }
}

/// Per span, the rows it is linked to (see the module docs).
#[derive(Clone, Copy)]
pub(super) struct Links<'a> {
    /// The attempts' rows, in row order.
    pub(super) attempts: &'a [usize],
    pub(super) is_call: &'a [bool],
    /// CLIENT spans whose SERVER children are re-sends (call spans of their attempts).
    pub(super) resends: &'a [bool],
    pub(super) call_parent: &'a [Option<usize>],
    pub(super) server_child: &'a [Option<usize>],
    pub(super) caller_of: &'a [Option<usize>],
    pub(super) hint_server: &'a [Option<usize>],
    /// The span standing for the caller's side of each attempt (see
    /// [`Shape::sender`](super::calls::Shape::sender)).
    pub(super) sender: &'a [usize],
    /// Per row: an attempt whose SERVER span started while the previous attempt's ran.
    pub(super) overlapping: &'a [bool],
    /// `retries.overlap_tolerance_ms`: how early a retry may start against an asked wait.
    pub(super) overlap_tolerance_ms: f64,
}

/// The lineage's per-span values, read into `lineage`'s columns for any set of rows: every
/// span's for `lineage`, the attempts' alone for `lineage_attempts`.
pub(super) struct Values<'a> {
    /// The spans, with the attempt numbers their calls give unreadable ones.
    spans: RecordBatch,
    nodes: Vec<Node>,
    links: &'a Links<'a>,
    calls: &'a [CallSlot],
}

impl Values<'_> {
    /// Column `name` of [`LINEAGE_SCHEMA`] for `rows`; span columns are gathered through
    /// `taken` (the rows' [`indices`]), or are the batch's own when `taken` is `None` (`rows`
    /// is every row, in order).
    fn column(&self, name: &str, rows: &[usize], taken: Option<&UInt32Array>) -> ArrayRef {
        let (nodes, calls) = (&self.nodes, self.calls);
        let bools = |f: &dyn Fn(usize) -> Option<bool>| -> ArrayRef {
            Arc::new(rows.iter().map(|&r| f(r)).collect::<BooleanArray>())
        };
        let ints = |f: &dyn Fn(usize) -> Option<i64>| -> ArrayRef {
            Arc::new(rows.iter().map(|&r| f(r)).collect::<Int64Array>())
        };
        let span_ids = |f: &dyn Fn(usize) -> Option<usize>| {
            gather(
                column(&self.spans, col::SPAN_ID),
                &indices(rows.iter().map(|&r| f(r))),
            )
        };
        match name {
            "upstream_retry" => bools(&|r| Some(nodes[r].upstream_retry)),
            "anchor_deadline_ms" => Arc::new(
                rows.iter()
                    .map(|&r| nodes[r].anchor.map(|a| a.0))
                    .collect::<Float64Array>(),
            ),
            "anchor_start_ns" => ints(&|r| nodes[r].anchor.map(|a| a.1)),
            "upstream_attempt_span_id" => span_ids(&|r| nodes[r].upstream_attempt),
            "root_span_id" => span_ids(&|r| Some(nodes[r].root)),
            "depth" => Arc::new(Int32Array::from_iter_values(
                rows.iter().map(|&r| nodes[r].depth),
            )),
            "is_call_span" => bools(&|r| Some(self.links.is_call[r])),
            "parent_is_call_span" => bools(&|r| Some(self.links.call_parent[r].is_some())),
            "is_attempt" => bools(&|r| Some(calls[r].id.is_some())),
            "logical_call_id" => ints(&|r| calls[r].id),
            "is_first_attempt" => bools(&|r| calls[r].id.map(|_| calls[r].first)),
            "is_last_attempt" => bools(&|r| calls[r].id.map(|_| calls[r].last)),
            "row_id" => Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|&r| int_key(r)),
            )),
            "root_row" => Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|&r| int_key(nodes[r].root)),
            )),
            "upstream_attempt_row" => ints(&|r| nodes[r].upstream_attempt.map(int_key)),
            span_column => {
                let column = column(&self.spans, span_column);
                match taken {
                    Some(taken) => gather(column, taken),
                    None => column.clone(),
                }
            }
        }
    }

    /// The `lineage` batch in `schema`'s columns.
    fn lineage(&self, schema: &SchemaRef) -> RecordBatch {
        let every: Vec<usize> = (0..self.nodes.len()).collect();
        let columns = schema
            .fields()
            .iter()
            .map(|f| self.column(f.name(), &every, None))
            .collect();
        match RecordBatch::try_new(schema.clone(), columns) {
            Ok(batch) => batch,
            Err(e) => unreachable!("lineage columns follow their schema: {e}"),
        }
    }
}

/// The `lineage` batch (every span, in [`Detail`]'s columns), the `lineage_attempts` batch
/// and the `edge_names` batch (see the module docs).
pub(super) fn build(
    spans: &RecordBatch,
    nodes: Vec<Node>,
    links: &Links,
    calls: &[CallSlot],
    detail: Detail,
) -> (RecordBatch, RecordBatch, RecordBatch) {
    let Links {
        attempts,
        resends,
        call_parent,
        server_child,
        sender,
        ..
    } = *links;
    let by_name = |name: &str| column(spans, name);
    // An attempt whose number was unreadable, or that was found without one after the first
    // of its call, takes the number its call gives it.
    let attempt = by_name(col::ATTEMPT).as_primitive::<Int32Type>();
    let number_of = |row: usize| {
        let own = attempt.is_valid(row).then(|| attempt.value(row));
        match calls[row].id {
            Some(_) if own.is_some() || calls[row].number != 0 => Some(calls[row].number),
            _ => own,
        }
    };
    let mut renumbered = spans.clone();
    if (0..attempt.len())
        .any(|row| number_of(row) != attempt.is_valid(row).then(|| attempt.value(row)))
    {
        let numbers: Int32Array = (0..attempt.len()).map(number_of).collect();
        let mut columns = spans.columns().to_vec();
        if let Ok(index) = spans.schema().index_of(col::ATTEMPT) {
            columns[index] = Arc::new(numbers);
        }
        if let Ok(batch) = RecordBatch::try_new(spans.schema(), columns) {
            renumbered = batch;
        }
    }
    let values = Values {
        spans: renumbered,
        nodes,
        links,
        calls,
    };
    let started = std::time::Instant::now();
    let lineage = values.lineage(match detail {
        Detail::Analysis => &ANALYSED_LINEAGE_SCHEMA,
        Detail::Query => &LINEAGE_SCHEMA,
    });
    timed("lineage: columns: lineage", started);
    let started = std::time::Instant::now();
    let nodes = &values.nodes;

    // The attempts: their lineage values, and each linked span's columns gathered. A
    // re-sent attempt's operation and budget are its CLIENT span's (the call the caller
    // made), and its outcome and end the ones the caller saw (see `CallSlot::seen_as`).
    let linked = |link: &dyn Fn(usize) -> Option<usize>| indices(attempts.iter().map(|&r| link(r)));
    let seen = |row: usize| calls[row].seen_as.unwrap_or(row);
    // Where the caller gave up on an attempt while it ran, its outcome and end are the
    // caller's (see `CallSlot::gave_up`), in the root's clock like every time here.
    let outcomes = by_name(col::OUTCOME).as_string::<i32>();
    let ends = by_name(col::END_NS).as_primitive::<Int64Type>();
    let seen_outcome = |row: usize| match calls[row].gave_up {
        Some(g) => g.outcome,
        None => outcomes.value(seen(row)),
    };
    let seen_end = |row: usize| match calls[row].gave_up {
        Some(g) => g.end_ns + nodes[row].offset_ns,
        None => ends.value(seen(row)),
    };
    let seen_outcomes = |link: &dyn Fn(usize) -> Option<usize>| -> ArrayRef {
        Arc::new(StringArray::from_iter(
            attempts.iter().map(|&r| link(r).map(seen_outcome)),
        ))
    };
    let seen_ends = |link: &dyn Fn(usize) -> Option<usize>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(
            attempts.iter().map(|&r| link(r).map(seen_end)),
        ))
    };
    let taken = indices(attempts.iter().map(|&r| Some(r)));
    let as_sent = linked(&|r| Some(sender[r]));
    // Its anchor is its CLIENT span's too: the budget the call had to fit in, not the call's
    // own (which its SERVER span, a child of the CLIENT span, inherits).
    let senders: Vec<usize> = attempts.iter().map(|&r| sender[r]).collect();
    let mut columns: Vec<ArrayRef> = ATTEMPT_COLUMNS
        .iter()
        .map(|&name| match name {
            col::OPERATION | col::DEADLINE_MS => gather(by_name(name), &as_sent),
            col::OUTCOME => seen_outcomes(&Some),
            col::END_NS => seen_ends(&Some),
            "anchor_deadline_ms" | "anchor_start_ns" => values.column(name, &senders, None),
            _ => values.column(name, attempts, Some(&taken)),
        })
        .collect();
    columns.push(seen_outcomes(&|r| calls[r].previous));
    columns.push(seen_ends(&|r| calls[r].previous));
    let whole = WholeCalls::new(spans, attempts, calls, sender, &seen_end);
    let of_call = |r: usize| calls[r].id.and_then(|id| whole.get(id));
    let call_of = |f: fn(&WholeCall) -> i64| {
        Int64Array::from_iter_values(attempts.iter().map(|&r| of_call(r).map_or(0, f)))
    };
    columns.push(Arc::new(call_of(|c| c.attempts)));
    columns.push(Arc::new(Int32Array::from_iter_values(
        attempts
            .iter()
            .map(|&r| of_call(r).map_or(0, |c| c.max_attempt)),
    )));
    columns.push(Arc::new(call_of(|c| c.start_ns)));
    columns.push(Arc::new(call_of(|c| c.end_ns)));
    columns.push(seen_outcomes(&|r| of_call(r).map(|c| c.last)));
    columns.push(gather(
        by_name(col::IDEMPOTENCY_KEY_HASH),
        &linked(&|r| of_call(r).map(|c| c.first)),
    ));
    timed("lineage: columns: attempts", started);
    let started = std::time::Instant::now();
    let edges = Edges::new(spans, links, calls);
    timed("lineage: columns: edges", started);
    let started = std::time::Instant::now();
    let names = || edges.of_attempt.iter().map(|&e| edges.names[e]);
    columns.push(Arc::new(StringArray::from_iter_values(
        names().map(|n| n.0),
    )));
    columns.push(Arc::new(StringArray::from_iter_values(
        names().map(|n| n.1),
    )));
    columns.push(Arc::new(Int64Array::from_iter_values(
        edges.of_attempt.iter().map(|&e| int_key(e)),
    )));
    columns.push(Arc::new(Int64Array::from_iter(attempts.iter().map(|&r| {
        nodes[r]
            .upstream_attempt
            .and_then(|u| edges.of_row[u])
            .map(int_key)
    }))));
    let call_anchor = |row: usize| call_parent[row].and_then(|p| nodes[p].anchor);
    columns.push(Arc::new(Float64Array::from_iter(
        attempts.iter().map(|&r| call_anchor(r).map(|a| a.0)),
    )));
    columns.push(Arc::new(Int64Array::from_iter(
        attempts.iter().map(|&r| call_anchor(r).map(|a| a.1)),
    )));
    let call = linked(&|r| call_parent[r]);
    // A re-sending CLIENT span's own number is the attempt its re-sends are inside, not a
    // loop around them: their call numbers them all.
    let outer = linked(&|r| call_parent[r].filter(|&p| !resends[p]));
    columns.extend(CALL_COLUMNS.iter().map(|&name| match name {
        col::ATTEMPT => gather(by_name(name), &outer),
        _ => gather(by_name(name), &call),
    }));
    let server = linked(&|r| server_child[r]);
    columns.extend(
        SERVER_COLUMNS
            .iter()
            .map(|(name, _)| gather(by_name(name), &server)),
    );
    let flags = |f: &dyn Fn(&CallSlot) -> bool| -> ArrayRef {
        Arc::new(BooleanArray::from(
            attempts
                .iter()
                .map(|&r| f(&calls[r]))
                .collect::<Vec<bool>>(),
        ))
    };
    columns.push(Arc::new(BooleanArray::from(
        attempts
            .iter()
            .map(|&r| attempt.is_valid(r))
            .collect::<Vec<bool>>(),
    )));
    columns.push(flags(&|c| c.hidden));
    columns.push(flags(&|c| c.hedged));
    columns.push(flags(&|c| c.overlapped));
    columns.push(flags(&|c| c.inferred));
    // Where a retry landed: the instance of its SERVER span against the previous attempt's.
    let instance = by_name(col::INSTANCE).as_string::<i32>();
    let instance_of = |row: usize| {
        server_child[row]
            .filter(|&s| instance.is_valid(s))
            .map(|s| instance.value(s))
    };
    columns.push(Arc::new(BooleanArray::from_iter(attempts.iter().map(
        |&r| {
            let before = calls[r].previous?;
            Some(instance_of(r)? != instance_of(before)?)
        },
    ))));
    columns.push(Arc::new(BooleanArray::from(
        attempts
            .iter()
            .map(|&r| links.overlapping[r])
            .collect::<Vec<bool>>(),
    )));
    let writes = Writes::new(spans, call_parent);
    let rerun = rerun_writes(spans, attempts, calls, &writes, nodes, &edges.of_row);
    columns.push(Arc::new(BooleanArray::from(
        attempts.iter().map(|&r| rerun[r]).collect::<Vec<bool>>(),
    )));
    // How long each given-up keyed write's result stayed unknown (see `unknowns`).
    let duplicate = by_name(col::DUPLICATE).as_boolean();
    let said_duplicate = |r: usize| {
        std::iter::once(r)
            .chain(server_child[r])
            .any(|s| duplicate.is_valid(s) && duplicate.value(s))
    };
    let trace_ids = by_name(col::TRACE_ID).as_fixed_size_binary();
    let unknown = unknown_results(spans.num_rows(), attempts, &writes, |r| {
        let outcome = seen_outcome(r);
        Seen {
            row: r,
            trace: trace_int(trace_ids, r),
            end_ns: seen_end(r),
            gave_up: outcome == "deadline" || outcome == "cancelled",
            answered: outcome == "ok" || said_duplicate(r),
        }
    });
    columns.push(Arc::new(Float64Array::from_iter(
        attempts.iter().map(|&r| unknown[r].flatten()),
    )));
    columns.push(Arc::new(BooleanArray::from(
        attempts
            .iter()
            .map(|&r| unknown[r] == Some(None))
            .collect::<Vec<bool>>(),
    )));
    // The wait the previous attempt's answer asked for: its own span's, else its callee's
    // SERVER span's (server instrumentations capture response headers too).
    let retry_after = by_name(col::RETRY_AFTER_MS).as_primitive::<Float64Type>();
    let asked = |row: usize| {
        std::iter::once(row)
            .chain(server_child[row])
            .find(|&r| retry_after.is_valid(r))
            .map(|r| retry_after.value(r))
    };
    columns.push(Arc::new(Float64Array::from_iter(
        attempts.iter().map(|&r| calls[r].previous.and_then(asked)),
    )));
    // A retry (not a hedge) sent before that wait elapsed, from the previous attempt's end
    // as its caller saw it, by more than the overlap tolerance (a server span closes after
    // the answer it carries went out); or at all after a pushback saying not to retry.
    let starts = by_name(col::START_NS).as_primitive::<Int64Type>();
    let tolerance_ms = links.overlap_tolerance_ms.max(0.0);
    let early = |r: usize| {
        let p = calls[r].previous.filter(|_| !calls[r].hedged)?;
        let wait_ms = asked(p)?;
        let gap_ms = (starts.value(r) - seen_end(p)) as f64 / 1e6;
        Some(wait_ms < 0.0 || gap_ms < wait_ms - tolerance_ms)
    };
    columns.push(Arc::new(BooleanArray::from(
        attempts
            .iter()
            .map(|&r| early(r).unwrap_or(false))
            .collect::<Vec<bool>>(),
    )));
    let attempts = match RecordBatch::try_new(ATTEMPT_LINEAGE_SCHEMA.clone(), columns) {
        Ok(batch) => batch,
        Err(e) => unreachable!("attempt columns follow ATTEMPT_LINEAGE_SCHEMA: {e}"),
    };
    timed("lineage: columns: linked", started);
    (lineage, attempts, edges.batch())
}
