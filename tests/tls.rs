//! End-to-end: `stormglass serve` with TLS (client certificates required) and bearer tokens
//! on the receivers and the API, fed by the real OpenTelemetry Rust SDK (OTLP/gRPC) and
//! Python SDK (OTLP/HTTP, from PyPI); the API read with curl; a renewed certificate served
//! without a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;
use opentelemetry::trace::{Span, SpanKind, Tracer, TracerProvider};
use opentelemetry_otlp::tonic_types::metadata::MetadataMap;
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

const TOKEN: &str = "receiver-s3cret";
const API_TOKEN: &str = "api-s3cret";

/// A test CA and the PEM files signed by it.
struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "stormglass test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki {
            dir: dir.to_owned(),
            ca,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    /// Write `NAME.pem` and `NAME.key`: a certificate for localhost and 127.0.0.1 named `cn`.
    fn issue(&self, name: &str, cn: &str) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        // Written beside, then renamed over: a reader never sees half a file.
        for (file, text) in [
            (format!("{name}.pem"), cert.pem()),
            (format!("{name}.key"), key.serialize_pem()),
        ] {
            let temporary = self.dir.join(format!("{file}.new"));
            std::fs::write(&temporary, text).unwrap();
            std::fs::rename(&temporary, self.dir.join(file)).unwrap();
        }
    }
}

