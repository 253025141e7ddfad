//! Receivers on real loopback sockets: every transport yields the same Arrow rows, and every
//! kind of bad input gets OTLP's answer while the server keeps serving. Long because it is
//! one short test per transport and kind of bad input; each stands alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use stormglass_ingest::{IngestMetrics, Pipeline, ReceiverConfig, Receivers};
use stormglass_model::Conventions;
use stormglass_runtime::{MemoryBudget, Overload, SinkFull, SpanSink};
use stormglass_testkit::otlp::{request, retry_fixture, span};
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;

const LIMIT: usize = 256 * 1024;

/// Records every batch; refuses everything while `full` is set.
#[derive(Default)]
struct Recording {
    batches: Mutex<Vec<RecordBatch>>,
    full: AtomicBool,
}

impl SpanSink for Recording {
    fn accept(&self, batch: RecordBatch) -> Result<(), SinkFull> {
        if self.full.load(Ordering::SeqCst) {
            return Err(SinkFull {
                retry_after: Duration::from_secs(3),
                limit: Overload::Memory,
            });
        }
        self.batches.lock().unwrap().push(batch);
        Ok(())
    }
}

impl Recording {
    fn take(&self) -> Vec<RecordBatch> {
        std::mem::take(&mut *self.batches.lock().unwrap())
    }
}

struct Harness {
    sink: Arc<Recording>,
    registry: prometheus::Registry,
    grpc: String,
    http: String,
    client: reqwest::Client,
    _stop: watch::Sender<bool>,
}

impl Harness {
    async fn start() -> Harness {
        Self::start_with(MemoryBudget::unregistered(256 << 20)).await
    }

    async fn start_with(memory: MemoryBudget) -> Harness {
        let sink = Arc::new(Recording::default());
        let registry = prometheus::Registry::new();
        let metrics = IngestMetrics::register(&registry).unwrap();
        let pipeline = Pipeline::new(sink.clone(), Arc::new(Conventions::default()), metrics);
        let (stop, shutdown) = watch::channel(false);
        let config = ReceiverConfig {
            grpc: "127.0.0.1:0".parse().unwrap(),
            http: "127.0.0.1:0".parse().unwrap(),
            max_request_bytes: LIMIT,
            max_concurrent_requests: 64,
            memory,
            tls: None,
            token: None,
            request_timeout: BODY_TIMEOUT,
        };
        let receivers = Receivers::start(&config, pipeline, shutdown).await.unwrap();
        let harness = Harness {
            sink,
            registry,
            grpc: format!("http://{}", receivers.grpc_addr),
            http: format!("http://{}/v1/traces", receivers.http_addr),
            client: reqwest::Client::new(),
            _stop: stop,
        };
        tokio::spawn(receivers.wait());
        harness
    }

    async fn grpc_client(&self) -> TraceServiceClient<tonic::transport::Channel> {
        TraceServiceClient::connect(self.grpc.clone())
            .await
            .unwrap()
    }

