//! Attempts grouped into logical calls: the order, the rules that join an attempt to the
//! one before it (numbers, re-sends, hedges, loops), and each attempt's place in its call.

use std::collections::HashMap;

use arrow::array::{Array, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{Int32Type, Int64Type};
use stormglass_model::hash::KeyedHash;
use stormglass_model::schema as col;

use super::RetryRules;
use super::races::{GaveUp, RaceInput, settle};
use super::rows::{Kind, TraceGroups, column, span_int, trace_int};
use stormglass_model::Outcome;

/// SQL's ORDER BY ... ASC puts nulls last: `None` sorts after every value.
pub(super) fn nulls_last<T: Copy + Default>(v: Option<T>) -> (bool, T) {
    match v {
        Some(v) => (false, v),
        None => (true, T::default()),
    }
}

/// Per span: its logical call and its place in it (attempts only).
#[derive(Clone, Copy, Default)]
pub(super) struct CallSlot {
    pub(super) id: Option<i64>,
    pub(super) first: bool,
    pub(super) last: bool,
    pub(super) previous: Option<usize>,
    /// The attempt number: the span's own, 0 when it has none, and for an unreadable one
    /// the number after the attempt before it (1 when none is). In a call with attempts
    /// found without numbers (re-sends, hedges, inferred), the position in the call.
    pub(super) number: i32,
    /// The SERVER span (under any attempt of the call) whose service sorts last.
    pub(super) server: Option<usize>,
    /// Read from a SERVER span that carries no number of its own: a re-send below its
    /// caller's CLIENT span, or a call from a caller that sent no span for it.
    pub(super) hidden: bool,
    /// A SERVER attempt that started before an earlier attempt of its call had ended, read
    /// as a hedge (see [`super::races`]).
    pub(super) hedged: bool,
    /// A SERVER attempt that started before an earlier attempt of its call had ended, by
    /// more than the overlap tolerance: hedged, or a retry after a per-try timeout.
    pub(super) overlapped: bool,
    /// The SERVER attempt whose answer the caller took, where its call's attempts raced.
    pub(super) decides: bool,
    /// An attempt its caller stopped waiting for while it ran (see [`super::races`]).
    pub(super) gave_up: Option<GaveUp>,
    /// Joined to the attempt before it by inference (an application's retry loop).
    pub(super) inferred: bool,
    /// The row whose outcome and end the caller saw, where it is not the attempt's own: the
    /// re-sending CLIENT span, for its last SERVER child, when the client gave up on it
    /// (deadline, cancelled) and the server may have gone on.
    pub(super) seen_as: Option<usize>,
}

/// The structure [`logical_calls`] groups: per row, what [`lineage_in_window`] found.
///
/// [`lineage_in_window`]: super::lineage_in_window
pub(super) struct Shape<'a> {
    pub(super) kinds: &'a [Kind],
    pub(super) parent_rows: &'a [Option<usize>],
    pub(super) is_attempt: &'a [bool],
    pub(super) call_parent: &'a [Option<usize>],
    pub(super) server_child: &'a [Option<usize>],
    /// The span that stands for the caller's side of each attempt: the re-sending CLIENT
    /// span for its SERVER children, else the attempt itself. Calls are grouped and ordered
    /// by it, so a CLIENT span's re-sends stay together and in its place among its siblings.
    pub(super) sender: &'a [usize],
    /// Per row: nanoseconds that bring its times into its parent's clock.
    pub(super) to_parent: &'a [i64],
}

/// An attempt's callee hint: its own, else its call span's (SQL's
/// `COALESCE(callee_hint, call_callee_hint)`).
pub(super) fn callee_hint<'a>(
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
pub(super) fn hint_servers(
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
pub(super) fn logical_calls(
    spans: &RecordBatch,
    groups: &TraceGroups,
    shape: &Shape,
    rules: RetryRules,
) -> Vec<CallSlot> {
    let overlap_ns = (rules.overlap_tolerance_ms.max(0.0) * 1e6) as i64;
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
        to_parent,
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
        let loop_retry = rules.infer_loops
            && s != sb
            && !attempt.is_valid(s)
            && kinds[s] == Kind::Client
            && kinds[sb] == Kind::Client
            && start.value(s) >= end.value(sb)
            && Outcome::from_class(outcome.value(sb)).is_some_and(Outcome::is_retried)
            && same_target(s, sb);
        loop_retry.then_some(Found::Inferred)
    };

    let mut slots = vec![CallSlot::default(); rows];
    let mut id = 0i64;
    // The call being gathered: its attempts in order, and whether any was found without
    // a number (then attempts are numbered by position).
    let mut members: Vec<usize> = Vec::new();
    let mut positional = false;
    let mut raced: Vec<Vec<usize>> = Vec::new();
    let mut flush = |members: &mut Vec<usize>, positional: &mut bool, slots: &mut Vec<CallSlot>| {
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
        for (i, &row) in members.iter().enumerate() {
            let slot = &mut slots[row];
            slot.first = i == 0;
            slot.last = i + 1 == n;
            slot.previous = (i > 0).then(|| members[i - 1]);
            slot.server = server;
            slot.hidden = hidden(row);
            let s = sender[row];
            let last_of_sender = members.get(i + 1).is_none_or(|&next| sender[next] != s);
            if s != row && last_of_sender && matches!(outcome.value(s), "deadline" | "cancelled") {
                slot.seen_as = Some(s);
            }
        }
        // Calls whose SERVER attempts may have raced, read once every call is known.
        let servers: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&r| server_found(r))
            .collect();
        if servers.len() > 1 {
            raced.push(servers);
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
    let input = RaceInput {
        kinds,
        sender,
        to_parent,
        start,
        end,
        outcome,
        tolerance_ns: overlap_ns,
    };
    let raced: Vec<&[usize]> = raced.iter().map(Vec::as_slice).collect();
    settle(&input, &raced, rules.overlapping, &mut slots);
    slots
}

/// Why an attempt belongs to the call of the attempt before it.
#[derive(Clone, Copy)]
pub(super) enum Found {
    /// Its own number says it is a retry.
    Numbered,
    /// A SERVER span re-sent below the caller's instrumentation.
    Resent,
    /// An application loop's retry, inferred from its siblings.
    Inferred,
}
