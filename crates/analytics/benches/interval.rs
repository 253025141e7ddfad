//! Analysing one interval of ~1 M spans as the live path does, in chunks of whole traces
//! with one engine on one thread: the time `Engine::analyse` (lineage + every derived
//! table + partials) takes over every chunk, and the report merge, as a fraction of the
//! default 10 s `analytics.interval` they must fit in.
//!
//! Run: `cargo bench -p stormglass-analytics --bench interval` (add `-- 200000` for another
//! span count, `-- 1000000 0` for one batch). Prints one table; nothing is asserted.

#![allow(clippy::expect_used)] // a bench binary: failing loudly is the point

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use stormglass_analytics::alerts::AlertThresholds;
use stormglass_analytics::report::{Report, WindowBounds};
use stormglass_analytics::{Engine, Partials};
use stormglass_model::{Conventions, SpanBatchBuilder};
use stormglass_testkit::otlp::{kv, kv_int, request};

const INTERVAL: Duration = Duration::from_secs(10);

/// One trace of 9 spans: gateway SERVER -> api (1-2 attempts) -> api SERVER -> db (1-2
/// attempts, uninstrumented), plus an auth call; attributes as SDKs send them.
fn trace(n: u64, services: &mut [(String, Vec<Span>); 3]) {
    let id = |k: u64| (n * 16 + k).to_be_bytes().to_vec();
    let trace_id = {
        let mut t = vec![0x11; 8];
        t.extend_from_slice(&n.to_be_bytes());
        t
    };
    let t0 = 1_764_000_000_000_000_000u64 + n * 1_000_000;
    let span = |k: u64,
                parent: Option<u64>,
                name: &str,
                kind: i32,
                start: u64,
                end: u64,
                attributes: Vec<KeyValue>| Span {
        trace_id: trace_id.clone(),
        span_id: id(k),
        parent_span_id: parent.map(id).unwrap_or_default(),
        name: name.into(),
        kind,
        start_time_unix_nano: t0 + start * 1_000_000,
        end_time_unix_nano: t0 + end * 1_000_000,
        attributes,
        ..Default::default()
    };
    let retried = n.is_multiple_of(10);
    let common = |route: &str| {
        vec![
            kv("http.route", route),
            kv("http.request.method", "GET"),
            kv("server.address", "10.0.0.1"),
            kv("user_agent.original", "bench/1.0"),
        ]
    };
    let [(_, g), (_, a), (_, auth)] = services;
    g.push(span(
        1,
        None,
        "GET /checkout",
        2,
        0,
        120,
        [
            common("/checkout"),
            vec![
                kv_int("http.response.status_code", 200),
                kv_int("deadline", 1000),
            ],
        ]
        .concat(),
    ));
    g.push(span(
        2,
        Some(1),
        "GET",
        3,
        1,
        if retried { 60 } else { 100 },
        vec![
            kv("peer.service", "api"),
            kv("url.template", "/cart"),
            kv_int("retry", 0),
            kv_int("deadline", 500),
            kv_int("http.response.status_code", if retried { 503 } else { 200 }),
        ],
    ));
    g.push(span(
        3,
        Some(1),
        "GET",
        3,
        101,
        110,
        vec![
            kv("peer.service", "auth"),
            kv("url.template", "/token"),
            kv_int("deadline", 200),
            kv_int("http.response.status_code", 200),
        ],
    ));
    a.push(span(
        4,
        Some(2),
        "GET /cart",
        2,
        2,
        if retried { 59 } else { 99 },
        [common("/cart"), vec![kv_int("deadline", 498)]].concat(),
    ));
    a.push(span(
        5,
        Some(4),
        "SELECT",
        3,
        3,
        40,
        vec![
            kv("db.system.name", "postgresql"),
            kv("db.operation.name", "SELECT"),
            kv_int("retry", 0),
            kv_int("deadline", 300),
        ],
    ));
    let db_retry = n.is_multiple_of(7);
    a.push(span(
        6,
        Some(4),
        "SELECT",
        3,
        41,
        50,
        vec![
            kv("db.system.name", "postgresql"),
            kv("db.operation.name", "SELECT"),
            kv_int("retry", 0),
            kv_int("deadline", 300),
        ],
    ));
    if retried {
        g.push(span(
            7,
            Some(1),
            "GET",
            3,
            62,
            100,
            vec![
                kv("peer.service", "api"),
                kv("url.template", "/cart"),
                kv_int("retry", 1),
                kv("cause", "unavailable"),
                kv_int("deadline", 438),
                kv_int("http.response.status_code", 200),
            ],
        ));
        a.push(span(
            8,
            Some(7),
            "GET /cart",
            2,
            63,
            99,
            [common("/cart"), vec![kv_int("deadline", 436)]].concat(),
        ));
    } else {
        auth.push(span(
            9,
            Some(3),
            "GET /token",
            2,
            102,
            109,
            [common("/token"), vec![kv_int("deadline", 198)]].concat(),
        ));
    }
    if db_retry {
        a.push(span(
            10,
            Some(4),
            "SELECT",
            3,
            51,
            60,
            vec![
                kv("db.system.name", "postgresql"),
                kv("db.operation.name", "SELECT"),
                kv_int("retry", 1),
                kv_int("deadline", 300),
            ],
        ));
    }
}