    async fn post(
        &self,
        content_type: &str,
        encoding: Option<&str>,
        body: Vec<u8>,
    ) -> reqwest::Response {
        let mut req = self
            .client
            .post(&self.http)
            .header("content-type", content_type)
            .body(body);
        if let Some(e) = encoding {
            req = req.header("content-encoding", e);
        }
        req.send().await.unwrap()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| {
                labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// A gRPC client that sends raw bytes to the Export method, and the method's path.
    async fn raw_grpc(
        &self,
    ) -> (
        tonic::client::Grpc<tonic::transport::Channel>,
        tonic::codegen::http::uri::PathAndQuery,
    ) {
        let channel = tonic::transport::Endpoint::from_shared(self.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        );
        (grpc, path)
    }

    /// The server still accepts a good request.
    async fn assert_still_serving(&self) {
        self.sink.take();
        let response = self
            .post(
                "application/x-protobuf",
                None,
                retry_fixture().encode_to_vec(),
            )
            .await;
        assert_eq!(response.status(), 200);
        let mut client = self.grpc_client().await;
        client.export(retry_fixture()).await.unwrap();
        assert_eq!(self.sink.take().len(), 2);
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn json(request: &ExportTraceServiceRequest) -> Vec<u8> {
    serde_json::to_vec(request).unwrap()
}

/// The same fixture over gRPC, gzip'd gRPC, HTTP/protobuf, HTTP/JSON, gzip'd and zstd'd HTTP
/// yields identical Arrow batches.
#[tokio::test]
async fn every_transport_yields_identical_batches() {
    let h = Harness::start().await;
    let fixture = retry_fixture();
    let proto = fixture.encode_to_vec();

    h.grpc_client().await.export(fixture.clone()).await.unwrap();
    h.grpc_client()
        .await
        .send_compressed(CompressionEncoding::Gzip)
        .export(fixture.clone())
        .await
        .unwrap();
    for (content_type, encoding, body) in [
        ("application/x-protobuf", None, proto.clone()),
        ("application/json", None, json(&fixture)),
        ("application/x-protobuf", Some("gzip"), gzip(&proto)),
        ("application/json", Some("gzip"), gzip(&json(&fixture))),
        (
            "application/x-protobuf",
            Some("zstd"),
            zstd::encode_all(&proto[..], 3).unwrap(),
        ),
    ] {
        let response = h.post(content_type, encoding, body).await;
        assert_eq!(response.status(), 200, "{content_type} {encoding:?}");
        assert_eq!(response.headers()["content-type"], content_type);
    }

    let batches = h.sink.take();
    assert_eq!(batches.len(), 7);
    assert_eq!(batches[0].num_rows(), 5);
    for (i, batch) in batches.iter().enumerate() {
        assert_eq!(batch, &batches[0], "transport #{i} differs");
    }
    assert_eq!(
        h.counter(
            "stormglass_receiver_accepted_spans_total",
            &[("transport", "grpc")]
        ),
        10
    );
    assert_eq!(
        h.counter("stormglass_receiver_accepted_spans_total", &[]),
        35
    );
}

/// Hand-written OTLP/JSON as other SDKs send it: ids in hex, enums as integers, 64-bit
/// integers as strings or numbers, unknown fields anywhere.
#[tokio::test]
async fn otlp_json_as_sdks_write_it() {
    let h = Harness::start().await;
    let body = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"checkout"}}],"futureField":1},
      "scopeSpans":[{"scope":{"name":"x"},"spans":[
        {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","parentSpanId":"",
         "name":"GET /a","kind":2,"startTimeUnixNano":"1544712660000000000","endTimeUnixNano":1544712661000000000,
         "attributes":[{"key":"retry","value":{"intValue":"2"}},{"key":"deadline","value":{"intValue":300}}],
         "status":{"code":2,"message":"boom"},"droppedAttributesCount":0,"unknown":{"nested":[1,2]}}]}]}]}"#;
    let response = h
        .post("application/json", None, body.as_bytes().to_vec())
        .await;
    assert_eq!(response.status(), 200);
    let batches = h.sink.take();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].num_rows(), 1);
}

