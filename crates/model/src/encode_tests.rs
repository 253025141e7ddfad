use arrow::array::{Array, AsArray, MapArray};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use proptest::prelude::*;

use super::*;
use crate::schema as col;
use stormglass_testkit::otlp::*;

fn encode(request: &ExportTraceServiceRequest) -> (RecordBatch, EncodeReport) {
    encode_request(&Conventions::default(), request)
}

fn strings(batch: &RecordBatch, name: &str) -> Vec<Option<String>> {
    let column = batch.column_by_name(name).unwrap().as_string::<i32>();
    column.iter().map(|v| v.map(str::to_owned)).collect()
}

fn outcomes(batch: &RecordBatch) -> Vec<String> {
    strings(batch, col::OUTCOME)
        .into_iter()
        .map(Option::unwrap)
        .collect()
}

fn map_keys(batch: &RecordBatch, row: usize) -> Vec<String> {
    let map: &MapArray = batch.column_by_name(col::ATTRIBUTES).unwrap().as_map();
    let entry = map.value(row);
    entry
        .column(0)
        .as_string::<i32>()
        .iter()
        .map(|k| k.unwrap().to_owned())
        .collect()
}

/// The retry fixture yields one typed row per span with every contract column derived.
#[test]
fn retry_fixture_columns() {
    let (batch, report) = encode(&retry_fixture());
    assert_eq!(report.accepted, 5);
    assert_eq!(report.rejected, 0);
    assert_eq!(batch.num_rows(), 5);

    let service = strings(&batch, col::SERVICE_NAME);
    assert_eq!(service[0].as_deref(), Some("gateway"));
    assert_eq!(service[4].as_deref(), Some("orders"));
    let kind = strings(&batch, col::KIND);
    assert_eq!(kind[0].as_deref(), Some("server"));
    assert_eq!(kind[1].as_deref(), Some("client"));

    let attempt = batch
        .column_by_name(col::ATTEMPT)
        .unwrap()
        .as_primitive::<Int32Type>();
    assert!(attempt.is_null(0));
    assert_eq!((attempt.value(1), attempt.value(2)), (0, 1));
    let cause = strings(&batch, col::RETRY_CAUSE);
    assert_eq!(cause[1], None);
    assert_eq!(cause[2].as_deref(), Some("deadline"));

    let deadline = batch
        .column_by_name(col::DEADLINE_MS)
        .unwrap()
        .as_primitive::<Float64Type>();
    let deadlines: Vec<Option<f64>> = deadline.iter().collect();
    assert_eq!(
        deadlines,
        vec![None, Some(200.0), Some(185.0), Some(195.0), Some(180.0)]
    );

    let outcome = strings(&batch, col::OUTCOME);
    let outcome: Vec<_> = outcome.iter().map(|o| o.as_deref().unwrap()).collect();
    // Span 4 is a server span that saw ctx_cancelled=true with no error code.
    assert_eq!(outcome, vec!["ok", "deadline", "ok", "cancelled", "ok"]);

    let operation = strings(&batch, col::OPERATION);
    assert_eq!(operation[0].as_deref(), Some("/checkout"));
    assert_eq!(operation[1].as_deref(), Some("/orders"));
    assert_eq!(
        strings(&batch, col::CALLEE_HINT)[1].as_deref(),
        Some("orders")
    );

    let bools = |name| -> Vec<bool> {
        let c = batch.column_by_name(name).unwrap().as_boolean();
        (0..c.len()).map(|i| c.value(i)).collect()
    };
    assert_eq!(bools(col::IS_WRITE), vec![false, true, true, false, false]);
    assert_eq!(
        bools(col::HAS_IDEMPOTENCY_KEY),
        vec![false, false, true, false, false]
    );
    assert_eq!(
        bools(col::CTX_CANCELLED),
        vec![false, false, false, true, false]
    );
    assert_eq!(bools(col::PENDING), vec![false, false, false, true, false]);
    assert!(batch.column_by_name(col::IDEMPOTENT).unwrap().is_null(1));

    let parent = batch
        .column_by_name(col::PARENT_SPAN_ID)
        .unwrap()
        .as_fixed_size_binary();
    assert!(parent.is_null(0));
    assert_eq!(parent.value(1), span_id(1).as_slice());
    let duration = batch
        .column_by_name(col::DURATION_NS)
        .unwrap()
        .as_primitive::<Int64Type>();
    assert_eq!(duration.value(1), 200_000_000);

    // Consumed attributes leave the map; the rest stay.
    let keys = map_keys(&batch, 2);
    assert!(keys.contains(&"http.request.method".to_owned()));
    assert!(keys.contains(&"peer.service".to_owned()));
    for consumed in ["retry", "cause", "deadline", "idempotency_key"] {
        assert!(
            !keys.contains(&consumed.to_owned()),
            "{consumed} still in map"
        );
    }
}

