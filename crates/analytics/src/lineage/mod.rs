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
//! | `logical_attempts`, `logical_max_attempt`, `logical_start_ns`, `logical_end_ns`, `logical_final_outcome`, `logical_first_key_hash` | its logical call's: attempts, highest attempt number, first start, last end (root clock), the last attempt's outcome, and the first attempt's own idempotency key hash |
//! | `caller` | the service that made the attempt: its own, or for a SERVER attempt its parent's (`unknown` without a parent) |
//! | `callee` | the service of a SERVER span under any attempt of the call (the greatest, if several), else `hint_server` below, else the callee hint (the attempt's own, else its call span's), else `unknown` |
//! | `edge`, `upstream_edge` | the attempt's (caller, callee, operation) as an integer key of `edge_names` (one row per edge: edge, caller, callee, operation), and its upstream attempt's when that is an attempt: the partials group and join on these instead of three strings |
//! | `call_anchor_deadline_ms`, `call_anchor_start_ns` | the anchor of the parent call span (the budget the whole call had to fit in), when the parent is one |
//! | `call_parent_span_id`, `call_attempt`, `call_deadline_ms`, `call_idempotent`, `call_has_idempotency_key`, `call_is_write`, `call_idempotency_key_hash` | those columns of the parent, when it is a call span (else null) |
//! | `server_span_id`, `server_service`, `server_start_ns`, `server_end_ns`, `server_outcome`, `server_pending`, `server_ctx_cancelled`, `server_deadline_ms`, `server_idempotency_hit`, `server_duplicate`, `server_response_code` | those columns of the attempt's first SERVER child by start (else null) |
//! | `numbered` | the span carries an attempt number of its own |
//! | `hidden` | a SERVER attempt without a number of its own (a re-send, or an uninstrumented caller's call) |
//! | `hedged` | a SERVER attempt started before an earlier attempt of its call had ended, read as a hedge (see [`races`]) |
//! | `overlapped` | a SERVER attempt started before an earlier attempt of its call had ended, by more than `retries.overlap_tolerance_ms`: hedged, or (not hedged) a retry after a per-try timeout |
//! | `inferred` | joined to its call as an application loop's retry (see below) |
//! | `other_instance` | the attempt's SERVER span ran on another instance (`instance`) than the previous attempt's (null on first attempts, or where either is unknown) |
//! | `overlapping` | the attempt's SERVER span started before the previous attempt's SERVER span ended, by more than `retries.overlap_tolerance_ms`: the callee was still working on the call when it came again |
//! | `prev_retry_after_ms` | the wait the previous attempt's answer asked for (`retry_after_ms` of its span, else of its SERVER child; -1: do not retry) |
//! | `retry_after_violation` | a retry (not a hedge) started before that wait elapsed, from the previous attempt's end as its caller saw it, by more than `retries.overlap_tolerance_ms`, or at all after a pushback saying not to retry |
//! | `unknown_result_ms`, `unknown_unresolved` | a keyed write its caller gave up on (`deadline`, `cancelled`): how long (ms, from its end) until a later span of its trace with the same key answered (`ok`, or a duplicate), or that none in its trace did (see [`unknowns`]) |
//! | `rerun_write` | the first attempt of a write call made for a retry of an upstream call, repeating (same edge) a write made for an earlier attempt of that call without the earlier write's idempotency key (see [`reruns`]) |
//!
//! A SERVER child of a re-sending CLIENT span takes the CLIENT span's `operation`,
//! `deadline_ms` and `anchor_*` (the call its caller made, and the budget that call had to
//! fit in) and is named after it in `edge`; its outcome and
//! end are its own, except the last one's when the client gave up (deadline, cancelled):
//! then they are the CLIENT span's, the outcome and end the caller saw, so a server that
//! went on is an orphan as it would be under a single attempt; and except an attempt the
//! caller abandoned while it ran ([`races`]): `deadline` or `cancelled`, ending when the
//! caller let go of it. `outcome`, `end_ns`, `prev_*` and `logical_final_outcome` (the
//! attempt the call took its answer from, where attempts raced) read them so.
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
//!
//! Along its seams: [`schema`] (table names and schemas), `rows` (span kinds, traces
//! grouped by id, parent rows), `skew` (clock bounds and offsets), `calls` (logical calls),
//! [`races`] (re-sent attempts read together: answered, abandoned, hedged), [`reruns`] (writes
//! re-run under an upstream retry), [`unknowns`] (how long a given-up write's result stays
//! unknown), `columns` (edges
//! and the output batches); this file walks the ancestors and wires them. Each names what
//! it uses from the others, so a reader sees where a name comes from.

