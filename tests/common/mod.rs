//! Shared helpers for the end-to-end tests: start the real `stormglass` binary on free
//! loopback ports, read its Prometheus metrics, stop it with a signal.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod scenario;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `stormglass serve`. When it stops (dropped or terminated), it must not have
/// failed an analysis or caught a fault in a task: a failed chunk's figures are missing from
/// every dashboard, so no end-to-end test may pass over one unless it injected the fault
/// (`STORMGLASS_TEST_FAULTS` in its environment).
pub struct Server {
    child: Option<Child>,
    pub grpc: String,
    pub http: String,
    pub api: String,
    faults_injected: bool,
}

impl Server {
    /// Start `stormglass serve` on port 0 everywhere, with extra `env` overrides.
    pub fn start(env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_stormglass"));
        command
            .args([
                "serve",
                "--grpc-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            .args(["--api-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("start stormglass");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = |key: &str| -> String {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key}= in start-up line {line:?}"))
                .to_owned()
        };
        Server {
            grpc: addr("grpc"),
            http: addr("http"),
            api: addr("api"),
            child: Some(child),
            faults_injected: env.iter().any(|(k, _)| *k == "STORMGLASS_TEST_FAULTS"),
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The `/metrics` exposition as (series, value) pairs.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        self.try_metrics().expect("read /metrics")
    }

    /// [`Server::metrics`], or `None` when they cannot be read (the server has exited).
    fn try_metrics(&self) -> Option<Vec<(String, f64)>> {
        let url = format!("http://{}/metrics", self.api);
        let text = reqwest::blocking::get(url).ok()?.text().ok()?;
        Some(
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    Some((series.to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// Sum of every series of `name` whose labels include all of `labels` (`k="v"` form).
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        total(&self.metrics(), name, labels)
    }

    /// Poll until `check` holds (bounded: 20 s).
    pub fn wait_until(&self, what: &str, check: impl FnMut(&Server) -> bool) {
        self.wait_until_within(what, Duration::from_secs(20), check)
    }

    /// Poll until `check` holds, for at most `bound`.
    pub fn wait_until_within(
        &self,
        what: &str,
        bound: Duration,
        mut check: impl FnMut(&Server) -> bool,
    ) {
        let deadline = Instant::now() + bound;
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the server failed (see [`Server`]): `None` when it failed nothing, the fault was
    /// injected, or its metrics cannot be read (it has exited).
    fn faults(&self) -> Option<String> {
        if self.faults_injected {
            return None;
        }
        let metrics = self.try_metrics()?;
        let failures = total(&metrics, "stormglass_analysis_failures_total", &[]);
        let faults = total(&metrics, "stormglass_internal_errors_total", &[]);
        (failures != 0.0 || faults != 0.0).then(|| {
            format!("the server failed {failures} analyses and caught {faults} faults in its tasks")
        })
    }

    /// Send SIGTERM and wait for exit; returns (exit success, stderr).
    pub fn terminate(mut self) -> (bool, String) {
        let faults = self.faults();
        let mut child = self.child.take().unwrap();
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let mut stderr: ChildStderr = child.stderr.take().unwrap();
        let mut text = String::new();
        stderr.read_to_string(&mut text).unwrap();
        let status = child.wait().unwrap();
        if let Some(faults) = faults {
            panic!("{faults}; its log:\n{text}");
        }
        (status.success(), text)
    }
}

impl Server {
    /// `kill -9`: no signal handler runs, nothing is flushed (a crash or an OOM kill).
    pub fn crash(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Terminated or crashed: nothing left to check or stop.
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Read before the kill; not while the test is already failing (a second panic
        // while unwinding aborts the test binary).
        let faults = if std::thread::panicking() {
            None
        } else {
            self.faults()
        };
        let _ = child.kill();
        let _ = child.wait();
        if let Some(faults) = faults {
            panic!("{faults}");
        }
    }
}

/// Sum of the `metrics` series of `name` whose labels include all of `labels`.
fn total(metrics: &[(String, f64)], name: &str, labels: &[&str]) -> f64 {
    metrics
        .iter()
        .filter(|(series, _)| {
            let base = series.split('{').next().unwrap_or("");
            base == name && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

/// Run the built `stormglass` binary; returns (success, stdout, stderr).
pub fn stormglass(args: &[&str]) -> (bool, String, String) {
    let (code, stdout, stderr) = stormglass_exit(args);
    (code == Some(0), stdout, stderr)
}

/// Run the built `stormglass` binary; returns (exit code, stdout, stderr).
pub fn stormglass_exit(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_stormglass"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// Run `python -c script args...` with the test virtualenv's Python (`TEST_PYTHON`, which
/// tests/run.sh sets after installing DuckDB and the OpenTelemetry SDK from PyPI), without
/// the CA-bundle variables some machines set (requests lets them override an exporter's
/// own certificate_file); asserts success and returns stdout.
pub fn python(script: &str, args: &[&str]) -> Vec<u8> {
    let python = std::env::var("TEST_PYTHON").unwrap_or_else(|_| {
        panic!("TEST_PYTHON is unset: run tests/run.sh, which installs the Python packages")
    });
    let output = Command::new(python)
        .env_remove("REQUESTS_CA_BUNDLE")
        .env_remove("CURL_CA_BUNDLE")
        .args(["-c", script])
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// One OTLP/JSON request per line, as the Collector's file exporter writes (a garbage line
/// second where given).
pub fn write_jsonl(
    path: &std::path::Path,
    spans: &stormglass_testkit::fixtures::Spans,
    garbage_line: Option<&str>,
) {
    let mut lines: Vec<String> = spans
        .requests_by_trace()
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    if let Some(g) = garbage_line {
        lines.insert(1, g.to_owned());
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// GET a URL on loopback; returns (status, body).
pub fn get(url: &str) -> (u16, String) {
    let response = reqwest::blocking::get(url).unwrap();
    let status = response.status().as_u16();
    (status, response.text().unwrap())
}

/// A free loopback port (bound, then released for the server about to use it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A program from the machine (Prometheus, Alertmanager), killed when dropped.
pub struct Daemon {
    name: &'static str,
    child: Child,
    log: std::path::PathBuf,
}

impl Daemon {
    /// Start `program` with `args`, logging to `dir/<name>.log`.
    pub fn start(
        name: &'static str,
        program: &str,
        args: &[String],
        dir: &std::path::Path,
    ) -> Daemon {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {program} ({e}); run tests/run.sh, which installs it")
            });
        Daemon { name, child, log }
    }

    /// Poll `url` until it answers 200 (bounded: 30 s).
    pub fn wait_ready(&mut self, url: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::blocking::get(url)
                && r.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited with {status}:\n{}", self.name, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh temporary directory for one test, removed with everything in it when dropped
/// (the suite's meshes are ~15 MB a test, and CI's machine is kept).
pub fn temp_dir(name: &str) -> tempfile::TempDir {
    (tempfile::Builder::new().prefix(&format!("stormglass-{name}-")))
        .tempdir()
        .unwrap()
}

/// The repository root (tests run from the crate directory).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Open `url` (stormglass' built-in page) in headless Chromium with tests/js/page.mjs, saving
/// a screenshot to `screenshot`: what the page drew, as page.mjs prints it. Needs Debian's
/// chromium and tests/js's packages (tests/run.sh installs both).
pub fn open_page(url: &str, screenshot: &std::path::Path) -> serde_json::Value {
    let js = repo_root().join("tests/js");
    assert!(
        js.join("node_modules/playwright-core").is_dir(),
        "run `npm ci` in tests/js (tests/run.sh does) for the page tests"
    );
    let output = Command::new("node")
        .arg(js.join("page.mjs"))
        .arg(url)
        .arg(screenshot)
        .output()
        .expect("node runs");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// POST one trace of one SERVER span of `svc` (trace id `trace`) to `server` over
/// OTLP/HTTP, expecting 200.
pub fn post_span(server: &Server, trace: u8) {
    use stormglass_testkit::otlp::{request, span};
    post(
        server,
        &request(vec![("svc", vec![span(trace, 1, "op", 2, 0, 5, vec![])])]),
    );
}

/// POST every trace of `spans` to `server` over OTLP/HTTP, a request per trace, expecting
/// 200 each.
pub fn post_traces(server: &Server, spans: &stormglass_testkit::fixtures::Spans) {
    for request in spans.requests_by_trace() {
        post(server, &request);
    }
}

fn post(
    server: &Server,
    request: &opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
) {
    use prost::Message;
    let response = reqwest::blocking::Client::new()
        .post(format!("http://{}/v1/traces", server.http))
        .header("content-type", "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
}
