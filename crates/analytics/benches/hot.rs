//! The analysis's hot functions on 100 k spans of the default synthetic shape: grouping
//! attempts into logical calls (the Rust lineage pass: parents, attempt numbers, logical
//! call ids, first/last attempts) and one interval's aggregation (every derived table and
//! partial aggregate in DataFusion, lineage included).
//!
//! Run: `cargo bench -p stormglass-analytics --bench hot`. `interval` prints the same for
//! 1 M spans as a fraction of the analysis interval.

#![allow(clippy::expect_used)] // a bench binary: failing loudly is the point

// The allocator the `stormglass` binary runs with, so the figures are the collector's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Duration;

use arrow::array::RecordBatch;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use stormglass_analytics::Engine;
use stormglass_analytics::lineage::lineage;
use stormglass_model::synth::{Generator, Shape};
use stormglass_model::{Conventions, encode_request};

const SPANS: usize = 100_000;

fn spans() -> RecordBatch {
    let request = Generator::new(Shape::default(), 1_764_000_000_000_000_000).request(SPANS);
    encode_request(&Conventions::default(), &request).0
}

fn hot(c: &mut Criterion) {
    let spans = spans();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let engine = Engine::default();
    let mut group = c.benchmark_group("analysis");
    group
        .throughput(Throughput::Elements(spans.num_rows() as u64))
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("attempt_grouping", |b| b.iter(|| lineage(&spans)));
    group.bench_function("interval_aggregation", |b| {
        b.iter(|| {
            runtime
                .block_on(engine.analyse(spans.clone()))
                .expect("analysis")
        })
    });
    group.finish();
}

criterion_group!(benches, hot);
criterion_main!(benches);