/// Invalid spans are rejected with an OTLP message while their valid neighbours are kept.
#[test]
fn invalid_spans_are_rejected_not_dropped_silently() {
    let mut bad_trace = span(1, 1, "a", 2, 0, 1, vec![]);
    bad_trace.trace_id = vec![1, 2, 3];
    let mut zero_span = span(1, 2, "b", 2, 0, 1, vec![]);
    zero_span.span_id = vec![0; 8];
    let mut bad_parent = span(1, 3, "c", 2, 0, 1, vec![]);
    bad_parent.parent_span_id = vec![1; 5];
    let backwards = span(1, 4, "d", 2, 10, 5, vec![]);
    let good = span(1, 5, "e", 2, 0, 1, vec![]);
    let req = request(vec![(
        "svc",
        vec![bad_trace, zero_span, bad_parent, backwards, good],
    )]);

    let (batch, report) = encode(&req);
    assert_eq!(batch.num_rows(), 1);
    assert_eq!((report.accepted, report.rejected), (1, 4));
    assert_eq!(
        report.partial_success_message().as_deref(),
        Some("rejected 4 of 5 spans; first: trace id has 3 bytes, expected 16")
    );
}

/// Absolute deadlines become budgets relative to the span start; past ones become 0.
#[test]
fn absolute_deadline_becomes_budget() {
    let s = span(1, 1, "a", 3, 0, 10, vec![]);
    let start_ms = (s.start_time_unix_nano / 1_000_000) as i64;
    let mut future = s.clone();
    future.attributes = vec![kv_int("deadline.unix_ms", start_ms + 750)];
    let mut past = span(1, 2, "b", 3, 0, 10, vec![]);
    past.attributes = vec![kv(
        "http.request.header.x-request-timeout",
        &(start_ms - 5).to_string(),
    )];
    let (batch, _) = encode(&request(vec![("svc", vec![future, past])]));
    let d = batch
        .column_by_name(col::DEADLINE_MS)
        .unwrap()
        .as_primitive::<Float64Type>();
    assert_eq!((d.value(0), d.value(1)), (750.0, 0.0));
}

/// A relative deadline beats an absolute one, and earlier aliases beat later ones.
#[test]
fn alias_precedence() {
    let s = span(
        1,
        1,
        "a",
        3,
        0,
        10,
        vec![
            kv_int("http.request.resend_count", 2),
            kv_int("retry", 1),
            kv_int("deadline.unix_ms", 1),
            kv("timeout_ms", "90"),
            kv("deadline", "1s"),
        ],
    );
    let (batch, _) = encode(&request(vec![("svc", vec![s])]));
    let attempt = batch
        .column_by_name(col::ATTEMPT)
        .unwrap()
        .as_primitive::<Int32Type>();
    assert_eq!(attempt.value(0), 1);
    let d = batch
        .column_by_name(col::DEADLINE_MS)
        .unwrap()
        .as_primitive::<Float64Type>();
    assert_eq!(d.value(0), 1000.0);
}

/// An unreadable contract attribute is counted as malformed and kept in the map.
#[test]
fn malformed_fields_are_counted_and_kept() {
    let s = span(
        1,
        1,
        "a",
        3,
        0,
        10,
        vec![kv("retry", "second"), kv("deadline", "soon")],
    );
    let (batch, report) = encode(&request(vec![("svc", vec![s])]));
    let malformed: Vec<_> = report.malformed_by_field().collect();
    assert_eq!(malformed, vec![("attempt", 1), ("deadline", 1)]);
    let attempt = batch.column_by_name(col::ATTEMPT).unwrap();
    assert_eq!(
        attempt
            .as_primitive::<arrow::datatypes::Int32Type>()
            .value(0),
        col::UNREADABLE_ATTEMPT
    );
    let keys = map_keys(&batch, 0);
    assert_eq!(keys, vec!["retry", "deadline"]);
}

