//! `stormglass demo`: the collector on its defaults plus the instrumented demo chain
//! replaying one scenario, with a live summary every few seconds. `/metrics`,
//! `/api/v1/report` and `/api/v1/alerts` serve the figures while it runs.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use stormglass_analytics::Report;
use stormglass_demo::{Chain, Counts, EdgeSetting, Plan, Scenario};
use stormglass_export::notify::AlertStatus;
use tokio::sync::watch;

use crate::config::Config;
use crate::serve::{Collector, shutdown_signal};

/// How often the summary is printed.
const SUMMARY_EVERY: Duration = Duration::from_secs(5);

/// The scenario's plan, its clients obeying `policy` (a policy file) where given: each
/// edge of the chain the file names takes its attempts, timeout and retry budget.
pub fn plan(scenario: Scenario, policy: Option<&std::path::Path>) -> anyhow::Result<Plan> {
    let Some(path) = policy else {
        return Ok(scenario.plan());
    };
    let policy = crate::offline::read_policy(path)?;
    // The chain's clients call per (caller, callee): of several operations, the fewest
    // attempts and the shortest timeout.
    let mut settings: BTreeMap<(&str, &str), EdgeSetting> = BTreeMap::new();
    for e in &policy.edges {
        match settings.entry((e.caller.as_str(), e.callee.as_str())) {
            Entry::Occupied(mut s) => {
                let s = s.get_mut();
                s.max_attempts = s.max_attempts.min(e.max_attempts);
                s.timeout_ms = match (s.timeout_ms, e.timeout_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Entry::Vacant(v) => {
                v.insert(EdgeSetting {
                    caller: e.caller.clone(),
                    callee: e.callee.clone(),
                    max_attempts: e.max_attempts,
                    timeout_ms: e.timeout_ms,
                    budget_ratio: e.retry_budget_ratio.filter(|_| e.max_attempts > 1),
                    budget_min_per_second: e
                        .retry_budget_min_per_second
                        .filter(|_| e.max_attempts > 1),
                });
            }
        }
    }
    let settings: Vec<EdgeSetting> = settings.into_values().collect();
    let (plan, unknown) = scenario.plan().with_settings(&settings);
    if !unknown.is_empty() {
        anyhow::bail!(
            "{}: the demo chain has no edge {} (it has gateway -> order, order -> inventory, \
             order -> payment, inventory -> db, payment -> db)",
            path.display(),
            unknown.join(", ")
        );
    }
    Ok(plan)
}

pub async fn run(
    config: Config,
    scenario: Scenario,
    plan: Plan,
    duration: Duration,
    rate: f64,
) -> anyhow::Result<()> {
    let collector = Collector::start(config).await?;
    println!(
        "stormglass demo: scenario {scenario}: {}\n\
         collector: OTLP gRPC {} and HTTP {}; figures at http://{}/metrics, \
         http://{api}/api/v1/report, http://{api}/api/v1/alerts\n\
         sending {rate} requests/s for {}; Ctrl-C stops early.\n",
        scenario.story(),
        collector.grpc,
        collector.http,
        collector.api,
        humantime::format_duration(duration),
        api = collector.api,
    );
    let chain = Chain::start_with(
        scenario,
        plan,
        &collector.grpc.to_string(),
        &collector.http.to_string(),
    )
    .await?;
    let started = Instant::now();
    let counts = drive(&chain, rate, duration, |counts| {
        print!(
            "{}",
            summary(scenario, started.elapsed(), duration, counts, &collector)
        )
    })
    .await?;
    chain.shutdown().await;
    // Let assembly release the last traces and the analysis run over them.
    println!("load done; waiting for the last traces to be analysed...");
    tokio::time::sleep(collector.settle_time()).await;
    print!(
        "{}",
        summary(scenario, started.elapsed(), duration, counts, &collector)
    );
    collector.stop().await
}

/// The demo chain alone, exporting its spans to a collector already running (OTLP/gRPC at
/// `grpc`, OTLP/HTTP at `http`): the figures are that collector's to show.
pub async fn send(
    scenario: Scenario,
    plan: Plan,
    duration: Duration,
    rate: f64,
    grpc: &str,
    http: &str,
) -> anyhow::Result<()> {
    println!(
        "stormglass demo: scenario {scenario}: {}\n\
         exporting to OTLP gRPC {grpc} and HTTP {http}\n\
         sending {rate} requests/s for {}; Ctrl-C stops early.\n",
        scenario.story(),
        humantime::format_duration(duration),
    );
    let chain = Chain::start_with(scenario, plan, grpc, http).await?;
    let started = Instant::now();
    let line = |counts: Counts| {
        format!(
            "{:>4.0}s: {} requests ({} ok, {} failed)\n",
            started.elapsed().as_secs_f64(),
            counts.requests,
            counts.succeeded,
            counts.failed
        )
    };
    let counts = drive(&chain, rate, duration, |counts| print!("{}", line(counts))).await?;
    chain.shutdown().await;
    print!("{}", line(counts));
    Ok(())
}

/// Run the chain at `rate` for `duration` (Ctrl-C stops early), calling `tick` with the
/// counts so far every few seconds; returns the final counts.
async fn drive(
    chain: &Chain,
    rate: f64,
    duration: Duration,
    tick: impl Fn(Counts),
) -> anyhow::Result<Counts> {
    let (stop, stopped) = watch::channel(false);
    let load = chain.run(rate, duration, 512, stopped);
    tokio::pin!(load);
    let mut every = tokio::time::interval(SUMMARY_EVERY);
    every.tick().await;
    loop {
        tokio::select! {
            counts = &mut load => return Ok(counts),
            _ = every.tick() => tick(chain.stats()),
            signal = shutdown_signal() => {
                tracing::info!(signal = signal?, "stopping the demo");
                let _ = stop.send(true);
            }
        }
    }
}

/// The headline figures: requests, the entry edge's success, amplification per layer, and
/// the alerts (conditions holding now; firing once held for their `for:`).
fn summary(
    scenario: Scenario,
    elapsed: Duration,
    duration: Duration,
    counts: Counts,
    collector: &Collector,
) -> String {
    let alerts = collector.evaluator.alerts();
    match collector.analysis.report() {
        Some(report) => render(scenario, elapsed, duration, counts, &report, &alerts),
        // Let go to build the next within limits.memory: the figures come at the next tick.
        None => format!(
            "{:>4.0}s  {scenario}: the window's report is being rebuilt\n",
            elapsed.as_secs_f64()
        ),
    }
}

fn render(
    scenario: Scenario,
    elapsed: Duration,
    duration: Duration,
    counts: Counts,
    report: &Report,
    alerts: &[AlertStatus],
) -> String {
    let done = (elapsed.as_secs_f64() / duration.as_secs_f64().max(1e-9)).min(1.0);
    let width = 30;
    let filled = (done * width as f64).round() as usize;
    let mut out = format!(
        "[{}{}] {:>4.0}s / {}  {scenario}: {} requests ({} ok, {} failed)\n",
        "#".repeat(filled),
        "-".repeat(width - filled),
        elapsed.as_secs_f64(),
        humantime::format_duration(duration),
        counts.requests,
        counts.succeeded,
        counts.failed,
    );
    let _ = writeln!(
        out,
        "  window: {} traces, {} spans analysed",
        report.window.traces, report.window.spans
    );
    let percent = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}%", v * 100.0));
    if let Some(e) = report.edges.iter().find(|e| e.caller == "gateway") {
        let _ = writeln!(
            out,
            "  gateway -> {}: effective success {}, raw {}, {} retries per first attempt",
            e.callee,
            percent(e.effective_success_rate),
            percent(e.raw_success_rate),
            e.retry_ratio.map_or("-".to_owned(), |r| format!("{r:.2}")),
        );
    }
    let mut layers: Vec<_> = report
        .layers
        .iter()
        .filter_map(|l| l.amplification.map(|a| (l.service.as_str(), a)))
        .collect();
    layers.sort_by(|a, b| b.1.total_cmp(&a.1));
    if !layers.is_empty() {
        let list: Vec<String> = layers.iter().map(|(s, a)| format!("{s} {a:.1}x")).collect();
        let _ = writeln!(out, "  amplification: {}", list.join(", "));
    }
    let mut holding: Vec<(&str, String)> = report
        .alerts
        .iter()
        .map(|a| (a.name.as_str(), series(&a.labels)))
        .collect();
    holding.sort();
    let firing = alerts.iter().filter(|a| a.state == "firing").count();
    let _ = writeln!(
        out,
        "  alerts: {} conditions holding, {firing} firing (after their for:)",
        holding.len()
    );
    let mut names: Vec<&str> = holding.iter().map(|(n, _)| *n).collect();
    names.dedup();
    for name in names {
        let list: Vec<&str> = holding
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, s)| s.as_str())
            .collect();
        let _ = writeln!(out, "    {name}: {}", list.join("; "));
    }
    out
}

/// An alert's series, readably: `caller -> callee operation` or `service operation`.
fn series(labels: &std::collections::BTreeMap<String, String>) -> String {
    let get = |k: &str| labels.get(k).map_or("", String::as_str);
    let head = if labels.contains_key("caller") {
        format!("{} -> {}", get("caller"), get("callee"))
    } else {
        get("service").to_owned()
    };
    format!("{head} {}", get("operation")).trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary shows progress, the entry edge's success and the alerts holding.
    #[test]
    fn summary_lines() {
        let report = Report::default();
        let text = render(
            Scenario::Storm,
            Duration::from_secs(15),
            Duration::from_secs(60),
            Counts {
                requests: 10,
                succeeded: 4,
                failed: 6,
                ..Counts::default()
            },
            &report,
            &[],
        );
        assert!(
            text.starts_with("[########----------------------]"),
            "{text}"
        );
        assert!(
            text.contains("storm: 10 requests (4 ok, 6 failed)"),
            "{text}"
        );
        assert!(text.contains("0 conditions holding, 0 firing"), "{text}");
    }
}
