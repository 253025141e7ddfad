//! OTLP -> Arrow: what every accepted span costs before assembly. Four steps on one
//! 600-span export request of the default synthetic shape (~8.6 spans per trace, SDK
//! attributes): prost decoding into `opentelemetry_proto`'s types (the floor any OTLP
//! receiver pays), decoding into stormglass's lean messages ([`stormglass_model::wire`],
//! what the receivers run), the lean Arrow encoding of a decoded request, and both, as the
//! live path runs them.
//!
//! Run: `cargo bench -p stormglass-model --bench encode`.

#![allow(clippy::expect_used)] // a bench binary: failing loudly is the point

// The allocator the `stormglass` binary runs with, so the figures are the collector's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use stormglass_model::synth::{Generator, Shape};
use stormglass_model::{Conventions, encode_lean, wire};

fn otlp_to_arrow(c: &mut Criterion) {
    let request = Generator::new(Shape::default(), 1_764_000_000_000_000_000).request(600);
    // As tonic holds a received message: one shared buffer the lean strings borrow from.
    let bytes = Bytes::from(request.encode_to_vec());
    let decoded = wire::decode(bytes.clone()).expect("decodes");
    let conventions = Conventions::default();
    let spans = encode_lean(&conventions, &decoded).0.num_rows();
    let mut group = c.benchmark_group("otlp_to_arrow");
    group.throughput(Throughput::Elements(spans as u64));
    group.bench_function("prost_decode", |b| {
        b.iter(|| ExportTraceServiceRequest::decode(&bytes[..]).expect("decodes"))
    });
    group.bench_function("lean_decode", |b| {
        b.iter(|| wire::decode(bytes.clone()).expect("decodes"))
    });
    group.bench_function("arrow_encode", |b| {
        b.iter(|| encode_lean(&conventions, &decoded))
    });
    group.bench_function("decode_and_encode", |b| {
        b.iter(|| encode_lean(&conventions, &wire::decode(bytes.clone()).expect("decodes")))
    });
    group.finish();
}

criterion_group!(benches, otlp_to_arrow);
criterion_main!(benches);