/// Attempt numbers written as integral strings or doubles ("3.0", 2.0) are read; negative
/// and fractional ones are malformed (counted) and marked unreadable, not left null (null
/// would read as a first attempt).
#[test]
fn attempt_numbers_in_any_integral_form() {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    let double = |d: f64| KeyValue {
        key: "retry".into(),
        value: Some(AnyValue {
            value: Some(Value::DoubleValue(d)),
        }),
        ..Default::default()
    };
    let spans = vec![
        span(1, 1, "a", 3, 0, 1, vec![kv("retry", "3.0")]),
        span(1, 2, "b", 3, 0, 1, vec![double(2.0)]),
        span(1, 3, "c", 3, 0, 1, vec![kv_int("retry", -1)]),
        span(1, 4, "d", 3, 0, 1, vec![kv("retry", "1.5")]),
    ];
    let (batch, report) = encode(&request(vec![("svc", spans)]));
    let a = batch
        .column_by_name(col::ATTEMPT)
        .unwrap()
        .as_primitive::<arrow::datatypes::Int32Type>();
    assert_eq!((a.value(0), a.value(1)), (3, 2));
    assert_eq!((a.value(2), a.value(3)), (-1, -1));
    let malformed: Vec<_> = report.malformed_by_field().collect();
    assert_eq!(malformed, vec![("attempt", 2)]);
}

/// A captured header is read in either spelling, as OpenTelemetry Python writes it
/// (dashes as underscores) or as the semantic conventions do now: Envoy's budget on the
/// request, and its attempt count.
#[test]
fn captured_headers_read_with_underscores_too() {
    let spans = vec![
        span(
            1,
            1,
            "a",
            2,
            0,
            1,
            vec![
                kv_strings(
                    "http.request.header.x_envoy_expected_rq_timeout_ms",
                    &["300"],
                ),
                kv_strings("http.request.header.x_envoy_attempt_count", &["2"]),
            ],
        ),
        span(
            1,
            2,
            "b",
            2,
            0,
            1,
            vec![kv_strings(
                "http.request.header.x-envoy-expected-rq-timeout-ms",
                &["250"],
            )],
        ),
    ];
    let (batch, _) = encode(&request(vec![("svc", spans)]));
    let deadline = batch
        .column_by_name(col::DEADLINE_MS)
        .unwrap()
        .as_primitive::<Float64Type>();
    assert_eq!((deadline.value(0), deadline.value(1)), (300.0, 250.0));
    let attempt = batch
        .column_by_name(col::ATTEMPT)
        .unwrap()
        .as_primitive::<Int32Type>();
    assert_eq!(attempt.value(0), 1);
}

/// A proxy's and gRPC's own counts as captured headers and metadata (string arrays):
/// Envoy's `x-envoy-attempt-count` counts from 1, gRPC's `grpc-previous-rpc-attempts` is the
/// attempt number itself.
#[test]
fn attempt_numbers_from_proxy_headers_and_grpc_metadata() {
    let spans = vec![
        span(
            1,
            1,
            "a",
            2,
            0,
            1,
            vec![kv_strings(
                "http.request.header.x-envoy-attempt-count",
                &["3"],
            )],
        ),
        span(
            1,
            2,
            "b",
            2,
            0,
            1,
            vec![kv_strings(
                "rpc.grpc.request.metadata.grpc-previous-rpc-attempts",
                &["2"],
            )],
        ),
    ];
    let (batch, _) = encode(&request(vec![("svc", spans)]));
    let a = batch
        .column_by_name(col::ATTEMPT)
        .unwrap()
        .as_primitive::<Int32Type>();
    assert_eq!((a.value(0), a.value(1)), (2, 2));
}

