//! The structural part of the analysis, computed in Rust over the Arrow columns and
//! registered as the `lineage` and `lineage_attempts` tables the SQL reads: ancestor walks
//! (which SQL expresses badly) and the two parent/child lookups every attempt needs (which
//! SQL expresses as self-joins of the whole span table, the costliest part of an interval).
//!
//! `lineage` is the span table itself (every column of the span schema, shared, not
//! copied) plus, per span, the columns below: all of them for `stormglass query`
//! ([`Detail::Query`]), the four `queries/` read for the analysis ([`Detail::Analysis`]):
//!
//! | column | meaning |
//! |---|---|
//! | `upstream_retry` | some ancestor (not the span itself) has attempt number > 0; an attempt is a *baseline* attempt (one the layer would receive with no retries anywhere upstream) when its own number is 0 and this is false |
//! | `anchor_deadline_ms`, `anchor_start_ns` | the nearest ancestor carrying a deadline, and when it started: the budget a child must fit in |
//! | `upstream_attempt_span_id` | the nearest ancestor that is a client span or carries an attempt number: the attempt this span's work was done for |
//! | `root_span_id` | the topmost ancestor present in the trace (the span itself when it has none) |
//! | `depth` | number of ancestors present |
//! | `is_call_span` | a CLIENT/INTERNAL span with CLIENT/INTERNAL children carrying attempt numbers (a gRPC-style call span whose children are its attempts), or a CLIENT span with several SERVER children of one service (re-sends below the instrumentation: a client library or a proxy sent the request again) |
//! | `parent_is_call_span` | the parent is such a call span |
//! | `is_attempt` | the span is an attempt: a CLIENT span that is not a call span, a numbered INTERNAL child of a call span, a SERVER child of a re-sending CLIENT span, or a SERVER span whose caller sent no attempt span for it: numbered (a proxy or gateway without tracing numbered it), or under another service's non-CLIENT span (the caller propagates the context but sends no CLIENT spans); such a SERVER attempt is its own `server_*` span |
//! | `logical_call_id` | attempts only: the logical call (numbered from 1 in the order below) |
//! | `is_first_attempt`, `is_last_attempt` | attempts only: position within the call |
//! | `row_id`, `root_row`, `upstream_attempt_row` | the span's row in this analysis's batch, its `root_span_id`'s and its `upstream_attempt_span_id`'s: keys for joins within one analysis (one integer hashes and compares in a fraction of the time of a trace id and a span id) |
//!
//! `lineage_attempts` has one row per attempt: the `lineage` columns `attempts` reads
//! ([`ATTEMPT_COLUMNS`]), then the columns of the spans the attempt is linked to. They are
//! gathered for the attempts alone: gathered for every span of `lineage` and filtered down
//! to the attempts in SQL, they were copied twice, ~45 columns, a fifth of an analysis.
//!
//! | column | meaning |
//! |---|---|
//! | `prev_outcome`, `prev_end_ns` | the outcome and end of the attempt before it in the call |
//! | `logical_attempts`, `logical_max_attempt`, `logical_start_ns`, `logical_end_ns`, `logical_final_outcome` | its logical call's: attempts, highest attempt number, first start, last end (root clock), and the last attempt's outcome |
//! | `caller` | the service that made the attempt: its own, or for a SERVER attempt its parent's (`unknown` without a parent) |
//! | `callee` | the service of a SERVER span under any attempt of the call (the greatest, if several), else `hint_server` below, else the callee hint (the attempt's own, else its call span's), else `unknown` |
//! | `edge`, `upstream_edge` | the attempt's (caller, callee, operation) as an integer key of `edge_names` (one row per edge: edge, caller, callee, operation), and its upstream attempt's when that is an attempt: the partials group and join on these instead of three strings |
//! | `call_anchor_deadline_ms`, `call_anchor_start_ns` | the anchor of the parent call span (the budget the whole call had to fit in), when the parent is one |
//! | `call_parent_span_id`, `call_attempt`, `call_deadline_ms`, `call_idempotent`, `call_has_idempotency_key`, `call_is_write` | those columns of the parent, when it is a call span (else null) |
//! | `server_span_id`, `server_service`, `server_end_ns`, `server_outcome`, `server_pending`, `server_ctx_cancelled`, `server_deadline_ms` | those columns of the attempt's first SERVER child by start (else null) |
//! | `numbered` | the span carries an attempt number of its own |
//! | `hidden` | a SERVER attempt without a number of its own (a re-send, or an uninstrumented caller's call) |
//! | `hedged` | a SERVER attempt started before an earlier attempt of its call had ended |
//! | `inferred` | joined to its call as an application loop's retry (see below) |
//! | `other_instance` | the attempt's SERVER span ran on another instance (`instance`) than the previous attempt's (null on first attempts, or where either is unknown) |
//!
//! A SERVER child of a re-sending CLIENT span takes the CLIENT span's `operation`,
//! `deadline_ms` and `anchor_*` (the call its caller made, and the budget that call had to
//! fit in) and is named after it in `edge`; its outcome and
//! end are its own, except the last one's when the client gave up (deadline, cancelled):
//! then they are the CLIENT span's, the outcome and end the caller saw, so a server that
//! went on is an orphan as it would be under a single attempt.
//!
//! `hint_server`, for attempts with a callee hint (theirs, else their call span's): the
//! service SERVER spans under this batch's attempts most often have for that hint (ties:
//! the first by name), the callee's name where no SERVER span answered the call itself.
//!
//! Logical calls: attempts ordered by their sender (the re-sending CLIENT span for its
//! SERVER children, else the attempt itself): by trace, the sender's parent, callee hint
//! (the call span's when it has none) and operation, then its start, attempt number and
//! span id (SDKs with millisecond clocks give a first attempt and its quick retry the same
//! start: the number, never the span id, orders them), then the attempt's own start. A new
//! call starts wherever trace, parent, hint or operation change, and at every attempt
//! numbered 0 (or unnumbered) unless it is
//! * another SERVER child of the same re-sending CLIENT span;
//! * an unnumbered SERVER attempt after a sibling SERVER attempt of the same parent (an
//!   uninstrumented caller's re-send);
//! * with `infer_loops`, an unnumbered CLIENT span started after the previous one (also a
//!   CLIENT span) ended in a retryable failure (deadline, cancelled, unavailable,
//!   throttled, server_error), to the same URL where both carry one (`target_hash`): an
//!   application's retry loop; a loop over different URLs stays separate calls.
//!
//! Within a call, attempts are ordered by number, start and span id; in a call with
//! attempts found without numbers (re-sent, hidden, inferred), they keep the order above
//! and their position is their number. The calls are grouped before the ancestor walk, so
//! `upstream_retry` sees the numbers they give.
//!
//! Clock skew: the completed attempts' SERVER children give each (caller service, callee
//! service) the offsets its callee's clock may have (see [`crate::clock`]), intersected with
//! what earlier chunks of the live window gave (`prior`); every span of a callee's subtree
//! is then shifted by the offsets along its path from the root, so `start_ns`, `end_ns` and
//! every time copied from another span are in the root service's clock. The pairs are
//! returned as the `clock_pairs` table (caller, callee, low_ms, high_ms).
//!
//! Each span's values derive from its parent's, so every span is computed once (memoised,
//! iteratively, so deep traces cannot overflow the stack). A parent cycle in bad data is
//! cut where it closes: that span is treated as a root.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use crate::clock::{self, Bound, ClockBounds};
use crate::engine::timed;
use stormglass_model::hash::KeyedHash;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray, UInt32Array,
};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, Float64Type, Int32Type, Int64Type, Schema, SchemaRef};
use stormglass_model::schema::{self as col, SPAN_ID_LEN};

