use std::time::{Duration, Instant};

use arrow::array::AsArray;
use stormglass_model::{Conventions, encode_request};
use stormglass_testkit::otlp::{request, span};

use super::*;
use crate::sink::MemorySink;
use stormglass_model::hold;

const SERVER: i32 = 2;

fn batch(spans: &[(u8, u8)]) -> RecordBatch {
    let spans = spans
        .iter()
        .map(|&(trace, id)| span(trace, id, "op", SERVER, 0, 1, vec![]))
        .collect();
    encode_request(&Conventions::default(), &request(vec![("svc", spans)])).0
}

/// One span of a trace numbered beyond `batch`'s 255.
fn batch_of_trace(trace: u32) -> RecordBatch {
    let mut s = span(0, 1, "op", SERVER, 0, 1, vec![]);
    s.trace_id[12..].copy_from_slice(&trace.to_be_bytes());
    encode_request(&Conventions::default(), &request(vec![("svc", vec![s])])).0
}

fn assembly(config: AssemblyConfig) -> (Assembly, Arc<MemorySink>) {
    assembly_with(config, MemoryBudget::unregistered(1 << 30))
}

fn assembly_with(config: AssemblyConfig, budget: MemoryBudget) -> (Assembly, Arc<MemorySink>) {
    let sink = Arc::new(MemorySink::default());
    let assembly = Assembly::new(
        config,
        sink.clone(),
        AssemblyMetrics::unregistered(),
        budget,
    );
    (assembly, sink)
}

fn config() -> AssemblyConfig {
    AssemblyConfig {
        idle: Duration::from_secs(10),
        max_age: Duration::from_secs(60),
        max_spans: 100,
        released_ids: 0,
    }
}

/// (trace last byte, span last byte) of every row, in order.
fn rows(batch: &RecordBatch) -> Vec<(u8, u8)> {
    let t = batch
        .column_by_name(schema::TRACE_ID)
        .unwrap()
        .as_fixed_size_binary();
    let s = batch
        .column_by_name(schema::SPAN_ID)
        .unwrap()
        .as_fixed_size_binary();
    (0..batch.num_rows())
        .map(|i| (t.value(i)[15], s.value(i)[7]))
        .collect()
}

/// Spans of one trace spread over several batches come out together once the trace is idle,
/// and not before; its batches are freed.
#[test]
fn releases_whole_trace_after_idle() {
    let (a, sink) = assembly(config());
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1), (2, 1)]), t0).unwrap();
    a.accept_at(batch(&[(1, 2), (2, 2)]), t0 + Duration::from_secs(5))
        .unwrap();
    assert_eq!(a.open(), (4, 2));

    assert_eq!(a.release_due(t0 + Duration::from_secs(14)), 0);
    assert_eq!(a.release_due(t0 + Duration::from_secs(15)), 2);
    let released = sink.take();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].traces, 2);
    assert_eq!(
        rows(&released[0].batch),
        vec![(1, 1), (1, 2), (2, 1), (2, 2)]
    );
    assert_eq!(a.open(), (0, 0));
    assert_eq!(a.memory_bytes(), 0, "both batches were freed");
}

/// A trace that never goes quiet is released at max_age.
#[test]
fn busy_trace_is_released_at_max_age() {
    let (a, sink) = assembly(config());
    let t0 = Instant::now();
    for s in 0..13u8 {
        let now = t0 + Duration::from_secs(5 * u64::from(s));
        a.accept_at(batch(&[(7, s + 1)]), now).unwrap();
        a.release_due(now);
    }
    let released = sink.take();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].batch.num_rows(), 13);
}

/// Spans for a released trace are late: counted, not reopened; accounting holds.
#[test]
fn late_spans_are_counted_not_reopened() {
    let registry = prometheus::Registry::new();
    let sink = Arc::new(MemorySink::default());
    let a = Assembly::new(
        config(),
        sink.clone(),
        AssemblyMetrics::register(&registry).unwrap(),
        MemoryBudget::unregistered(1 << 30),
    );
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1)]), t0).unwrap();
    a.release_due(t0 + Duration::from_secs(10));
    a.accept_at(batch(&[(1, 2), (3, 1)]), t0 + Duration::from_secs(11))
        .unwrap();
    assert_eq!(a.open(), (1, 1));
    let late = registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "stormglass_assembly_late_spans_total")
        .unwrap();
    assert_eq!(late.get_metric()[0].get_counter().get_value(), 1.0);
    // accepted (3) = released (1) + late (1) + open (1)
    assert_eq!(sink.take()[0].batch.num_rows(), 1);
    // The late span is a SERVER span: handed over for its service's latency.
    let late_servers = sink.take_late_servers();
    assert_eq!(rows(&late_servers[0]), vec![(1, 2)]);
}