/// Envoy's upstream spans (`router <cluster> egress`, `component: proxy`) are attempts:
/// `retry.count` on a retry, 0 on the first; `retry.count` elsewhere is left alone (it
/// often counts the retries a call made), and the Istio cluster names the callee.
#[test]
fn envoy_upstream_spans_are_numbered_attempts() {
    let proxy = || kv("component", "proxy");
    let cluster = || {
        kv(
            "upstream_cluster",
            "outbound|9080||reviews.default.svc.cluster.local",
        )
    };
    let spans = vec![
        span(
            1,
            1,
            "router reviews egress",
            3,
            0,
            1,
            vec![proxy(), cluster()],
        ),
        span(
            1,
            2,
            "router reviews egress",
            3,
            1,
            2,
            vec![proxy(), cluster(), kv("retry.count", "2")],
        ),
        span(
            1,
            3,
            "GET /reviews",
            3,
            0,
            1,
            vec![kv_int("retry.count", 2)],
        ),
        span(1, 4, "ingress", 2, 0, 2, vec![proxy()]),
    ];
    let (batch, report) = encode(&request(vec![("svc", spans)]));
    let a = batch
        .column_by_name(col::ATTEMPT)
        .unwrap()
        .as_primitive::<Int32Type>();
    let attempts: Vec<_> = a.iter().collect();
    assert_eq!(attempts, vec![Some(0), Some(2), None, None]);
    assert_eq!(
        strings(&batch, col::CALLEE_HINT)[..2],
        [Some("reviews".to_owned()), Some("reviews".to_owned())]
    );
    assert_eq!(map_keys(&batch, 2), vec!["retry.count"]);
    assert!(!map_keys(&batch, 1).contains(&"retry.count".to_owned()));
    assert_eq!(report.malformed_by_field().count(), 0);
}

/// A proxy's flags decide the class before the status: Envoy's `response_flags` and
/// HAProxy's termination state, where the proxy's tracing puts them on its spans.
#[test]
fn outcome_from_proxy_flags() {
    let cases = [
        // A per-try timeout: no status from the upstream.
        ("response_flags", "UT", 0, "deadline"),
        // The caller went away while a 200 was being sent.
        ("response_flags", "DC", 200, "cancelled"),
        // Circuit breaking answers 503: load shed, not an outage.
        ("response_flags", "UO", 503, "throttled"),
        // Retries exhausted: the status decides.
        ("response_flags", "URX,UF", 503, "unavailable"),
        ("response_flags", "-", 200, "ok"),
        ("haproxy.termination_state", "sH--", 504, "deadline"),
        ("haproxy.termination_state", "CD--", 200, "cancelled"),
        ("haproxy.termination_state", "SH--", 502, "unavailable"),
        ("haproxy.termination_state", "----", 200, "ok"),
    ];
    let mut spans: Vec<Span> = (1u8..)
        .zip(&cases)
        .map(|(id, (key, flags, status, _))| {
            let attributes = vec![kv(key, flags), kv_int("http.status_code", *status)];
            span(1, id, "proxy", 3, 0, 1, attributes)
        })
        .collect();
    // Envoy's spans name the gRPC status `grpc.status_code`.
    spans.push(span(
        1,
        99,
        "grpc",
        3,
        0,
        1,
        vec![kv("grpc.status_code", "14")],
    ));
    let (batch, _) = encode(&request(vec![("svc", spans)]));
    let mut expected: Vec<&str> = cases.iter().map(|c| c.3).collect();
    expected.push("unavailable");
    assert_eq!(outcomes(&batch), expected);
}

/// gRPC codes as numbers or names, business error codes and resource defaults.
#[test]
fn outcome_signals_from_attributes() {
    let spans = vec![
        span(1, 1, "a", 3, 0, 1, vec![kv_int("rpc.grpc.status_code", 14)]),
        span(
            1,
            2,
            "b",
            3,
            0,
            1,
            vec![kv("rpc.response.status_code", "RESOURCE_EXHAUSTED")],
        ),
        span(1, 3, "c", 2, 0, 1, vec![kv_int("err_code", 1042)]),
        span(
            1,
            4,
            "d",
            3,
            0,
            1,
            vec![kv("error.type", "connection reset")],
        ),
        with_status(span(1, 5, "e", 2, 0, 1, vec![]), 2, "boom"),
        span(1, 6, "f", 3, 0, 1, vec![kv_int("err_code", 0)]),
    ];
    let mut req = request(vec![("svc", spans)]);
    req.resource_spans[0].resource = None;
    let (batch, _) = encode(&req);
    assert_eq!(
        outcomes(&batch),
        vec![
            "unavailable",
            "throttled",
            "client_error",
            "unavailable",
            "server_error",
            "ok"
        ]
    );
    assert_eq!(
        strings(&batch, col::SERVICE_NAME)[0].as_deref(),
        Some(UNKNOWN_SERVICE)
    );
    assert_eq!(
        strings(&batch, col::STATUS_MESSAGE)[4].as_deref(),
        Some("boom")
    );
}