/// Name of the registered table.
pub const LINEAGE: &str = "lineage";

/// Name of the registered table of the attempts' lineage.
pub const ATTEMPT_LINEAGE: &str = "lineage_attempts";

/// Span columns copied from the parent call span (prefix `call_`).
const CALL_COLUMNS: [&str; 6] = [
    col::PARENT_SPAN_ID,
    col::ATTEMPT,
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

/// A field of the span schema.
fn span_field(name: &str) -> Field {
    match stormglass_model::SPANS_SCHEMA.field_with_name(name) {
        Ok(f) => f.clone(),
        Err(e) => unreachable!("{name} is a span column: {e}"),
    }
}

/// The span schema followed by the lineage columns every span has.
pub static LINEAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
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
        Field::new("is_attempt", DataType::Boolean, false),
        Field::new("logical_call_id", DataType::Int64, true),
        Field::new("is_first_attempt", DataType::Boolean, true),
        Field::new("is_last_attempt", DataType::Boolean, true),
        Field::new("row_id", DataType::Int64, false),
        Field::new("root_row", DataType::Int64, false),
        Field::new("upstream_attempt_row", DataType::Int64, true),
    ]);
    Arc::new(Schema::new(fields))
});

/// Which of `lineage`'s columns to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// The span's columns and [`ANALYSED_COLUMNS`]: what `queries/` read of `lineage` (the
    /// attempts' values are in `lineage_attempts`, built for the attempts alone): the other
    /// columns for every span have no reader in the analysis.
    Analysis,
    /// Every column of [`LINEAGE_SCHEMA`]: for `stormglass query`, whose users may read any.
    Query,
}

/// The lineage columns `queries/` read from `lineage` (the rest they read per attempt, from
/// `lineage_attempts`).
pub const ANALYSED_COLUMNS: [&str; 4] = ["depth", "is_attempt", "is_first_attempt", "row_id"];

/// [`LINEAGE_SCHEMA`] in [`Detail::Analysis`]: the span schema and [`ANALYSED_COLUMNS`].
pub static ANALYSED_LINEAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let wanted = |name: &str| {
        stormglass_model::SPANS_SCHEMA.field_with_name(name).is_ok()
            || ANALYSED_COLUMNS.contains(&name)
    };
    let fields: Vec<Field> = LINEAGE_SCHEMA
        .fields()
        .iter()
        .filter(|f| wanted(f.name()))
        .map(|f| f.as_ref().clone())
        .collect();
    Arc::new(Schema::new(fields))
});

/// Columns of `lineage` that `lineage_attempts` carries for each attempt: what `attempts`
/// reads.
const ATTEMPT_COLUMNS: [&str; 25] = [
    col::TRACE_ID,
    col::SPAN_ID,
    col::PARENT_SPAN_ID,
    col::OPERATION,
    col::ATTEMPT,
    col::RETRY_CAUSE,
    col::OUTCOME,
    col::START_NS,
    col::END_NS,
    col::DEADLINE_MS,
    col::IDEMPOTENT,
    col::HAS_IDEMPOTENCY_KEY,
    col::IS_WRITE,
    col::WEIGHT,
    "upstream_retry",
    "anchor_deadline_ms",
    "anchor_start_ns",
    "upstream_attempt_span_id",
    "root_span_id",
    "logical_call_id",
    "is_first_attempt",
    "is_last_attempt",
    "row_id",
    "root_row",
    "upstream_attempt_row",
];

/// The attempts' columns of `lineage` ([`ATTEMPT_COLUMNS`]), then the columns copied
/// from the spans an attempt is linked to (see the module docs).
pub static ATTEMPT_LINEAGE_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields: Vec<Field> = ATTEMPT_COLUMNS
        .iter()
        .map(|name| match LINEAGE_SCHEMA.field_with_name(name) {
            Ok(f) => f.clone(),
            Err(e) => unreachable!("{name} is a lineage column: {e}"),
        })
        .collect();
    let nullable = |name: &str, to: &str| span_field(name).with_name(to).with_nullable(true);
    fields.extend([
        nullable(col::OUTCOME, "prev_outcome"),
        nullable(col::END_NS, "prev_end_ns"),
        Field::new("logical_attempts", DataType::Int64, false),
        Field::new("logical_max_attempt", DataType::Int32, false),
        Field::new("logical_start_ns", DataType::Int64, false),
        Field::new("logical_end_ns", DataType::Int64, false),
        nullable(col::OUTCOME, "logical_final_outcome"),
        Field::new("caller", DataType::Utf8, false),
        Field::new("callee", DataType::Utf8, false),
        Field::new("edge", DataType::Int64, false),
        Field::new("upstream_edge", DataType::Int64, true),
        Field::new("call_anchor_deadline_ms", DataType::Float64, true),
        Field::new("call_anchor_start_ns", DataType::Int64, true),
    ]);
    fields.extend(
        CALL_COLUMNS
            .iter()
            .map(|name| nullable(name, &format!("call_{name}"))),
    );
    fields.extend(SERVER_COLUMNS.iter().map(|(from, to)| nullable(from, to)));
    fields.extend([
        Field::new("numbered", DataType::Boolean, false),
        Field::new("hidden", DataType::Boolean, false),
        Field::new("hedged", DataType::Boolean, false),
        Field::new("inferred", DataType::Boolean, false),
        Field::new("other_instance", DataType::Boolean, true),
    ]);
    Arc::new(Schema::new(fields))
});

/// Name of the registered table of the attempts' edges.
pub const EDGE_NAMES: &str = "edge_names";

