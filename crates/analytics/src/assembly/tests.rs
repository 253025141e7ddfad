use std::time::{Duration, Instant};

use arrow::array::AsArray;
use stormglass_model::testing::{request, span};
use stormglass_model::{Conventions, encode_request};

use super::*;
use crate::sink::MemorySink;

const SERVER: i32 = 2;

fn batch(spans: &[(u8, u8)]) -> RecordBatch {
    let spans = spans
        .iter()
        .map(|&(trace, id)| span(trace, id, "op", SERVER, 0, 1, vec![]))
        .collect();
    encode_request(&Conventions::default(), &request(vec![("svc", spans)])).0
}

fn assembly(config: AssemblyConfig) -> (Assembly, Arc<MemorySink>) {
    let sink = Arc::new(MemorySink::default());
    let assembly = Assembly::new(config, sink.clone(), AssemblyMetrics::unregistered());
    (assembly, sink)
}

fn config() -> AssemblyConfig {
    AssemblyConfig {
        idle: Duration::from_secs(10),
        max_age: Duration::from_secs(60),
        max_spans: 100,
        late_memory: Duration::from_secs(60),
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
    assert!(a.lock().batches.is_empty());
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
}

/// Released ids are forgotten after two rotations of late_memory.
#[test]
fn late_memory_is_bounded() {
    let (a, _sink) = assembly(config());
    let t0 = Instant::now();
    a.accept_at(batch(&[(1, 1)]), t0).unwrap();
    a.release_due(t0 + Duration::from_secs(10));
    a.accept_at(batch(&[(9, 1)]), t0 + Duration::from_secs(61))
        .unwrap();
    a.accept_at(batch(&[(9, 2)]), t0 + Duration::from_secs(122))
        .unwrap();
    a.accept_at(batch(&[(1, 2)]), t0 + Duration::from_secs(123))
        .unwrap();
    assert_eq!(a.open(), (3, 2), "trace 1 reopens once its id is forgotten");
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

/// A batch partly released stays stored until its last live row goes, and its Arrow
/// memory stays counted until then.
#[test]
fn shared_batch_freed_with_its_last_row() {
    let (a, _sink) = assembly(config());
    let t0 = Instant::now();
    let (first, second) = (batch(&[(1, 1), (2, 1)]), batch(&[(2, 2)]));
    let both = first.get_array_memory_size() + second.get_array_memory_size();
    a.accept_at(first, t0).unwrap();
    a.accept_at(second, t0 + Duration::from_secs(8)).unwrap();
    assert_eq!(a.lock().batch_bytes, both);
    a.release_due(t0 + Duration::from_secs(10));
    assert_eq!(
        a.lock().batches.len(),
        2,
        "trace 2 still lives in the first batch"
    );
    assert_eq!(a.lock().batch_bytes, both);
    assert!(a.lock().memory_bytes() > both);
    a.release_due(t0 + Duration::from_secs(18));
    assert!(a.lock().batches.is_empty());
    assert_eq!(a.lock().batch_bytes, 0);
}

/// The config rejects impossible combinations, naming each key.
#[test]
fn validate_names_every_problem() {
    let bad = AssemblyConfig {
        idle: Duration::ZERO,
        max_age: Duration::ZERO,
        max_spans: 0,
        late_memory: Duration::from_secs(1),
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
