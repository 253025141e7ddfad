//! The figure metrics on the fixtures: what `/metrics` exposes after live intervals equals
//! the window report's figures, counters start at 0 and sum exactly, and the cardinality
//! bound folds new series into `__overflow__`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stormglass_testkit::fixtures;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fixtures::Spans;
use prometheus::{Encoder, Registry, TextEncoder};
use stormglass_analytics::alerts::AlertThresholds;
use stormglass_analytics::figures::EDGE_COUNTS;
use stormglass_analytics::{
    AnalysisMetrics, AnalyticsConfig, Engine, LiveAnalysis, ReleasedTraces, Report, TraceSink,
};
use stormglass_export::FigureMetrics;
use stormglass_model::{Conventions, encode_request};

/// Every sample of the registry's text exposition, by `name{labels}`.
fn samples(registry: &Registry) -> BTreeMap<String, f64> {
    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut text)
        .unwrap();
    String::from_utf8(text)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

/// Sum of the samples of `name` whose labels include every `k="v"` of `labels`.
fn sum(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            series.split('{').next() == Some(name) && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

struct Live {
    registry: Registry,
    live: LiveAnalysis,
    t0: SystemTime,
    intervals: u64,
}

impl Live {
    fn new(max_series: usize) -> Live {
        let registry = Registry::new();
        let figures = FigureMetrics::register(&registry, max_series).unwrap();
        let live = LiveAnalysis::new(
            Engine::default(),
            AlertThresholds::default(),
            AnalyticsConfig::default(),
            AnalysisMetrics::unregistered(),
        )
        .with_observer(figures);
        Live {
            registry,
            live,
            t0: SystemTime::now(),
            intervals: 0,
        }
    }

    async fn interval(&mut self, spans: &Spans) -> Arc<Report> {
        let budget = stormglass_runtime::MemoryBudget::unregistered(1 << 40);
        for request in spans.requests_by_trace() {
            let (batch, _) = encode_request(&Conventions::default(), &request);
            self.live
                .release(ReleasedTraces::reserved(batch, 1, &budget));
        }
        self.intervals += 1;
        self.live
            .run_interval(self.t0 + Duration::from_secs(10 * self.intervals))
            .await
            .unwrap()
    }
}

/// Every failure mode in one interval: after the next interval the counters hold exactly the
/// report's counts (logical calls, attempts by kind and outcome, layer attempts and
/// baselines, orphans, unsafe/immediate/timeout-on-write retries, deadline violations,
/// multi-layer traces, entry requests), the histogram counts every layer duration, and the
/// gauges equal the report's figures in base units.
#[tokio::test]
async fn exposition_matches_the_report() {
    let mut live = Live::new(2000);
    let spans = fixtures::every_fixture();
    let report = live.interval(&spans).await;

    // A new series is exposed at 0 first, so Prometheus' increase() sees it start.
    let first = samples(&live.registry);
    assert_eq!(sum(&first, "stormglass_logical_calls_total", &[]), 0.0);
    assert!(
        first
            .keys()
            .any(|k| k.starts_with("stormglass_logical_calls_total{"))
    );
    assert_eq!(
        sum(&first, "stormglass_layer_duration_seconds_count", &[]),
        0.0
    );

    live.interval(&Spans::default()).await;
    let s = samples(&live.registry);
    for e in &report.edges {
        let edge = [
            format!("caller=\"{}\"", e.caller),
            format!("callee=\"{}\"", e.callee),
            format!("operation=\"{}\"", e.operation),
        ];
        let mut labels: Vec<&str> = edge.iter().map(String::as_str).collect();
        let what = format!("{} -> {} {}", e.caller, e.callee, e.operation);
        let calls = sum(&s, "stormglass_logical_calls_total", &labels);
        assert_eq!(calls, e.logical_calls as f64, "{what}");
        assert_eq!(
            sum(&s, "stormglass_attempts_total", &labels),
            e.attempts as f64,
            "{what}"
        );
        labels.push("attempt=\"retry\"");
        assert_eq!(
            sum(&s, "stormglass_attempts_total", &labels),
            e.retry_attempts as f64,
            "{what}"
        );
        labels.pop();
        let timed_out = {
            let mut l = labels.clone();
            l.push("outcome=\"deadline\"");
            sum(&s, "stormglass_attempts_total", &l)
        };
        let timeout_rate = timed_out / sum(&s, "stormglass_attempts_total", &labels);
        assert_eq!(
            Some(timeout_rate).filter(|r| r.is_finite()),
            e.timeout_rate,
            "timeout_rate {what}"
        );
        let first_ok = {
            let mut l = labels.clone();
            l.push("first_outcome=\"ok\"");
            sum(&s, "stormglass_logical_calls_total", &l)
        };
        assert_eq!(Some(first_ok / calls), e.effective_success_rate, "{what}");
        for (metric, expected) in [
            (
                "stormglass_out_of_budget_retries_total",
                e.out_of_budget_retries,
            ),
            ("stormglass_orphan_pairs_total", e.orphan_pairs),
        ] {
            assert_eq!(sum(&s, metric, &labels), expected as f64, "{metric} {what}");
        }
        // Every per-edge count of the figure catalogue the report shows under its column's
        // name: its counter holds the report's value, in base units.
        let shown = serde_json::to_value(e).unwrap();
        for count in EDGE_COUNTS {
            let Some(expected) = shown.get(count.column).and_then(|v| v.as_f64()) else {
                continue;
            };
            let metric = format!("stormglass_{}_total", count.counter);
            let counted = sum(&s, &metric, &labels);
            assert!(
                (counted - expected * count.unit.to_base()).abs() < 1e-9,
                "{metric} {what}: {counted} against {expected}"
            );
        }
        // Each ratio figure is the ratio of its two counters (null where the denominator is 0).
        for (numerator, denominator, expected) in [
            (
                "stormglass_other_instance_retries_total",
                "stormglass_instance_retries_total",
                e.retries_to_other_instance,
            ),
            (
                "stormglass_retried_failed_calls_total",
                "stormglass_retried_calls_total",
                e.retried_failed_share,
            ),
            (
                "stormglass_timed_out_server_ok_attempts_total",
                "stormglass_timed_out_served_attempts_total",
                e.timed_out_server_ok_share,
            ),
            (
                "stormglass_unbudgeted_served_attempts_total",
                "stormglass_served_attempts_total",
                e.attempts_without_deadline,
            ),
            (
                "stormglass_timeout_killed_attempts_total",
                "stormglass_served_budgeted_attempts_total",
                e.timeout_kill_share,
            ),
        ] {
            let ratio = sum(&s, numerator, &labels) / sum(&s, denominator, &labels);
            assert_eq!(
                Some(ratio).filter(|r| r.is_finite()),
                expected,
                "{numerator} {what}"
            );
        }
        let retried = sum(&s, "stormglass_retried_calls_total", &labels);
        assert_eq!(retried, e.retried_calls as f64, "{what}");
        let work = sum(&s, "stormglass_orphan_work_seconds_total", &labels);
        assert!((work - e.orphan_work_seconds).abs() < 1e-9, "{what}");
        let gauge = |name: &str| {
            let v = sum(&s, name, &labels);
            s.keys()
                .any(|k| k.starts_with(name) && labels.iter().all(|l| k.contains(l)))
                .then_some(v)
        };
        assert_eq!(
            gauge("stormglass_raw_success_ratio"),
            e.raw_success_rate,
            "{what}"
        );
        assert_eq!(gauge("stormglass_retry_ratio"), e.retry_ratio, "{what}");
        assert_eq!(
            gauge("stormglass_retry_success_ratio"),
            e.retry_success_rate,
            "{what}"
        );
        assert_eq!(
            gauge("stormglass_timeout_seconds"),
            e.timeout_ms.map(|ms| ms / 1e3),
            "{what}"
        );
        // The mean budget from the counters: present exactly where the report has a
        // timeout, and equal to it (each fixture edge has one timeout policy).
        let budgeted = sum(&s, "stormglass_budgeted_attempts_total", &labels);
        let budgets = sum(&s, "stormglass_attempt_deadline_seconds_total", &labels);
        let mean = (budgeted > 0.0).then(|| budgets / budgeted);
        assert_eq!(mean, e.timeout_ms.map(|ms| ms / 1e3), "{what}");
        // The remaining-budget histogram has the attempts the report's median is of.
        let remaining = sum(&s, "stormglass_remaining_budget_seconds_count", &labels);
        assert_eq!(remaining > 0.0, e.remaining_budget_ms.is_some(), "{what}");
    }
    for l in &report.layers {
        let service = format!("service=\"{}\"", l.service);
        let labels = [service.as_str()];
        assert_eq!(
            sum(&s, "stormglass_layer_attempts_total", &labels),
            l.requests as f64,
            "{}",
            l.service
        );
        assert_eq!(
            sum(&s, "stormglass_layer_baseline_attempts_total", &labels),
            l.baseline_attempts as f64
        );
        assert_eq!(
            Some(sum(&s, "stormglass_amplification_ratio", &labels)),
            l.amplification
        );
        assert_eq!(
            Some(sum(&s, "stormglass_layer_latency_p999_seconds", &labels)),
            l.p999_ms.map(|ms| ms / 1e3)
        );
        // The histogram's +Inf bucket is its count.
        let count = sum(&s, "stormglass_layer_duration_seconds_count", &labels);
        let inf = format!("{service},le=\"+Inf\"");
        assert_eq!(
            sum(&s, "stormglass_layer_duration_seconds_bucket", &[&inf]),
            count
        );
    }
    let entries: u64 = report.entries.iter().map(|e| e.requests).sum();
    assert_eq!(
        sum(&s, "stormglass_entry_requests_total", &[]),
        entries as f64
    );
    assert_eq!(
        sum(&s, "stormglass_multi_layer_retry_traces_total", &[]),
        report.traces.multi_layer_retry_traces as f64
    );
    let violations: u64 = report
        .findings
        .iter()
        .filter(|f| {
            ["deadline_inversion", "overcommit", "not_propagated"].contains(&f.kind.as_str())
        })
        .map(|f| f.count)
        .sum();
    assert!(violations > 0);
    assert_eq!(
        sum(&s, "stormglass_deadline_violations_total", &[]),
        violations as f64
    );
    for e in &report.entries {
        let labels = [
            format!("service=\"{}\"", e.service),
            format!("operation=\"{}\"", e.operation),
        ];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        assert_eq!(
            sum(&s, "stormglass_storm_potential_ratio", &labels),
            e.storm_potential
        );
        // The entry's error rate from its counters; its histogram holds every request.
        let requests = sum(&s, "stormglass_entry_requests_total", &labels);
        assert_eq!(requests, e.requests as f64, "{e:?}");
        let failed = sum(&s, "stormglass_entry_failed_requests_total", &labels);
        assert_eq!(Some(failed / requests), e.error_rate, "{e:?}");
        assert_eq!(
            sum(&s, "stormglass_entry_duration_seconds_count", &labels),
            requests,
            "{e:?}"
        );
    }
}

/// Counters keep growing across intervals (they are not the window): the same spans twice
/// count twice.
#[tokio::test]
async fn counters_accumulate_across_intervals() {
    let mut live = Live::new(2000);
    let mut storm = Spans::default();
    fixtures::storm(&mut storm, 1);
    live.interval(&storm).await;
    let mut again = Spans::default();
    fixtures::storm(&mut again, 2);
    live.interval(&again).await;
    live.interval(&Spans::default()).await;
    let s = samples(&live.registry);
    assert_eq!(
        sum(&s, "stormglass_layer_attempts_total", &["service=\"db\""]),
        54.0
    );
    assert_eq!(
        sum(
            &s,
            "stormglass_layer_baseline_attempts_total",
            &["service=\"db\""]
        ),
        2.0
    );
}

/// With room for one series per metric, every further edge folds into `__overflow__`
/// series: nothing is lost from the totals, and the folding is counted.
#[tokio::test]
async fn cardinality_bound_folds_into_overflow() {
    let mut bounded = Live::new(1);
    // Unbounded for the histograms too (54 series per label set).
    let mut unbounded = Live::new(100_000);
    let spans = fixtures::every_fixture();
    for live in [&mut bounded, &mut unbounded] {
        live.interval(&spans).await;
        live.interval(&Spans::default()).await;
    }
    let (b, u) = (samples(&bounded.registry), samples(&unbounded.registry));
    for metric in [
        "stormglass_attempts_total",
        "stormglass_logical_calls_total",
        "stormglass_layer_attempts_total",
        "stormglass_unsafe_retries_total",
        "stormglass_layer_duration_seconds_count",
    ] {
        assert_eq!(sum(&b, metric, &[]), sum(&u, metric, &[]), "{metric}");
    }
    assert!(
        b.keys()
            .any(|k| k.starts_with("stormglass_attempts_total{") && k.contains("__overflow__"))
    );
    assert!(sum(&b, "stormglass_export_overflow_total", &[]) > 0.0);
    assert_eq!(sum(&u, "stormglass_export_overflow_total", &[]), 0.0);
    let gauges = b
        .keys()
        .filter(|k| k.starts_with("stormglass_amplification_ratio{"))
        .count();
    assert_eq!(gauges, 1);
    assert!(sum(&b, "stormglass_export_dropped_series", &[]) > 0.0);
}

/// Retries whose `cause` attribute is hostile free text (quotes, backslashes, newlines,
/// control characters, non-ASCII, 1 KB long; 60 distinct values) stay within the series
/// bound, fold into `__overflow__`, lose no count, and the exposition stays valid Prometheus
/// text, as `promtool check metrics` (Prometheus' own parser) reads it.
#[tokio::test]
async fn hostile_causes_are_bounded_and_escaped() {
    const LIMIT: usize = 8;
    let mut s = Spans::default();
    let long = "x".repeat(1024);
    let hostile = [
        "quote\"d",
        "back\\slash",
        "new\nline",
        "tab\tand\rreturn",
        "nul\u{0}byte",
        "ünïcödé ✓ 🌩",
        "}{=,\" le=\"+Inf",
        long.as_str(),
    ];
    for trace in 0..60u32 {
        let root = s
            .span(fixtures::SERVER, trace + 1, "gateway", "GET /")
            .at(0.0, 100.0)
            .add();
        for attempt in 0..2 {
            let cause = format!("{} #{trace}", hostile[trace as usize % hostile.len()]);
            let mut attributes = vec![fixtures::peer("api"), fixtures::retry(attempt)];
            if attempt > 0 {
                attributes.push(fixtures::cause(&cause));
            }
            s.span(fixtures::CLIENT, trace + 1, "gateway", "GET")
                .under(root)
                .at(1.0, 40.0)
                .with(attributes)
                .add();
        }
    }
    let mut bounded = Live::new(LIMIT);
    let mut unbounded = Live::new(2000);
    for live in [&mut bounded, &mut unbounded] {
        live.interval(&s).await;
        live.interval(&Spans::default()).await;
    }
    let (b, u) = (samples(&bounded.registry), samples(&unbounded.registry));
    let series = b
        .keys()
        .filter(|k| k.starts_with("stormglass_attempts_total{"))
        .count();
    // The bound: the limit, plus one fully folded series per combination of the closed
    // labels (attempt kind, outcome) that reached the fold.
    let label = |key: &str, name: &str| {
        key.split(&format!("{name}=\""))
            .nth(1)
            .and_then(|v| v.split('"').next())
            .map(str::to_owned)
    };
    let closed: std::collections::BTreeSet<_> = u
        .keys()
        .filter(|k| k.starts_with("stormglass_attempts_total{"))
        .map(|k| (label(k, "attempt"), label(k, "outcome")))
        .collect();
    assert!(
        series <= LIMIT + closed.len(),
        "{series} series over a limit of {LIMIT} and {} closed-label combinations",
        closed.len()
    );
    assert!(
        u.keys()
            .filter(|k| k.starts_with("stormglass_attempts_total{"))
            .count()
            > LIMIT * 4,
        "the unbounded run keeps one series per cause"
    );
    assert_eq!(
        sum(&b, "stormglass_attempts_total", &[]),
        sum(&u, "stormglass_attempts_total", &[])
    );
    assert!(b.keys().any(|k| k.contains("cause=\"__overflow__\"")));

    for registry in [&bounded.registry, &unbounded.registry] {
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let mut promtool = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool (Debian's prometheus package; tests/run.sh installs it)");
        use std::io::Write;
        promtool.stdin.take().unwrap().write_all(&text).unwrap();
        let output = promtool.wait_with_output().unwrap();
        let report = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        // promtool's lint warns about naming conventions only; a parse error fails it.
        assert!(
            !report.contains("error while linting") && !report.contains("parse"),
            "{report}"
        );
    }
}
