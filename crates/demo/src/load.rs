//! A load generator for OTLP receivers: `stormglass load`.
//!
//! Traces come from [`stormglass_model::synth`] and are encoded once, up front, into a few
//! export requests ([`Payloads`]). Each send copies one of them and writes fresh trace ids
//! into it at the byte offsets found at encoding time, so every send carries new traces at
//! the cost of a copy, never a re-encode. `concurrency` tasks each keep one unary export in
//! flight over OTLP/gRPC (one HTTP/2 connection, as an SDK exporter has) or OTLP/HTTP
//! protobuf, until `duration` has passed. Span timestamps stay those of the encoding: the
//! collector assembles by arrival, and only the spans' relative times matter to the figures.
//!
//! [`ProcStats`] reads a server's CPU time and resident memory from `/proc`, so a run
//! reports spans per server CPU-second, which is what the benchmark compares.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use serde::Serialize;
use stormglass_model::synth::{Generator, Shape};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// What a load run sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Grpc,
    Http,
}

/// Export requests encoded once; each send gets fresh trace ids without re-encoding.
pub struct Payloads {
    templates: Vec<Template>,
    traces: u64,
    /// Random per run, so two runs against one collector never send the same trace id.
    run: u64,
}

struct Template {
    bytes: Vec<u8>,
    spans: u64,
    /// Where each span's 16-byte trace id starts.
    trace_id_offsets: Vec<usize>,
}

impl Payloads {
    /// `count` requests of at least `spans_per_request` spans (whole traces) each.
    pub fn generate(shape: Shape, spans_per_request: usize, count: usize) -> Payloads {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let mut generator = Generator::new(shape, now);
        let templates = (0..count.max(1))
            .map(|_| Template::new(&generator.request(spans_per_request)))
            .collect();
        Payloads {
            templates,
            traces: generator.traces(),
            run: rand::random(),
        }
    }

    /// The `send`-th request: template `send % count` with trace ids unique to this send.
    /// The first 8 bytes of each id become the run's random number plus `send`; the last 8
    /// stay the template's random ones, which tell its traces apart.
    pub fn fresh(&self, send: u64) -> (Vec<u8>, u64) {
        let template = &self.templates[(send % self.templates.len() as u64) as usize];
        let mut bytes = template.bytes.clone();
        let prefix = self.run.wrapping_add(send).to_be_bytes();
        for &offset in &template.trace_id_offsets {
            bytes[offset..offset + 8].copy_from_slice(&prefix);
        }
        (bytes, template.spans)
    }

    pub fn requests(&self) -> impl Iterator<Item = &[u8]> {
        self.templates.iter().map(|t| t.bytes.as_slice())
    }

    pub fn spans(&self) -> u64 {
        self.templates.iter().map(|t| t.spans).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.templates.iter().map(|t| t.bytes.len() as u64).sum()
    }

    pub fn spans_per_request(&self) -> f64 {
        self.spans() as f64 / self.templates.len().max(1) as f64
    }

    pub fn spans_per_trace(&self) -> f64 {
        self.spans() as f64 / self.traces.max(1) as f64
    }
}

impl Template {
    fn new(request: &ExportTraceServiceRequest) -> Template {
        let bytes = request.encode_to_vec();
        let spans = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans);
        let ids: HashSet<&[u8]> = spans.clone().map(|s| &s.trace_id[..]).collect();
        let spans = spans.count();
        // A span's trace id is field 1, length-delimited: tag 0x0a, length 0x10, 16 bytes.
        // The ids are random, so their 18-byte pattern occurs nowhere else; the count check
        // below proves it for this payload.
        let trace_id_offsets: Vec<usize> = bytes
            .windows(18)
            .enumerate()
            .filter(|(_, w)| w[0] == 0x0a && w[1] == 0x10 && ids.contains(&w[2..]))
            .map(|(i, _)| i + 2)
            .collect();
        assert_eq!(
            trace_id_offsets.len(),
            spans,
            "every span's trace id must be found exactly once in the encoded request"
        );
        Template {
            bytes,
            spans: spans as u64,
            trace_id_offsets,
        }
    }
}

/// A tonic codec sending already-encoded request bytes and decoding the OTLP response.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        prost::bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ExportTraceServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = ProstDecoder<ExportTraceServiceResponse>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