/// The schema of `edge_names`: one row per edge of this analysis's attempts.
pub static EDGE_NAMES_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("edge", DataType::Int64, false),
        Field::new("caller", DataType::Utf8, false),
        Field::new("callee", DataType::Utf8, false),
        span_field(col::OPERATION).with_nullable(true),
    ]))
});

/// The schema of `clock_pairs`: one row per completed attempt with a SERVER child on
/// another service.
pub static CLOCK_PAIRS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("caller", DataType::Utf8, false),
        Field::new("callee", DataType::Utf8, false),
        Field::new("low_ms", DataType::Float64, false),
        Field::new("high_ms", DataType::Float64, false),
    ]))
});

/// The lineage table and the clock pairs it was corrected with.
pub struct Lineage {
    /// `lineage`: [`LINEAGE_SCHEMA`], or [`ANALYSED_LINEAGE_SCHEMA`] in [`Detail::Analysis`].
    pub batch: RecordBatch,
    /// `lineage_attempts`: one row per attempt ([`ATTEMPT_LINEAGE_SCHEMA`]).
    pub attempts: RecordBatch,
    /// `edge_names`: the attempts' edges ([`EDGE_NAMES_SCHEMA`]).
    pub edges: RecordBatch,
    pub clock_pairs: RecordBatch,
    /// Distinct trace ids in the spans.
    pub traces: usize,
}

#[derive(Clone, Copy)]
struct Node {
    /// Nanoseconds added to this span's times to bring them into the root's clock.
    offset_ns: i64,
    upstream_retry: bool,
    anchor: Option<(f64, i64)>,
    upstream_attempt: Option<usize>,
    root: usize,
    /// -1 until the walk reaches the span.
    depth: i32,
}

impl Node {
    /// A span the walk has not reached yet (a root is this with its own row as `root`, at
    /// depth 0).
    const UNSET: Node = Node {
        offset_ns: 0,
        upstream_retry: false,
        anchor: None,
        upstream_attempt: None,
        root: usize::MAX,
        depth: -1,
    };

    fn is_set(&self) -> bool {
        self.depth >= 0
    }
}

/// Compute the lineage of every span of `spans` (one batch of [`stormglass_model::SPANS_SCHEMA`])
/// on its own, with the default clock tolerance and loop inference.
pub fn lineage(spans: &RecordBatch) -> RecordBatch {
    lineage_in_window(spans, &ClockBounds::new(), 1.0, true, Detail::Query).batch
}

