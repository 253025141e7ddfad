//! End-to-end against the real thing: Debian's Prometheus, Alertmanager, promtool and amtool
//! with the shipped rules, dashboards and example configs, and the real `stormglass serve`
//! fed by the OpenTelemetry SDK. `tests/run.sh` installs the packages when missing. Long
//! because each test starts its own daemons; the helpers they share come first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::scenario::Services;
use common::{Daemon, Server, free_port, get, repo_root, temp_dir};
use serde_json::Value;

fn rules_file() -> PathBuf {
    repo_root()
        .join("dashboards/prometheus/stormglass-rules.yml")
        .canonicalize()
        .unwrap()
}

/// Run a tool with `args` (and `stdin`), asserting success; returns its output.
fn run_tool(program: &str, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}); run tests/run.sh, which installs it")
        });
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{text}"
    );
    text
}

/// The shipped rules file is exactly what `stormglass rules` prints for the defaults.
#[test]
fn shipped_rules_equal_generated() {
    let output = Command::new(env!("CARGO_BIN_EXE_stormglass"))
        .arg("rules")
        .output()
        .unwrap();
    assert!(output.status.success());
    let shipped = std::fs::read_to_string(rules_file()).unwrap();
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        shipped,
        "dashboards/prometheus/stormglass-rules.yml is stale: regenerate it with \
         `cargo run -p stormglass -- rules > dashboards/prometheus/stormglass-rules.yml`"
    );
}