/// gRPC operations combine service and method.
#[test]
fn rpc_operation_name() {
    let s = span(
        1,
        1,
        "x",
        3,
        0,
        1,
        vec![
            kv("rpc.service", "inventory.Stock"),
            kv("rpc.method", "Reserve"),
        ],
    );
    let (batch, _) = encode(&request(vec![("svc", vec![s])]));
    assert_eq!(
        strings(&batch, col::OPERATION)[0].as_deref(),
        Some("inventory.Stock/Reserve")
    );
    assert_eq!(
        strings(&batch, col::CALLEE_HINT)[0].as_deref(),
        Some("inventory.Stock")
    );
}

/// An empty request encodes to an empty batch of the right schema.
#[test]
fn empty_request() {
    let (batch, report) = encode(&ExportTraceServiceRequest::default());
    assert_eq!(batch.num_rows(), 0);
    assert_eq!(batch.schema(), *SPANS_SCHEMA);
    assert_eq!(report, EncodeReport::default());
}

fn any_value() -> impl Strategy<Value = AnyValue> {
    let leaf = prop_oneof![
        any::<String>().prop_map(Value::StringValue),
        "[0-9]{1,3}(ms|s|m|S|u)?".prop_map(Value::StringValue),
        any::<i64>().prop_map(Value::IntValue),
        any::<f64>().prop_map(Value::DoubleValue),
        any::<bool>().prop_map(Value::BoolValue),
        proptest::collection::vec(any::<u8>(), 0..4).prop_map(Value::BytesValue),
    ];
    proptest::option::of(leaf).prop_map(|value| AnyValue { value })
}

fn attribute() -> impl Strategy<Value = KeyValue> {
    let names: Vec<&'static str> = crate::conventions::DEFAULT_ALIASES
        .iter()
        .flat_map(|(_, names)| names.iter().copied())
        .chain(["custom", "x"])
        .collect();
    (
        proptest::sample::select(names),
        proptest::option::of(any_value()),
    )
        .prop_map(|(key, value)| KeyValue {
            key: key.into(),
            value,
            ..Default::default()
        })
}

fn id(valid_len: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), valid_len),
        1 => proptest::collection::vec(any::<u8>(), 0..20),
    ]
}

fn any_span() -> impl Strategy<Value = Span> {
    (
        id(16),
        id(8),
        prop_oneof![Just(vec![]), id(8)],
        any::<i32>(),
        any::<u64>(),
        0u64..1 << 40,
        proptest::collection::vec(attribute(), 0..8),
    )
        .prop_map(
            |(trace_id, span_id, parent_span_id, kind, start, len, attributes)| Span {
                trace_id,
                span_id,
                parent_span_id,
                kind,
                start_time_unix_nano: start,
                end_time_unix_nano: start.saturating_add(len),
                attributes,
                ..Default::default()
            },
        )
}

fn any_request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    proptest::collection::vec(proptest::collection::vec(any_span(), 0..6), 0..4).prop_map(
        |groups| ExportTraceServiceRequest {
            resource_spans: groups
                .into_iter()
                .map(|spans| ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        },
    )
}

proptest! {
    /// Any request encodes without panic; every span is either a row or a counted rejection,
    /// and accepted rows carry their span's ids and times unchanged.
    #[test]
    fn any_request_encodes_and_round_trips_ids(req in any_request()) {
        let (batch, report) = encode(&req);
        let decoded = wire::from_proto(&req);
        let spans: Vec<&wire::Span> = spans_of(&decoded).collect();
        prop_assert_eq!(report.accepted + report.rejected, spans.len() as u64);
        prop_assert_eq!(batch.num_rows() as u64, report.accepted);
        let valid: Vec<&&wire::Span> = spans.iter().filter(|s| validate(s).is_ok()).collect();
        prop_assert_eq!(valid.len(), batch.num_rows());
        let trace = batch.column_by_name(col::TRACE_ID).unwrap().as_fixed_size_binary();
        let span = batch.column_by_name(col::SPAN_ID).unwrap().as_fixed_size_binary();
        let start = batch.column_by_name(col::START_NS).unwrap().as_primitive::<Int64Type>();
        let end = batch.column_by_name(col::END_NS).unwrap().as_primitive::<Int64Type>();
        for (row, s) in valid.iter().enumerate() {
            prop_assert_eq!(trace.value(row), &s.trace_id[..]);
            prop_assert_eq!(span.value(row), &s.span_id[..]);
            prop_assert_eq!(start.value(row) as u64, s.start_time_unix_nano);
            prop_assert_eq!(end.value(row) as u64, s.end_time_unix_nano);
        }
    }
}