/// A 3-byte trace id is rejected with partial success over both transports; the valid span
/// of the same request is kept.
#[tokio::test]
async fn bad_ids_get_partial_success() {
    let h = Harness::start().await;
    let mut bad = span(1, 1, "bad", 2, 0, 1, vec![]);
    bad.trace_id = vec![1, 2, 3];
    let good = span(1, 2, "good", 2, 0, 1, vec![]);
    let req = request(vec![("svc", vec![bad, good])]);

    let grpc = h
        .grpc_client()
        .await
        .export(req.clone())
        .await
        .unwrap()
        .into_inner();
    let partial = grpc.partial_success.unwrap();
    assert_eq!(partial.rejected_spans, 1);
    assert!(
        partial.error_message.contains("trace id has 3 bytes"),
        "{}",
        partial.error_message
    );

    let response = h
        .post("application/x-protobuf", None, req.encode_to_vec())
        .await;
    assert_eq!(response.status(), 200);
    let body = ExportTraceServiceResponse::decode(response.bytes().await.unwrap()).unwrap();
    assert_eq!(body.partial_success.unwrap().rejected_spans, 1);

    let response = h.post("application/json", None, json(&req)).await;
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(
        body["partialSuccess"]["rejectedSpans"].as_i64(),
        Some(1),
        "{body}"
    );

    assert_eq!(h.sink.take().iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    assert_eq!(
        h.counter(
            "stormglass_receiver_refused_spans_total",
            &[("reason", "invalid")]
        ),
        3
    );
}

/// Undecodable bodies, unknown content types and encodings get 400/415 and a google.rpc.Status.
#[tokio::test]
async fn malformed_requests_get_client_errors() {
    let h = Harness::start().await;
    let cases: [(&str, Option<&str>, Vec<u8>, u16); 5] = [
        ("application/x-protobuf", None, vec![0xff, 0xff, 0xff], 400),
        (
            "application/json",
            None,
            b"{\"resourceSpans\": [".to_vec(),
            400,
        ),
        (
            "application/x-protobuf",
            Some("gzip"),
            b"not gzip at all".to_vec(),
            400,
        ),
        ("text/plain", None, b"hello".to_vec(), 415),
        ("application/x-protobuf", Some("br"), vec![], 415),
    ];
    for (content_type, encoding, body, status) in cases {
        let response = h.post(content_type, encoding, body).await;
        assert_eq!(response.status(), status, "{content_type} {encoding:?}");
        let bytes = response.bytes().await.unwrap();
        if content_type == "application/x-protobuf" {
            let rpc = stormglass_ingest::error::RpcStatus::decode(bytes).unwrap();
            assert!(!rpc.message.is_empty());
        } else {
            let rpc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let message = rpc["message"].as_str().unwrap();
            assert_eq!(status == 415, message.contains("unsupported"), "{rpc}");
        }
    }
    assert_eq!(
        h.counter("stormglass_receiver_refused_requests_total", &[]),
        5
    );
    h.assert_still_serving().await;
}

/// Bodies over the limit get 413 / RESOURCE_EXHAUSTED, whether large as sent or only after
/// decompression (a gzip and a zstd bomb of 64 MiB of zeroes, and the same over gRPC).
#[tokio::test]
async fn oversized_and_bomb_bodies_are_refused() {
    let h = Harness::start().await;
    let huge = vec![0u8; LIMIT + 1];
    let bomb = vec![0u8; 64 << 20];
    assert_eq!(
        h.post("application/x-protobuf", None, huge).await.status(),
        413
    );
    let gz = gzip(&bomb);
    assert!(gz.len() < LIMIT);
    assert_eq!(
        h.post("application/x-protobuf", Some("gzip"), gz)
            .await
            .status(),
        413
    );
    let zs = zstd::encode_all(&bomb[..], 3).unwrap();
    assert_eq!(
        h.post("application/x-protobuf", Some("zstd"), zs)
            .await
            .status(),
        413
    );

    // gRPC: one real request with a 300 KiB attribute, plain and gzip'd.
    let mut s = span(
        1,
        1,
        "big",
        2,
        0,
        1,
        vec![stormglass_testkit::otlp::kv(
            "blob",
            &"x".repeat(300 * 1024),
        )],
    );
    s.name = "big".into();
    let big = request(vec![("svc", vec![s])]);
    let status = h.grpc_client().await.export(big.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let status = h
        .grpc_client()
        .await
        .send_compressed(CompressionEncoding::Gzip)
        .export(big)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");

    assert_eq!(
        h.counter(
            "stormglass_receiver_refused_requests_total",
            &[("reason", "too_large")]
        ),
        5
    );
    h.assert_still_serving().await;
}

/// Garbage sent as a gRPC message gets INVALID_ARGUMENT, not tonic's INTERNAL.
#[tokio::test]
async fn undecodable_grpc_message_is_invalid_argument() {
    let h = Harness::start().await;
    let (mut grpc, path) = h.raw_grpc().await;
    let status = grpc
        .unary::<Vec<u8>, Vec<u8>, RawCodec>(tonic::Request::new(vec![0xff; 7]), path, RawCodec)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    h.assert_still_serving().await;
}

/// A string that is not UTF-8 sent over gRPC gets INVALID_ARGUMENT, counted as undecodable,
/// with nothing stored (the receiver decodes strings as bytes and checks them itself).
#[tokio::test]
async fn invalid_utf8_over_grpc_is_invalid_argument() {
    let h = Harness::start().await;
    let mut body =
        request(vec![("svc", vec![span(1, 1, "XXXX", 2, 0, 1, vec![])])]).encode_to_vec();
    let at = body.windows(4).position(|w| w == b"XXXX").unwrap();
    body[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xc0, 0x80]);
    let (mut grpc, path) = h.raw_grpc().await;
    let status = grpc
        .unary::<Vec<u8>, Vec<u8>, RawCodec>(tonic::Request::new(body), path, RawCodec)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("Span.name"), "{status:?}");
    assert_eq!(
        h.counter(
            "stormglass_receiver_refused_requests_total",
            &[("transport", "grpc"), ("reason", "undecodable")]
        ),
        1
    );
    assert!(h.sink.take().is_empty());
    h.assert_still_serving().await;
}

