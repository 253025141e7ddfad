//! The structural part of the analysis, computed in Rust over the Arrow columns and
//! registered as the `lineage` table the SQL reads: ancestor walks (which SQL expresses
//! badly) and the two parent/child lookups every attempt needs (which SQL expresses as
//! self-joins of the whole span table, measured at most of an interval's cost).
//!
//! `lineage` is the span table itself (every column of the span schema, shared, not
//! copied) plus, per span:
//!
//! | column | meaning |
//! |---|---|
//! | `upstream_retry` | some ancestor (not the span itself) has attempt number > 0; an attempt is a *baseline* attempt (one the layer would receive with no retries anywhere upstream) when its own number is 0 and this is false |
//! | `anchor_deadline_ms`, `anchor_start_ns` | the nearest ancestor carrying a deadline, and when it started: the budget a child must fit in |
//! | `upstream_attempt_span_id` | the nearest ancestor that is a client span or carries an attempt number: the attempt this span's work was done for |
//! | `root_span_id` | the topmost ancestor present in the trace (the span itself when it has none) |
//! | `depth` | number of ancestors present |
//! | `is_call_span` | a CLIENT/INTERNAL span with CLIENT/INTERNAL children carrying attempt numbers: a gRPC-style call span whose children are its attempts |
//! | `parent_is_call_span` | the parent is such a call span |
//! | `call_parent_span_id`, `call_callee_hint`, `call_deadline_ms`, `call_idempotent`, `call_has_idempotency_key`, `call_is_write` | those columns of the parent, when it is a call span (else null) |
//! | `server_span_id`, `server_service`, `server_end_ns`, `server_outcome`, `server_pending`, `server_ctx_cancelled`, `server_deadline_ms` | those columns of the span's first SERVER child by start (else null) |
//!
//! Each span's values derive from its parent's, so every span is computed once (memoised,
//! iteratively, so deep traces cannot overflow the stack). A parent cycle in bad data is
//! cut where it closes: that span is treated as a root.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, Float64Array, Int32Array,
    Int64Array, RecordBatch, UInt32Array,
};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, Float64Type, Int32Type, Int64Type, Schema, SchemaRef};
use stormglass_model::schema::{self as col, SPAN_ID_LEN};

/// Name of the registered table.
pub const LINEAGE: &str = "lineage";

/// Span columns copied from the parent call span (prefix `call_`).
const CALL_COLUMNS: [&str; 6] = [
    col::PARENT_SPAN_ID,
    col::CALLEE_HINT,
    col::DEADLINE_MS,
    col::IDEMPOTENT,
    col::HAS_IDEMPOTENCY_KEY,
    col::IS_WRITE,
];

/// Span columns copied from the first SERVER child, and their names there.
const SERVER_COLUMNS: [(&str, &str); 7] = [
    (col::SPAN_ID, "server_span_id"),
    (col::SERVICE_NAME, "server_service"),
    (col::END_NS, "server_end_ns"),
    (col::OUTCOME, "server_outcome"),
    (col::PENDING, "server_pending"),
    (col::CTX_CANCELLED, "server_ctx_cancelled"),
    (col::DEADLINE_MS, "server_deadline_ms"),
];

/// The span schema followed by the lineage columns.
pub static LINEAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let span_field = |name: &str| -> Field {
        match stormglass_model::SPANS_SCHEMA.field_with_name(name) {
            Ok(f) => f.clone(),
            Err(e) => unreachable!("{name} is a span column: {e}"),
        }
    };
    let mut fields: Vec<Field> = stormglass_model::SPANS_SCHEMA
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.extend([
        Field::new("upstream_retry", DataType::Boolean, false),
        Field::new("anchor_deadline_ms", DataType::Float64, true),
        Field::new("anchor_start_ns", DataType::Int64, true),
        Field::new(
            "upstream_attempt_span_id",
            DataType::FixedSizeBinary(SPAN_ID_LEN),
            true,
        ),
        Field::new(
            "root_span_id",
            DataType::FixedSizeBinary(SPAN_ID_LEN),
            false,
        ),
        Field::new("depth", DataType::Int32, false),
        Field::new("is_call_span", DataType::Boolean, false),
        Field::new("parent_is_call_span", DataType::Boolean, false),
    ]);
    fields.extend(CALL_COLUMNS.iter().map(|name| {
        span_field(name)
            .with_name(format!("call_{name}"))
            .with_nullable(true)
    }));
    fields.extend(
        SERVER_COLUMNS
            .iter()
            .map(|(from, to)| span_field(from).with_name(*to).with_nullable(true)),
    );
    Arc::new(Schema::new(fields))
});