/// Compute the lineage of one chunk of a window whose earlier chunks gave `prior` clock
/// bounds; clocks agreeing within `tolerance_ms` are not corrected; `infer_loops` joins
/// unnumbered sibling attempts into calls (see the module docs). `lineage` has `detail`'s
/// columns.
pub fn lineage_in_window(
    spans: &RecordBatch,
    prior: &ClockBounds,
    tolerance_ms: f64,
    infer_loops: bool,
    detail: Detail,
) -> Lineage {
    let column = |name: &str| column(spans, name);
    let trace = column(col::TRACE_ID).as_fixed_size_binary();
    let span = column(col::SPAN_ID).as_fixed_size_binary();
    let parent = column(col::PARENT_SPAN_ID).as_fixed_size_binary();
    let attempt = column(col::ATTEMPT).as_primitive::<Int32Type>();
    let deadline = column(col::DEADLINE_MS).as_primitive::<Float64Type>();
    let start = column(col::START_NS).as_primitive::<Int64Type>();
    let kinds = kinds(spans);
    let kind = |row: usize| kinds[row];

    let rows = spans.num_rows();
    let started = std::time::Instant::now();
    let groups = TraceGroups::new(trace);
    let parent_rows = parent_rows(&groups, span, parent);
    timed("lineage: parents", started);
    let parent_of = |row: usize| parent_rows[row];
    let (clock_pairs, offsets) = clock_offsets(spans, &kinds, &parent_rows, prior, tolerance_ms);
    // Looked up per SERVER span: borrowed keys, no allocation.
    let offsets: HashMap<(&str, &str), i64, KeyedHash> = offsets
        .iter()
        .map(|((caller, callee), ns)| ((caller.as_str(), callee.as_str()), *ns))
        .collect();
    let service = column(col::SERVICE_NAME).as_string::<i32>();
    let edge_offset = |p: usize, row: usize| -> i64 {
        if offsets.is_empty() || kind(row) != Kind::Server {
            return 0;
        }
        let (caller, callee) = (service.value(p), service.value(row));
        if caller == callee {
            return 0;
        }
        offsets.get(&(caller, callee)).copied().unwrap_or(0)
    };
    // Call spans: CLIENT/INTERNAL parents of numbered CLIENT/INTERNAL children.
    let client_or_internal = |row: usize| matches!(kind(row), Kind::Client | Kind::Internal);
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
    // First SERVER child of each span, by start time; how many it has, and whether they
    // are all of one service.
    let mut server_child: Vec<Option<usize>> = vec![None; rows];
    let mut servers_under = vec![0u32; rows];
    let mut one_service = vec![true; rows];
    for row in 0..rows {
        let Some(p) = parent_of(row) else { continue };
        if kind(row) != Kind::Server {
            continue;
        }
        servers_under[p] += 1;
        if let Some(first) = server_child[p] {
            one_service[p] &= service.value(first) == service.value(row);
        }
        if server_child[p].is_none_or(|best| start.value(row) < start.value(best)) {
            server_child[p] = Some(row);
        }
    }
    // Re-sends below the instrumentation: a CLIENT span answered by several SERVER spans
    // of one service (a client library or a proxy sent the request again). It becomes the
    // call span of its SERVER children, which are its attempts. (Children of different
    // services are a mirror or a fan-out, not re-sends.)
    let resends: Vec<bool> = (0..rows)
        .map(|p| kind(p) == Kind::Client && !is_call[p] && servers_under[p] >= 2 && one_service[p])
        .collect();
    for (p, resent) in resends.iter().enumerate() {
        is_call[p] |= resent;
    }
    let call_parent: Vec<Option<usize>> = (0..rows)
        .map(|row| parent_of(row).filter(|p| is_call[*p]))
        .collect();
    // Attempts: CLIENT spans that are not call spans, numbered INTERNAL children of call
    // spans, and SERVER spans whose caller sent no attempt span for them: re-sends below a
    // CLIENT span, numbered ones (a proxy or gateway without tracing numbered them), and
    // those whose parent is another service's non-CLIENT span (a caller that propagates
    // the context but sends no CLIENT spans).
    let sent_attempt = |row: usize| {
        !is_call[row]
            && match kind(row) {
                Kind::Client => true,
                Kind::Internal => attempt.is_valid(row) && call_parent[row].is_some(),
                _ => false,
            }
    };
    let is_attempt: Vec<bool> = (0..rows)
        .map(|row| {
            sent_attempt(row)
                || (kind(row) == Kind::Server
                    && match parent_of(row) {
                        None => attempt.is_valid(row),
                        Some(p) => {
                            resends[p]
                                || (!sent_attempt(p)
                                    && (attempt.is_valid(row)
                                        || (kind(p) != Kind::Client
                                            && service.value(p) != service.value(row))))
                        }
                    })
        })
        .collect();
    // The attempt that made a SERVER attempt is itself: it is its own callee's span.
    for row in 0..rows {
        if is_attempt[row] && kind(row) == Kind::Server {
            server_child[row] = Some(row);
        }
    }
    // Who made each attempt: its own service, or a SERVER attempt's parent's (none for a
    // SERVER attempt without a parent).
    let caller_of: Vec<Option<usize>> = (0..rows)
        .map(|row| match (is_attempt[row], kind(row)) {
            (false, _) => None,
            (true, Kind::Server) => parent_of(row),
            (true, _) => Some(row),
        })
        .collect();
    // The span that stands for the caller's side of each attempt: the re-sending CLIENT
    // span for its SERVER children, else the attempt itself.
    let sender: Vec<usize> = (0..rows)
        .map(|row| match parent_of(row) {
            Some(p) if is_attempt[row] && resends[p] => p,
            _ => row,
        })
        .collect();
    let started = std::time::Instant::now();
    let attempts: Vec<usize> = (0..rows).filter(|&r| is_attempt[r]).collect();
    let shape = Shape {
        kinds: &kinds,
        parent_rows: &parent_rows,
        is_attempt: &is_attempt,
        call_parent: &call_parent,
        server_child: &server_child,
        sender: &sender,
    };
    let calls = logical_calls(spans, &groups, &shape, infer_loops);
    timed("lineage: calls", started);

    // A call span is not an attempt: the attempts under it work for the call's own upstream
    // attempt, so the call graph (storm potential) runs through it. An attempt's number is
    // the one its call gives it (re-sends and inferred attempts carry none of their own).
    let derive = |row: usize, p: usize, above: &Node| Node {
        offset_ns: above.offset_ns + edge_offset(p, row),
        // Any number but 0 is a retry, including an unreadable one.
        upstream_retry: above.upstream_retry
            || (attempt.is_valid(p) && attempt.value(p) != 0)
            || (calls[p].id.is_some() && calls[p].number != 0),
        anchor: if deadline.is_valid(p) {
            Some((deadline.value(p), start.value(p) + above.offset_ns))
        } else {
            above.anchor
        },
        upstream_attempt: if (kind(p) == Kind::Client || attempt.is_valid(p) || is_attempt[p])
            && !is_call[p]
        {
            Some(p)
        } else {
            above.upstream_attempt
        },
        root: above.root,
        depth: above.depth + 1,
    };

    // Not `Option<Node>`: unwrapping every node for the columns was a pass and a copy of
    // its own.
    let mut nodes: Vec<Node> = vec![Node::UNSET; rows];
    let mut on_path = vec![false; rows];
    let mut path = Vec::new();
    for start_row in 0..rows {
        // Climb to the first computed ancestor, a root, or a cycle; then fill the path
        // downwards, each span from its (now computed) parent.
        let mut row = start_row;
        while !nodes[row].is_set() && !on_path[row] {
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
            let node = match parent_of(row).filter(|&p| nodes[p].is_set()) {
                Some(p) => derive(row, p, &nodes[p]),
                None => Node {
                    root: row,
                    depth: 0,
                    ..Node::UNSET
                },
            };
            nodes[row] = node;
        }
    }
    let corrected = in_root_clock(spans, &nodes);
    let hint_server = hint_servers(spans, &attempts, &call_parent, &server_child, &sender);
    let links = Links {
        attempts: &attempts,
        is_call: &is_call,
        resends: &resends,
        call_parent: &call_parent,
        server_child: &server_child,
        caller_of: &caller_of,
        hint_server: &hint_server,
        sender: &sender,
    };
    let started = std::time::Instant::now();
    let (batch, attempts, edges) = build(
        corrected.as_ref().unwrap_or(spans),
        nodes,
        &links,
        &calls,
        detail,
    );
    timed("lineage: columns", started);
    Lineage {
        batch,
        attempts,
        edges,
        clock_pairs,
        traces: groups.len(),
    }
}

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
type BorrowedBounds<'a> = HashMap<(&'a str, &'a str), Bound, KeyedHash>;

/// One completed call's clock pair: the caller's and the callee's rows, and the offsets
/// (ms) it allows, `client.start - server.start ..= client.end - server.end`.
struct ClockPair {
    client: usize,
    server: usize,
    low_ms: f64,
    high_ms: f64,
}

/// The bounds of the batch's completed calls per (caller, callee) service pair, and the
/// pair of each call giving one.
fn own_bounds<'a>(
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
    let mut bounds = BorrowedBounds::default();
    let mut pairs = Vec::new();
    for (row, parent) in parent_rows.iter().enumerate() {
        let Some(p) = *parent else { continue };
        // Only an answered call must contain its callee's span.
        if kinds[row] != Kind::Server
            || service.value(p) == service.value(row)
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
/// the chunk's bounds intersected with `prior`'s (see [`crate::clock`]).
fn clock_offsets(
    spans: &RecordBatch,
    kinds: &[Kind],
    parent_rows: &[Option<usize>],
    prior: &ClockBounds,
    tolerance_ms: f64,
) -> (RecordBatch, HashMap<(String, String), i64>) {
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
    let mut bounds = prior.clone();
    for ((caller, callee), bound) in chunk {
        clock::add(&mut bounds, (caller.to_owned(), callee.to_owned()), bound);
    }
    let offsets = bounds
        .into_iter()
        .filter_map(|(pair, b)| {
            let ns = (clock::offset_ms(b.low_ms, b.high_ms, tolerance_ms) * 1e6).round() as i64;
            (ns != 0).then_some((pair, ns))
        })
        .collect();
    (pairs, offsets)
}

/// `spans` with `start_ns` and `end_ns` shifted into the root's clock, or `None` when no
/// span needs it.
fn in_root_clock(spans: &RecordBatch, nodes: &[Node]) -> Option<RecordBatch> {
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

/// The span kinds the lineage tells apart.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Client,
    Server,
    Internal,
    Other,
}

/// Each row's kind, read from the `kind` column once: the walks above ask it several times
/// per span, and comparing an enum costs nothing next to comparing the text.
fn kinds(spans: &RecordBatch) -> Vec<Kind> {
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
fn column<'a>(spans: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    match spans.column_by_name(name) {
        Some(c) => c,
        None => unreachable!("spans follow SPANS_SCHEMA, which has {name}"),
    }
}