/// Over the memory bound: retryable 503 + Retry-After and UNAVAILABLE; nothing stored.
#[tokio::test]
async fn full_pipeline_answers_retryable() {
    let h = Harness::start().await;
    h.sink.full.store(true, Ordering::SeqCst);
    let response = h
        .post(
            "application/x-protobuf",
            None,
            retry_fixture().encode_to_vec(),
        )
        .await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "3");
    let status = h
        .grpc_client()
        .await
        .export(retry_fixture())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(h.sink.take().is_empty());
    assert_eq!(
        h.counter(
            "stormglass_receiver_refused_spans_total",
            &[("reason", "memory_limit")]
        ),
        10
    );
    h.sink.full.store(false, Ordering::SeqCst);
    h.assert_still_serving().await;
}

/// Empty requests (no body, empty JSON object, empty protobuf) succeed and store nothing.
#[tokio::test]
async fn empty_requests_succeed() {
    let h = Harness::start().await;
    assert_eq!(
        h.post("application/x-protobuf", None, vec![])
            .await
            .status(),
        200
    );
    assert_eq!(
        h.post("application/json", None, b"{}".to_vec())
            .await
            .status(),
        200
    );
    assert_eq!(h.post("application/json", None, vec![]).await.status(), 200);
    h.grpc_client()
        .await
        .export(ExportTraceServiceRequest::default())
        .await
        .unwrap();
    assert!(h.sink.take().is_empty());
}