/// curl against the server, trusting the test CA and presenting the client certificate;
/// returns (HTTP status, body, curl's verbose log).
fn curl(pki: &Pki, url: &str, extra: &[&str]) -> (u16, String, String) {
    let output = Command::new("curl")
        .args([
            "-sS",
            "-v",
            "--max-time",
            "10",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args(["--cacert", &pki.path("ca.pem")])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl (Debian's curl package)");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = stdout.rsplit_once('\n').unwrap_or(("", "0"));
    (
        status.trim().parse().unwrap_or(0),
        body.to_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn with_client_cert(pki: &Pki) -> Vec<String> {
    vec![
        "--cert".into(),
        pki.path("client.pem"),
        "--key".into(),
        pki.path("client.key"),
    ]
}

/// A metric from `/metrics` over TLS with the API token (sum over series matching labels).
fn metric(pki: &Pki, server: &Server, name: &str, labels: &[&str]) -> f64 {
    let mut args = with_client_cert(pki);
    args.extend(["-H".into(), format!("authorization: Bearer {API_TOKEN}")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, body, log) = curl(pki, &format!("https://{}/metrics", server.api), &args);
    assert_eq!(status, 200, "{log}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series.split('{').next() == Some(name) && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `spans` SERVER spans through the Rust SDK's OTLP/gRPC exporter over TLS, with `token`.
fn rust_sdk_export(pki: &Pki, grpc: &str, token: &str, spans: usize) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let provider = runtime.block_on(async {
        let read = |name: &str| std::fs::read_to_string(pki.path(name)).unwrap();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("ca.pem")))
            .identity(Identity::from_pem(read("client.pem"), read("client.key")))
            .domain_name("localhost");
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(format!("https://{grpc}"))
            .with_tls_config(tls)
            .with_metadata(metadata)
            .build()
            .unwrap();
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name("rust-checkout")
                    .build(),
            )
            .build()
    });
    let tracer = provider.tracer("stormglass-tls");
    for _ in 0..spans {
        tracer
            .span_builder("GET /checkout")
            .with_kind(SpanKind::Server)
            .start(&tracer)
            .end();
    }
    let _ = provider.force_flush();
    let _ = provider.shutdown();
}

/// `spans` SERVER spans through the Python SDK's OTLP/HTTP exporter over TLS, with a client
/// certificate and `token`.
fn python_sdk_export(pki: &Pki, http: &str, token: &str, spans: usize) {
    let script = r#"
import sys
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
endpoint, ca, cert, key, token, spans = sys.argv[1:7]
exporter = OTLPSpanExporter(endpoint=endpoint, certificate_file=ca,
    client_certificate_file=cert, client_key_file=key,
    headers={"authorization": "Bearer " + token})
provider = TracerProvider(resource=Resource.create({"service.name": "python-checkout"}))
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("stormglass-tls")
for _ in range(int(spans)):
    with tracer.start_as_current_span("GET /checkout", kind=trace.SpanKind.SERVER):
        pass
provider.shutdown()
"#;
    let endpoint = format!("https://localhost:{}/v1/traces", port(http));
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let spans = spans.to_string();
    common::python(script, &[&endpoint, &ca, &cert, &key, token, &spans]);
}

fn port(addr: &str) -> &str {
    addr.rsplit_once(':').unwrap().1
}

/// Over TLS with client certificates required and bearer tokens set: the Rust SDK (gRPC) and
/// the Python SDK (HTTP) get their spans in with the token; a wrong token gets
/// UNAUTHENTICATED / 401 and is counted; a client without a certificate fails the handshake
/// (counted); the API wants its own token except on the probes; and a renewed certificate
/// is served without a restart.
#[test]
fn tls_and_tokens_let_in_only_who_is_invited() {
    let scratch = common::temp_dir("tls");
    let dir = scratch.path();
    let pki = Pki::new(dir);
    pki.issue("server", "stormglass-first");
    pki.issue("client", "an-exporter");
    let server = Server::start(&[
        ("STORMGLASS_TLS__CERT_FILE", &pki.path("server.pem")),
        ("STORMGLASS_TLS__KEY_FILE", &pki.path("server.key")),
        ("STORMGLASS_TLS__CLIENT_CA_FILE", &pki.path("ca.pem")),
        ("STORMGLASS_AUTH__TOKEN", TOKEN),
        ("STORMGLASS_AUTH__API_TOKEN", API_TOKEN),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ]);
    let accepted = |transport: &str| {
        metric(
            &pki,
            &server,
            "stormglass_receiver_accepted_spans_total",
            &[&format!("transport=\"{transport}\"")],
        )
    };

    rust_sdk_export(&pki, &server.grpc, TOKEN, 7);
    wait_for("the Rust SDK's spans", || accepted("grpc") == 7.0);
    python_sdk_export(&pki, &server.http, TOKEN, 5);
    wait_for("the Python SDK's spans", || {
        accepted("http_protobuf") == 5.0
    });

    // A wrong token: refused, counted, nothing accepted.
    rust_sdk_export(&pki, &server.grpc, "wrong", 3);
    python_sdk_export(&pki, &server.http, "wrong", 2);
    let unauthenticated = |transport: &str| {
        metric(
            &pki,
            &server,
            "stormglass_receiver_refused_requests_total",
            &[
                "reason=\"unauthenticated\"",
                &format!("transport=\"{transport}\""),
            ],
        )
    };
    wait_for("the refusals counted", || {
        unauthenticated("grpc") >= 1.0 && unauthenticated("http_protobuf") >= 1.0
    });
    assert_eq!(accepted("grpc"), 7.0);
    assert_eq!(accepted("http_protobuf"), 5.0);
    let traces = format!("https://{}/v1/traces", server.http);
    let mut args = with_client_cert(&pki);
    // HTTP/1.1 as the SDKs' OTLP/HTTP exporters speak it: over HTTP/2 the refusal comes
    // before the body is read, and the server then resets the stream (NO_ERROR, as RFC 9113
    // allows), which curl 7.88 reports as a framing error when the reset wins the race.
    args.push("--http1.1".into());
    args.extend(["-H".into(), "content-type: application/json".into()]);
    args.extend(["--data".into(), "{}".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, _, log) = curl(&pki, &traces, &args);
    assert_eq!(status, 401, "{log}");
    assert!(log.contains("www-authenticate: Bearer"), "{log}");

    // No client certificate: the handshake fails, and is counted.
    let (status, _, _) = curl(&pki, &traces, &["--data", "{}"]);
    assert_eq!(status, 0, "answered without a client certificate");
    wait_for("the failed handshake counted", || {
        metric(
            &pki,
            &server,
            "stormglass_tls_handshake_failures_total",
            &["listener=\"http\""],
        ) >= 1.0
    });

    // The API: its own token, except on the probes.
    let api = |path: &str, token: Option<&str>| {
        let mut args = with_client_cert(&pki);
        if let Some(token) = token {
            args.extend(["-H".into(), format!("authorization: Bearer {token}")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(&pki, &format!("https://{}{path}", server.api), &args).0
    };
    assert_eq!(api("/metrics", None), 401);
    assert_eq!(
        api("/metrics", Some(TOKEN)),
        401,
        "the receivers' token is not the API's"
    );
    assert_eq!(api("/api/v1/report", Some(API_TOKEN)), 200);
    assert_eq!(api("/healthz", None), 200);
    assert_eq!(api("/readyz", None), 200);

    // A renewed certificate is served without a restart.
    let subject = || {
        let args = with_client_cert(&pki);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(&pki, &format!("https://{}/healthz", server.api), &args).2
    };
    assert!(subject().contains("CN=stormglass-first"));
    pki.issue("server", "stormglass-renewed");
    wait_for("the renewed certificate", || {
        subject().contains("CN=stormglass-renewed")
    });
    let (ok, stderr) = server.terminate();
    assert!(ok, "{stderr}");
    assert!(stderr.contains("TLS certificate reloaded"), "{stderr}");
}