/// One load run's settings.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub protocol: Protocol,
    /// `host:port` of the receiver.
    pub endpoint: String,
    pub concurrency: usize,
    pub duration: Duration,
    /// Spans per second to send at most (paced per request); `None` sends as fast as the
    /// receiver answers.
    pub rate: Option<f64>,
    /// Server process whose CPU and memory to report.
    pub server_pid: Option<u32>,
    /// Extra time after the last answer before reading the server's CPU, so work the
    /// server does after answering (assembly, analysis) is counted.
    pub settle: Duration,
}

/// What a load run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    pub protocol: Option<Protocol>,
    pub concurrency: usize,
    pub wall_seconds: f64,
    pub requests: u64,
    /// Spans the server accepted (sent less refused, rejected and failed).
    pub accepted_spans: u64,
    /// Spans of requests refused with a retryable answer (UNAVAILABLE, RESOURCE_EXHAUSTED,
    /// 429, 503), not re-sent.
    pub refused_spans: u64,
    /// Spans the server rejected by partial success.
    pub rejected_spans: u64,
    /// Spans of requests that failed otherwise (transport errors, other statuses).
    pub failed_spans: u64,
    pub first_error: Option<String>,
    pub spans_per_second: f64,
    pub bytes_per_span: f64,
    pub spans_per_trace: f64,
    pub server: Option<ServerUsage>,
}

/// A server's resource use over a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerUsage {
    pub pid: u32,
    pub cpu_seconds: f64,
    pub spans_per_cpu_second: f64,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl Counters {
    fn error(&self, spans: u64, message: String, retryable: bool) {
        if retryable {
            self.refused.fetch_add(spans, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(spans, Ordering::Relaxed);
        }
        let mut first = self
            .first_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        first.get_or_insert(message);
    }
}

/// Errors that stop a run before it sends anything.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("cannot read /proc for pid {pid}: {source}")]
    Proc { pid: u32, source: std::io::Error },
}