/// One request per bad-input class of docs/operating.md's "Bad input" table, over OTLP/HTTP
/// protobuf, with the answer each must get: 400 for what cannot be decoded (truncated, wrong
/// types, invalid UTF-8, nesting past the decoder's depth limit); partial success for spans
/// that cannot be placed (end before start, times past 2262); 200 with everything kept for
/// odd but valid spans (huge attribute counts and values, nested arrays, hostile UTF-8 in
/// names, unreadable contract attributes, which are counted).
#[tokio::test]
async fn every_bad_input_class_gets_its_answer() {
    use opentelemetry_proto::tonic::common::v1::{
        AnyValue, ArrayValue, KeyValue, KeyValueList, any_value::Value,
    };
    let h = Harness::start().await;
    let text = |v: &str| AnyValue {
        value: Some(Value::StringValue(v.into())),
    };
    let attribute = |key: &str, value: AnyValue| KeyValue {
        key: key.into(),
        value: Some(value),
        ..Default::default()
    };
    let nested = |depth: usize| {
        let mut value = text("bottom");
        for _ in 0..depth {
            value = AnyValue {
                value: Some(Value::ArrayValue(ArrayValue {
                    values: vec![value],
                })),
            };
        }
        value
    };
    let one = |s| request(vec![("svc", vec![s])]);
    // (class, body, HTTP status, spans rejected by partial success, spans kept)
    let mut cases: Vec<(&str, Vec<u8>, u16, i64, usize)> = Vec::new();

    let whole = retry_fixture().encode_to_vec();
    cases.push(("truncated", whole[..whole.len() / 2].to_vec(), 400, 0, 0));
    // A string where a message belongs: the field's wire type is wrong.
    cases.push(("wrong types", vec![0x0a, 0x03, 0x0a, 0x01, 0x05], 400, 0, 0));
    let mut invalid_utf8 = one(span(1, 1, "XXXX", 2, 0, 1, vec![])).encode_to_vec();
    let at = invalid_utf8.windows(4).position(|w| w == b"XXXX").unwrap();
    invalid_utf8[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xc0, 0x80]);
    cases.push(("invalid UTF-8", invalid_utf8, 400, 0, 0));
    let too_deep = one(span(
        1,
        1,
        "deep",
        2,
        0,
        1,
        vec![attribute("a", nested(200))],
    ));
    cases.push((
        "nesting past the decoder's limit",
        too_deep.encode_to_vec(),
        400,
        0,
        0,
    ));

    let backwards = span(1, 1, "backwards", 2, 5, 1, vec![]);
    cases.push((
        "end before start",
        one(backwards).encode_to_vec(),
        200,
        1,
        0,
    ));
    let mut future = span(1, 1, "future", 2, 0, 1, vec![]);
    future.start_time_unix_nano = u64::MAX - 1;
    future.end_time_unix_nano = u64::MAX;
    cases.push(("times past 2262", one(future).encode_to_vec(), 200, 1, 0));
    let mut epoch = span(1, 1, "1970", 2, 0, 1, vec![]);
    epoch.start_time_unix_nano = 0;
    epoch.end_time_unix_nano = 1;
    cases.push(("times at 1970", one(epoch).encode_to_vec(), 200, 0, 1));

    let many: Vec<KeyValue> = (0..2000)
        .map(|i| attribute(&format!("k{i}"), text("v")))
        .chain([attribute("big", text(&"x".repeat(100_000)))])
        .collect();
    cases.push((
        "huge attribute counts and values",
        one(span(1, 1, "many", 2, 0, 1, many)).encode_to_vec(),
        200,
        0,
        1,
    ));
    let list = AnyValue {
        value: Some(Value::KvlistValue(KeyValueList {
            values: vec![attribute("inner", nested(3))],
        })),
    };
    let arrays = vec![
        attribute("a", nested(20)),
        attribute("l", list),
        attribute("retry", nested(2)),
    ];
    cases.push((
        "nested arrays and lists",
        one(span(1, 1, "nested", 2, 0, 1, arrays)).encode_to_vec(),
        200,
        0,
        1,
    ));
    let hostile = span(
        1,
        1,
        "na\"me\n\u{0}\u{202e}\u{1F329}",
        2,
        0,
        1,
        vec![attribute("retry", text("three"))],
    );
    cases.push((
        "hostile UTF-8 in names, unreadable contract attribute",
        request(vec![("s\"v\\c\n\u{202e}", vec![hostile])]).encode_to_vec(),
        200,
        0,
        1,
    ));

    for (class, body, status, rejected, kept) in cases {
        let response = h.post("application/x-protobuf", None, body).await;
        assert_eq!(response.status().as_u16(), status, "{class}");
        let bytes = response.bytes().await.unwrap();
        if status == 200 {
            let answer = ExportTraceServiceResponse::decode(bytes).unwrap();
            let partial = answer.partial_success.map_or(0, |p| p.rejected_spans);
            assert_eq!(partial, rejected, "{class}");
        }
        let stored: usize = h.sink.take().iter().map(|b| b.num_rows()).sum();
        assert_eq!(stored, kept, "{class}");
    }
    assert!(
        h.counter(
            "stormglass_receiver_malformed_fields_total",
            &[("field", "attempt")]
        ) >= 2,
        "the retry attributes that are an array and a word are counted"
    );
    h.assert_still_serving().await;
}