mod calls;
mod columns;
mod races;
mod reruns;
mod rows;
pub mod schema;
mod skew;
mod unknowns;

pub use races::Overlapping;
pub(crate) use rows::{TraceGroups, repeated_rows};
pub use schema::*;
pub use skew::clock_bounds;

use std::sync::Arc;

use calls::{Shape, hint_servers, logical_calls};
use columns::{Links, build};
use rows::{Kind, column, kinds, parent_rows};
use skew::{clock_offsets, in_root_clock};

use crate::clock::ClockBounds;
use crate::table::timed;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type};
use stormglass_model::schema as col;

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
    /// The nearest ancestor (not the span itself) that is an attempt of a call with more
    /// than one: the retried call whose attempts the span's work repeats (see [`reruns`]).
    retried_attempt: Option<usize>,
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
        retried_attempt: None,
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
    lineage_in_window(spans, &[], 1.0, RetryRules::default(), Detail::Query).batch
}

/// How attempts that carry no number are read (`retries.*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryRules {
    /// Unnumbered sibling CLIENT spans after a retryable failure are one call's attempts (an
    /// application's retry loop).
    pub infer_loops: bool,
    /// A SERVER attempt starting at most this long (ms) before the one before it ended
    /// follows it, and is no hedge: a proxy re-sends as soon as it has a 503's status line,
    /// while the backend's span closes once the body is written.
    pub overlap_tolerance_ms: f64,
    /// How a SERVER attempt sent while an earlier one still ran is read: a hedge, or a retry
    /// after a per-try timeout (see [`races`]).
    pub overlapping: Overlapping,
}

impl Default for RetryRules {
    fn default() -> Self {
        RetryRules {
            infer_loops: true,
            overlap_tolerance_ms: 5.0,
            overlapping: Overlapping::Auto,
        }
    }
}

/// Compute the lineage of one chunk of a window whose earlier chunks gave the clock bounds
/// `prior` (parts, intersected); clocks agreeing within `tolerance_ms` are not corrected;
/// `rules` say how unnumbered attempts join calls (see the module docs). `lineage` has
/// `detail`'s columns.
pub fn lineage_in_window(
    spans: &RecordBatch,
    prior: &[Arc<ClockBounds>],
    tolerance_ms: f64,
    rules: RetryRules,
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
    let to_parent: Vec<i64> = (0..rows)
        .map(|row| parent_of(row).map_or(0, |p| edge_offset(p, row)))
        .collect();
    let shape = Shape {
        kinds: &kinds,
        parent_rows: &parent_rows,
        is_attempt: &is_attempt,
        call_parent: &call_parent,
        server_child: &server_child,
        sender: &sender,
        to_parent: &to_parent,
    };
    let calls = logical_calls(spans, &groups, &shape, rules);
    // A retry that reached its callee while the attempt before was still running there: its
    // SERVER span started before the previous attempt's ended, by more than the overlap
    // tolerance (both the callee's spans, so one clock).
    let tolerance_ns = (rules.overlap_tolerance_ms.max(0.0) * 1e6) as i64;
    let end = column(col::END_NS).as_primitive::<Int64Type>();
    let overlapping: Vec<bool> = (0..rows)
        .map(|r| {
            let (Some(p), Some(s)) = (calls[r].previous, server_child[r]) else {
                return false;
            };
            server_child[p].is_some_and(|sp| {
                sp != s
                    && service.value(s) == service.value(sp)
                    && start.value(s) < end.value(sp) - tolerance_ns
            })
        })
        .collect();
    timed("lineage: calls", started);

    // A call span is not an attempt: the attempts under it work for the call's own upstream
    // attempt, so the call graph (storm potential) runs through it. An attempt's number is
    // the one its call gives it (re-sends and inferred attempts carry none of their own).
    let derive = |row: usize, p: usize, above: &Node| Node {
        // `p` is `row`'s parent: the clock offset to it was looked up once, in `to_parent`.
        offset_ns: above.offset_ns + to_parent[row],
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
        retried_attempt: if is_attempt[p]
            && calls[p].id.is_some()
            && !(calls[p].first && calls[p].last)
        {
            Some(p)
        } else {
            above.retried_attempt
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
        overlapping: &overlapping,
        overlap_tolerance_ms: rules.overlap_tolerance_ms,
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

#[cfg(test)]
mod tests;
