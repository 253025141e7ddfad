//! The lineage on hand-built spans.

use std::collections::HashMap;

use arrow::array::{AsArray, BooleanArray, FixedSizeBinaryArray};
use arrow::datatypes::{Float64Type, Int32Type};
use stormglass_model::{Conventions, encode_request};
use stormglass_testkit::otlp::{child_of, kv_int, request, span, span_id};

use super::*;

fn lineage_of(spans: Vec<opentelemetry_proto::tonic::trace::v1::Span>) -> RecordBatch {
    let (batch, report) = encode_request(&Conventions::default(), &request(vec![("svc", spans)]));
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
        let attributes = vec![stormglass_testkit::otlp::kv("peer.service", hint)];
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
    } = lineage_in_window(&batch, &[], 1.0, RetryRules::default(), Detail::Query);
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
