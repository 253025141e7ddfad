//! Shared helpers for the end-to-end tests: start the real `stormglass` binary on free
//! loopback ports, read its Prometheus metrics, stop it with a signal.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `stormglass serve`.
pub struct Server {
    child: Option<Child>,
    pub grpc: String,
    pub http: String,
    pub api: String,
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
        }
    }

    /// The `/metrics` exposition as (series, value) pairs.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let text = get(&format!("http://{}/metrics", self.api)).1;
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// Sum of every series of `name` whose labels include all of `labels` (`k="v"` form).
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .iter()
            .filter(|(series, _)| {
                let base = series.split('{').next().unwrap_or("");
                base == name && labels.iter().all(|l| series.contains(l))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// Poll until `check` holds (bounded: 20 s), returning its last value.
    pub fn wait_until(&self, what: &str, mut check: impl FnMut(&Server) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send SIGTERM and wait for exit; returns (exit success, stderr).
    pub fn terminate(mut self) -> (bool, String) {
        let mut child = self.child.take().unwrap();
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let mut stderr: ChildStderr = child.stderr.take().unwrap();
        let mut text = String::new();
        stderr.read_to_string(&mut text).unwrap();
        let status = child.wait().unwrap();
        (status.success(), text)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// GET a URL on loopback; returns (status, body).
pub fn get(url: &str) -> (u16, String) {
    let response = reqwest::blocking::get(url).unwrap();
    let status = response.status().as_u16();
    (status, response.text().unwrap())
}