/// Each span's parent row: the row of the same trace whose span id is the span's parent id
/// (the last such row, should one appear twice), `None` for a root or a parent not in the
/// batch. Each trace's parents are found in a sorted list of that trace's span ids (see
/// [`TraceGroups`]): a few cache lines per lookup.
fn parent_rows(
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
    fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Each trace's rows.
    pub(crate) fn traces(&self) -> impl Iterator<Item = &[usize]> {
        self.bounds.windows(2).map(|b| &self.rows[b[0]..b[1]])
    }
}

/// A trace id as an integer that orders like its bytes.
fn trace_int(ids: &FixedSizeBinaryArray, row: usize) -> u128 {
    let mut bytes = [0u8; 16];
    let id = ids.value(row);
    let n = id.len().min(16);
    bytes[..n].copy_from_slice(&id[..n]);
    u128::from_be_bytes(bytes)
}

/// A span id as an integer that orders like its bytes.
fn span_int(ids: &FixedSizeBinaryArray, row: usize) -> u64 {
    let mut bytes = [0u8; 8];
    let id = ids.value(row);
    let n = id.len().min(8);
    bytes[..n].copy_from_slice(&id[..n]);
    u64::from_be_bytes(bytes)
}

/// SQL's ORDER BY ... ASC puts nulls last: `None` sorts after every value.
fn nulls_last<T: Copy + Default>(v: Option<T>) -> (bool, T) {
    match v {
        Some(v) => (false, v),
        None => (true, T::default()),
    }
}

/// Per span: its logical call and its place in it (attempts only).
#[derive(Clone, Copy, Default)]
struct CallSlot {
    id: Option<i64>,
    first: bool,
    last: bool,
    previous: Option<usize>,
    /// The attempt number: the span's own, 0 when it has none, and for an unreadable one
    /// the number after the attempt before it (1 when none is). In a call with attempts
    /// found without numbers (re-sends, hedges, inferred), the position in the call.
    number: i32,
    /// The SERVER span (under any attempt of the call) whose service sorts last.
    server: Option<usize>,
    /// Read from a SERVER span that carries no number of its own: a re-send below its
    /// caller's CLIENT span, or a call from a caller that sent no span for it.
    hidden: bool,
    /// A SERVER attempt that started before an earlier attempt of its call had ended.
    hedged: bool,
    /// Joined to the attempt before it by inference (an application's retry loop).
    inferred: bool,
    /// The row whose outcome and end the caller saw, where it is not the attempt's own: the
    /// re-sending CLIENT span, for its last SERVER child, when the client gave up on it
    /// (deadline, cancelled) and the server may have gone on.
    seen_as: Option<usize>,
}

/// The structure [`logical_calls`] groups: per row, what [`lineage_in_window`] found.
struct Shape<'a> {
    kinds: &'a [Kind],
    parent_rows: &'a [Option<usize>],
    is_attempt: &'a [bool],
    call_parent: &'a [Option<usize>],
    server_child: &'a [Option<usize>],
    /// The span that stands for the caller's side of each attempt: the re-sending CLIENT
    /// span for its SERVER children, else the attempt itself. Calls are grouped and ordered
    /// by it, so a CLIENT span's re-sends stay together and in its place among its siblings.
    sender: &'a [usize],
}

/// Outcomes an application loop retries (METRICS.md's failure classes minus
/// `client_error`).
fn retryable(outcome: &str) -> bool {
    matches!(
        outcome,
        "deadline" | "cancelled" | "unavailable" | "throttled" | "server_error"
    )
}

/// An attempt's callee hint: its own, else its call span's (SQL's
/// `COALESCE(callee_hint, call_callee_hint)`).
fn callee_hint<'a>(
    hint: &'a StringArray,
    call_parent: &[Option<usize>],
    row: usize,
) -> Option<&'a str> {
    let of = |row: usize| hint.is_valid(row).then(|| hint.value(row));
    of(row).or_else(|| call_parent[row].and_then(of))
}

/// Per attempt with a callee hint, a SERVER span of the service that SERVER spans under
/// the batch's attempts most often have for that hint (ties: the service first by name);
/// `None` otherwise. Computed here, with the other links, so `attempts` names its callee
/// without joining the whole attempt table to a table of hints, which would copy every
/// column of every attempt.
fn hint_servers(
    spans: &RecordBatch,
    attempts: &[usize],
    call_parent: &[Option<usize>],
    server_child: &[Option<usize>],
    sender: &[usize],
) -> Vec<Option<usize>> {
    let service = column(spans, col::SERVICE_NAME).as_string::<i32>();
    let hint = column(spans, col::CALLEE_HINT).as_string::<i32>();
    // (hint, service) -> (attempts, one SERVER span of that service)
    let mut counts: HashMap<(&str, &str), (u64, usize), KeyedHash> = HashMap::default();
    for &row in attempts {
        let hint_of = callee_hint(hint, call_parent, sender[row]);
        if let (Some(h), Some(server)) = (hint_of, server_child[row]) {
            counts
                .entry((h, service.value(server)))
                .or_insert((0, server))
                .0 += 1;
        }
    }
    let mut servers = vec![None; spans.num_rows()];
    if counts.is_empty() {
        return servers;
    }
    // per hint: (attempts, service, SERVER span): most attempts, then the first service by name
    let mut best: HashMap<&str, (u64, &str, usize), KeyedHash> = HashMap::default();
    for ((h, name), (n, server)) in counts {
        let better = |b: &(u64, &str, usize)| n > b.0 || (n == b.0 && name < b.1);
        if best.get(h).is_none_or(better) {
            best.insert(h, (n, name, server));
        }
    }
    for &row in attempts {
        if let Some(h) = callee_hint(hint, call_parent, sender[row]) {
            servers[row] = best.get(h).map(|&(_, _, server)| server);
        }
    }
    servers
}