/// The harness's `limits.request_timeout`: short, for the slow-body test, yet far above what
/// the largest test body takes on loopback.
const BODY_TIMEOUT: Duration = Duration::from_secs(3);

/// A body that stalls (a slow or hostile client: headers, part of the body, then nothing)
/// gets 408 over HTTP and DEADLINE_EXCEEDED over gRPC once limits.request_timeout passes,
/// counted as reason="timeout"; its request slot is freed.
#[tokio::test]
async fn stalled_bodies_time_out_and_free_their_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start().await;
    let address = h
        .http
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    tcp.write_all(
        b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\ncontent-length: 1000\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    let mut answer = vec![0; 512];
    let read = tokio::time::timeout(BODY_TIMEOUT * 4, tcp.read(&mut answer))
        .await
        .expect("an answer once limits.request_timeout passed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    let (mut grpc, path) = h.raw_grpc().await;
    // One message, then the stream neither ends nor sends more.
    let stalled = tokio_stream::StreamExt::chain(
        tokio_stream::iter(vec![retry_fixture().encode_to_vec()]),
        tokio_stream::pending(),
    );
    let status = tokio::time::timeout(
        BODY_TIMEOUT * 4,
        grpc.client_streaming::<_, Vec<u8>, Vec<u8>, RawCodec>(
            tonic::Request::new(stalled),
            path,
            RawCodec,
        ),
    )
    .await
    .expect("an answer once limits.request_timeout passed")
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert_eq!(
        h.counter(
            "stormglass_receiver_refused_requests_total",
            &[("reason", "timeout")]
        ),
        2
    );
    assert!(h.sink.take().is_empty());
    h.assert_still_serving().await;
}

/// Sends and receives raw bytes, so a test can put anything on the wire.
#[derive(Clone, Copy)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes_put::BufMutExt;
        dst.put_bytes(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes_put::BufExt;
        Ok(Some(src.take_all()))
    }
}

/// Tiny adapters over the `bytes` traits that tonic's buffers implement.
mod bytes_put {
    pub trait BufMutExt {
        fn put_bytes(&mut self, bytes: &[u8]);
    }
    impl<T: prost::bytes::BufMut> BufMutExt for T {
        fn put_bytes(&mut self, bytes: &[u8]) {
            self.put_slice(bytes);
        }
    }
    pub trait BufExt {
        fn take_all(&mut self) -> Vec<u8>;
    }
    impl<T: prost::bytes::Buf> BufExt for T {
        fn take_all(&mut self) -> Vec<u8> {
            let mut out = vec![0; self.remaining()];
            self.copy_to_slice(&mut out);
            out
        }
    }
}

/// A full memory budget refuses requests before they are decoded: retryable on both
/// transports (503 + Retry-After, UNAVAILABLE + RetryInfo), counted per request, nothing
/// stored; freeing the memory lets requests in again.
#[tokio::test]
async fn admission_refuses_before_decoding_when_memory_is_full() {
    use tonic_types::StatusExt;
    let budget = MemoryBudget::unregistered(1 << 20);
    let h = Harness::start_with(budget.clone()).await;
    let hog = budget.try_reserve(budget.limit() * 3 / 4 - 64).unwrap();
    let response = h
        .post(
            "application/x-protobuf",
            None,
            retry_fixture().encode_to_vec(),
        )
        .await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let status = h
        .grpc_client()
        .await
        .export(retry_fixture())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let retry = status.get_details_retry_info().and_then(|r| r.retry_delay);
    assert_eq!(retry, Some(Duration::from_secs(1)));
    assert!(h.sink.take().is_empty());
    assert_eq!(
        h.counter(
            "stormglass_receiver_refused_requests_total",
            &[("reason", "memory_limit")]
        ),
        2
    );
    assert!(budget.refusing());
    drop(hog);
    h.assert_still_serving().await;
    assert_eq!(budget.used(), 0, "every request's reservation was returned");
}