/// Released ids are remembered however long ago their trace left (a span 10 minutes late
/// is still late, not a new trace); memory stays bounded: with room for 64 ids (2 per
/// generation and shard), releasing a thousand more traces forgets the first.
#[test]
fn released_ids_bounded_by_count_not_time() {
    let (a, _sink) = assembly(config());
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1)]), t0).unwrap();
    a.release_due(t0 + Duration::from_secs(10));
    a.accept_at(batch(&[(1, 2)]), t0 + Duration::from_secs(600))
        .unwrap();
    assert_eq!(a.open(), (0, 0), "still late after 10 minutes");

    let (a, _sink) = assembly(AssemblyConfig {
        released_ids: 64,
        max_spans: 10_000,
        ..config()
    });
    a.accept_at(batch(&[(1, 1)]), t0).unwrap();
    a.release_due(t0 + Duration::from_secs(10));
    for t in 0..1000u32 {
        a.accept_at(batch_of_trace(1000 + t), t0 + Duration::from_secs(20))
            .unwrap();
    }
    a.release_due(t0 + Duration::from_secs(30));
    a.accept_at(batch(&[(1, 2)]), t0 + Duration::from_secs(40))
        .unwrap();
    assert_eq!(a.open(), (1, 1), "trace 1 reopens once its id is forgotten");
}

/// A batch that would cross max_spans is refused whole and retryably; nothing is kept.
#[test]
fn over_the_bound_refuses_whole_batch() {
    let (a, _sink) = assembly(AssemblyConfig {
        max_spans: 3,
        ..config()
    });
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1), (1, 2)]), t0).unwrap();
    let full = a.accept_at(batch(&[(2, 1), (2, 2)]), t0).unwrap_err();
    assert_eq!(full.retry_after, Duration::from_secs(10));
    assert_eq!(full.limit, Overload::Spans);
    assert_eq!(a.open(), (2, 1));
    a.accept_at(batch(&[(2, 1)]), t0).unwrap();
    assert!(!a.has_room());
}

/// Shutdown releases every open trace, however fresh.
#[test]
fn release_all_empties_assembly() {
    let (a, sink) = assembly(config());
    a.accept_at(batch(&[(1, 1), (2, 1), (3, 1)]), Instant::now())
        .unwrap();
    assert_eq!(a.release_all(), 3);
    assert_eq!(sink.take()[0].batch.num_rows(), 3);
    assert_eq!(a.open(), (0, 0));
}

/// A batch partly released stays stored until its last live row goes, and its memory
/// stays counted (in assembly and in the budget) until then.
#[test]
fn shared_batch_freed_with_its_last_row() {
    let budget = MemoryBudget::unregistered(1 << 30);
    let (a, sink) = assembly_with(config(), budget.clone());
    let t0 = Instant::now();
    let (first, second) = (hold(&batch(&[(1, 1), (2, 1)])), hold(&batch(&[(2, 2)])));
    let both = first.get_array_memory_size() + second.get_array_memory_size();
    a.accept_at(first, t0).unwrap();
    a.accept_at(second, t0 + Duration::from_secs(8)).unwrap();
    assert_eq!(a.held_bytes.load(Ordering::Relaxed), both);
    assert_eq!(budget.used(), both + 3 * INDEX_BYTES_PER_SPAN);
    a.release_due(t0 + Duration::from_secs(10));
    assert_eq!(
        a.held_bytes.load(Ordering::Relaxed),
        both,
        "trace 2 still lives in the first batch"
    );
    drop(sink.take());
    a.release_due(t0 + Duration::from_secs(18));
    assert_eq!(a.held_bytes.load(Ordering::Relaxed), 0);
    drop(sink.take());
    assert_eq!(
        budget.used(),
        0,
        "released batches return their reservation when dropped"
    );
}

/// A batch that would cross the memory budget is refused whole and retryably, and
/// counted nowhere as held.
#[test]
fn over_the_memory_budget_refuses_whole_batch() {
    let one = hold(&batch(&[(1, 1), (1, 2)])).get_array_memory_size() + 2 * INDEX_BYTES_PER_SPAN;
    // Room for one such batch in the admission share (three quarters), not two.
    let budget = MemoryBudget::unregistered(one * 4 / 3 + 8);
    let (a, _sink) = assembly_with(config(), budget.clone());
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1), (1, 2)]), t0).unwrap();
    let full = a.accept_at(batch(&[(2, 1), (2, 2)]), t0).unwrap_err();
    assert_eq!(full.limit, Overload::Memory);
    assert_eq!(a.open(), (2, 1));
    assert!(!a.has_room(), "refusing: /readyz says not ready");
    a.release_all();
    assert_eq!(a.open(), (0, 0));
}

