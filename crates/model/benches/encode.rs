//! OTLP -> Arrow: what every accepted span costs before assembly. Three steps on one
//! 600-span export request of the default synthetic shape (~8.6 spans per trace, SDK
//! attributes): prost decoding alone (the floor any OTLP receiver pays), the Arrow encoding
//! of the decoded request, and both, as the receivers run them.
//!
//! Run: `cargo bench -p stormglass-model --bench encode`.

#![allow(clippy::expect_used)] // a bench binary: failing loudly is the point

// The allocator the `stormglass` binary runs with, so the figures are the collector's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use stormglass_model::synth::{Generator, Shape};
use stormglass_model::{Conventions, encode_request};

fn otlp_to_arrow(c: &mut Criterion) {
    let request = Generator::new(Shape::default(), 1_764_000_000_000_000_000).request(600);
    let bytes = request.encode_to_vec();
    let spans = encode_request(&Conventions::default(), &request)
        .0
        .num_rows();
    let conventions = Conventions::default();
    let mut group = c.benchmark_group("otlp_to_arrow");
    group.throughput(Throughput::Elements(spans as u64));
    group.bench_function("prost_decode", |b| {
        b.iter(|| ExportTraceServiceRequest::decode(&bytes[..]).expect("decodes"))
    });
    group.bench_function("arrow_encode", |b| {
        b.iter(|| encode_request(&conventions, &request))
    });
    group.bench_function("decode_and_encode", |b| {
        b.iter(|| {
            let request = ExportTraceServiceRequest::decode(&bytes[..]).expect("decodes");
            encode_request(&conventions, &request)
        })
    });
    group.finish();
}

criterion_group!(benches, otlp_to_arrow);
criterion_main!(benches);
