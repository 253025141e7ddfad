//! Synthetic traces shaped like SDK exports, for load generation and benchmarks.
//!
//! A trace is a chain of services `depth` layers deep. Every non-leaf SERVER span calls
//! `fanout` services of the next layer. Each call is one CLIENT span per attempt, siblings
//! under the calling SERVER span (the HTTP shape). With probability `retry_rate`, the first
//! attempt fails fast (503 or UNAVAILABLE) and a second attempt follows with `retry=1`,
//! `cause` and `http.request.resend_count`. Each leaf server makes one database call to an
//! uninstrumented callee. Odd layers speak gRPC, even ones HTTP, each with the attributes
//! their SDK instrumentations set.
//!
//! The defaults (depth 4, fan-out 1, 10% retries) give ~8.6 spans per trace, like the
//! reference load of issue 6. Trace and span ids are random but seeded, so a shape and seed
//! always give the same traces.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::attribute::{kv, kv_int};

/// OTLP span kinds and status codes used here.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const STATUS_ERROR: i32 = 2;

/// Service names by layer; a fan-out branch past the first gets a `-N` suffix.
const LAYERS: [&str; 8] = [
    "gateway",
    "orders",
    "inventory",
    "pricing",
    "ledger",
    "audit",
    "catalog",
    "search",
];

/// What the generated traces look like.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Instrumented services on the longest path (>= 1).
    pub depth: u32,
    /// Services each non-leaf service calls (>= 1).
    pub fanout: u32,
    /// Probability that a call's first attempt fails and is retried once.
    pub retry_rate: f64,
    /// Services of each layer (>= 1): with more than one, every service in a trace is one of
    /// `width` of its layer's (`orders-w17`), drawn at random, so the same span count spreads
    /// over up to `width`² caller/callee pairs per hop: a wide fleet.
    pub width: u32,
    /// Seed of every random choice (ids, retries, durations).
    pub seed: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            depth: 4,
            fanout: 1,
            retry_rate: 0.1,
            width: 1,
            seed: 1,
        }
    }
}

/// Generates traces one after another, `start_ns` onwards, one trace per millisecond.
pub struct Generator {
    shape: Shape,
    rng: StdRng,
    start_ns: u64,
    traces: u64,
    resources: HashMap<String, Resource>,
}

impl Generator {
    pub fn new(shape: Shape, start_ns: u64) -> Self {
        Generator {
            shape: Shape {
                depth: shape.depth.clamp(1, LAYERS.len() as u32),
                fanout: shape.fanout.max(1),
                width: shape.width.max(1),
                ..shape
            },
            rng: StdRng::seed_from_u64(shape.seed),
            start_ns,
            traces: 0,
            resources: HashMap::new(),
        }
    }

    /// Traces generated so far.
    pub fn traces(&self) -> u64 {
        self.traces
    }

    /// The next trace, as `(service, span)` pairs.
    pub fn trace(&mut self) -> Vec<(String, Span)> {
        let mut trace_id = vec![0u8; 16];
        self.rng.fill(&mut trace_id[..]);
        let t0 = self.start_ns + self.traces * 1_000_000;
        self.traces += 1;
        let mut spans = Vec::with_capacity(10);
        let mut ctx = TraceCtx {
            rng: &mut self.rng,
            shape: self.shape,
            trace_id,
            spans: &mut spans,
        };
        let gateway = ctx.variant(service_name(0, 0));
        ctx.server(0, gateway, None, t0, None, true);
        spans
    }