#[derive(Clone, Copy)]
struct Node {
    upstream_retry: bool,
    anchor: Option<(f64, i64)>,
    upstream_attempt: Option<usize>,
    root: usize,
    depth: i32,
}

/// Compute the lineage of every span of `spans` (one batch of [`stormglass_model::SPANS_SCHEMA`]).
pub fn lineage(spans: &RecordBatch) -> RecordBatch {
    let column = |name: &str| -> &ArrayRef {
        match spans.column_by_name(name) {
            Some(c) => c,
            None => unreachable!("spans follow SPANS_SCHEMA, which has {name}"),
        }
    };
    let trace = column(col::TRACE_ID).as_fixed_size_binary();
    let span = column(col::SPAN_ID).as_fixed_size_binary();
    let parent = column(col::PARENT_SPAN_ID).as_fixed_size_binary();
    let attempt = column(col::ATTEMPT).as_primitive::<Int32Type>();
    let deadline = column(col::DEADLINE_MS).as_primitive::<Float64Type>();
    let start = column(col::START_NS).as_primitive::<Int64Type>();
    let kind = column(col::KIND).as_string::<i32>();

    let rows = spans.num_rows();
    let mut index: HashMap<(&[u8], &[u8]), usize> = HashMap::with_capacity(rows);
    for row in 0..rows {
        index.insert((trace.value(row), span.value(row)), row);
    }
    let parent_of = |row: usize| -> Option<usize> {
        if parent.is_null(row) {
            return None;
        }
        index.get(&(trace.value(row), parent.value(row))).copied()
    };
    // Call spans: CLIENT/INTERNAL parents of numbered CLIENT/INTERNAL children.
    let client_or_internal = |row: usize| matches!(kind.value(row), "client" | "internal");
    let mut is_call = vec![false; rows];
    for row in 0..rows {
        if let Some(p) = parent_of(row)
            && attempt.is_valid(row)
            && client_or_internal(row)
            && client_or_internal(p)
        {
            is_call[p] = true;
        }
    }
    // A call span is not an attempt: the attempts under it work for the call's own upstream
    // attempt, so the call graph (storm potential) runs through it.
    let derive = |p: usize, above: &Node| Node {
        upstream_retry: above.upstream_retry || (attempt.is_valid(p) && attempt.value(p) > 0),
        anchor: if deadline.is_valid(p) {
            Some((deadline.value(p), start.value(p)))
        } else {
            above.anchor
        },
        upstream_attempt: if (kind.value(p) == "client" || attempt.is_valid(p)) && !is_call[p] {
            Some(p)
        } else {
            above.upstream_attempt
        },
        root: above.root,
        depth: above.depth + 1,
    };

    let mut nodes: Vec<Option<Node>> = vec![None; rows];
    let mut on_path = vec![false; rows];
    let mut path = Vec::new();
    for start_row in 0..rows {
        // Climb to the first computed ancestor, a root, or a cycle; then fill the path
        // downwards, each span from its (now computed) parent.
        let mut row = start_row;
        while nodes[row].is_none() && !on_path[row] {
            on_path[row] = true;
            path.push(row);
            match parent_of(row) {
                Some(p) => row = p,
                None => break,
            }
        }
        while let Some(row) = path.pop() {
            on_path[row] = false;
            // A parent still uncomputed here closes a cycle: cut it, this span is a root.
            let node = match parent_of(row).and_then(|p| nodes[p].map(|above| (p, above))) {
                Some((p, above)) => derive(p, &above),
                None => Node {
                    upstream_retry: false,
                    anchor: None,
                    upstream_attempt: None,
                    root: row,
                    depth: 0,
                },
            };
            nodes[row] = Some(node);
        }
    }
    // First SERVER child of each span, by start time.
    let mut server_child: Vec<Option<usize>> = vec![None; rows];
    for row in 0..rows {
        let Some(p) = parent_of(row) else { continue };
        if kind.value(row) == "server"
            && server_child[p].is_none_or(|best| start.value(row) < start.value(best))
        {
            server_child[p] = Some(row);
        }
    }
    let call_parent: Vec<Option<usize>> = (0..rows)
        .map(|row| parent_of(row).filter(|p| is_call[*p]))
        .collect();
    build(spans, span, nodes, &is_call, &call_parent, &server_child)
}