/// The shipped rules, their unit tests (every alert firing and not firing) and the example
/// Prometheus and Alertmanager configs pass Prometheus' and Alertmanager's own checkers.
#[test]
fn shipped_rules_and_configs_pass_promtool_and_amtool() {
    let dashboards = repo_root().join("dashboards");
    let path = |p: &str| dashboards.join(p).to_string_lossy().into_owned();
    let checked = run_tool(
        "promtool",
        &["check", "rules", &path("prometheus/stormglass-rules.yml")],
        None,
    );
    assert!(checked.contains("SUCCESS: 86 rules found"), "{checked}");
    let tested = run_tool(
        "promtool",
        &[
            "test",
            "rules",
            &path("prometheus/stormglass-rules.test.yml"),
            &path("prometheus/stormglass-rules.week.test.yml"),
        ],
        None,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
    run_tool(
        "promtool",
        &["check", "config", &path("prometheus/prometheus.yml")],
        None,
    );
    run_tool(
        "amtool",
        &["check-config", &path("alertmanager/alertmanager.yml")],
        None,
    );
    // The commented example receivers are valid once uncommented and filled in.
    let example = std::fs::read_to_string(path("alertmanager/alertmanager.yml")).unwrap();
    let filled: String = example
        .lines()
        .map(|l| {
            l.strip_prefix("  # ")
                .map_or(l.to_owned(), |l| format!("  {l}"))
        })
        .map(|l| {
            l.replace(
                "<your PagerDuty Events v2 integration key>",
                "0123456789abcdef0123456789abcdef",
            )
            .replace("<your webhook path>", "T0/B0/X0")
                + "\n"
        })
        .collect();
    assert!(filled.contains("pagerduty_configs") && filled.contains("slack_configs"));
    let scratch = temp_dir("alertmanager-example");
    let dir = scratch.path();
    std::fs::write(dir.join("alertmanager.yml"), filled).unwrap();
    let checked = run_tool(
        "amtool",
        &[
            "check-config",
            &dir.join("alertmanager.yml").to_string_lossy(),
        ],
        None,
    );
    assert!(checked.contains("3 receivers"), "{checked}");
    // Every alert of the definitions has a unit test.
    let tests = [
        "stormglass-rules.test.yml",
        "stormglass-rules.week.test.yml",
    ]
    .map(|f| std::fs::read_to_string(path(&format!("prometheus/{f}"))).unwrap())
    .concat();
    for name in stormglass_export::rules::self_alert_names() {
        assert!(
            tests.contains(&format!("alertname: {name}")),
            "no promtool test for {name}"
        );
    }
    for d in stormglass_analytics::alerts::DEFINITIONS {
        assert!(
            tests.contains(&format!("alertname: {}", d.name)),
            "no promtool test for {}",
            d.name
        );
    }
}

/// At width, the shipped rules fire no alert more than 50 times at once: 60 caller/callee
/// pairs inverting budgets (40 from caller a, 20 from b) fire one summary instance per
/// caller, counting its pairs, and no instance per pair; 50 pairs fire one each.
#[test]
fn shipped_rules_summarise_an_alert_beyond_its_bound_per_caller() {
    let series = |pairs: &[(&str, usize)]| {
        let mut lines = String::new();
        for (caller, n) in pairs {
            for i in 0..*n {
                lines.push_str(&format!(
                    "      - series: 'stormglass_deadline_violations_total{{caller=\"{caller}\",\
                     callee=\"c{i}\",kind=\"inversion\"}}'\n        values: '0+1x20'\n      \
                     - series: 'stormglass_attempts_total{{caller=\"{caller}\",callee=\"c{i}\",\
                     operation=\"op\",attempt=\"first\",outcome=\"ok\",cause=\"none\"}}'\n        \
                     values: '0+30x20'\n"
                ));
            }
        }
        lines
    };
    let wide = series(&[("a", 40), ("b", 20)]);
    let narrow = series(&[("a", 50)]);
    let summary = |caller: &str, n: usize| {
        format!(
            "          - exp_labels: {{severity: warning, caller: {caller}, instances: per_caller}}\n            \
             exp_annotations:\n              summary: \"{caller}: {n} series breach \
             StormglassDeadlineInversion\"\n              description: \"{n} series breach \
             StormglassDeadlineInversion with caller {caller}: more than \
             alerts.max_instances_per_rule (50) breach in all, so it fires once per caller \
             service. The worst are in stormglass' /api/v1/alerts and report.\"\n              \
             runbook_url: \"http://stormglass:9464/runbooks#stormglassdeadlineinversion\"\n"
        )
    };
    let scratch = temp_dir("rules-at-width");
    let dir = scratch.path();
    std::fs::copy(rules_file(), dir.join("stormglass-rules.yml")).unwrap();
    let test = format!(
        "rule_files:\n  - stormglass-rules.yml\nevaluation_interval: 1m\ntests:\n  \
         - interval: 1m\n    input_series:\n      - series: 'up{{instance=\"stormglass:9464\"}}'\n        \
         values: '1x30'\n{wide}    alert_rule_test:\n      - eval_time: 10m\n        \
         alertname: StormglassDeadlineInversion\n        exp_alerts:\n{}{}  \
         - interval: 1m\n    input_series:\n{narrow}    promql_expr_test:\n      \
         - expr: count(ALERTS{{alertname=\"StormglassDeadlineInversion\",alertstate=\"firing\"}})\n        \
         eval_time: 10m\n        exp_samples:\n          - labels: '{{}}'\n            value: 50\n",
        summary("a", 40),
        summary("b", 20),
    );
    let path = dir.join("width.test.yml");
    std::fs::write(&path, test).unwrap();
    let tested = run_tool(
        "promtool",
        &["test", "rules", &path.to_string_lossy()],
        None,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The shipped dashboards are exactly what their declarative list generates
/// (`stormglass_export::dashboards`), and there is no other. Regenerate them after changing
/// the list: `STORMGLASS_BLESS=1 cargo nextest run --workspace -E
/// 'test(dashboards_are_generated)'`.
#[test]
fn dashboards_are_generated() {
    let dir = repo_root().join("dashboards/grafana");
    let bless = std::env::var_os("STORMGLASS_BLESS").is_some();
    let rendered = stormglass_export::dashboards::render();
    for (file, text) in &rendered {
        let path = dir.join(file);
        if bless {
            std::fs::write(&path, text).unwrap();
        } else {
            let shipped = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                shipped == *text,
                "{} differs from its generated form: regenerate with STORMGLASS_BLESS=1",
                path.display()
            );
        }
    }
    let mut shipped: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    shipped.sort();
    let mut generated: Vec<String> = rendered.into_iter().map(|(file, _)| file).collect();
    generated.sort();
    assert_eq!(shipped, generated, "dashboards/grafana/*.json");
}

/// Every shipped dashboard is valid against Grafana's published dashboard schema (the
/// `Dashboard` type of npm's @grafana/schema, as a JSON Schema): no misspelt or misplaced
/// field, no wrong type. Needs tests/js's packages (tests/run.sh installs them).
#[test]
fn dashboards_follow_grafanas_schema() {
    let js = repo_root().join("tests/js");
    assert!(
        js.join("node_modules/@grafana/schema").is_dir(),
        "run `npm ci` in tests/js (tests/run.sh does) for the dashboard schema test"
    );
    let dashboards: Vec<String> = std::fs::read_dir(repo_root().join("dashboards/grafana"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    assert_eq!(dashboards.len(), 5, "{dashboards:?}");
    let output = Command::new("node")
        .arg(js.join("grafana_schema.mjs"))
        .args(&dashboards)
        .output()
        .expect("node runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.matches(": valid").count() == dashboards.len(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The shipped Grafana dashboards: stable unique uids, a `datasource` variable every panel
/// and query uses, the service/caller/callee variables they filter on, and a provisioning
/// file pointing Grafana at them.
#[test]
fn dashboards_are_portable() {
    let dir = repo_root().join("dashboards/grafana");
    let mut uids = Vec::new();
    for name in [
        "stormglass-overview",
        "stormglass-edges",
        "stormglass-layers",
        "stormglass-deadlines",
        "stormglass-topology",
    ] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        let d: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(d["uid"], name);
        uids.push(d["uid"].as_str().unwrap().to_owned());
        let variables: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(variables[0], "datasource", "{name}");
        assert_eq!(d["templating"]["list"][0]["type"], "datasource");
        for panel in d["panels"].as_array().unwrap() {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{name}: {panel}"
            );
            for target in panel["targets"].as_array().unwrap() {
                assert_eq!(target["datasource"]["uid"], "${datasource}");
                let expr = target["expr"].as_str().unwrap();
                // Scoped like the monitoring mixins: every selector keeps to the chosen
                // cluster and job (raw series also to the instance), and rates follow
                // Grafana's interval.
                let selectors =
                    expr.matches("stormglass").count() + expr.matches("ALERTS{").count();
                let scoped = expr.matches("{cluster=~\"$cluster\",job=~\"$job\"").count();
                assert_eq!(selectors, scoped, "{name}: an unscoped selector in {expr}");
                assert!(!expr.contains("[5m]"), "{name}: a fixed range in {expr}");
                for var in ["service", "caller", "callee", "cluster", "job", "instance"] {
                    if expr.contains(&format!("${var}")) {
                        assert!(
                            variables.contains(&var),
                            "{name}: ${var} undefined in {expr}"
                        );
                    }
                }
            }
        }
    }
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), 5);
    let provisioning =
        std::fs::read_to_string(dir.join("provisioning/dashboards/stormglass.yml")).unwrap();
    assert!(provisioning.contains("type: file"));
}

/// stormglass, Prometheus (scraping it every second with the shipped rules) and
/// Alertmanager, on free loopback ports.
struct Stack {
    server: Server,
    prometheus: Daemon,
    alertmanager: Daemon,
    prometheus_url: String,
    alertmanager_url: String,
    /// Prometheus's and Alertmanager's files, removed after both stop (fields drop in order).
    _dir: tempfile::TempDir,
}

impl Stack {
    fn start(name: &str) -> Stack {
        let scratch = temp_dir(name);
        let dir = scratch.path();
        let (alertmanager, am_port) = start_alertmanager(dir);
        let alertmanager_url = format!("http://127.0.0.1:{am_port}");

        let server = Server::start(&[
            ("STORMGLASS_ASSEMBLY__IDLE", "500ms"),
            ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
            ("STORMGLASS_ANALYTICS__WINDOW", "1m"),
            ("STORMGLASS_ALERTS__ALERTMANAGERS", &alertmanager_url),
            ("STORMGLASS_ALERTS__RESEND_INTERVAL", "5s"),
            ("STORMGLASS_ALERTS__LABELS__SOURCE", "stormglass"),
        ]);

        let prom_port = free_port();
        let prometheus_url = format!("http://127.0.0.1:{prom_port}");
        let prometheus = start_prometheus(
            dir,
            prom_port,
            &format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  external_labels:\n    source: prometheus\n\
                 rule_files:\n  - {}\n\
                 alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n\
                 scrape_configs:\n  - job_name: stormglass\n    static_configs:\n      - targets: ['{}']\n",
                rules_file().display(),
                server.api
            ),
        );
        Stack {
            server,
            prometheus,
            alertmanager,
            prometheus_url,
            alertmanager_url,
            _dir: scratch,
        }
    }

    /// An instant PromQL query; returns the result vector.
    fn query(&self, promql: &str) -> Vec<Value> {
        query(&self.prometheus_url, promql)
    }

    fn alertmanager_alerts(&self) -> Vec<Value> {
        alertmanager_alerts(&self.alertmanager_url)
    }

    fn logs(&self) -> String {
        format!(
            "--- prometheus\n{}\n--- alertmanager\n{}",
            self.prometheus.log(),
            self.alertmanager.log()
        )
    }
}

/// Sends a scenario every 100 ms from a thread until dropped (bounded by `limit`).
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Traffic {
    fn start(grpc: &str, limit: Duration, scenario: fn(&Services, SystemTime)) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let grpc = grpc.to_owned();
        let thread = std::thread::spawn(move || {
            let services = Services::new(&grpc);
            let end = Instant::now() + limit;
            let mut sent = 0;
            while !flag.load(Ordering::Relaxed) && Instant::now() < end {
                for _ in 0..3 {
                    scenario(&services, SystemTime::now());
                    sent += 1;
                }
                services.flush();
                std::thread::sleep(Duration::from_millis(100));
            }
            sent
        });
        Traffic {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Alertmanager on a free loopback port (its files in `dir`), once ready; and the port.
fn start_alertmanager(dir: &Path) -> (Daemon, u16) {
    let port = free_port();
    std::fs::write(
        dir.join("alertmanager.yml"),
        "route:\n  receiver: default\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n\
         receivers:\n  - name: default\n",
    )
    .unwrap();
    let mut alertmanager = Daemon::start(
        "alertmanager",
        "prometheus-alertmanager",
        &[
            format!("--config.file={}", dir.join("alertmanager.yml").display()),
            format!("--storage.path={}", dir.join("am-data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--cluster.listen-address=".to_owned(),
        ],
        dir,
    );
    alertmanager.wait_ready(&format!("http://127.0.0.1:{port}/-/ready"));
    (alertmanager, port)
}

/// The alerts the Alertmanager at `url` holds.
fn alertmanager_alerts(url: &str) -> Vec<Value> {
    let (status, body) = get(&format!("{url}/api/v2/alerts"));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Prometheus on 127.0.0.1:`port` with `config` (written to `dir`), once ready.
fn start_prometheus(dir: &Path, port: u16, config: &str) -> Daemon {
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let mut prometheus = Daemon::start(
        "prometheus",
        "prometheus",
        &[
            format!("--config.file={}", dir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("prom-data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ],
        dir,
    );
    prometheus.wait_ready(&format!("http://127.0.0.1:{port}/-/ready"));
    prometheus
}

/// An instant PromQL query against the Prometheus at `url`; returns the result vector.
fn query(url: &str, promql: &str) -> Vec<Value> {
    let url = reqwest::Url::parse_with_params(&format!("{url}/api/v1/query"), [("query", promql)])
        .unwrap();
    let body = reqwest::blocking::Client::new()
        .get(url)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let response: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(response["status"], "success", "{promql}: {response}");
    response["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn has_labels(alert: &Value, labels: &[(&str, &str)]) -> bool {
    labels.iter().all(|(k, v)| alert["labels"][k] == *v)
}

/// Every PromQL expression of every shipped dashboard panel, with the template variables
/// set to "All" (`.*`).
fn dashboard_expressions() -> Vec<(String, String)> {
    let dir = repo_root().join("dashboards/grafana");
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        5,
        "expected the five dashboards in {}",
        dir.display()
    );
    for file in files {
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let expr = [
                    "$service",
                    "$caller",
                    "$callee",
                    "$cluster",
                    "$job",
                    "$instance",
                ]
                .iter()
                .fold(expr.to_owned(), |e, var| e.replace(var, ".*"))
                .replace("$__rate_interval", "5m");
                let name = format!(
                    "{} / {}",
                    file_name(&file),
                    panel["title"].as_str().unwrap()
                );
                out.push((name, expr));
            }
        }
    }
    out
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// A retry storm (3 layers x 3 attempts) sent through the SDK: StormglassRetryAmplificationHigh
/// reaches Alertmanager from Prometheus' rules over the exported metrics and from the
/// built-in evaluator, both after their `for: 2m`; every dashboard expression returns data;
/// the exposition passes `promtool check metrics`; the counters match the window report.
#[test]
fn retry_storm_reaches_alertmanager_from_both_engines() {
    let stack = Stack::start("storm");
    let _traffic = Traffic::start(
        &stack.server.grpc,
        Duration::from_secs(360),
        Services::storm,
    );

    let amplification = [
        ("alertname", "StormglassRetryAmplificationHigh"),
        ("service", "db"),
        ("severity", "critical"),
    ];
    let started = Instant::now();
    let mut from_prometheus = None;
    let mut from_stormglass = None;
    while from_prometheus.is_none() || from_stormglass.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(330),
            "alert not received from both engines (prometheus: {from_prometheus:?}, \
             stormglass: {from_stormglass:?}); alertmanager holds {:?}\n{}",
            stack.alertmanager_alerts(),
            stack.logs()
        );
        for alert in stack.alertmanager_alerts() {
            if has_labels(&alert, &amplification) {
                // Both engines link to the runbook on stormglass' own page, and it resolves.
                let runbook = alert["annotations"]["runbook_url"].as_str().unwrap();
                assert!(
                    runbook.starts_with(&format!("http://{}/runbooks#", stack.server.api))
                        && runbook.ends_with("#stormglassretryamplificationhigh"),
                    "{alert}"
                );
                let (status, page) = get(runbook);
                assert_eq!(status, 200, "{runbook}");
                assert!(page.contains("<h3 id=\"stormglassretryamplificationhigh\">"));
                if alert["labels"]["source"] == "prometheus" {
                    from_prometheus.get_or_insert(started.elapsed());
                } else if alert["labels"]["source"] == "stormglass" {
                    from_stormglass.get_or_insert(started.elapsed());
                    assert!(
                        alert["annotations"]["summary"]
                            .as_str()
                            .unwrap()
                            .starts_with("db receives 27x"),
                        "{alert}"
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    // Both engines honour `for: 2m`.
    for elapsed in [from_prometheus, from_stormglass].into_iter().flatten() {
        assert!(
            elapsed >= Duration::from_secs(120),
            "fired after {elapsed:?}"
        );
    }

    // The built-in evaluator lists it as firing.
    let (_, body) = get(&format!("http://{}/api/v1/alerts", stack.server.api));
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert!(
        listed["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "StormglassRetryAmplificationHigh"
                && a["state"] == "firing"
                && a["labels"]["service"] == "db"),
        "{listed}"
    );

    // Prometheus' view of the figures: amplification 27 at db, 9 at inventory, 3 at orders.
    for (service, expected) in [("db", 27.0), ("inventory", 9.0), ("orders", 3.0)] {
        let result = stack.query(&format!(
            "stormglass:layer_amplification:ratio_rate5m{{service=\"{service}\"}}"
        ));
        let value: f64 = result[0]["value"][1].as_str().unwrap().parse().unwrap();
        assert!((value - expected).abs() < 1e-9, "{service}: {value}");
    }

    let missing: Vec<String> = dashboard_expressions()
        .into_iter()
        .filter(|(_, expr)| stack.query(expr).is_empty())
        .map(|(name, expr)| format!("{name}: {expr}"))
        .collect();
    assert!(
        missing.is_empty(),
        "dashboard expressions without data:\n{}",
        missing.join("\n")
    );

    let (_, exposition) = get(&format!("http://{}/metrics", stack.server.api));
    run_tool("promtool", &["check", "metrics"], Some(&exposition));
}

/// A healthy chain (no retries, generous deadlines, steady latency) fires nothing: no alert
/// pending or firing in Prometheus, in stormglass' evaluator, or in Alertmanager, once the
/// recording rules have data.
#[test]
fn healthy_traffic_fires_nothing() {
    let stack = Stack::start("healthy");
    let _traffic = Traffic::start(
        &stack.server.grpc,
        Duration::from_secs(120),
        Services::healthy,
    );
    let started = Instant::now();
    loop {
        let amplification =
            stack.query("stormglass:layer_amplification:ratio_rate5m{service=\"db\"}");
        let retry_ratio = stack.query("stormglass:edge_retry:ratio_rate5m");
        if !amplification.is_empty() && !retry_ratio.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the recording rules produced no data\n{}",
            stack.logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // Let every rule evaluate over the data a few more times.
    std::thread::sleep(Duration::from_secs(10));
    let amplification = stack.query("stormglass:layer_amplification:ratio_rate5m");
    assert!(amplification.len() >= 3, "{amplification:?}");
    for series in &amplification {
        assert_eq!(series["value"][1], "1", "{series}");
    }
    let alerts = stack.query("ALERTS");
    assert!(alerts.is_empty(), "Prometheus alerts: {alerts:?}");
    let (_, body) = get(&format!("http://{}/api/v1/alerts", stack.server.api));
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["alerts"], serde_json::json!([]), "{listed}");
    let (_, report) = get(&format!("http://{}/api/v1/report", stack.server.api));
    let report: Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["alerts"], serde_json::json!([]), "{report}");
    assert!(report["window"]["traces"].as_u64().unwrap() > 0);
    assert!(stack.alertmanager_alerts().is_empty());
}

/// The figures per cluster that a sharded deployment must get exactly as one instance does,
/// read from the summed counters and histogram buckets: per edge the logical calls by first
/// and final outcome (effective and raw success, retry contribution), attempts by kind and
/// outcome (retry success), orphan work, unsafe retries and the mean timeout (budgets summed
/// over budgeted attempts); per layer the received and baseline attempts (amplification) and
/// the P99, P99.9 and their ratio (tail ratio) of the summed histogram. Keyed by cluster, then by the series' other labels.
type Figures = std::collections::BTreeMap<String, f64>;

fn figures_by_cluster(url: &str) -> std::collections::BTreeMap<String, Figures> {
    let promql = [
        "sum by (cluster, caller, callee, operation, first_outcome, final_outcome) (stormglass_logical_calls_total)",
        "sum by (cluster, caller, callee, operation, attempt, outcome) (stormglass_attempts_total)",
        "sum by (cluster, caller, callee, operation) (stormglass_orphan_work_seconds_total)",
        "sum by (cluster, caller, callee, operation) (stormglass_unsafe_retries_total)",
        "sum by (cluster, service) (stormglass_layer_attempts_total) / sum by (cluster, service) (stormglass_layer_baseline_attempts_total)",
        "histogram_quantile(0.99, sum by (cluster, service, le) (stormglass_layer_duration_seconds_bucket))",
        "histogram_quantile(0.999, sum by (cluster, service, le) (stormglass_layer_duration_seconds_bucket))",
        "sum by (cluster, caller, callee, operation) (stormglass_attempt_deadline_seconds_total) / sum by (cluster, caller, callee, operation) (stormglass_budgeted_attempts_total)",
        "histogram_quantile(0.999, sum by (cluster, service, le) (stormglass_layer_duration_seconds_bucket)) / histogram_quantile(0.99, sum by (cluster, service, le) (stormglass_layer_duration_seconds_bucket))",
    ];
    let mut figures: std::collections::BTreeMap<String, Figures> = Default::default();
    for (i, promql) in promql.iter().enumerate() {
        for series in query(url, promql) {
            let mut labels = series["metric"].as_object().unwrap().clone();
            let cluster = labels
                .remove("cluster")
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let value: f64 = series["value"][1].as_str().unwrap().parse().unwrap();
            figures
                .entry(cluster)
                .or_default()
                .insert(format!("{i} {}", Value::Object(labels)), value);
        }
    }
    figures
}

/// Two `stormglass serve` instances each fed whole traces (every trace to one instance, as
/// the Collector's load-balancing exporter routes by trace id), scraped by a real Prometheus
/// as cluster "sharded", beside one instance fed every trace as cluster "single": the two
/// clusters stay apart, and the figures summed over the sharded instances equal the single
/// instance's exactly (counts, the ratios of counts, the histogram quantiles). The
/// OpenTelemetry Collector contrib binary is not available from the registries this project
/// installs from, so the test routes the traces itself: alternately, whole traces.
#[test]
fn sharded_instances_sum_to_one_instance() {
    let scratch = temp_dir("sharded");
    let dir = scratch.path();
    let env = [
        ("STORMGLASS_ASSEMBLY__IDLE", "500ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ];
    let (a, b, single) = (
        Server::start(&env),
        Server::start(&env),
        Server::start(&env),
    );
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let prometheus = start_prometheus(
        dir,
        port,
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: stormglass\n    static_configs:\n\
             \x20     - targets: ['{}', '{}']\n        labels: {{cluster: sharded}}\n\
             \x20     - targets: ['{}']\n        labels: {{cluster: single}}\n",
            rules_file().display(),
            a.api,
            b.api,
            single.api
        ),
    );

    let (to_a, to_b, to_single) = (
        Services::new(&a.grpc),
        Services::new(&b.grpc),
        Services::new(&single.grpc),
    );
    let scenarios: [fn(&Services, SystemTime); 2] = [Services::storm, Services::healthy];
    // Spread over a few seconds, so the counters rise across scrapes and the recording
    // rules' rates see them.
    for i in 0..8 {
        let t0 = SystemTime::now();
        let scenario = scenarios[i % 2];
        scenario(if i % 3 == 0 { &to_a } else { &to_b }, t0);
        scenario(&to_single, t0);
        for services in [&to_a, &to_b, &to_single] {
            services.flush();
        }
        std::thread::sleep(Duration::from_millis(700));
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let figures = figures_by_cluster(&url);
        let (sharded, one) = (figures.get("sharded"), figures.get("single"));
        let total = |metric: &str, cluster: &str| {
            query(&url, &format!("sum({metric}{{cluster=\"{cluster}\"}})"))
                .first()
                .map(|s| s["value"][1].as_str().unwrap().parse::<f64>().unwrap())
                .unwrap_or(0.0)
        };
        // Counts are exact; sums of float seconds may differ in their last bits with the
        // order of addition: equal to 1e-9, relatively.
        let agree = |x: &Figures, y: &Figures| {
            x.len() == y.len()
                && x.iter().zip(y).all(|((kx, vx), (ky, vy))| {
                    kx == ky
                        && (vx == vy
                            || (vx.is_nan() && vy.is_nan())
                            || (vx - vy).abs() <= 1e-9 * vx.abs().max(vy.abs()))
                })
        };
        // Every span accepted is analysed, in both clusters alike, before the figures count:
        // spans are counted as analysed chunk by chunk, the figures at the interval's end.
        let accepted = total("stormglass_receiver_accepted_spans_total", "single");
        let settled = accepted > 0.0
            && ["sharded", "single"].iter().all(|c| {
                total("stormglass_receiver_accepted_spans_total", c) == accepted
                    && total("stormglass_analysis_spans_total", c) == accepted
            });
        if let (Some(sharded), Some(one)) = (sharded, one)
            && settled
            && agree(sharded, one)
        {
            assert!(
                one.keys().any(|k| k.starts_with("0 ")),
                "edges counted: {one:?}"
            );
            assert!(
                one.keys().any(|k| k.starts_with("4 ")),
                "layers counted: {one:?}"
            );
            for (figure, what) in [
                ("6 ", "quantiles"),
                ("7 ", "timeouts"),
                ("8 ", "tail ratios"),
            ] {
                assert!(one.keys().any(|k| k.starts_with(figure)), "{what}: {one:?}");
            }
            // The recording rules keep the clusters apart too.
            let apart = [
                "stormglass:layer_amplification:ratio_rate5m",
                "stormglass:layer_tail:ratio_rate5m",
                "stormglass:edge_timeout:mean_seconds_rate5m",
            ]
            .iter()
            .all(|rule| {
                let clusters: std::collections::BTreeSet<String> = query(&url, rule)
                    .iter()
                    .map(|s| s["metric"]["cluster"].as_str().unwrap().to_owned())
                    .collect();
                clusters.len() == 2
            });
            if apart {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "sharded and single never agreed:\nsharded {sharded:#?}\nsingle {one:#?}\namplification rule: {:?}\n{}",
            query(&url, "stormglass:layer_amplification:ratio_rate5m"),
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `stormglass demo --otlp-grpc/--otlp-http` runs the storm against a collector already
/// serving, and `alerts.for` at 0s makes the built-in evaluator page on the first interval
/// that breaches: the amplification alert reaches Alertmanager long before its default
/// `for: 2m` could have passed.
#[test]
fn a_zero_hold_pages_on_the_first_breach() {
    let scratch = temp_dir("zero-hold");
    let dir = scratch.path();
    let (alertmanager, am_port) = start_alertmanager(dir);
    let alertmanager_url = format!("http://127.0.0.1:{am_port}");
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "1s"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
        ("STORMGLASS_ALERTS__ALERTMANAGERS", &alertmanager_url),
        (
            "STORMGLASS_ALERTS__FOR__STORMGLASSRETRYAMPLIFICATIONHIGH",
            "0s",
        ),
    ]);
    let mut demo = Command::new(env!("CARGO_BIN_EXE_stormglass"))
        .args([
            "demo",
            "--scenario",
            "storm",
            "--rate",
            "10",
            "--duration",
            "40s",
            "--otlp-grpc",
            &server.grpc,
            "--otlp-http",
            &server.http,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let paged = loop {
        let alerts = alertmanager_alerts(&alertmanager_url);
        if let Some(alert) = alerts
            .into_iter()
            .find(|a| a["labels"]["alertname"] == "StormglassRetryAmplificationHigh")
        {
            break alert;
        }
        if started.elapsed() > Duration::from_secs(60) || demo.try_wait().unwrap().is_some() {
            let _ = demo.kill();
            let output = demo.wait_with_output().unwrap();
            panic!(
                "no page after {:?}; demo: {}{}\n--- alertmanager\n{}",
                started.elapsed(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                alertmanager.log()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let _ = demo.kill();
    let output = demo.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("exporting to OTLP gRPC {}", server.grpc)),
        "{stdout}"
    );
    assert!(
        paged["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("x the attempts"),
        "{paged}"
    );
    // The built-in evaluator's own view: firing, with the hold it was configured with.
    let (_, body) = get(&format!("http://{}/api/v1/alerts", server.api));
    assert!(body.contains("\"firing\""), "{body}");
}