fn main() {
    // `-- <spans> [<chunk>]`: the interval's size, and the spans per live chunk (~45k is a
    // 32nd of the analysis share at the default 1 GiB `limits.memory`; 0 for one batch).
    let numbers: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let target = numbers.first().copied().unwrap_or(1_000_000);
    let chunk = numbers.get(1).copied().unwrap_or(45_000);
    let conventions = Conventions::default();
    let mut chunks = Vec::new();
    let mut builder = SpanBatchBuilder::new(&conventions);
    let mut rows = 0;
    let mut n = 0u64;
    while rows + builder.len() < target {
        let mut services = [
            ("gateway".to_owned(), vec![]),
            ("api".to_owned(), vec![]),
            ("auth".to_owned(), vec![]),
        ];
        for _ in 0..100 {
            trace(n, &mut services);
            n += 1;
        }
        let req: ExportTraceServiceRequest = request(
            services
                .iter()
                .map(|(s, v)| (s.as_str(), v.clone()))
                .collect(),
        );
        builder.append_request(&stormglass_model::wire::from_proto(&req));
        // Whole traces per chunk, as the live path cuts them.
        if chunk > 0 && builder.len() >= chunk {
            let (spans, _) =
                std::mem::replace(&mut builder, SpanBatchBuilder::new(&conventions)).finish();
            rows += spans.num_rows();
            chunks.push(spans);
        }
    }
    if !builder.is_empty() {
        let (spans, _) = builder.finish();
        rows += spans.num_rows();
        chunks.push(spans);
    }

    // One thread and an engine planned for it, as the live worker runs.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let engine = Engine::default().on_one_thread();
    let chunk_count = chunks.len();
    let started = Instant::now();
    let mut analysed = Vec::with_capacity(chunk_count);
    for spans in chunks {
        analysed.push(runtime.block_on(engine.analyse(spans)).expect("analysis"));
    }
    let analyse = started.elapsed();
    let partials = Partials::concat(analysed)
        .expect("at least one chunk")
        .compact_for_window();
    // A 5-minute window: the same interval's partials 30 times (shared, not copied).
    let partials = Arc::new(partials);
    let window: Vec<_> = (0..30).map(|_| partials.clone()).collect();
    let started = Instant::now();
    let report = runtime
        .block_on(Report::build(&engine, &window, WindowBounds::default()))
        .expect("report");
    std::hint::black_box(stormglass_analytics::alerts::evaluate(
        &report,
        &AlertThresholds::default(),
    ));
    let merge = started.elapsed();

    println!("spans analysed in one interval      {rows}");
    println!("traces                              {n}");
    println!("chunks (whole traces each)          {chunk_count}");
    println!(
        "analyse (derive + partials)         {:.2} s  = {:.1}% of a {} s interval",
        analyse.as_secs_f64(),
        100.0 * analyse.as_secs_f64() / INTERVAL.as_secs_f64(),
        INTERVAL.as_secs()
    );
    println!(
        "merge 30 intervals (5 min) + report {:.3} s",
        merge.as_secs_f64()
    );
    println!(
        "spans per second of analysis        {:.0}",
        rows as f64 / analyse.as_secs_f64()
    );
    println!(
        "edges / layers in report            {} / {}",
        report.edges.len(),
        report.layers.len()
    );
}