/// Send `payloads` as `config` says and report what happened.
pub async fn run(config: &LoadConfig, payloads: Arc<Payloads>) -> Result<LoadReport, LoadError> {
    let before = match config.server_pid {
        Some(pid) => Some(ProcStats::read(pid).map_err(|source| LoadError::Proc { pid, source })?),
        None => None,
    };
    let sender = Sender::connect(config).await?;
    let counters = Arc::new(Counters::default());
    let sends = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + config.duration;
    // With a rate, the n-th request is due n request-intervals after the start, whichever
    // task sends it: the rate holds however many are in flight.
    let every = config
        .rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(payloads.spans_per_request() / r));
    let tasks: Vec<_> = (0..config.concurrency.max(1))
        .map(|_| {
            let (sender, counters, sends, payloads) = (
                sender.clone(),
                counters.clone(),
                sends.clone(),
                payloads.clone(),
            );
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let send = sends.fetch_add(1, Ordering::Relaxed);
                    if let Some(every) = every {
                        let due = started + every.mul_f64(send as f64);
                        if due >= deadline {
                            break;
                        }
                        tokio::time::sleep_until(due.into()).await;
                    }
                    let (body, spans) = payloads.fresh(send);
                    counters.requests.fetch_add(1, Ordering::Relaxed);
                    if !sender.send(body, spans, &counters).await {
                        // Refused: back off a little, as exporters do, instead of spinning.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    let wall = started.elapsed().as_secs_f64();
    tokio::time::sleep(config.settle).await;
    let accepted = counters.accepted.load(Ordering::Relaxed);
    let server = match (config.server_pid, before) {
        (Some(pid), Some(before)) => {
            let after = ProcStats::read(pid).map_err(|source| LoadError::Proc { pid, source })?;
            let cpu = after.cpu_seconds - before.cpu_seconds;
            Some(ServerUsage {
                pid,
                cpu_seconds: cpu,
                spans_per_cpu_second: if cpu > 0.0 {
                    accepted as f64 / cpu
                } else {
                    0.0
                },
                rss_bytes: after.rss_bytes,
                peak_rss_bytes: after.peak_rss_bytes,
            })
        }
        _ => None,
    };
    let first_error = counters
        .first_error
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    Ok(LoadReport {
        protocol: Some(config.protocol),
        concurrency: config.concurrency.max(1),
        wall_seconds: wall,
        requests: counters.requests.load(Ordering::Relaxed),
        accepted_spans: accepted,
        refused_spans: counters.refused.load(Ordering::Relaxed),
        rejected_spans: counters.rejected.load(Ordering::Relaxed),
        failed_spans: counters.failed.load(Ordering::Relaxed),
        first_error,
        spans_per_second: accepted as f64 / wall,
        bytes_per_span: payloads.bytes() as f64 / payloads.spans().max(1) as f64,
        spans_per_trace: payloads.spans_per_trace(),
        server,
    })
}

#[derive(Clone)]
enum Sender {
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
    Http {
        client: reqwest::Client,
        url: String,
    },
}

impl Sender {
    async fn connect(config: &LoadConfig) -> Result<Sender, LoadError> {
        Ok(match config.protocol {
            Protocol::Grpc => {
                let endpoint = format!("http://{}", config.endpoint);
                let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
                    .map_err(|source| LoadError::Connect {
                        endpoint: endpoint.clone(),
                        source,
                    })?
                    .connect()
                    .await
                    .map_err(|source| LoadError::Connect { endpoint, source })?;
                Sender::Grpc(
                    tonic::client::Grpc::new(channel).max_decoding_message_size(4 * 1024 * 1024),
                )
            }
            Protocol::Http => Sender::Http {
                client: reqwest::Client::builder().build()?,
                url: format!("http://{}/v1/traces", config.endpoint),
            },
        })
    }

    /// Send one request; false when it was refused or failed.
    async fn send(&self, body: Vec<u8>, spans: u64, counters: &Counters) -> bool {
        let response = match self {
            Sender::Grpc(grpc) => {
                let mut grpc = grpc.clone();
                if let Err(e) = grpc.ready().await {
                    counters.error(spans, format!("gRPC channel: {e}"), false);
                    return false;
                }
                match grpc
                    .unary(
                        tonic::Request::new(body),
                        http::uri::PathAndQuery::from_static(EXPORT_PATH),
                        RawCodec,
                    )
                    .await
                {
                    Ok(response) => response.into_inner(),
                    Err(status) => {
                        let retryable = matches!(
                            status.code(),
                            tonic::Code::Unavailable | tonic::Code::ResourceExhausted
                        );
                        counters.error(spans, format!("gRPC {status}"), retryable);
                        return false;
                    }
                }
            }
            Sender::Http { client, url } => {
                let answer = client
                    .post(url)
                    .header("content-type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await;
                let answer = match answer {
                    Ok(answer) => answer,
                    Err(e) => {
                        counters.error(spans, format!("HTTP: {e}"), false);
                        return false;
                    }
                };
                let status = answer.status();
                let body = answer.bytes().await.unwrap_or_default();
                if !status.is_success() {
                    let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
                    counters.error(spans, format!("HTTP {status}"), retryable);
                    return false;
                }
                ExportTraceServiceResponse::decode(body).unwrap_or_default()
            }
        };
        let rejected = response
            .partial_success
            .map(|p| p.rejected_spans.max(0) as u64)
            .unwrap_or(0)
            .min(spans);
        counters.rejected.fetch_add(rejected, Ordering::Relaxed);
        counters
            .accepted
            .fetch_add(spans - rejected, Ordering::Relaxed);
        true
    }
}

/// The floor every OTLP receiver pays: decoding the payloads with prost into
/// `opentelemetry_proto`'s types on this thread for `duration`, and, for comparison,
/// decoding and encoding them to Arrow as stormglass's live path does (its lean messages
/// over one copy of the request, as tonic's buffer holds it, then the lean encoding).
/// Returns spans per CPU-second of each.
pub fn decode_floor(payloads: &Payloads, duration: Duration) -> DecodeReport {
    let conventions = stormglass_model::Conventions::default();
    let decode_only = per_cpu_second(payloads, duration, |bytes| {
        ExportTraceServiceRequest::decode(bytes)
            .map(|r| std::hint::black_box(r).resource_spans.len())
            .unwrap_or(0);
    });
    let decode_and_encode = per_cpu_second(payloads, duration, |bytes| {
        if let Ok(request) = stormglass_model::wire::decode(bytes::Bytes::copy_from_slice(bytes)) {
            let (batch, _) = stormglass_model::encode_lean(&conventions, &request);
            std::hint::black_box(batch);
        }
    });
    DecodeReport {
        decode_spans_per_cpu_second: decode_only,
        decode_and_arrow_spans_per_cpu_second: decode_and_encode,
        bytes_per_span: payloads.bytes() as f64 / payloads.spans().max(1) as f64,
        spans_per_trace: payloads.spans_per_trace(),
    }
}

/// Spans per CPU-second of this thread running `work` over every payload in turn.
fn per_cpu_second(payloads: &Payloads, duration: Duration, mut work: impl FnMut(&[u8])) -> f64 {
    let started = Instant::now();
    let cpu_before = thread_cpu_seconds();
    let mut spans = 0u64;
    while started.elapsed() < duration {
        for (bytes, template) in payloads.requests().zip(&payloads.templates) {
            work(bytes);
            spans += template.spans;
        }
    }
    let cpu = thread_cpu_seconds() - cpu_before;
    // /proc ticks are 10 ms; wall time is the better clock when the thread never waited.
    let seconds = if cpu > 0.5 {
        cpu
    } else {
        started.elapsed().as_secs_f64()
    };
    spans as f64 / seconds
}

/// What [`decode_floor`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeReport {
    pub decode_spans_per_cpu_second: f64,
    pub decode_and_arrow_spans_per_cpu_second: f64,
    pub bytes_per_span: f64,
    pub spans_per_trace: f64,
}

/// CPU time and memory of a process, from `/proc/PID/stat` and `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcStats {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
}

/// Clock ticks per second of `/proc` CPU times. Linux fixes USER_HZ at 100 on every
/// architecture it exports to user space.
const TICKS_PER_SECOND: f64 = 100.0;

impl ProcStats {
    pub fn read(pid: u32) -> std::io::Result<ProcStats> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        Ok(ProcStats {
            cpu_seconds: cpu_ticks(&stat) as f64 / TICKS_PER_SECOND,
            rss_bytes: status_kib(&status, "VmRSS:") * 1024,
            peak_rss_bytes: status_kib(&status, "VmHWM:") * 1024,
        })
    }
}