/// Group attempts into logical calls (see the module docs for the order). Trace by trace,
/// in trace id order: each trace's few attempts sort in cache, by their strings directly,
/// where one sort of every attempt of the batch would need every hint and operation ranked
/// first.
fn logical_calls(
    spans: &RecordBatch,
    groups: &TraceGroups,
    shape: &Shape,
    infer_loops: bool,
) -> Vec<CallSlot> {
    let column = |name: &str| column(spans, name);
    let trace = column(col::TRACE_ID).as_fixed_size_binary();
    let span = column(col::SPAN_ID).as_fixed_size_binary();
    let parent = column(col::PARENT_SPAN_ID).as_fixed_size_binary();
    let attempt = column(col::ATTEMPT).as_primitive::<Int32Type>();
    let operation = column(col::OPERATION).as_string::<i32>();
    let hint = column(col::CALLEE_HINT).as_string::<i32>();
    let start = column(col::START_NS).as_primitive::<Int64Type>();
    let end = column(col::END_NS).as_primitive::<Int64Type>();
    let outcome = column(col::OUTCOME).as_string::<i32>();
    let target = column(col::TARGET_HASH).as_primitive::<Int64Type>();
    let service = column(col::SERVICE_NAME).as_string::<i32>();
    let Shape {
        kinds,
        parent_rows,
        is_attempt,
        call_parent,
        server_child,
        sender,
    } = *shape;

    let rows = spans.num_rows();
    let number = |row: usize| {
        if attempt.is_valid(row) {
            attempt.value(row)
        } else {
            0
        }
    };
    // Where starts tie, an unreadable number sorts after every readable one.
    let sort_number = |row: usize| match number(row) {
        col::UNREADABLE_ATTEMPT => i32::MAX,
        n => n,
    };
    // (parent, hint, operation) of the sender identifies a run of attempts within a trace;
    // the sender's start, then its attempt number where starts tie (coarse clocks), then
    // its span id order them, and a re-sending span's attempts by their own start.
    let run_of = |row: usize| {
        let s = sender[row];
        (
            nulls_last(parent.is_valid(s).then(|| span_int(parent, s))),
            nulls_last(callee_hint(hint, call_parent, s)),
            nulls_last(operation.is_valid(s).then(|| operation.value(s))),
        )
    };
    let order_of = |row: usize| {
        let s = sender[row];
        (
            run_of(row),
            start.value(s),
            sort_number(s),
            span_int(span, s),
            start.value(row),
            span_int(span, row),
            row,
        )
    };
    let server_found = |row: usize| kinds[row] == Kind::Server;
    let hidden = |row: usize| server_found(row) && !attempt.is_valid(row);
    // Where both say what they requested, an inferred retry requested the same.
    let same_target = |a: usize, b: usize| {
        !(target.is_valid(a) && target.is_valid(b)) || target.value(a) == target.value(b)
    };
    // How an attempt continues the call of the attempt before it in its run (`None`: it
    // starts a new call).
    let continues = |row: usize, before: usize| -> Option<Found> {
        let (s, sb) = (sender[row], sender[before]);
        if s != row && s == sb {
            // Another SERVER child of the same re-sending CLIENT span.
            return Some(Found::Resent);
        }
        if s == row
            && hidden(row)
            && sb == before
            && server_found(before)
            && parent_rows[row] == parent_rows[before]
        {
            // An uninstrumented caller's re-send: an earlier sibling SERVER span came first.
            return Some(Found::Resent);
        }
        if number(s) != 0 {
            return Some(Found::Numbered);
        }
        let loop_retry = infer_loops
            && s != sb
            && !attempt.is_valid(s)
            && kinds[s] == Kind::Client
            && kinds[sb] == Kind::Client
            && start.value(s) >= end.value(sb)
            && retryable(outcome.value(sb))
            && same_target(s, sb);
        loop_retry.then_some(Found::Inferred)
    };

    let mut slots = vec![CallSlot::default(); rows];
    let mut id = 0i64;
    // The call being gathered: its attempts in order, and whether any was found without
    // a number (then attempts are numbered by position).
    let mut members: Vec<usize> = Vec::new();
    let mut positional = false;
    let flush = |members: &mut Vec<usize>, positional: &mut bool, slots: &mut Vec<CallSlot>| {
        if *positional {
            for (i, &row) in members.iter().enumerate() {
                slots[row].number = i32::try_from(i).unwrap_or(i32::MAX);
            }
        } else {
            // Members arrive in start order: an unreadable number follows the one before it.
            let mut before: Option<i32> = None;
            for &row in members.iter() {
                let n = match number(row) {
                    col::UNREADABLE_ATTEMPT => before.map_or(1, |b| b + 1),
                    n => n,
                };
                slots[row].number = n;
                before = Some(n);
            }
            members.sort_by_key(|&row| (slots[row].number, start.value(row), span_int(span, row)));
        }
        let server = members
            .iter()
            .filter_map(|&row| server_child[row])
            .max_by(|&a, &b| service.value(a).cmp(service.value(b)));
        let n = members.len();
        // The latest end among the SERVER attempts before each one: a SERVER attempt
        // starting before it is a hedge.
        let mut served_until: Option<i64> = None;
        for (i, &row) in members.iter().enumerate() {
            let slot = &mut slots[row];
            slot.first = i == 0;
            slot.last = i + 1 == n;
            slot.previous = (i > 0).then(|| members[i - 1]);
            slot.server = server;
            slot.hidden = hidden(row);
            if server_found(row) {
                slot.hedged = served_until.is_some_and(|until| start.value(row) < until);
                served_until = Some(served_until.map_or(end.value(row), |u| u.max(end.value(row))));
            }
            let s = sender[row];
            let last_of_sender = members.get(i + 1).is_none_or(|&next| sender[next] != s);
            if s != row && last_of_sender && matches!(outcome.value(s), "deadline" | "cancelled") {
                slot.seen_as = Some(s);
            }
        }
        members.clear();
        *positional = false;
    };
    let mut traces: Vec<(u128, &[usize])> = groups
        .traces()
        .filter(|rows| !rows.is_empty())
        .map(|rows| (trace_int(trace, rows[0]), rows))
        .collect();
    traces.sort_unstable_by_key(|&(id, _)| id);
    // Each attempt's key read once, not once per comparison (the strings behind it are
    // reached through the call span).
    let mut order = Vec::new();
    for (_, rows) in traces {
        order.clear();
        order.extend(
            rows.iter()
                .filter(|&&r| is_attempt[r])
                .map(|&r| order_of(r)),
        );
        order.sort_unstable();
        let mut previous: Option<(_, usize)> = None;
        for &(run, .., row) in &order {
            let found = previous
                .filter(|&(before_run, _)| before_run == run)
                .and_then(|(_, before)| continues(row, before));
            if found.is_none() {
                flush(&mut members, &mut positional, &mut slots);
                id += 1;
            }
            if matches!(found, Some(Found::Inferred)) {
                slots[row].inferred = true;
            }
            positional |= sender[row] != row || hidden(row) || slots[row].inferred;
            slots[row].id = Some(id);
            members.push(row);
            previous = Some((run, row));
        }
        flush(&mut members, &mut positional, &mut slots);
    }
    slots
}