/// One long-lived trace in a big batch does not keep the batch's other rows: once the
/// others are released, its rows move to a small batch and the big one is freed.
#[test]
fn long_trace_does_not_pin_its_neighbours() {
    let (a, sink) = assembly(AssemblyConfig {
        max_spans: 10_000,
        ..config()
    });
    let t0 = Instant::now();
    let mut spans: Vec<(u8, u8)> = (0..250u8).map(|t| (t, 1)).collect();
    spans.extend((0..250u8).map(|t| (t, 2)));
    spans.extend((0..250u8).map(|t| (t, 3)));
    let big = hold(&batch(&spans)).get_array_memory_size();
    assert!(
        big >= COMPACT_MIN_BYTES,
        "{big} bytes is big enough to compact"
    );
    a.accept_at(batch(&spans), t0).unwrap();
    // Trace 7 stays busy; every other trace goes idle.
    a.accept_at(batch(&[(7, 9)]), t0 + Duration::from_secs(9))
        .unwrap();
    a.release_due(t0 + Duration::from_secs(10));
    drop(sink.take());
    assert_eq!(a.open(), (4, 1));
    let held = a.held_bytes.load(Ordering::Relaxed);
    assert!(held * 5 < big, "held {held} bytes of a {big}-byte batch");
    a.release_due(t0 + Duration::from_secs(19));
    let released = sink.take();
    assert_eq!(
        rows(&released[0].batch),
        vec![(7, 1), (7, 2), (7, 3), (7, 9)]
    );
}

/// Releases go to the sink in chunks bounded in bytes, each holding whole traces.
#[test]
fn releases_are_chunked_by_bytes() {
    let (mut a, sink) = assembly(AssemblyConfig {
        max_spans: 10_000,
        ..config()
    });
    a.chunk_bytes = 1;
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1), (2, 1), (3, 1), (1, 2)]), t0)
        .unwrap();
    assert_eq!(a.release_due(t0 + Duration::from_secs(10)), 3);
    let chunks: Vec<Vec<(u8, u8)>> = sink.take().iter().map(|r| rows(&r.batch)).collect();
    assert_eq!(
        chunks,
        vec![vec![(1, 1), (1, 2)], vec![(2, 1)], vec![(3, 1)]]
    );
}

/// The config rejects impossible combinations, naming each key.
#[test]
fn validate_names_every_problem() {
    let bad = AssemblyConfig {
        idle: Duration::ZERO,
        max_age: Duration::ZERO,
        max_spans: 0,
        released_ids: 0,
    };
    let keys: Vec<String> = bad
        .validate("assembly")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, vec!["assembly.idle", "assembly.max_spans"]);
    let bad = AssemblyConfig {
        max_age: Duration::from_secs(1),
        ..config()
    };
    assert_eq!(bad.validate("assembly")[0].0, "assembly.max_age");
}

/// A trace that grows to the size bound is released at the next round, whatever its age,
/// and spans arriving for it afterwards are late.
#[test]
fn oversized_trace_is_released_early() {
    let (mut a, sink) = assembly(AssemblyConfig {
        max_spans: 10_000,
        ..config()
    });
    // Trace 1 holds three of the four rows: over half the batch.
    a.max_trace_bytes = hold(&batch(&[(1, 1), (1, 2), (1, 3), (2, 1)])).get_array_memory_size() / 2;
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1), (1, 2), (1, 3), (2, 1)]), t0)
        .unwrap();
    assert_eq!(a.release_due(t0 + Duration::from_secs(1)), 1);
    assert_eq!(rows(&sink.take()[0].batch), vec![(1, 1), (1, 2), (1, 3)]);
    a.accept_at(batch(&[(1, 4)]), t0 + Duration::from_secs(2))
        .unwrap();
    assert_eq!(
        a.open(),
        (1, 1),
        "trace 2 stays; the late span of trace 1 is not held"
    );
}

/// A span sent twice (an exporter's retry, a re-sent batch) is held once, whether the
/// copies come in one batch or two, in a short trace or a long one; duplicates are counted
/// and the accounting identity holds.
#[test]
fn duplicate_spans_are_kept_once() {
    let registry = prometheus::Registry::new();
    let sink = Arc::new(MemorySink::default());
    let a = Assembly::new(
        AssemblyConfig {
            max_spans: 10_000,
            ..config()
        },
        sink.clone(),
        AssemblyMetrics::register(&registry).unwrap(),
        MemoryBudget::unregistered(1 << 30),
    );
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1), (1, 2), (1, 1)]), t0).unwrap();
    a.accept_at(batch(&[(1, 2), (1, 3)]), t0).unwrap();
    // A long trace: past the scan limit, duplicates are found through its id set.
    let long: Vec<(u8, u8)> = (1..=100u8).map(|s| (2, s)).collect();
    a.accept_at(batch(&long), t0).unwrap();
    a.accept_at(batch(&long[40..60]), t0).unwrap();
    assert_eq!(a.open(), (103, 2));
    a.release_all();
    let released: usize = sink.take().iter().map(|r| r.batch.num_rows()).sum();
    let duplicates = registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "stormglass_assembly_duplicate_spans_total")
        .unwrap()
        .get_metric()[0]
        .get_counter()
        .get_value();
    assert_eq!(duplicates, 22.0);
    // accepted (5 + 120) = released (103) + duplicates (22)
    assert_eq!(released + duplicates as usize, 125);
}