fn thread_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/stat")
        .map(|stat| cpu_ticks(&stat) as f64 / TICKS_PER_SECOND)
        .unwrap_or(0.0)
}

/// utime + stime (fields 14 and 15) of a `stat` line; the command name (field 2) may hold
/// spaces, so fields are counted after its closing parenthesis.
fn cpu_ticks(stat: &str) -> u64 {
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state), so field N is fields[N - 3].
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    field(14).unwrap_or(0) + field(15).unwrap_or(0)
}

fn status_kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each send carries trace ids no other send has, and the rest of the payload is the
    /// template's bytes: the request still decodes to the same spans.
    #[test]
    fn fresh_sends_get_new_trace_ids_without_reencoding() {
        let payloads = Payloads::generate(Shape::default(), 200, 2);
        let decode = |send| {
            let (bytes, spans) = payloads.fresh(send);
            let request = ExportTraceServiceRequest::decode(&bytes[..]).expect("decodes");
            let ids: Vec<Vec<u8>> = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
                .map(|s| s.trace_id.clone())
                .collect();
            assert_eq!(ids.len() as u64, spans);
            ids
        };
        let (first, again, other) = (decode(0), decode(2), decode(1));
        assert_eq!(first.len(), again.len(), "send 2 reuses template 0");
        assert!(
            first
                .iter()
                .zip(&again)
                .all(|(a, b)| a != b && a[8..] == b[8..])
        );
        assert!(first.iter().all(|id| !other.contains(id)));
    }

    /// The CPU fields are read after the command name, even when it holds spaces.
    #[test]
    fn proc_stat_fields() {
        let stat = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1";
        assert_eq!(cpu_ticks(stat), 300);
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), 1024);
        assert_eq!(status_kib(status, "VmHWM:"), 2048);
        let me = ProcStats::read(std::process::id()).expect("own /proc");
        assert!(me.rss_bytes > 0 && me.peak_rss_bytes >= me.rss_bytes);
    }
}