/// Why an attempt belongs to the call of the attempt before it.
#[derive(Clone, Copy)]
enum Found {
    /// Its own number says it is a retry.
    Numbered,
    /// A SERVER span re-sent below the caller's instrumentation.
    Resent,
    /// An application loop's retry, inferred from its siblings.
    Inferred,
}

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
struct Edges<'a> {
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
struct WholeCall {
    attempts: i64,
    max_attempt: i32,
    start_ns: i64,
    end_ns: i64,
    /// The row of its last attempt.
    last: usize,
}

/// Every logical call's [`WholeCall`], by id (ids are dense from 1): what `logical_calls`
/// reads from each call's first attempt, where it aggregated and joined the attempts of
/// every retried call in SQL (its largest part).
struct WholeCalls {
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
    ) -> WholeCalls {
        let time = |name| column(spans, name).as_primitive::<Int64Type>();
        let (start, end) = (time(col::START_NS), time(col::END_NS));
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
            let seen = calls[row].seen_as.unwrap_or(row);
            let started = start.value(row).min(start.value(sender[row]));
            let slot = slot.get_or_insert(WholeCall {
                attempts: 0,
                max_attempt: calls[row].number,
                start_ns: started,
                end_ns: end.value(seen),
                last: seen,
            });
            slot.attempts += 1;
            slot.max_attempt = slot.max_attempt.max(calls[row].number);
            slot.start_ns = slot.start_ns.min(started);
            slot.end_ns = slot.end_ns.max(end.value(seen));
            if calls[row].last {
                slot.last = seen;
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
fn int_key(index: usize) -> i64 {
    i64::try_from(index).unwrap_or(i64::MAX)
}

/// Row links as Arrow indices (null where there is no row), built once per link and
/// shared by every column gathered through it.
fn indices(rows: impl IntoIterator<Item = Option<usize>>) -> UInt32Array {
    rows.into_iter()
        .map(|i| i.map(|i| u32::try_from(i).unwrap_or(u32::MAX)))
        .collect()
}

/// Rows `indices` of `column` (null where the index is), via Arrow's `take`.
fn gather(column: &ArrayRef, indices: &UInt32Array) -> ArrayRef {
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
struct Links<'a> {
    /// The attempts' rows, in row order.
    attempts: &'a [usize],
    is_call: &'a [bool],
    /// CLIENT spans whose SERVER children are re-sends (call spans of their attempts).
    resends: &'a [bool],
    call_parent: &'a [Option<usize>],
    server_child: &'a [Option<usize>],
    caller_of: &'a [Option<usize>],
    hint_server: &'a [Option<usize>],
    /// The span standing for the caller's side of each attempt (see [`Shape::sender`]).
    sender: &'a [usize],
}

/// The lineage's per-span values, read into `lineage`'s columns for any set of rows: every
/// span's for `lineage`, the attempts' alone for `lineage_attempts`.
struct Values<'a> {
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
fn build(
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
    let taken = indices(attempts.iter().map(|&r| Some(r)));
    let as_sent = linked(&|r| Some(sender[r]));
    let as_seen = linked(&|r| Some(seen(r)));
    // Its anchor is its CLIENT span's too: the budget the call had to fit in, not the call's
    // own (which its SERVER span, a child of the CLIENT span, inherits).
    let senders: Vec<usize> = attempts.iter().map(|&r| sender[r]).collect();
    let mut columns: Vec<ArrayRef> = ATTEMPT_COLUMNS
        .iter()
        .map(|&name| match name {
            col::OPERATION | col::DEADLINE_MS => gather(by_name(name), &as_sent),
            col::OUTCOME | col::END_NS => gather(by_name(name), &as_seen),
            "anchor_deadline_ms" | "anchor_start_ns" => values.column(name, &senders, None),
            _ => values.column(name, attempts, Some(&taken)),
        })
        .collect();
    let previous = linked(&|r| calls[r].previous.map(seen));
    columns.push(gather(by_name(col::OUTCOME), &previous));
    columns.push(gather(by_name(col::END_NS), &previous));
    let whole = WholeCalls::new(spans, attempts, calls, sender);
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
    columns.push(gather(
        by_name(col::OUTCOME),
        &linked(&|r| of_call(r).map(|c| c.last)),
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
    let attempts = match RecordBatch::try_new(ATTEMPT_LINEAGE_SCHEMA.clone(), columns) {
        Ok(batch) => batch,
        Err(e) => unreachable!("attempt columns follow ATTEMPT_LINEAGE_SCHEMA: {e}"),
    };
    timed("lineage: columns: linked", started);
    (lineage, attempts, edges.batch())
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

    /// [`lineage_of`] for spans with malformed attributes.
    fn lineage_of_lenient(spans: Vec<opentelemetry_proto::tonic::trace::v1::Span>) -> RecordBatch {
        let (batch, _) = encode_request(&Conventions::default(), &request(vec![("svc", spans)]));
        lineage(&batch)
    }

    fn bools(batch: &RecordBatch, name: &str) -> Vec<bool> {
        let c: &BooleanArray = batch.column_by_name(name).unwrap().as_boolean();
        (0..c.len()).map(|i| c.value(i)).collect()
    }

    /// Copies of a span spread through interleaved traces, and one span id reused by
    /// another trace: every later copy is repeated, the first stays, and the reuse is not a
    /// copy.
    #[test]
    fn repeated_rows_are_later_copies_within_one_trace() {
        let ids = |values: &[(u8, u8)]| {
            let traces = FixedSizeBinaryArray::try_from_iter(values.iter().map(|(t, _)| [*t; 16]));
            let spans = FixedSizeBinaryArray::try_from_iter(values.iter().map(|(_, s)| [*s; 8]));
            (traces.unwrap(), spans.unwrap())
        };
        // rows:        0       1       2       3       4       5       6       7
        let (traces, spans) = ids(&[
            (1, 1),
            (2, 1),
            (1, 2),
            (1, 1),
            (2, 2),
            (1, 1),
            (2, 1),
            (3, 9),
        ]);
        assert_eq!(repeated_rows(&traces, &spans), vec![3, 5, 6]);
        let (traces, spans) = ids(&[(1, 1), (2, 1), (1, 2)]);
        assert!(repeated_rows(&traces, &spans).is_empty());
    }

    /// Traces interleaved in the batch (files of requests as they came), reusing each
    /// other's span ids: every parent is found in its own trace, wherever its rows are.
    #[test]
    fn parents_are_found_within_their_trace_across_interleaved_rows() {
        let spans = vec![
            span(1, 1, "root", 2, 0, 100, vec![]),
            span(2, 1, "root", 2, 0, 100, vec![]),
            child_of(span(1, 2, "a", 3, 1, 50, vec![]), 1),
            child_of(span(2, 2, "a", 3, 1, 50, vec![]), 1),
            child_of(span(2, 3, "b", 3, 2, 40, vec![]), 2),
            child_of(span(1, 3, "b", 3, 2, 40, vec![]), 2),
            // Its parent is in another batch.
            child_of(span(1, 4, "c", 3, 2, 40, vec![]), 9),
        ];
        let (batch, _) = encode_request(&Conventions::default(), &request(vec![("svc", spans)]));
        let ids = |name: &str| batch.column_by_name(name).unwrap().as_fixed_size_binary();
        let parents = parent_rows(
            &TraceGroups::new(ids(col::TRACE_ID)),
            ids(col::SPAN_ID),
            ids(col::PARENT_SPAN_ID),
        );
        assert_eq!(
            parents,
            vec![None, None, Some(0), Some(1), Some(3), Some(2), None]
        );
    }

    /// An attempt's callee is the service of the SERVER span that answered its call, else
    /// the service its callee hint's SERVER spans most often have in the batch (ties: the
    /// first by name); attempts of one (caller, callee, operation) share one edge, named in
    /// `edge_names`.
    #[test]
    fn hints_resolve_to_their_most_frequent_server_service() {
        let client = |id, start: u64, hint: &str| {
            let attributes = vec![stormglass_model::testing::kv("peer.service", hint)];
            child_of(span(1, id, "call", 3, start, start + 5, attributes), 1)
        };
        let server = |id, parent, start: u64| {
            child_of(
                span(1, id, "serve", 2, start + 1, start + 4, vec![]),
                parent,
            )
        };
        let front = vec![
            span(1, 1, "root", 2, 0, 100, vec![]),
            client(2, 10, "db-host"),
            client(3, 20, "db-host"),
            client(4, 30, "db-host"),
            // Unanswered.
            client(5, 40, "db-host"),
            client(6, 50, "x-host"),
            client(7, 60, "x-host"),
            client(8, 70, "x-host"),
        ];
        let (batch, _) = encode_request(
            &Conventions::default(),
            &request(vec![
                ("front", front),
                ("db", vec![server(12, 2, 10), server(13, 3, 20)]),
                ("cache", vec![server(14, 4, 30)]),
                ("b", vec![server(16, 6, 50)]),
                ("a", vec![server(17, 7, 60)]),
            ]),
        );
        let Lineage {
            attempts, edges, ..
        } = lineage_in_window(&batch, &ClockBounds::new(), 1.0, true, Detail::Query);
        let ids = attempts
            .column_by_name(col::SPAN_ID)
            .unwrap()
            .as_fixed_size_binary();
        let text = |batch: &RecordBatch, name| {
            let column = batch.column_by_name(name).unwrap().as_string::<i32>();
            (0..batch.num_rows())
                .map(|row| column.value(row).to_owned())
                .collect::<Vec<_>>()
        };
        let callee = text(&attempts, "callee");
        let edge = attempts
            .column_by_name("edge")
            .unwrap()
            .as_primitive::<Int64Type>();
        let by_span: HashMap<u8, (&str, i64)> = (0..attempts.num_rows())
            .map(|row| (ids.value(row)[7], (callee[row].as_str(), edge.value(row))))
            .collect();
        for (span, expected) in [
            (2, "db"),
            (3, "db"),
            // Answered by another service than its hint's most frequent one.
            (4, "cache"),
            // Unanswered.
            (5, "db"),
            (6, "b"),
            (7, "a"),
            // Unanswered, its hint's servers tied one to one.
            (8, "a"),
        ] {
            assert_eq!(by_span[&span].0, expected, "span {span}");
        }
        // One edge per (caller, callee, operation), each named once.
        let edge_of = |span: u8| by_span[&span].1;
        assert_eq!(edge_of(2), edge_of(3));
        assert_eq!(edge_of(2), edge_of(5));
        assert_ne!(edge_of(2), edge_of(4));
        assert_eq!(edge_of(7), edge_of(8));
        assert_eq!(edges.num_rows(), 4);
        let named = |span: u8| {
            let row = usize::try_from(edge_of(span)).unwrap();
            (
                text(&edges, "caller")[row].clone(),
                text(&edges, "callee")[row].clone(),
            )
        };
        assert_eq!(named(4), ("front".to_owned(), "cache".to_owned()));
        assert_eq!(named(7), ("front".to_owned(), "a".to_owned()));
        // The root and the SERVER spans are not attempts: no rows of `lineage_attempts`.
        assert!(!by_span.contains_key(&1) && !by_span.contains_key(&12));
    }

    /// Coarse clocks: a first attempt and its retry with the same start time, the retry
    /// with the smaller span id, are one logical call of two attempts, in number order.
    #[test]
    fn tied_starts_order_by_attempt_number() {
        let spans = vec![
            span(1, 1, "root", 2, 0, 100, vec![]),
            child_of(
                span(
                    1,
                    3,
                    "GET",
                    3,
                    5,
                    6,
                    vec![kv_int("http.request.resend_count", 0)],
                ),
                1,
            ),
            child_of(
                span(
                    1,
                    2,
                    "GET",
                    3,
                    5,
                    7,
                    vec![kv_int("http.request.resend_count", 1)],
                ),
                1,
            ),
        ];
        let l = lineage_of(spans);
        let calls = l
            .column_by_name("logical_call_id")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(calls.value(1), calls.value(2), "one logical call");
        assert_eq!(bools(&l, "is_first_attempt")[1..], [true, false]);
    }

    /// An unreadable attempt number (`retry=-1`) is a retry, never a first attempt: it stays
    /// in its call, numbered after the attempt before it, and marks what runs under it.
    #[test]
    fn unreadable_attempt_numbers_are_retries() {
        let spans = vec![
            span(1, 1, "root", 2, 0, 100, vec![]),
            child_of(span(1, 2, "GET", 3, 5, 6, vec![kv_int("retry", 0)]), 1),
            child_of(span(1, 3, "GET", 3, 7, 8, vec![kv_int("retry", -1)]), 1),
            child_of(span(1, 4, "serve", 2, 7, 8, vec![]), 3),
        ];
        let l = lineage_of_lenient(spans);
        let calls = l
            .column_by_name("logical_call_id")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(calls.value(1), calls.value(2), "one logical call");
        assert_eq!(bools(&l, "is_first_attempt")[1..3], [true, false]);
        let attempt = l
            .column_by_name(col::ATTEMPT)
            .unwrap()
            .as_primitive::<Int32Type>();
        assert_eq!((attempt.value(1), attempt.value(2)), (0, 1));
        assert!(bools(&l, "upstream_retry")[3], "work for a retry");
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