    /// The next request: whole traces until it holds at least `min_spans` spans, grouped
    /// into one `ResourceSpans` per service as an agent forwards them.
    pub fn request(&mut self, min_spans: usize) -> ExportTraceServiceRequest {
        let mut by_service: Vec<(String, Vec<Span>)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut count = 0;
        while count < min_spans.max(1) {
            for (service, span) in self.trace() {
                count += 1;
                match index.get(&service) {
                    Some(&i) => by_service[i].1.push(span),
                    None => {
                        index.insert(service.clone(), by_service.len());
                        by_service.push((service, vec![span]));
                    }
                }
            }
        }
        ExportTraceServiceRequest {
            resource_spans: by_service
                .into_iter()
                .map(|(service, spans)| ResourceSpans {
                    resource: Some(self.resource(&service)),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(InstrumentationScope {
                            name: "opentelemetry-instrumentation".into(),
                            version: "0.33.0".into(),
                            ..Default::default()
                        }),
                        spans,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// The resource attributes an SDK sends for `service`.
    fn resource(&mut self, service: &str) -> Resource {
        let instance = self.rng.random::<u64>();
        self.resources
            .entry(service.to_string())
            .or_insert_with(|| Resource {
                attributes: vec![
                    kv("service.name", service),
                    kv("service.version", "1.4.2"),
                    kv("service.instance.id", &format!("{instance:016x}")),
                    kv("telemetry.sdk.name", "opentelemetry"),
                    kv("telemetry.sdk.language", "rust"),
                    kv("telemetry.sdk.version", "0.33.0"),
                    kv("host.name", &format!("{service}-7d9f8")),
                ],
                ..Default::default()
            })
            .clone()
    }
}

struct TraceCtx<'a> {
    rng: &'a mut StdRng,
    shape: Shape,
    trace_id: Vec<u8>,
    spans: &'a mut Vec<(String, Span)>,
}

impl TraceCtx<'_> {
    fn span_id(&mut self) -> Vec<u8> {
        let mut id = vec![0u8; 8];
        self.rng.fill(&mut id[..]);
        id
    }

    fn grpc(layer: u32) -> bool {
        layer % 2 == 1
    }

    /// A SERVER span of `service` at `layer`, starting at `start`, with its calls below
    /// it when `healthy`; returns its end.
    fn server(
        &mut self,
        layer: u32,
        service: String,
        parent: Option<Vec<u8>>,
        start: u64,
        deadline_ms: Option<i64>,
        healthy: bool,
    ) -> u64 {
        let id = self.span_id();
        let mut end = start + self.rng.random_range(100_000..400_000);
        if healthy {
            if layer + 1 < self.shape.depth {
                for branch in 0..self.shape.fanout {
                    end = self.call(layer, &service, branch, &id, end);
                }
            } else {
                end = self.database(&service, &id, end);
            }
        }
        end += self.rng.random_range(50_000..200_000);
        let status = if healthy { 200 } else { 503 };
        let (name, mut attributes) = if Self::grpc(layer) {
            grpc_span(&service, healthy)
        } else {
            let route = format!("/api/{service}");
            let attributes = vec![
                kv("http.request.method", "GET"),
                kv("http.route", &route),
                kv_int("http.response.status_code", status),
                kv("url.scheme", "http"),
                kv("user_agent.original", "checkout-web/2.3"),
            ];
            (format!("GET {route}"), attributes)
        };
        if let Some(deadline) = deadline_ms {
            attributes.push(kv_int("deadline", deadline));
        }
        self.push(
            service,
            Span {
                span_id: id,
                parent_span_id: parent.unwrap_or_default(),
                name,
                kind: SERVER,
                start_time_unix_nano: start,
                end_time_unix_nano: end,
                attributes,
                status: (!healthy).then(|| Status {
                    code: STATUS_ERROR,
                    message: "overloaded".into(),
                }),
                ..Default::default()
            },
        );
        end
    }

    /// One of the `width` services named `name` (itself when the width is 1: no draw, so
    /// narrow shapes keep their seeded traces).
    fn variant(&mut self, name: String) -> String {
        if self.shape.width <= 1 {
            return name;
        }
        let v = self.rng.random_range(0..self.shape.width);
        format!("{name}-w{v}")
    }

    /// One call from `caller` at `layer` to the service `branch` of the next layer: one or
    /// two attempts; returns when the last attempt ended.
    fn call(&mut self, layer: u32, caller: &str, branch: u32, parent: &[u8], start: u64) -> u64 {
        let caller = caller.to_owned();
        let callee = self.variant(service_name(layer + 1, branch));
        let attempts = if self.rng.random_bool(self.shape.retry_rate.clamp(0.0, 1.0)) {
            2
        } else {
            1
        };
        let deadline_ms = 1000 - 200 * i64::from(layer);
        let grpc = Self::grpc(layer + 1);
        let mut at = start;
        for attempt in 0..attempts {
            let ok = attempt + 1 == attempts;
            let id = self.span_id();
            let server_start = at + self.rng.random_range(200_000..500_000);
            let server_end = self.server(
                layer + 1,
                callee.clone(),
                Some(id.clone()),
                server_start,
                Some(deadline_ms),
                ok,
            );
            let end = server_end + self.rng.random_range(200_000..500_000);
            let (name, mut attributes) = if grpc {
                let (name, mut attributes) = grpc_span(&callee, ok);
                attributes.push(kv_int("server.port", 50051));
                (name, attributes)
            } else {
                let attributes = vec![
                    kv("http.request.method", "GET"),
                    kv("url.full", &format!("http://{callee}:8080/api/{callee}")),
                    kv_int("http.response.status_code", if ok { 200 } else { 503 }),
                    kv("server.address", &callee),
                    kv_int("server.port", 8080),
                ];
                ("GET".to_string(), attributes)
            };
            attributes.push(kv_int("retry", attempt));
            attributes.push(kv_int("deadline", deadline_ms));
            if attempt > 0 {
                attributes.push(kv("cause", "unavailable"));
                if !grpc {
                    attributes.push(kv_int("http.request.resend_count", attempt));
                }
            }
            self.push(
                caller.clone(),
                Span {
                    span_id: id,
                    parent_span_id: parent.to_vec(),
                    name,
                    kind: CLIENT,
                    start_time_unix_nano: at,
                    end_time_unix_nano: end,
                    attributes,
                    status: (!ok).then(|| Status {
                        code: STATUS_ERROR,
                        message: "unavailable".into(),
                    }),
                    ..Default::default()
                },
            );
            at = end + self.rng.random_range(10_000_000..50_000_000);
            if ok {
                return end;
            }
        }
        at
    }

    /// The database call a leaf service makes; returns its end.
    fn database(&mut self, service: &str, parent: &[u8], start: u64) -> u64 {
        let end = start + self.rng.random_range(1_000_000..4_000_000);
        let span_id = self.span_id();
        self.push(
            service.to_string(),
            Span {
                span_id,
                parent_span_id: parent.to_vec(),
                name: "SELECT orders".into(),
                kind: CLIENT,
                start_time_unix_nano: start,
                end_time_unix_nano: end,
                attributes: vec![
                    kv("db.system.name", "postgresql"),
                    kv("db.operation.name", "SELECT"),
                    kv("db.collection.name", "orders"),
                    kv("server.address", "postgres"),
                ],
                ..Default::default()
            },
        );
        end
    }

    fn push(&mut self, service: String, mut span: Span) {
        span.trace_id = self.trace_id.clone();
        self.spans.push((service, span));
    }
}

fn service_name(layer: u32, branch: u32) -> String {
    let name = LAYERS[layer as usize % LAYERS.len()];
    if branch == 0 {
        name.to_string()
    } else {
        format!("{name}-{branch}")
    }
}

/// Name and attributes of either side of a gRPC call to `service`.
fn grpc_span(service: &str, ok: bool) -> (String, Vec<KeyValue>) {
    let rpc_service = format!("demo.{}", capitalise(service));
    let attributes = vec![
        kv("rpc.system", "grpc"),
        kv("rpc.service", &rpc_service),
        kv("rpc.method", "Get"),
        kv_int("rpc.grpc.status_code", if ok { 0 } else { 14 }),
        kv("server.address", service),
    ];
    (format!("{rpc_service}/Get"), attributes)
}

fn capitalise(name: &str) -> String {
    let mut chars = name.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Conventions, encode_request};

    /// The default shape gives ~8.6 spans per trace, every one of which encodes.
    #[test]
    fn default_shape_has_reference_span_count_and_encodes() {
        let mut generator = Generator::new(Shape::default(), 1_764_000_000_000_000_000);
        let request = generator.request(10_000);
        let spans = crate::encode::spans_of(&crate::wire::from_proto(&request)).count();
        let per_trace = spans as f64 / generator.traces() as f64;
        assert!(
            (8.3..8.9).contains(&per_trace),
            "{per_trace} spans per trace"
        );
        let (batch, report) = encode_request(&Conventions::default(), &request);
        assert_eq!(batch.num_rows(), spans);
        assert_eq!(report.rejected, 0);
    }

    /// Depth and fan-out multiply as documented: depth 3, fan-out 2, no retries is
    /// 1 + 2*2 + 4*2 SERVER/CLIENT spans plus one database call per leaf (4).
    #[test]
    fn depth_and_fanout_shape_the_tree() {
        let shape = Shape {
            depth: 3,
            fanout: 2,
            retry_rate: 0.0,
            seed: 7,
            width: 1,
        };
        let trace = Generator::new(shape, 0).trace();
        assert_eq!(trace.len(), 1 + 4 + 8 + 4);
        assert_eq!(Generator::new(shape, 0).trace(), trace, "seeded");
    }

    /// A width spreads the same traces over many services: every caller of a CLIENT span
    /// is the service of the SERVER span it is under, and 200 traces of width 50 reach
    /// more than 100 gateway -> orders pairs.
    #[test]
    fn width_spreads_traces_over_many_services() {
        let shape = Shape {
            width: 50,
            ..Shape::default()
        };
        let mut generator = Generator::new(shape, 0);
        let mut pairs = std::collections::HashSet::new();
        for _ in 0..200 {
            let trace = generator.trace();
            let service_of: HashMap<&[u8], &str> = trace
                .iter()
                .map(|(s, span)| (span.span_id.as_slice(), s.as_str()))
                .collect();
            for (service, span) in &trace {
                if span.kind == SERVER
                    && let Some(caller_span) =
                        trace.iter().find(|(_, c)| c.span_id == span.parent_span_id)
                {
                    assert_eq!(
                        service_of[caller_span.1.parent_span_id.as_slice()],
                        caller_span.0
                    );
                    pairs.insert((caller_span.0.clone(), service.clone()));
                }
            }
        }
        let gateway_orders = pairs
            .iter()
            .filter(|(a, b)| a.starts_with("gateway-w") && b.starts_with("orders-w"))
            .count();
        assert!(gateway_orders > 100, "{gateway_orders}");
    }
}