/// Rows `indices` of `column` (null where the index is), via Arrow's `take`.
fn gather(column: &ArrayRef, indices: &[Option<usize>]) -> ArrayRef {
    let indices: UInt32Array = indices
        .iter()
        .map(|i| i.map(|i| u32::try_from(i).unwrap_or(u32::MAX)))
        .collect();
    match take(column.as_ref(), &indices, None) {
        Ok(array) => array,
        Err(e) => unreachable!("indices come from the same batch: {e}"),
    }
}

fn build(
    spans: &RecordBatch,
    span: &FixedSizeBinaryArray,
    nodes: Vec<Option<Node>>,
    is_call: &[bool],
    call_parent: &[Option<usize>],
    server_child: &[Option<usize>],
) -> RecordBatch {
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    let span_at = |row: usize| span.value(row);
    let ids = |f: &dyn Fn(&Node) -> Option<usize>| -> FixedSizeBinaryArray {
        match FixedSizeBinaryArray::try_from_sparse_iter_with_size(
            nodes.iter().map(|n| f(n).map(span_at)),
            SPAN_ID_LEN,
        ) {
            Ok(a) => a,
            Err(e) => unreachable!("span ids are {SPAN_ID_LEN} bytes: {e}"),
        }
    };
    let by_name = |name: &str| -> &ArrayRef {
        match spans.column_by_name(name) {
            Some(c) => c,
            None => unreachable!("spans follow SPANS_SCHEMA, which has {name}"),
        }
    };
    let mut columns: Vec<ArrayRef> = spans.columns().to_vec();
    columns.extend([
        Arc::new(BooleanArray::from_iter(
            nodes.iter().map(|n| Some(n.upstream_retry)),
        )) as ArrayRef,
        Arc::new(Float64Array::from_iter(
            nodes.iter().map(|n| n.anchor.map(|a| a.0)),
        )),
        Arc::new(Int64Array::from_iter(
            nodes.iter().map(|n| n.anchor.map(|a| a.1)),
        )),
        Arc::new(ids(&|n| n.upstream_attempt)),
        Arc::new(ids(&|n| Some(n.root))),
        Arc::new(Int32Array::from_iter_values(nodes.iter().map(|n| n.depth))),
        Arc::new(BooleanArray::from_iter(is_call.iter().map(|c| Some(*c)))),
        Arc::new(BooleanArray::from_iter(
            call_parent.iter().map(|p| Some(p.is_some())),
        )),
    ]);
    columns.extend(
        CALL_COLUMNS
            .iter()
            .map(|name| gather(by_name(name), call_parent)),
    );
    columns.extend(
        SERVER_COLUMNS
            .iter()
            .map(|(name, _)| gather(by_name(name), server_child)),
    );
    match RecordBatch::try_new(LINEAGE_SCHEMA.clone(), columns) {
        Ok(batch) => batch,
        Err(e) => unreachable!("lineage columns follow LINEAGE_SCHEMA: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, BooleanArray};
    use arrow::datatypes::{Float64Type, Int32Type};
    use stormglass_model::testing::{child_of, kv_int, request, span, span_id};
    use stormglass_model::{Conventions, encode_request};

    use super::*;

    fn lineage_of(spans: Vec<opentelemetry_proto::tonic::trace::v1::Span>) -> RecordBatch {
        let (batch, report) =
            encode_request(&Conventions::default(), &request(vec![("svc", spans)]));
        assert_eq!(report.rejected, 0);
        lineage(&batch)
    }

    fn bools(batch: &RecordBatch, name: &str) -> Vec<bool> {
        let c: &BooleanArray = batch.column_by_name(name).unwrap().as_boolean();
        (0..c.len()).map(|i| c.value(i)).collect()
    }

    /// A retry anywhere above marks every descendant; budgets anchor on the nearest
    /// budgeted ancestor; roots and depths follow the chain.
    #[test]
    fn chain_retry_anchor_root_depth() {
        // 1 server (deadline 800) -> 2 client retry=1 -> 3 server -> 4 client (deadline 100)
        let spans = vec![
            span(1, 1, "root", 2, 0, 100, vec![kv_int("deadline", 800)]),
            child_of(span(1, 2, "call", 3, 1, 90, vec![kv_int("retry", 1)]), 1),
            child_of(span(1, 3, "serve", 2, 2, 80, vec![]), 2),
            child_of(span(1, 4, "db", 3, 3, 70, vec![kv_int("deadline", 100)]), 3),
        ];
        let l = lineage_of(spans);
        assert_eq!(bools(&l, "upstream_retry"), vec![false, false, true, true]);
        let anchor = l
            .column_by_name("anchor_deadline_ms")
            .unwrap()
            .as_primitive::<Float64Type>();
        assert!(anchor.is_null(0));
        assert_eq!((anchor.value(1), anchor.value(3)), (800.0, 800.0));
        let up = l
            .column_by_name("upstream_attempt_span_id")
            .unwrap()
            .as_fixed_size_binary();
        assert!(up.is_null(0) && up.is_null(1));
        assert_eq!(
            up.value(3),
            span_id(2).as_slice(),
            "the db call works for attempt 2"
        );
        let root = l
            .column_by_name("root_span_id")
            .unwrap()
            .as_fixed_size_binary();
        assert!((0..4).all(|i| root.value(i) == span_id(1).as_slice()));
        let depth = l
            .column_by_name("depth")
            .unwrap()
            .as_primitive::<Int32Type>();
        assert_eq!(depth.values().to_vec(), vec![0, 1, 2, 3]);
    }

    /// gRPC's shape: the attempts under a call span work for the call's upstream attempt,
    /// not for the call span, and what runs under an attempt works for that attempt.
    #[test]
    fn call_spans_are_not_upstream_attempts() {
        // 1 server -> 2 client retry=2 -> 3 server -> 4 call span -> 5 attempt (retry=1)
        //   -> 6 server -> 7 client (db)
        let spans = vec![
            span(1, 1, "root", 2, 0, 100, vec![]),
            child_of(span(1, 2, "call", 3, 1, 90, vec![kv_int("retry", 2)]), 1),
            child_of(span(1, 3, "serve", 2, 2, 80, vec![]), 2),
            child_of(span(1, 4, "grpc call", 3, 3, 70, vec![]), 3),
            child_of(
                span(
                    1,
                    5,
                    "attempt",
                    3,
                    4,
                    60,
                    vec![kv_int("previous-rpc-attempts", 1)],
                ),
                4,
            ),
            child_of(span(1, 6, "serve", 2, 5, 50, vec![]), 5),
            child_of(span(1, 7, "db", 3, 6, 40, vec![]), 6),
        ];
        let l = lineage_of(spans);
        let up = l
            .column_by_name("upstream_attempt_span_id")
            .unwrap()
            .as_fixed_size_binary();
        assert_eq!(
            up.value(4),
            span_id(2).as_slice(),
            "the attempt works for 2, not the call span"
        );
        assert_eq!(
            up.value(6),
            span_id(5).as_slice(),
            "the db call works for attempt 5"
        );
    }

    /// A span whose parent never arrived is its own root at depth 0.
    #[test]
    fn missing_parent_makes_a_root() {
        let l = lineage_of(vec![child_of(span(1, 5, "orphaned", 2, 0, 1, vec![]), 9)]);
        let depth = l
            .column_by_name("depth")
            .unwrap()
            .as_primitive::<Int32Type>();
        assert_eq!(depth.value(0), 0);
    }

    /// A parent cycle in bad data is cut, not followed forever.
    #[test]
    fn parent_cycle_terminates() {
        let spans = vec![
            child_of(span(1, 1, "a", 2, 0, 1, vec![kv_int("retry", 2)]), 2),
            child_of(span(1, 2, "b", 3, 0, 1, vec![]), 1),
        ];
        let l = lineage_of(spans);
        assert_eq!(l.num_rows(), 2);
        let depth = l
            .column_by_name("depth")
            .unwrap()
            .as_primitive::<Int32Type>();
        assert!(depth.values().iter().all(|d| *d <= 1));
    }
}