/// A request's batch is sized for that request: outside the attributes map (which grows
/// as arrow's builders do), its buffers hold at most 10% more than a tight copy of it.
/// Held spans cost this memory in assembly until their trace is released.
#[test]
fn request_batches_are_sized_to_the_request() {
    use arrow::array::UInt32Array;
    let mut generator = crate::synth::Generator::new(crate::synth::Shape::default(), 1);
    let request = generator.request(600);
    let (batch, _) = encode_request(&Conventions::default(), &request);
    let all = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    let (mut held, mut tight) = (0, 0);
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.name() != col::ATTRIBUTES {
            held += column.get_array_memory_size();
            let copy = arrow::compute::take(column, &all, None).expect("take");
            tight += copy.get_array_memory_size();
        }
    }
    assert!(
        held as f64 <= tight as f64 * 1.1,
        "{held} bytes held for {tight} bytes of data"
    );
}

/// The fuzz targets' committed seeds (`fuzz/seeds/`) are the retry fixture in binary OTLP
/// and OTLP/JSON, so fuzzing starts from a request that reaches every column; regenerate
/// them with `STORMGLASS_BLESS=1` after the fixture changes.
#[test]
fn fuzz_seeds_are_the_retry_fixture() {
    use prost::Message;
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    let request = retry_fixture();
    let files = [
        ("otlp_protobuf/retry_fixture.pb", request.encode_to_vec()),
        (
            "otlp_json/retry_fixture.json",
            serde_json::to_vec(&request).unwrap(),
        ),
    ];
    for (name, bytes) in files {
        let path = seeds.join(name);
        if std::env::var_os("STORMGLASS_BLESS").is_some() {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap();
        assert_eq!(
            committed, bytes,
            "{name}: regenerate with STORMGLASS_BLESS=1"
        );
    }
    let (batch, report) = encode(&request);
    assert!(batch.num_rows() > 0 && report.rejected == 0);
}

/// An idempotency key is kept as a keyed hash only: equal keys (as an attribute or a
/// captured header array, under any alias) hash alike, different keys and another secret
/// do not, and the value leaves the attributes map under every alias it came with. An
/// empty key is none.
#[test]
fn idempotency_keys_are_kept_as_a_keyed_hash_only() {
    let secret = "pay-7f3a9c";
    let spans = vec![
        span(1, 1, "a", 3, 0, 1, vec![kv("idempotency_key", secret)]),
        span(
            1,
            2,
            "b",
            3,
            0,
            1,
            vec![
                kv_strings("http.request.header.idempotency_key", &[secret]),
                kv("idempotency.key", secret),
            ],
        ),
        span(1, 3, "c", 3, 0, 1, vec![kv("idempotency_key", "other")]),
        span(1, 4, "d", 3, 0, 1, vec![kv("idempotency_key", "")]),
        span(1, 5, "e", 2, 0, 1, vec![kv_bool("idempotency.hit", true)]),
        span(
            1,
            6,
            "f",
            2,
            0,
            1,
            vec![kv("idempotency.state", "replayed")],
        ),
        span(1, 7, "g", 2, 0, 1, vec![kv("idempotency.state", "pending")]),
    ];
    let req = request(vec![("svc", spans)]);
    let conventions = Conventions::default().with_key_secret([7; 16]);
    let (batch, _) = encode_request(&conventions, &req);
    let hashes: Vec<Option<i64>> = batch
        .column_by_name(col::IDEMPOTENCY_KEY_HASH)
        .unwrap()
        .as_primitive::<Int64Type>()
        .iter()
        .collect();
    assert!(hashes[0].is_some());
    assert_eq!(hashes[0], hashes[1], "the same key under other aliases");
    assert_ne!(hashes[0], hashes[2]);
    assert_eq!(hashes[3], None, "an empty key is none");
    assert_eq!(
        hashes[0],
        Some(conventions.idempotency_key_hash(secret.as_bytes()))
    );
    let other = Conventions::default().with_key_secret([8; 16]);
    assert_ne!(
        hashes[0],
        Some(other.idempotency_key_hash(secret.as_bytes())),
        "keyed"
    );
    for row in 0..3 {
        let keys = map_keys(&batch, row);
        assert!(!keys.iter().any(|k| k.contains("idempotency")), "{keys:?}");
    }
    let text = format!("{batch:?}");
    assert!(!text.contains(secret), "the value is kept nowhere");
    let hits: Vec<Option<bool>> = batch
        .column_by_name(col::IDEMPOTENCY_HIT)
        .unwrap()
        .as_boolean()
        .iter()
        .collect();
    assert_eq!(&hits[4..], [Some(true), Some(true), None]);
    let pending: Vec<Option<bool>> = batch
        .column_by_name(col::PENDING)
        .unwrap()
        .as_boolean()
        .iter()
        .collect();
    assert_eq!(&pending[4..], [Some(false), Some(false), Some(true)]);
    assert!(
        !format!("{conventions:?}").contains("7, 7"),
        "the secret is not shown"
    );
}

/// The response code is kept raw (an HTTP status as its number, else a gRPC status by its
/// name, given as a number or a name), and an answer saying the request repeats one already
/// done is marked: HTTP 409, gRPC ALREADY_EXISTS, an `error.type` naming a duplicate.
#[test]
fn response_codes_raw_and_duplicates() {
    let spans = vec![
        span(
            1,
            1,
            "a",
            2,
            0,
            1,
            vec![kv_int("http.response.status_code", 409)],
        ),
        span(1, 2, "b", 2, 0, 1, vec![kv_int("rpc.grpc.status_code", 6)]),
        span(
            1,
            3,
            "c",
            2,
            0,
            1,
            vec![kv("rpc.response.status_code", "already_exists")],
        ),
        span(
            1,
            4,
            "d",
            2,
            0,
            1,
            vec![kv("error.type", "UniqueViolation")],
        ),
        span(
            1,
            5,
            "e",
            2,
            0,
            1,
            vec![kv_int("http.response.status_code", 503)],
        ),
        span(1, 6, "f", 2, 0, 1, vec![]),
    ];
    let (batch, _) = encode(&request(vec![("svc", spans)]));
    let codes = strings(&batch, col::RESPONSE_CODE);
    let want = [
        Some("409"),
        Some("ALREADY_EXISTS"),
        Some("ALREADY_EXISTS"),
        None,
        Some("503"),
        None,
    ];
    assert_eq!(codes, want.map(|c| c.map(str::to_owned)));
    let duplicate: Vec<Option<bool>> = batch
        .column_by_name(col::DUPLICATE)
        .unwrap()
        .as_boolean()
        .iter()
        .collect();
    let want = [true, true, true, true, false, false];
    assert_eq!(duplicate, want.map(Some));
}

/// The wait an answer asks for, in ms: Retry-After in seconds or as an HTTP date (from the
/// span's end), gRPC pushback in ms, and -1 where a pushback says not to retry (negative,
/// or not an integer).
#[test]
fn asked_waits() {
    let header = |v: &str| vec![kv_strings("http.response.header.retry-after", &[v])];
    let pushback = |v: &str| {
        vec![kv_strings(
            "rpc.grpc.response.metadata.grpc-retry-pushback-ms",
            &[v],
        )]
    };
    // The spans end 1 s past the testkit's epoch, 2025-11-24 16:00:00 UTC.
    let spans = vec![
        span(1, 1, "a", 3, 0, 1000, header("2")),
        span(
            1,
            2,
            "b",
            3,
            0,
            1000,
            header("Mon, 24 Nov 2025 16:00:04 GMT"),
        ),
        span(
            1,
            3,
            "c",
            3,
            0,
            1000,
            header("Mon, 24 Nov 2025 15:00:00 GMT"),
        ),
        span(1, 4, "d", 3, 0, 1000, pushback("250")),
        span(1, 5, "e", 3, 0, 1000, pushback("-1")),
        span(1, 6, "f", 3, 0, 1000, pushback("soon")),
        span(1, 7, "g", 3, 0, 1000, header("tomorrow")),
        span(1, 8, "h", 3, 0, 1000, vec![]),
    ];
    let (batch, report) = encode(&request(vec![("svc", spans)]));
    let waits: Vec<Option<f64>> = batch
        .column_by_name(col::RETRY_AFTER_MS)
        .unwrap()
        .as_primitive::<Float64Type>()
        .iter()
        .collect();
    let want = [
        Some(2000.0),
        Some(3000.0),
        Some(0.0),
        Some(250.0),
        Some(-1.0),
        Some(-1.0),
        None,
        None,
    ];
    assert_eq!(waits, want);
    assert_eq!(
        report.malformed[Concept::RetryAfter as usize],
        1,
        "the unreadable one"
    );
}
