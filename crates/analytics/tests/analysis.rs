//! The analysis on hand-built fixtures (stormglass_testkit::fixtures): each failure mode
//! stormglass finds produces the figures computed by hand in its fixture's comment. Long
//! because it is one short test per fixture and figure; each stands alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stormglass_testkit::fixtures;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arrow::array::RecordBatch;
use fixtures::Spans;
use stormglass_analytics::alerts::AlertThresholds;
use stormglass_analytics::histogram::{bucket, bucket_ms};
use stormglass_analytics::lineage::{Overlapping, RetryRules};
use stormglass_analytics::report::{EdgeFigures, LayerFigures, Report, ReportConfig, WindowBounds};
use stormglass_analytics::{
    AnalysisMetrics, AnalyticsConfig, Engine, LiveAnalysis, Partials, ReleasedTraces, TraceSink,
    queries,
};
use stormglass_model::{Conventions, encode_request};

fn batch(spans: &Spans) -> RecordBatch {
    let (batch, report) = encode_request(&Conventions::default(), &spans.request());
    assert_eq!(report.rejected, 0);
    batch
}

async fn report(spans: &Spans) -> Report {
    let engine = Engine::default();
    let partials = Arc::new(engine.analyse(batch(spans)).await.unwrap());
    let mut report = Report::build(&engine, &[partials], WindowBounds::default())
        .await
        .unwrap();
    report.alerts = stormglass_analytics::alerts::evaluate(&report, &AlertThresholds::default());
    report
}

/// A live analysis on the defaults, its metrics unregistered.
fn live_analysis() -> LiveAnalysis {
    LiveAnalysis::new(
        Engine::default(),
        AlertThresholds::default(),
        AnalyticsConfig::default(),
        AnalysisMetrics::unregistered(),
    )
}

fn edge<'r>(r: &'r Report, caller: &str, callee: &str) -> &'r EdgeFigures {
    r.edges
        .iter()
        .find(|e| e.caller == caller && e.callee == callee)
        .unwrap_or_else(|| panic!("no edge {caller}->{callee} in {:#?}", r.edges))
}

/// The edge of `caller`'s calls of `operation` (whatever the callee).
fn operation_edge<'r>(r: &'r Report, caller: &str, operation: &str) -> &'r EdgeFigures {
    r.edges
        .iter()
        .find(|e| e.caller == caller && e.operation == operation)
        .unwrap_or_else(|| panic!("no edge {caller} {operation} in {:#?}", r.edges))
}

fn layer<'r>(r: &'r Report, service: &str) -> &'r LayerFigures {
    r.layers
        .iter()
        .find(|l| l.service == service)
        .unwrap_or_else(|| panic!("no layer {service} in {:#?}", r.layers))
}

fn alerts(r: &Report, name: &str) -> usize {
    r.alerts.iter().filter(|a| a.name == name).count()
}

fn findings(r: &Report, kind: &str) -> u64 {
    r.findings
        .iter()
        .filter(|f| f.kind == kind)
        .map(|f| f.count)
        .sum()
}

/// The callees and values alert `name` fires for on `r`, whatever the traffic (a fixture's
/// window is too short for the minimum-traffic guard).
fn fired_on_callees(r: &Report, name: &str) -> Vec<(String, f64)> {
    let t = AlertThresholds {
        min_events_per_minute: 0.0,
        ..AlertThresholds::default()
    };
    stormglass_analytics::alerts::evaluate(r, &t)
        .into_iter()
        .filter(|a| a.name == name)
        .map(|a| (a.labels["callee"].clone(), a.value))
        .collect()
}

/// Within the histogram's 2% relative error of `expected`.
fn near(actual: Option<f64>, expected: f64) -> bool {
    actual.is_some_and(|a| ((a - expected) / expected).abs() <= 0.02)
}

/// Every query in queries/ is registered and plans and runs against the span schema.
#[tokio::test]
async fn every_query_plans_on_the_schema() {
    let mut files: Vec<String> = (stormglass_queries::FILES.iter())
        .map(|(name, _)| (*name).to_owned())
        .collect();
    files.sort();
    let late = [queries::LATE_LATENCY];
    let mut registered: Vec<String> = [
        queries::DERIVED,
        queries::PARTIALS,
        queries::REPORT,
        queries::COMMANDS,
        &late,
    ]
    .concat()
    .iter()
    .map(|q| q.name.to_owned())
    .collect();
    registered.sort();
    assert_eq!(files, registered, "queries/ and the registry disagree");
    let r = report(&Spans::default()).await;
    assert!(r.edges.is_empty() && r.layers.is_empty() && r.alerts.is_empty());
    assert_eq!(r.window.spans, 0);
}

/// Three layers retrying 3x each: 27x at the bottom, storm potential 27.
#[tokio::test]
async fn retry_storm_three_by_three() {
    let mut s = Spans::default();
    fixtures::storm(&mut s, 1);
    let r = report(&s).await;

    assert_eq!(layer(&r, "gateway").amplification, Some(1.0));
    assert_eq!(layer(&r, "api").amplification, Some(3.0));
    assert_eq!(layer(&r, "svc").amplification, Some(9.0));
    assert_eq!(layer(&r, "db").amplification, Some(27.0));
    assert_eq!(
        (layer(&r, "db").requests, layer(&r, "db").baseline_attempts),
        (27, 1)
    );

    let db = edge(&r, "svc", "db");
    assert_eq!(
        (db.logical_calls, db.attempts, db.retry_attempts),
        (9, 27, 18)
    );
    assert_eq!(db.raw_success_rate, Some(0.0));
    assert_eq!(db.effective_success_rate, Some(0.0));
    assert_eq!(db.retry_ratio, Some(2.0));
    assert_eq!(db.edge_amplification, Some(3.0));
    assert_eq!(db.retry_success_rate, Some(0.0));
    assert_eq!(
        db.retry_contribution, None,
        "no final ok: empty denominator is null"
    );
    assert_eq!(db.retries_by_cause.get("unavailable"), Some(&18));
    assert_eq!(
        (
            edge(&r, "gateway", "api").logical_calls,
            edge(&r, "api", "svc").attempts
        ),
        (1, 9)
    );

    assert_eq!(r.entries.len(), 1);
    assert_eq!(r.entries[0].storm_potential, 27.0);
    assert_eq!(r.traces.multi_layer_retry_traces, 1);
    assert_eq!(r.traces.entry_requests, 1);
    assert_eq!(
        alerts(&r, "StormglassRetryAmplificationHigh"),
        3,
        "api, svc, db"
    );
    assert_eq!(alerts(&r, "StormglassRetryStormPotential"), 1);
    assert_eq!(alerts(&r, "StormglassRetriesFailing"), 3);
    assert_eq!(findings(&r, "multi_layer_retry"), 1);
}

/// A storm trace with a second entry row (a SERVER span whose parent never arrived): the
/// trace is counted once in multi_layer_retry_traces, not once per entry row.
#[tokio::test]
async fn broken_trace_counts_once_as_multi_layer() {
    let mut s = Spans::default();
    fixtures::storm(&mut s, 1);
    let lost = fixtures::Id {
        trace: 1,
        span: 9999,
    };
    s.span(2, 1, "audit", "Record")
        .under(lost)
        .at(5.0, 6.0)
        .add();
    let r = report(&s).await;
    assert_eq!(r.traces.entry_requests, 2, "two entry rows");
    assert_eq!(r.traces.multi_layer_retry_traces, 1);
    assert_eq!(r.traces.broken, 1, "the audit span's parent never arrived");
}

/// Overcommit looks only at sequential calls: under one 800 ms parent, two parallel calls
/// of 500 ms and 400 ms are no overcommit; in another trace 2,000 sequential short calls
/// with a 0.5 ms budget each (1,000 ms in all, under an 800 ms parent) are one.
#[tokio::test]
async fn overcommit_counts_sequential_calls_only() {
    let mut s = Spans::default();
    let p = s
        .server(1, "web", "GET /")
        .at(0.0, 800.0)
        .with(vec![fixtures::deadline(800)])
        .add();
    for (callee, budget) in [("a", 500), ("b", 400)] {
        let attrs = vec![fixtures::peer(callee), fixtures::deadline(budget)];
        s.client(1, "web", "GET")
            .under(p)
            .at(10.0, 300.0)
            .with(attrs)
            .add();
    }
    let p = s
        .server(2, "batch", "RUN")
        .at(0.0, 3000.0)
        .with(vec![fixtures::deadline(800)])
        .add();
    for i in 0..2000 {
        // 0.35 ms apart, all within the parent's 800 ms: none is inverted.
        let start = 1.0 + 0.35 * f64::from(i);
        let attrs = vec![fixtures::peer("db"), deadline_f(0.5)];
        s.client(2, "batch", "INSERT")
            .under(p)
            .at(start, start + 0.3)
            .with(attrs)
            .add();
    }
    let r = report(&s).await;
    let over: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.kind == "overcommit")
        .collect();
    assert_eq!(over.len(), 1, "{:?} {:?}", r.findings, r.edges);
    assert_eq!(
        (over[0].caller.as_str(), over[0].callee.as_str()),
        ("batch", "db")
    );
    assert_eq!(over[0].count, 1);
}

fn deadline_f(ms: f64) -> opentelemetry_proto::tonic::common::v1::KeyValue {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    KeyValue {
        key: "deadline".into(),
        value: Some(AnyValue {
            value: Some(Value::DoubleValue(ms)),
        }),
        ..Default::default()
    }
}

/// A finding's detail is its example trace's: two inversions on one edge in two traces,
/// the second's detail sorting first ("budget 1000 ..." < "budget 900 ..."), report the
/// first trace with its own 900 ms.
#[tokio::test]
async fn finding_detail_comes_from_its_example_trace() {
    let mut s = Spans::default();
    for (trace, budget) in [(1, 900), (2, 1000)] {
        let p = s
            .server(trace, "web", "GET /")
            .at(0.0, 800.0)
            .with(vec![fixtures::deadline(800)])
            .add();
        let attrs = vec![fixtures::peer("fraud"), fixtures::deadline(budget)];
        s.client(trace, "web", "POST")
            .under(p)
            .at(700.0, 750.0)
            .with(attrs)
            .add();
    }
    let r = report(&s).await;
    let f = r
        .findings
        .iter()
        .find(|f| f.kind == "deadline_inversion")
        .unwrap();
    assert_eq!(f.count, 2);
    assert!(
        f.example_trace_id.as_deref().unwrap().ends_with("00000001"),
        "{f:?}"
    );
    assert!(
        f.detail.as_deref().unwrap().starts_with("budget 900 ms"),
        "{f:?}"
    );
}

/// A callee stalled past assembly.idle: its SERVER span arrives after its trace was
/// released (late). Its duration still reaches the callee's latency, so the 5 s stall shows
/// as the layer's P99.9 instead of vanishing.
#[tokio::test]
async fn late_server_spans_feed_latency() {
    let live = live_analysis();
    let budget = stormglass_runtime::MemoryBudget::unregistered(1 << 40);
    let mut on_time = Spans::default();
    let mut late = Spans::default();
    for trace in 1..=20 {
        let p = on_time.server(trace, "web", "GET /").at(0.0, 300.0).add();
        let c = on_time
            .client(trace, "web", "GET")
            .under(p)
            .at(1.0, 201.0)
            .with(vec![fixtures::peer("inv")])
            .add();
        let ms = if trace == 20 { 5000.0 } else { 10.0 };
        late.server(trace, "inv", "GET /stock")
            .under(c)
            .at(2.0, 2.0 + ms)
            .add();
    }
    let (batch, _) = encode_request(&Conventions::default(), &on_time.request());
    live.release(ReleasedTraces::reserved(batch, 20, &budget));
    let (batch, _) = encode_request(&Conventions::default(), &late.request());
    live.late_servers(batch);
    let r = live.run_interval(SystemTime::now()).await.unwrap();
    let inv = r.layers.iter().find(|l| l.service == "inv").unwrap();
    assert_eq!(inv.requests, 20);
    assert!(near(inv.p999_ms, 5000.0), "{inv:?}");
}

/// A 200 ms timeout under a 320 ms P99.9: below the tail, recommended 480 ms.
#[tokio::test]
async fn timeout_below_callee_p999() {
    let mut s = Spans::default();
    fixtures::slow_tail(&mut s, 1000);
    let r = report(&s).await;

    let inv = layer(&r, "inventory");
    assert!(near(inv.p99_ms, 50.0), "{inv:?}");
    assert!(near(inv.p999_ms, 320.0), "{inv:?}");
    assert_eq!(inv.p999_ms, Some(bucket_ms(bucket(320.0))));
    // A ratio of two quantiles, each within 2%: exactly their ratio, within ~4% of 6.4.
    assert_eq!(
        inv.tail_ratio,
        Some(inv.p999_ms.unwrap() / inv.p99_ms.unwrap())
    );
    assert!(
        (inv.tail_ratio.unwrap() / 6.4 - 1.0).abs() <= 0.0405,
        "{inv:?}"
    );

    let e = edge(&r, "orders", "inventory");
    assert!(near(e.timeout_ms, 200.0));
    assert_eq!(e.timeout_below_tail, Some(true));
    assert!(near(e.recommended_timeout_ms, 480.0));
    assert_eq!(e.attempt_success_rate, Some(0.997));
    assert_eq!(e.orphan_pairs, 3);
    assert!(
        (e.orphan_work_seconds - 0.3615).abs() < 1e-9,
        "{}",
        e.orphan_work_seconds
    );
    assert!(r.orphans.iter().all(|o| o.server_outcome == "ok"));
    assert_eq!(findings(&r, "timeout_below_tail"), 1000);
    assert_eq!(alerts(&r, "StormglassTimeoutBelowTail"), 1);
    assert_eq!(alerts(&r, "StormglassTailRatioHigh"), 1);
    // 3 of inventory's 1000 durations are longer than 200 ms, counted exactly.
    assert_eq!(e.timeout_kill_share, Some(0.003));
    // The 3 timed-out calls were answered ok after the client gave up.
    assert_eq!(e.timed_out_server_ok_share, Some(1.0));
    assert_eq!(e.timeout_without_margin, Some(false));
}

/// A timeout is judged against the operation it guards (see fixtures::operations): the
/// fast operation's 100 ms timeout is above its 47 ms P99.9 though the users layer's P99.9
/// is the slow operation's 1,300 ms; the uninstrumented db by its operation; a call that no
/// SERVER span answered by the layer.
#[tokio::test]
async fn timeouts_are_judged_against_the_operation_they_guard() {
    let mut s = Spans::default();
    fixtures::operations(&mut s, 1);
    let r = report(&s).await;
    let on = |caller: &str, operation: &str| {
        r.edges
            .iter()
            .find(|e| e.caller == caller && e.operation == operation)
            .unwrap_or_else(|| panic!("no edge {caller} {operation}"))
    };
    let fast = on("web", "/users/{id}");
    assert_eq!(fast.callee_latency_source.as_deref(), Some("edge"));
    assert!(near(fast.callee_p999_ms, 47.0), "{fast:?}");
    assert_eq!(fast.timeout_below_tail, Some(false));
    assert!(near(fast.recommended_timeout_ms, 70.5), "{fast:?}");
    assert_eq!(fast.timeout_kill_share, Some(0.0));
    let slow = on("admin", "/reports");
    assert_eq!(slow.callee_latency_source.as_deref(), Some("edge"));
    assert!(near(slow.callee_p999_ms, 1300.0), "{slow:?}");
    assert_eq!(slow.timeout_below_tail, Some(false));
    assert_eq!(slow.timeout_without_margin, Some(false));
    let db = on("users", "SELECT");
    assert_eq!(db.callee_latency_source.as_deref(), Some("operation"));
    assert!(near(db.callee_p999_ms, 5.0), "{db:?}");
    let refused = on("web", "/users/{id}/avatar");
    assert_eq!(refused.callee_latency_source.as_deref(), Some("layer"));
    assert!(near(refused.callee_p999_ms, 1300.0), "{refused:?}");
    assert_eq!(refused.timeout_below_tail, Some(true));

    let users = layer(&r, "users");
    assert!(near(users.p999_ms, 1300.0), "{users:?}");
    let ops: Vec<(&str, u64)> = users
        .operations
        .iter()
        .map(|o| (o.operation.as_str(), o.requests))
        .collect();
    assert_eq!(ops, [("/reports", 20), ("/users/{id}", 20)]);
    let fast_op = &users.operations[1];
    assert!(near(fast_op.p95_ms, 40.0), "{fast_op:?}");
    assert!(
        near(fast_op.p99_ms, 47.0) && near(fast_op.p999_ms, 47.0),
        "{fast_op:?}"
    );
    // One finding: the call no SERVER span answered; it says whose P99.9 judged it.
    assert_eq!(findings(&r, "timeout_below_tail"), 2);
    let finding = r
        .findings
        .iter()
        .find(|f| f.kind == "timeout_below_tail")
        .unwrap();
    assert_eq!(finding.operation, "/users/{id}/avatar");
    let detail = finding.detail.as_deref().unwrap();
    assert!(detail.contains("the callee layer's"), "{detail}");
}

/// A layer lists at most 50 operations, the most requested, and counts them all: api
/// serves 60, the first 10 twice (each a root SERVER span of its own trace).
#[tokio::test]
async fn a_layer_lists_its_busiest_operations_and_counts_all() {
    let mut s = Spans::default();
    let mut trace = 0;
    for op in 0..60u32 {
        for _ in 0..(if op < 10 { 2 } else { 1 }) {
            trace += 1;
            s.server(trace, "api", &format!("GET /op{op:02}"))
                .at(0.0, 5.0)
                .with(vec![fixtures::route(&format!("/op{op:02}"))])
                .add();
        }
    }
    let r = report(&s).await;
    let api = layer(&r, "api");
    assert_eq!(api.operations_total, 60);
    assert_eq!(api.operations.len(), 50);
    for op in 0..10 {
        let name = format!("/op{op:02}");
        assert!(
            api.operations
                .iter()
                .any(|o| o.operation == name && o.requests == 2),
            "{name}: {:?}",
            api.operations
        );
    }
}

/// A 100 ms timeout over a callee that answers 5 of 20 calls in 180 ms kills 0.25 of them;
/// a 300 ms timeout over a 250 ms P99.9 kills none but has no margin (recommended 375 ms).
#[tokio::test]
async fn timeout_kill_share_and_margin() {
    let mut s = Spans::default();
    fixtures::timeouts(&mut s, 1);
    let r = report(&s).await;

    let pricing = edge(&r, "basket", "pricing");
    assert_eq!(pricing.timeout_ms, Some(100.0));
    assert_eq!(pricing.timeout_below_tail, Some(true));
    assert_eq!(pricing.timeout_kill_share, Some(0.25));
    assert_eq!(pricing.timeout_without_margin, Some(false));
    assert_eq!(pricing.timeout_rate, Some(0.25));
    // Every timed-out call was answered ok by pricing, after the caller gave up.
    assert_eq!(pricing.timed_out_server_ok_share, Some(1.0));

    let tax = edge(&r, "basket", "tax");
    assert_eq!(tax.timed_out_server_ok_share, None);
    assert_eq!(tax.timeout_ms, Some(300.0));
    assert_eq!(tax.timeout_below_tail, Some(false));
    assert_eq!(tax.timeout_kill_share, Some(0.0));
    assert_eq!(tax.timeout_without_margin, Some(true));
    assert!(near(tax.recommended_timeout_ms, 375.0), "{tax:?}");

    assert_eq!(findings(&r, "timeout_below_tail"), 20);
    assert_eq!(findings(&r, "timeout_without_margin"), 20);
    let margin = r
        .findings
        .iter()
        .find(|f| f.kind == "timeout_without_margin")
        .unwrap();
    assert_eq!(margin.severity, "info");
    assert_eq!(margin.callee, "tax");
    // The alert says how many healthy calls the timeout kills.
    let alert = r
        .alerts
        .iter()
        .find(|a| a.name == "StormglassTimeoutBelowTail")
        .unwrap();
    assert_eq!(alert.value, 0.25);
    let d = stormglass_analytics::alerts::definition(&alert.name).unwrap();
    let summary = d.render(
        d.summary,
        &alert.labels,
        alert.value,
        &AlertThresholds::default(),
    );
    assert_eq!(
        summary,
        "basket -> pricing /price: the timeout kills 25% of healthy calls"
    );
}

/// 800 ms split 500 + 400 overcommits; 900 ms under 100 ms left inverts; a dropped
/// deadline is not propagated.
#[tokio::test]
async fn deadline_budgets() {
    let mut s = Spans::default();
    fixtures::budgets(&mut s, 1);
    let r = report(&s).await;

    let over: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.kind == "overcommit")
        .collect();
    assert_eq!(over.len(), 1, "{:#?}", r.findings);
    assert_eq!(
        (
            over[0].caller.as_str(),
            over[0].callee.as_str(),
            over[0].count
        ),
        ("checkout", "payment", 1)
    );
    assert!(
        over[0].detail.as_deref().unwrap().contains("900 ms"),
        "{:?}",
        over[0].detail
    );

    let inv: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.kind == "deadline_inversion")
        .collect();
    assert_eq!(inv.len(), 1, "{:#?}", r.findings);
    assert_eq!((inv[0].callee.as_str(), inv[0].count), ("fraud", 1));
    assert_eq!(edge(&r, "checkout", "fraud").deadline_inversions, 1);
    assert_eq!(edge(&r, "checkout", "payment").deadline_inversions, 0);

    let np: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.kind == "not_propagated")
        .collect();
    assert_eq!(np.len(), 1);
    assert_eq!(np[0].callee, "ledger");
    assert_eq!(
        alerts(&r, "StormglassDeadlineInversion"),
        2,
        "fraud and payment"
    );
}

/// A keyed (safe) retry whose callee writes again below it without the first write's key
/// re-runs that write, at the edge of the write and two layers down; the same key, or none
/// retried above, re-runs nothing.
#[tokio::test]
async fn writes_rerun_below_a_safe_retry() {
    let mut s = Spans::default();
    fixtures::rerun_writes(&mut s, 1);
    let r = report(&s).await;
    assert_eq!(edge(&r, "gateway", "orders").unsafe_retries, 0, "one key");
    assert_eq!(edge(&r, "gateway", "orders").rerun_writes, 0);
    assert_eq!(edge(&r, "orders", "payments").rerun_writes, 2);
    assert_eq!(edge(&r, "orders", "inventory").rerun_writes, 0, "reads");
    assert_eq!(edge(&r, "inventory", "db").rerun_writes, 1);
    assert_eq!(findings(&r, "rerun_write"), 3);
    assert_eq!(alerts(&r, "StormglassRerunWrites"), 2);
    let rerun = r.findings.iter().find(|f| f.kind == "rerun_write");
    assert_eq!(rerun.map(|f| f.severity.as_str()), Some("critical"));
    assert!(rerun.is_some_and(|f| f.example_trace_id.is_some()));
}

/// A retried write answered 409, ALREADY_EXISTS or a duplicate error.type is a duplicate a
/// unique index caught; a first attempt's 409 and a retried GET's are not.
#[tokio::test]
async fn duplicates_caught_after_a_retry() {
    let mut s = Spans::default();
    fixtures::duplicates(&mut s, 1);
    let r = report(&s).await;
    let count = |operation: &str| operation_edge(&r, "app", operation).duplicate_rejections;
    assert_eq!(count("/orders"), 2);
    assert_eq!(count("orders.Orders/Create"), 1);
    assert_eq!(findings(&r, "duplicate_rejection"), 3);
    let found = r.findings.iter().find(|f| f.kind == "duplicate_rejection");
    assert_eq!(found.map(|f| f.severity.as_str()), Some("warning"));
}

/// A retry before the wait a Retry-After (seconds, or a date captured on the SERVER span)
/// asked for, or after a gRPC pushback saying not to retry, violates it; one after the wait
/// does not.
#[tokio::test]
async fn retries_against_retry_after_and_pushback() {
    let mut s = Spans::default();
    fixtures::pacing(&mut s, 1);
    let r = report(&s).await;
    let count = |operation: &str| operation_edge(&r, "app", operation).retry_after_violations;
    assert_eq!(count("/items"), 2);
    assert_eq!(count("api.Items/List"), 1);
    assert_eq!(findings(&r, "retry_after_violation"), 3);
    assert_eq!(alerts(&r, "StormglassRetryAfterIgnored"), 2);
}

/// How retries wait, classified per edge from 10 retried calls on: a fixed wait is
/// constant, a doubling one exponential (with jitter when its gaps spread), waits under
/// min_backoff_ms none; fewer retried calls are not classified.
#[tokio::test]
async fn backoff_is_classified_per_edge() {
    let mut s = Spans::default();
    fixtures::backoff(&mut s, 1);
    let r = report(&s).await;
    let close =
        |v: Option<f64>, want: f64| v.is_some_and(|v| (v - want).abs() < 1e-3 * want.max(1.0));
    let fixed = edge(&r, "app", "fixed");
    assert_eq!(fixed.backoff.as_deref(), Some("constant"));
    assert!(
        close(fixed.backoff_growth, 1.0),
        "{:?}",
        fixed.backoff_growth
    );
    assert!(close(fixed.backoff_per_call_ms, 200.0));
    let doubling = edge(&r, "app", "doubling");
    assert_eq!(doubling.backoff.as_deref(), Some("exponential"));
    assert!(close(doubling.backoff_growth, 2.0));
    assert!(close(doubling.backoff_per_call_ms, 300.0));
    let jittered = edge(&r, "app", "jittered");
    assert_eq!(jittered.backoff.as_deref(), Some("exponential_jitter"));
    assert!(
        close(jittered.backoff_jitter, 0.5745),
        "{:?}",
        jittered.backoff_jitter
    );
    assert_eq!(
        edge(&r, "app", "immediate").backoff.as_deref(),
        Some("none")
    );
    let rare = edge(&r, "app", "rare");
    assert_eq!(rare.backoff, None);
    assert!(close(rare.backoff_growth, 2.0), "measured, not classified");
}

/// Lines that page on what is missing: every call of the idempotency fixture has no
/// deadline on either side (6 findings, the alert on app -> pay), and one write of its 11
/// goes without a key (a finding for the first attempt; 2 of 11 write attempts keyless is
/// above the 10% line).
#[tokio::test]
async fn calls_without_deadline_and_writes_without_key() {
    let mut s = Spans::default();
    fixtures::idempotency_keys(&mut s, 1);
    let r = report(&s).await;
    assert_eq!(findings(&r, "unbudgeted_call"), 6);
    assert_eq!(findings(&r, "write_without_key"), 1);
    assert_eq!(alerts(&r, "StormglassCallsWithoutDeadline"), 1);
    assert_eq!(alerts(&r, "StormglassWritesWithoutKey"), 1);
    let mut healthy = Spans::default();
    fixtures::healthy(&mut healthy, 1);
    let r = report(&healthy).await;
    assert_eq!(findings(&r, "unbudgeted_call"), 0, "every call budgeted");
    assert_eq!(alerts(&r, "StormglassCallsWithoutDeadline"), 0);
}

/// The entry SLO's burn alerts over one window: an entry failing 16 of 20 requests burns
/// its 5% budget 16x (above 14.4), one failing 12 of 20 12x (below); the backoff fixture's
/// entries take 5-10 s against the 1.2 s target (none within it: 20x); the healthy chain
/// burns neither.
#[tokio::test]
async fn entry_slo_budgets_burn() {
    use fixtures::{get, http_status, route};
    let burning = |r: &Report, name: &str| {
        r.alerts
            .iter()
            .filter(|a| a.name == name)
            .map(|a| (a.labels["operation"].clone(), a.value))
            .collect::<Vec<_>>()
    };
    let mut s = Spans::default();
    for (route_, failing) in [("/checkout", 16), ("/search", 12)] {
        for t in 0..20 {
            let trace = if route_ == "/checkout" {
                1 + t
            } else {
                101 + t
            };
            let status = if t < failing { 503 } else { 200 };
            s.server(trace, "shop", "GET")
                .at(0.0, 100.0)
                .with(vec![route(route_), get(), http_status(status)])
                .add();
        }
    }
    let r = report(&s).await;
    assert_eq!(
        burning(&r, "StormglassEntryErrorBudgetBurn"),
        [("/checkout".to_owned(), 16.0)]
    );
    let mut s = Spans::default();
    fixtures::backoff(&mut s, 1);
    let r = report(&s).await;
    assert_eq!(r.entries[0].latency_slo_share, Some(0.0));
    assert_eq!(
        burning(&r, "StormglassEntryLatencyBudgetBurn").len(),
        1,
        "one entry: app /page"
    );
    let mut s = Spans::default();
    fixtures::healthy(&mut s, 1);
    let r = report(&s).await;
    assert!(r.entries.iter().all(|e| e.latency_slo_share == Some(1.0)));
    assert_eq!(burning(&r, "StormglassEntryErrorBudgetBurn"), []);
    assert_eq!(burning(&r, "StormglassEntryLatencyBudgetBurn"), []);
}

/// Each layer's error share: in the storm every attempt api, svc and db receive fails
/// (503 / UNAVAILABLE), so each is at 100% and StormglassLayerErrorRateHigh fires for the
/// three; the gateway receives no attempts (its entry requests aside).
#[tokio::test]
async fn layer_error_rates() {
    let mut s = Spans::default();
    fixtures::storm(&mut s, 1);
    let r = report(&s).await;
    for service in ["api", "svc", "db"] {
        assert_eq!(layer(&r, service).error_rate, Some(1.0), "{service}");
    }
    assert_eq!(layer(&r, "gateway").error_rate, None);
    let mut firing: Vec<&str> = r
        .alerts
        .iter()
        .filter(|a| a.name == "StormglassLayerErrorRateHigh")
        .map(|a| a.labels["service"].as_str())
        .collect();
    firing.sort();
    assert_eq!(firing, ["api", "db", "svc"]);
    let mut healthy = Spans::default();
    fixtures::healthy(&mut healthy, 1);
    let r = report(&healthy).await;
    assert!(r.layers.iter().all(|l| l.error_rate.unwrap_or(0.0) == 0.0));
}

/// A keyed write given up on stays unknown until a later span of its trace with its key
/// answers (ok, or a duplicate): 4 answered after 0.1, 0.3, 0.15 and 70 s, one never; two
/// past the minute of idempotency.unknown_after.
#[tokio::test]
async fn unknown_results_until_the_key_answers() {
    let mut s = Spans::default();
    fixtures::unknown_results(&mut s, 1);
    let r = report(&s).await;
    let e = edge(&r, "app", "orders");
    assert_eq!(e.unknown_results, 5);
    let seconds = e.unknown_result_seconds.unwrap();
    assert!((seconds - 17.6375).abs() < 1e-6, "{seconds}");
    assert_eq!(e.unknown_results_over_limit, 2);
}

/// Envoy's own upstream spans are the attempts: `retry.count` numbers the retries, its
/// `response_flags` say a per-try timeout (`UT`) and circuit breaking (`UO`), and the
/// cluster names the callee of an attempt that reached nobody (fixtures::envoy).
#[tokio::test]
async fn envoy_upstream_spans() {
    let mut s = Spans::default();
    fixtures::envoy(&mut s, 1);
    let r = report(&s).await;
    let api = edge(&r, "edge", "api");
    assert_eq!(
        (api.logical_calls, api.attempts, api.retry_attempts),
        (3, 5, 2),
        "{api:#?}"
    );
    assert_eq!(api.retries_by_cause.get("deadline"), Some(&1));
    assert_eq!(api.retries_by_cause.get("unavailable"), Some(&1));
    assert!(near(api.attempt_success_rate, 2.0 / 5.0), "{api:#?}");
    assert!(near(api.timeout_rate, 1.0 / 5.0), "{api:#?}");
    assert!(near(api.raw_success_rate, 2.0 / 3.0), "{api:#?}");
    assert_eq!(api.effective_success_rate, Some(0.0), "{api:#?}");
    assert_eq!(api.orphan_pairs, 1);
    assert!((api.orphan_work_seconds - 0.049).abs() < 1e-9, "{api:#?}");
    assert_eq!(r.edges.len(), 1, "{:#?}", r.edges);
}

/// Retries of six callers landing in one 100 ms slot at store are synchronised; one call per
/// slot is not, nor four calls in one slot at cache (under retries.synchronised_min_calls).
#[tokio::test]
async fn synchronised_retries_share_a_slot() {
    let mut s = Spans::default();
    fixtures::synchronised(&mut s, 1);
    let r = report(&s).await;
    assert_eq!(edge(&r, "svc1", "store").synchronised_retries, Some(0.2));
    for k in 2..=6 {
        let caller = format!("svc{k}");
        assert_eq!(edge(&r, &caller, "store").synchronised_retries, Some(1.0));
    }
    for k in 1..=4 {
        let caller = format!("svc{k}");
        assert_eq!(edge(&r, &caller, "cache").synchronised_retries, Some(0.0));
    }
    let mut healthy = Spans::default();
    fixtures::healthy(&mut healthy, 1);
    let r = report(&healthy).await;
    assert!(
        r.edges
            .iter()
            .all(|e| e.synchronised_retries.unwrap_or(0.0) == 0.0)
    );
}

/// A POST retried without a key is unsafe, and overlapping where its first attempt still
/// ran at the callee; timed-out writes retried are counted with or without key; a 2 ms
/// backoff is immediate; the committed orphan is found; half the attempts timed out.
#[tokio::test]
async fn unsafe_write_retries() {
    let mut s = Spans::default();
    fixtures::unsafe_post(&mut s, 1);
    let r = report(&s).await;
    let e = edge(&r, "cart", "orders");
    assert_eq!((e.logical_calls, e.attempts, e.retry_attempts), (2, 4, 2));
    assert_eq!(e.unsafe_retries, 1);
    assert_eq!((e.overlapping_retries, e.overlapping_write_retries), (1, 1));
    assert_eq!(findings(&r, "overlapping_retry"), 1);
    assert_eq!(alerts(&r, "StormglassOverlappingWriteRetries"), 1);
    // Half of what orders receives times out.
    assert_eq!(alerts(&r, "StormglassTimeoutRateHigh"), 1);
    assert_eq!(e.timeout_retries_on_writes, 2);
    assert_eq!(e.immediate_retries, 1);
    assert_eq!(e.retry_success_rate, Some(1.0));
    assert_eq!(e.retry_contribution, Some(1.0));
    assert_eq!(e.effective_success_rate, Some(0.0));
    assert_eq!(e.raw_success_rate, Some(1.0));
    assert_eq!(e.retries_by_cause.get("deadline"), Some(&2));
    assert_eq!(e.orphan_pairs, 1);
    assert!((e.orphan_work_seconds - 0.3).abs() < 1e-9);
    assert_eq!(r.orphans[0].server_outcome, "ok");
    assert_eq!(layer(&r, "orders").amplification, Some(2.0));
    assert_eq!(e.timeout_rate, Some(0.5));
    assert_eq!(layer(&r, "orders").timeout_rate, Some(0.5));
    assert_eq!(
        layer(&r, "cart").timeout_rate,
        None,
        "an entry receives no attempts"
    );
    assert_eq!(alerts(&r, "StormglassUnsafeRetries"), 1);
    assert_eq!(
        alerts(&r, "StormglassRetryAmplificationHigh"),
        0,
        "2.0 is not above 2"
    );
    assert_eq!(findings(&r, "unsafe_retry"), 1);
    assert_eq!(findings(&r, "immediate_retry"), 1);
    assert_eq!(findings(&r, "timeout_retry_on_write"), 2);
}

/// A server reporting ctx_cancelled+pending and a missing server span both pair as pending.
#[tokio::test]
async fn pending_orphans() {
    let mut s = Spans::default();
    fixtures::pending_orphans(&mut s, 1);
    let r = report(&s).await;
    let e = edge(&r, "web", "queue");
    assert_eq!((e.logical_calls, e.orphan_pairs), (2, 2));
    assert!(
        (e.orphan_work_seconds - 0.003).abs() < 1e-9,
        "{}",
        e.orphan_work_seconds
    );
    assert_eq!(r.orphans.len(), 2);
    assert!(r.orphans.iter().all(|o| o.server_outcome == "pending"));
}

/// Sibling attempts and a call span with gRPC attempt children give the same figures.
#[tokio::test]
async fn both_retry_shapes_agree() {
    let mut a = Spans::default();
    fixtures::both_shapes(&mut a, 1);
    let r = report(&a).await;
    let e = edge(&r, "front", "back");
    assert_eq!(r.edges.len(), 1, "{:#?}", r.edges);
    assert_eq!(e.operation, "back/Get");
    assert_eq!((e.logical_calls, e.attempts, e.retry_attempts), (2, 4, 2));
    assert_eq!(e.raw_success_rate, Some(1.0));
    assert_eq!(e.effective_success_rate, Some(0.0));
    assert_eq!(e.retry_contribution, Some(1.0));
    assert_eq!(e.retries_by_cause.get("unavailable"), Some(&2));
    assert_eq!(layer(&r, "back").amplification, Some(2.0));

    // Each shape alone gives the same attempts and logical calls.
    let engine = Engine::default();
    let mut shapes = Vec::new();
    for request in a.requests_by_trace() {
        let (b, _) = encode_request(&Conventions::default(), &request);
        let ctx = engine.derive(b).await.unwrap();
        let rows = ctx
            .sql("SELECT caller, callee, operation, attempt, cause, outcome FROM attempts ORDER BY attempt")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let calls = ctx
            .sql("SELECT attempts, first_outcome, final_outcome, retried FROM logical_calls")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        shapes.push((
            arrow::util::pretty::pretty_format_batches(&rows)
                .unwrap()
                .to_string(),
            arrow::util::pretty::pretty_format_batches(&calls)
                .unwrap()
                .to_string(),
        ));
    }
    assert_eq!(shapes.len(), 2);
    assert_eq!(shapes[0], shapes[1]);
}

/// A healthy chain fires no alert and has no finding but the info that its timeouts are
/// far longer than it needs (see `deadlines_missing_and_too_long`).
#[tokio::test]
async fn healthy_chain_is_quiet() {
    let mut s = Spans::default();
    fixtures::healthy(&mut s, 1);
    let r = report(&s).await;
    assert!(r.alerts.is_empty(), "{:#?}", r.alerts);
    assert!(
        r.findings.iter().all(|f| f.kind == "timeout_too_long"),
        "{:#?}",
        r.findings
    );
    assert_eq!(r.entries[0].storm_potential, 1.0);
    assert_eq!(edge(&r, "web", "api").retry_ratio, Some(0.0));
    assert_eq!(edge(&r, "web", "api").retry_success_rate, None);
    assert_eq!(layer(&r, "db").amplification, Some(1.0));
    assert_eq!(r.traces.entry_requests, 20);
}

/// A proxy's re-send that overlaps the 503 it follows by half a millisecond is a retry,
/// not a hedge; re-sends after a per-try timeout are retries with cause `deadline`, the
/// tries given up on are timed out, orphans where the backend worked on, and bound no clock
/// (fixtures::proxy_resends).
#[tokio::test]
async fn proxy_resends_are_retries_and_abandoned_attempts_bound_no_clock() {
    let mut s = Spans::default();
    fixtures::proxy_resends(&mut s, 1);
    let r = report(&s).await;
    let api = edge(&r, "web", "api");
    assert_eq!((api.logical_calls, api.attempts), (3, 7), "{api:#?}");
    assert_eq!(
        (
            api.retry_attempts,
            api.hedged_attempts,
            api.per_try_timeout_retries
        ),
        (4, 0, 3),
        "{api:#?}"
    );
    assert_eq!(api.retries_by_cause.get("unavailable"), Some(&1));
    assert_eq!(api.retries_by_cause.get("deadline"), Some(&3));
    assert!(near(api.attempt_success_rate, 2.0 / 7.0), "{api:#?}");
    assert!(near(api.timeout_rate, 4.0 / 7.0), "{api:#?}");
    assert!(near(api.raw_success_rate, 2.0 / 3.0), "{api:#?}");
    assert_eq!(api.effective_success_rate, Some(0.0), "{api:#?}");
    assert_eq!(api.orphan_pairs, 4);
    assert!((api.orphan_work_seconds - 1.137).abs() < 1e-9, "{api:#?}");
    assert_eq!(api.clock_skew_ms.unwrap_or(0.0), 0.0, "{api:#?}");
    assert_eq!(findings(&r, "clock_skew"), 0);

    // Told the edge hedges, the same spans read as hedges whose losers were cancelled.
    let hedging = report_with(&s, HEDGING).await;
    let api = edge(&hedging, "web", "api");
    assert_eq!(
        (
            api.retry_attempts,
            api.hedged_attempts,
            api.per_try_timeout_retries
        ),
        (1, 3, 0),
        "{api:#?}"
    );
    assert_eq!(api.orphan_pairs, 4);
}

/// A 503 whose SERVER span closes after the re-send answered (its body written late on a
/// busy host) answered with its failure: the re-send is a retry after it, no hedge, and
/// nothing was abandoned.
#[tokio::test]
async fn a_failure_closing_late_is_still_answered() {
    use fixtures::{http_status, peer, route, template};
    let mut s = Spans::default();
    let w = s.server(1, "web", "GET /page").at(0.0, 200.0).add();
    let c = s
        .client(1, "web", "GET")
        .under(w)
        .at(1.0, 100.0)
        .with(vec![peer("api"), template("/items"), http_status(200)])
        .add();
    for (start, end, status) in [(2.0, 95.0, 503), (20.0, 60.0, 200)] {
        s.server(1, "api", "GET /items")
            .under(c)
            .at(start, end)
            .with(vec![route("/items"), http_status(status)])
            .add();
    }
    let r = report(&s).await;
    let api = edge(&r, "web", "api");
    assert_eq!(
        (api.retry_attempts, api.hedged_attempts),
        (1, 0),
        "{api:#?}"
    );
    assert_eq!(api.retries_by_cause.get("unavailable"), Some(&1));
    assert_eq!((api.orphan_pairs, api.raw_success_rate), (0, Some(1.0)));
}

/// A hedging client's losers are abandoned, never successes, and orphans where their
/// handlers worked on; a call answered by its first attempt while the hedge ran reads as
/// hedged, one that looks like a per-try timeout as a retry unless told (fixtures::hedges).
#[tokio::test]
async fn hedge_losers_are_abandoned() {
    let mut s = Spans::default();
    fixtures::hedges(&mut s, 1);
    let r = report(&s).await;
    let search = edge(&r, "web", "search");
    assert_eq!(
        (
            search.logical_calls,
            search.attempts,
            search.hidden_attempts
        ),
        (2, 4, 4),
        "{search:#?}"
    );
    // How each call's overlapping re-send was read: one hedge, one per-try timeout.
    assert_eq!(
        (
            search.retry_attempts,
            search.hedged_attempts,
            search.per_try_timeout_retries
        ),
        (1, 1, 1),
        "{search:#?}"
    );
    assert_eq!(search.retries_by_cause.get("deadline"), Some(&1));
    assert!(near(search.attempt_success_rate, 0.5), "{search:#?}");
    assert!(near(search.raw_success_rate, 1.0), "{search:#?}");
    assert!(near(search.effective_success_rate, 0.5), "{search:#?}");
    assert_eq!(search.orphan_pairs, 2);
    let work = search.orphan_work_seconds;
    assert!((work - 0.378).abs() < 1e-9, "{search:#?}");
    assert_eq!(search.clock_skew_ms.unwrap_or(0.0), 0.0, "{search:#?}");
    assert_eq!(findings(&r, "clock_skew"), 0);

    // Told the fleet hedges, both calls' overlapping attempts are hedges.
    let hedging = report_with(&s, HEDGING).await;
    let search = edge(&hedging, "web", "search");
    assert_eq!(
        (
            search.retry_attempts,
            search.hedged_attempts,
            search.per_try_timeout_retries
        ),
        (0, 2, 0)
    );
    let work = search.orphan_work_seconds;
    assert!((work - 0.34).abs() < 1e-9, "{search:#?}");
}

/// Retries nobody numbered (fixtures::hidden): re-sends below the CLIENT span, a hedge, a
/// proxy's replayed POST, a caller without CLIENT spans, an application loop and a loop
/// over items give the figures worked out in the fixture's comment.
#[tokio::test]
async fn unnumbered_retries_count() {
    let mut s = Spans::default();
    fixtures::hidden(&mut s, 1);
    let r = report(&s).await;

    let api = edge(&r, "web", "api");
    assert_eq!(
        (api.logical_calls, api.attempts, api.retry_attempts),
        (1, 3, 2)
    );
    assert_eq!(
        (
            api.hidden_attempts,
            api.hedged_attempts,
            api.inferred_attempts
        ),
        (3, 0, 0)
    );
    assert_eq!(api.retries_by_cause.get("unavailable"), Some(&2));
    assert_eq!(api.effective_success_rate, Some(0.0));
    assert_eq!(api.raw_success_rate, Some(1.0));
    assert_eq!(api.retry_success_rate, Some(0.5));
    assert_eq!(api.edge_amplification, Some(3.0));
    assert_eq!(api.retries_to_other_instance, Some(1.0));
    assert_eq!(layer(&r, "api").amplification, Some(3.0));
    assert_eq!(api.timeout_ms, Some(125.0));
    assert!(near(api.remaining_budget_ms, 786.0), "{api:#?}");
    assert_eq!(api.immediate_retries, 2);
    assert_eq!(api.deadline_inversions, 0);
    let budget_kinds = ["deadline_inversion", "overcommit", "not_propagated"];
    assert!(
        r.findings
            .iter()
            .all(|f| f.callee != "api" || !budget_kinds.contains(&f.kind.as_str())),
        "{:#?}",
        r.findings
    );

    let search = edge(&r, "web", "search");
    assert_eq!(
        (search.logical_calls, search.attempts, search.retry_attempts),
        (1, 2, 0)
    );
    assert_eq!((search.hidden_attempts, search.hedged_attempts), (2, 1));
    assert!(
        search.retries_by_cause.is_empty(),
        "{:?}",
        search.retries_by_cause
    );
    assert_eq!(search.retry_success_rate, None);
    assert_eq!(layer(&r, "search").amplification, Some(2.0));

    let pay = edge(&r, "web", "pay");
    assert_eq!(
        (pay.logical_calls, pay.attempts, pay.retry_attempts),
        (2, 4, 2)
    );
    assert_eq!(pay.hidden_attempts, 4);
    assert_eq!(pay.unsafe_retries, 1);
    assert_eq!(findings(&r, "unsafe_retry"), 1);

    let inv = edge(&r, "gw", "stock");
    assert_eq!(
        (inv.logical_calls, inv.attempts, inv.retry_attempts),
        (1, 3, 2)
    );
    assert_eq!(inv.hidden_attempts, 1);
    assert_eq!(inv.effective_success_rate, Some(0.0));
    assert_eq!(inv.raw_success_rate, Some(1.0));

    let cat = edge(&r, "web", "cat");
    assert_eq!(
        (cat.logical_calls, cat.attempts, cat.retry_attempts),
        (3, 4, 1)
    );
    assert_eq!((cat.inferred_attempts, cat.hidden_attempts), (1, 0));
    assert!(near(cat.effective_success_rate, 1.0 / 3.0));
    assert!(near(cat.raw_success_rate, 2.0 / 3.0));

    let ledger = edge(&r, "web", "ledger");
    assert_eq!(
        (ledger.logical_calls, ledger.attempts, ledger.retry_attempts),
        (1, 3, 2)
    );
    assert_eq!(ledger.hidden_attempts, 2);
    assert_eq!(ledger.effective_success_rate, Some(0.0));
    assert_eq!(ledger.raw_success_rate, Some(1.0));
    assert_eq!(
        (ledger.max_attempt, ledger.max_outer_attempt),
        (Some(2), None)
    );

    // Coverage says how each edge's attempts were found.
    let coverage = |callee: &str| {
        let c = r
            .coverage
            .edges
            .iter()
            .find(|c| c.callee == callee)
            .unwrap();
        (
            c.shares.attempt_number,
            c.shares.from_server_spans,
            c.shares.inferred,
        )
    };
    assert_eq!(coverage("api"), (Some(0.0), Some(1.0), Some(0.0)));
    assert_eq!(coverage("cat"), (Some(0.0), Some(0.0), Some(0.25)));
    assert_eq!(
        coverage("stock"),
        (Some(2.0 / 3.0), Some(1.0 / 3.0), Some(0.0))
    );
    assert!(near(coverage("ledger").1, 2.0 / 3.0));
}

/// Every re-send while an earlier attempt ran read as a hedge.
const HEDGING: RetryRules = RetryRules {
    infer_loops: true,
    overlap_tolerance_ms: 5.0,
    overlapping: Overlapping::Hedge,
};

/// The report of `s` with retries read by `rules`.
async fn report_with(s: &Spans, rules: RetryRules) -> Report {
    let params = stormglass_analytics::Params {
        retries: rules,
        ..Default::default()
    };
    let engine = Engine::new(params);
    let partials = Arc::new(engine.analyse(batch(s)).await.unwrap());
    Report::build(&engine, &[partials], WindowBounds::default())
        .await
        .unwrap()
}

/// With `infer_loops` off, an application loop's sibling CLIENT spans stay separate calls.
#[tokio::test]
async fn loop_inference_can_be_turned_off() {
    let mut s = Spans::default();
    fixtures::hidden(&mut s, 1);
    let r = report_with(
        &s,
        RetryRules {
            infer_loops: false,
            ..Default::default()
        },
    )
    .await;
    let cat = edge(&r, "web", "cat");
    assert_eq!(
        (cat.logical_calls, cat.attempts, cat.inferred_attempts),
        (4, 4, 0)
    );
    // The re-sends below a CLIENT span are not inferred: they stay.
    assert_eq!(edge(&r, "web", "api").attempts, 3);
}

/// Every fixture together: the live path (traces released over several intervals, each
/// aggregated into partials, the window merged) gives the same figures as offline analysis
/// of all spans at once.
#[tokio::test]
async fn live_and_offline_agree() {
    let s = fixtures::every_fixture();
    let offline = report(&s).await;

    let live = live_analysis();
    let budget = stormglass_runtime::MemoryBudget::unregistered(1 << 40);
    let t0 = SystemTime::now();
    let traces = s.requests_by_trace();
    for (i, chunk) in traces.chunks(97).enumerate() {
        for request in chunk {
            let (batch, _) = encode_request(&Conventions::default(), request);
            live.release(ReleasedTraces::reserved(batch, 1, &budget));
        }
        live.run_interval(t0 + Duration::from_secs(10 * (i as u64 + 1)))
            .await
            .unwrap();
    }
    let live = live.report().expect("a report after its intervals");
    assert!(
        traces.len() / 97 >= 10,
        "the window must hold many intervals"
    );
    assert_same_figures(&live, &offline);
}

/// At width (400 services, ~4,000 edges) the live window, each interval's chunks merged and
/// compacted, gives every figure and finding total the same spans give offline.
#[tokio::test]
async fn live_and_offline_agree_at_width() {
    let mut s = Spans::default();
    let mesh = stormglass_testkit::mesh::wide_mesh(&mut s, 400, 3000);
    let mut offline = report(&s).await;
    assert_eq!(offline.edges.len(), mesh.edges.len());

    let live = live_analysis()
        // Several chunks per interval, merged before the window keeps them.
        .with_chunk_bytes(256 << 10);
    let budget = stormglass_runtime::MemoryBudget::unregistered(1 << 40);
    let t0 = SystemTime::now();
    let traces = s.requests_by_trace();
    for (i, chunk) in traces.chunks(300).enumerate() {
        let mut bytes = 0;
        for request in chunk {
            let (batch, _) = encode_request(&Conventions::default(), request);
            bytes += batch.get_array_memory_size();
            live.release(ReleasedTraces::reserved(batch, 1, &budget));
        }
        assert!(bytes > 2 * live.chunk_bytes(), "{bytes} bytes make chunks");
        live.run_interval(t0 + Duration::from_secs(10 * (i as u64 + 1)))
            .await
            .unwrap();
    }
    // The live report lists the default bound of findings per kind; offline, every one.
    offline.bound_findings(ReportConfig::default().max_findings_per_kind);
    let live = live.report().expect("a report after its intervals");
    assert_eq!(live.finding_totals, offline.finding_totals);
    assert_same_figures(&live, &offline);
}

/// Every figure of `a` and `b` (not the window's bounds) is the same.
fn assert_same_figures(a: &Report, b: &Report) {
    assert_eq!(a.edges, b.edges);
    assert_eq!(a.layers, b.layers);
    assert_eq!(a.entries, b.entries);
    assert_eq!(a.traces, b.traces);
    assert_eq!(a.orphans, b.orphans);
    assert_eq!(a.findings, b.findings);
    assert_eq!(a.coverage, b.coverage);
    assert_eq!(a.window.spans, b.window.spans);
    assert_eq!(a.window.traces, b.window.traces);
}

/// Streaming: one interval analysed as many small chunks (each a few traces) gives exactly
/// the figures of the same spans analysed offline as one batch.
#[tokio::test]
async fn chunked_interval_equals_offline() {
    let s = fixtures::every_fixture();
    let offline = report(&s).await;

    let budget = stormglass_runtime::MemoryBudget::unregistered(1 << 40);
    let live = live_analysis().with_chunk_bytes(64 << 10);
    let traces = s.requests_by_trace();
    let mut bytes = 0;
    for request in &traces {
        let (batch, _) = encode_request(&Conventions::default(), request);
        bytes += batch.get_array_memory_size();
        live.release(ReleasedTraces::reserved(batch, 1, &budget));
    }
    assert!(
        bytes > 20 * live.chunk_bytes(),
        "{bytes} bytes make many chunks"
    );
    live.run_interval(SystemTime::now()).await.unwrap();
    assert_eq!(budget.used(), 0, "analysed spans return their memory");
    assert_same_figures(&live.report().expect("a report"), &offline);
}

/// An interval's chunks are merged to one row per key before the window keeps them
/// (`Engine::merge_chunks`): the window holds an edge (a bucket, a link) once however many
/// chunks saw it, and the report is the one the chunks' rows give unmerged.
#[tokio::test]
async fn merged_chunks_hold_a_key_once() {
    let s = fixtures::every_fixture();
    let engine = Engine::default();
    let mut chunks = Vec::new();
    for _ in 0..4 {
        chunks.push(engine.analyse(batch(&s)).await.unwrap().compact());
    }
    let plain = Partials::concat(chunks.clone()).unwrap();
    let mut merged = Partials::concat(chunks).unwrap();
    engine.merge_chunks(&mut merged).await.unwrap();
    let merged_tables = [
        "partial_edges",
        "partial_links",
        "partial_sequences",
        "partial_attempts",
        "partial_calls",
        "partial_latency",
        "partial_edge_latency",
        "partial_budgets",
        "partial_retry_budgets",
        "partial_tail",
        "partial_timeouts",
        "partial_timeout_values",
        "partial_clock_skew",
        "partial_layer_codes",
        "partial_layers",
        "partial_entry_latency",
    ];
    for query in queries::PARTIALS {
        let rows = plain.rows(query.name);
        let expected = if merged_tables.contains(&query.name) {
            assert!(rows > 0, "{} has rows in the fixture", query.name);
            rows / 4
        } else {
            rows
        };
        assert_eq!(merged.rows(query.name), expected, "{}", query.name);
    }
    let mut reports = Vec::new();
    for partials in [plain, merged] {
        let window = [Arc::new(partials.compact_for_window())];
        reports.push(
            Report::build(&engine, &window, WindowBounds::default())
                .await
                .unwrap(),
        );
    }
    assert_same_figures(&reports[0], &reports[1]);
}

/// A deadline on a gRPC call span (the shape where the call span's INTERNAL children are
/// its attempts) is the call's budget, checked against the budget above the call span:
/// under an 800 ms handler, two sequential calls of 300 ms are fine, two of 500 ms
/// overcommit it, and one of 900 ms is an inversion (none was seen before: the call span's
/// budget was nobody's).
#[tokio::test]
async fn deadline_on_grpc_call_span() {
    let mut s = Spans::default();
    fixtures::grpc_call_budgets(&mut s, 1, "web", &[300, 300]);
    fixtures::grpc_call_budgets(&mut s, 2, "web", &[500, 500]);
    fixtures::grpc_call_budgets(&mut s, 3, "web", &[900]);
    let r = report(&s).await;
    assert_eq!(findings(&r, "overcommit"), 1, "{:?}", r.findings);
    assert_eq!(findings(&r, "deadline_inversion"), 1, "{:?}", r.findings);
    let inversion = r
        .findings
        .iter()
        .find(|f| f.kind == "deadline_inversion")
        .unwrap();
    assert_eq!(
        inversion
            .example_trace_id
            .as_deref()
            .map(|t| t.ends_with("03")),
        Some(true)
    );
}

/// The timeout is compared with the callee's P99.9 exactly: a 201 ms timeout against a
/// P99.9 of 203 ms (3 of 1,000 requests) is below the tail, although both fall in the same
/// 2% bucket, whose value (200.4 ms) read "not below".
#[tokio::test]
async fn timeout_compared_with_exact_p999() {
    let mut s = Spans::default();
    fixtures::tail_timeout(&mut s, 1..1001, "web");
    let r = report(&s).await;
    let e = edge(&r, "web", "inv");
    assert_eq!(e.timeout_ms, Some(201.0));
    assert!(
        e.callee_p999_ms.is_some_and(|p| p < 201.0),
        "bucketed {:?}",
        e.callee_p999_ms
    );
    assert_eq!(e.timeout_below_tail, Some(true));
}

/// A 50 ms timeout below every one of the callee's durations (inv answers in 100 ms): none
/// is at or below it, a count of zero rather than none, so the timeout is below the tail.
#[tokio::test]
async fn timeout_below_every_callee_duration() {
    let mut s = Spans::default();
    for t in 1..1001 {
        let p = s.server(t, "web", "GET /").at(0.0, 400.0).add();
        let attrs = vec![fixtures::peer("inv"), fixtures::deadline(50)];
        let c = s
            .client(t, "web", "GET")
            .under(p)
            .at(1.0, 102.0)
            .with(attrs)
            .add();
        s.server(t, "inv", "GET /stock")
            .under(c)
            .at(1.5, 101.5)
            .add();
    }
    let r = report(&s).await;
    let e = edge(&r, "web", "inv");
    assert_eq!(e.timeout_ms, Some(50.0));
    assert_eq!(e.timeout_below_tail, Some(true));
}

/// The calls each service makes one after another, as the window's partials carry them to
/// the advice and `check-budget --emit`, are the ones found by sorting every logical call
/// under its calling span (the rule done again here, over the `logical_calls` table).
#[tokio::test]
async fn sequential_calls_from_partials_match_the_calls() {
    #[derive(serde::Deserialize)]
    struct Call {
        caller: String,
        callee: String,
        parent: Option<String>,
        start_ns: i64,
        end_ns: i64,
    }
    let s = fixtures::every_fixture();
    let r = report(&s).await;
    let ctx = Engine::default().query_context(batch(&s)).await.unwrap();
    ctx.sql(
        "CREATE VIEW known_calls AS SELECT caller, callee, \
         encode(CAST(parent_span_id AS BYTEA), 'hex') AS parent, start_ns, end_ns \
         FROM logical_calls WHERE caller <> 'unknown'",
    )
    .await
    .unwrap();
    use stormglass_analytics::table::{rows, table};
    let calls: Vec<Call> = rows(&table(&ctx, "known_calls").await.unwrap());
    use std::collections::BTreeMap;
    let mut by_parent: BTreeMap<(&str, &str), Vec<&Call>> = BTreeMap::new();
    for c in &calls {
        if let Some(parent) = &c.parent {
            by_parent.entry((&c.caller, parent)).or_default().push(c);
        }
    }
    let mut counts: BTreeMap<(&str, Vec<&str>), usize> = BTreeMap::new();
    for ((caller, _), mut list) in by_parent {
        list.sort_by_key(|c| (c.start_ns, c.end_ns));
        let one_after_another = list.windows(2).all(|w| w[1].start_ns >= w[0].end_ns);
        let mut callees: Vec<&str> = list.iter().map(|c| c.callee.as_str()).collect();
        callees.dedup();
        if one_after_another && callees.len() >= 2 {
            *counts.entry((caller, callees)).or_default() += 1;
        }
    }
    let mut most: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for ((caller, callees), n) in counts {
        let best = most.entry(caller.to_owned()).or_default();
        if n > best.0 {
            *best = (n, callees.iter().map(|c| (*c).to_owned()).collect());
        }
    }
    let expected: BTreeMap<String, Vec<String>> = most
        .into_iter()
        .map(|(s, (_, callees))| (s, callees))
        .collect();
    assert!(!expected.is_empty(), "the fixtures make sequential calls");
    assert_eq!(r.sequential_calls, expected);
    let emitted = stormglass_analytics::budget_table::sequential_in(&ctx)
        .await
        .unwrap();
    assert_eq!(emitted, expected);
}

/// A callee whose name holds what a joined sequence would separate by (`tax > vat`) is
/// one callee of the sequence, not two.
#[tokio::test]
async fn sequential_callee_names_stay_whole() {
    let mut s = Spans::default();
    let p = s.server(1, "basket", "POST /").at(0.0, 500.0).add();
    for (i, callee) in [(0.0, "tax > vat"), (1.0, "ledger")] {
        let start = 10.0 + 100.0 * i;
        s.client(1, "basket", "POST")
            .under(p)
            .at(start, start + 50.0)
            .with(vec![fixtures::peer(callee)])
            .add();
    }
    let r = report(&s).await;
    let sequence = ["tax > vat", "ledger"].map(String::from).to_vec();
    assert_eq!(r.sequential_calls.get("basket"), Some(&sequence));
}

/// Coarse clocks: two back-to-back calls of 500 ms and 400 ms budget under an 800 ms
/// handler, the second stamped half a millisecond before the first ended (millisecond
/// timestamps), are still sequential: one overcommit.
#[tokio::test]
async fn back_to_back_calls_overlapping_by_a_tick_are_sequential() {
    let mut s = Spans::default();
    fixtures::tick_overlap(&mut s, 1, "web");
    let r = report(&s).await;
    assert_eq!(findings(&r, "overcommit"), 1, "{:?}", r.findings);
}

/// Offline, files larger than a chunk are analysed in chunks of whole traces, two at a
/// time: every figure equals the one-batch analysis, with skewed clocks corrected from
/// calls in other chunks, duplicate spans read twice, and the report the same on every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_chunks_equal_one_batch() {
    use stormglass_analytics::offline;
    let mut s = fixtures::every_fixture();
    // inv's clock 40 ms ahead: the timed-out calls' chunks have no answered call of their own.
    fixtures::add_skewed_calls(&mut s, 5000, 40.0, 1..=28);
    // Timed-out calls whose inv SERVER span never arrived: orphans, since inv sends SERVER
    // spans in other traces (other chunks).
    for t in 5101..=5104 {
        let root = s
            .span(fixtures::SERVER, t, "web", "GET /")
            .at(100.0, 500.0)
            .add();
        let rpc = vec![
            stormglass_testkit::otlp::kv("rpc.service", "inv"),
            stormglass_testkit::otlp::kv("rpc.method", "Get"),
            fixtures::peer("inv"),
            fixtures::grpc_status(4),
        ];
        s.span(fixtures::CLIENT, t, "web", "Get")
            .under(root)
            .at(101.0, 301.0)
            .with(rpc)
            .add();
    }
    let spans = batch(&s);
    // The first traces' spans read again, as a file holding them twice.
    let again = spans.slice(0, 40);
    let read = vec![spans, again];
    let params = stormglass_analytics::Params::default();
    let analysed = |chunk_spans: usize| {
        let (read, params) = (read.clone(), params.clone());
        async move {
            let analysed = offline::analyse(&params, read, chunk_spans).await.unwrap();
            let engine = Engine::default();
            let partials = Arc::new(analysed.partials);
            let report = Report::build(&engine, &[partials], WindowBounds::default())
                .await
                .unwrap();
            (report, analysed.chunks, analysed.duplicates)
        }
    };
    let (one, one_chunks, one_duplicates) = analysed(usize::MAX).await;
    let (chunked, chunks, duplicates) = analysed(7).await;
    assert_eq!(one_chunks, 1);
    assert!(chunks > 50, "{chunks} chunks");
    assert_eq!((one_duplicates, duplicates), (40, 40));
    // 4 orphans of the skewed calls, 4 of the calls inv never answered.
    let inv = one.edges.iter().find(|e| e.callee == "inv").unwrap();
    assert_eq!(inv.orphan_pairs, 8, "{inv:#?}");
    assert_same_figures(&chunked, &one);
    assert_eq!(chunked.window, one.window);
    let (again, _, _) = analysed(7).await;
    assert_eq!(
        serde_json::to_value(&again).unwrap(),
        serde_json::to_value(&chunked).unwrap()
    );
}

/// Retried calls the retries did not save: every retried call of the 3x3x3 storm is lost
/// (share 1, and StormglassRetriedCallsFailing fires once traffic allows); both retried
/// POSTs of unsafe_post end ok (share 0); a call never retried counts in neither.
#[tokio::test]
async fn retried_calls_lost_anyway() {
    let mut s = Spans::default();
    fixtures::storm(&mut s, 1);
    fixtures::unsafe_post(&mut s, 2);
    fixtures::timeouts(&mut s, 10);
    let r = report(&s).await;

    let storm = edge(&r, "gateway", "api");
    assert_eq!(
        (storm.retried_calls, storm.retried_failed_share),
        (1, Some(1.0))
    );
    let db = edge(&r, "svc", "db");
    assert_eq!((db.retried_calls, db.retried_failed_share), (9, Some(1.0)));
    let post = edge(&r, "cart", "orders");
    assert_eq!(
        (post.retried_calls, post.retried_failed_share),
        (2, Some(0.0))
    );
    let once = edge(&r, "basket", "pricing");
    assert_eq!((once.retried_calls, once.retried_failed_share), (0, None));

    let t = AlertThresholds {
        min_events_per_minute: 0.0,
        ..AlertThresholds::default()
    };
    let fired: Vec<_> = stormglass_analytics::alerts::evaluate(&r, &t)
        .into_iter()
        .filter(|a| a.name == "StormglassRetriedCallsFailing")
        .map(|a| {
            (
                a.labels["caller"].clone(),
                a.labels["callee"].clone(),
                a.value,
            )
        })
        .collect();
    assert_eq!(
        fired,
        [
            ("api".to_owned(), "svc".to_owned(), 1.0),
            ("gateway".to_owned(), "api".to_owned(), 1.0),
            ("svc".to_owned(), "db".to_owned(), 1.0),
        ]
    );
}

/// Calls that can wait forever and timeouts far above the need: the storm's calls carry no
/// deadline on either side (share 1); the healthy chain's do (0), its uninstrumented
/// database answers no SERVER span (null), and its 900 ms and 800 ms timeouts are more than
/// 10 x the recommended 71 ms and 56 ms: two timeout_too_long findings.
#[tokio::test]
async fn deadlines_missing_and_too_long() {
    let mut storm = Spans::default();
    fixtures::storm(&mut storm, 1);
    let storm = report(&storm).await;
    let gateway = edge(&storm, "gateway", "api");
    assert_eq!(gateway.attempts_without_deadline, Some(1.0));
    assert_eq!(gateway.timeout_too_long, None);

    let mut s = Spans::default();
    fixtures::healthy(&mut s, 1);
    let r = report(&s).await;
    let web = edge(&r, "web", "api");
    assert_eq!(web.attempts_without_deadline, Some(0.0));
    assert_eq!(web.timeout_too_long, Some(true));
    let db = edge(&r, "api", "db");
    assert_eq!(db.attempts_without_deadline, None);
    assert_eq!(db.timeout_too_long, Some(true));
    let too_long: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.kind == "timeout_too_long")
        .map(|f| {
            (
                f.severity.as_str(),
                f.caller.as_str(),
                f.callee.as_str(),
                f.count,
            )
        })
        .collect();
    assert_eq!(
        too_long,
        [("info", "api", "db", 20), ("info", "web", "api", 20)]
    );
}

/// Retries that cannot succeed: after a 404, an INVALID_ARGUMENT and a business err_code,
/// not after a 429; each is a warning finding with an example trace, and the alert fires.
#[tokio::test]
async fn retries_after_client_errors() {
    let mut s = Spans::default();
    fixtures::client_errors(&mut s, 1);
    let r = report(&s).await;

    let users = edge(&r, "app", "users");
    assert_eq!((users.retry_attempts, users.non_retryable_retries), (3, 2));
    let accounts = edge(&r, "app", "accounts");
    assert_eq!(
        (accounts.retry_attempts, accounts.non_retryable_retries),
        (1, 1)
    );
    assert_eq!(findings(&r, "non_retryable_retry"), 3);
    assert!(
        r.findings
            .iter()
            .filter(|f| f.kind == "non_retryable_retry")
            .all(|f| f.severity == "warning" && f.example_trace_id.is_some())
    );
    assert_eq!(
        fired_on_callees(&r, "StormglassNonRetryableRetries"),
        [("accounts".to_owned(), 1.0), ("users".to_owned(), 2.0)]
    );
}

/// Retries that cannot fit the budget left: of shop's 4 retries to stock (median 100 ms),
/// one with 35 ms left, one after the deadline and one re-send without numbers with 60 ms
/// left count; one with 115 ms left does not. A warning finding with the example trace of
/// the first, and the alert (3 of 4 retries above the 0.1 share) fires.
#[tokio::test]
async fn retries_that_cannot_fit() {
    let mut s = Spans::default();
    fixtures::out_of_budget(&mut s, 1);
    let r = report(&s).await;

    let stock = edge(&r, "shop", "stock");
    assert_eq!(stock.retry_attempts, 4);
    assert_eq!(
        (stock.out_of_budget_retries, stock.retries_after_deadline),
        (3, 1)
    );
    assert!(near(stock.callee_median_ms, 100.0), "{stock:?}");
    let found: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.kind == "out_of_budget_retry")
        .map(|f| (f.severity.as_str(), f.count, f.example_trace_id.as_deref()))
        .collect();
    assert_eq!(
        found,
        [("warning", 3, Some("5a5a5a5a5a5a5a5a5a5a5a5a00000008"))]
    );
    assert_eq!(
        fired_on_callees(&r, "StormglassRetriesOutOfBudget"),
        [("stock".to_owned(), 0.75)]
    );
}

/// Idempotency keys: of app's 5 retries to pay, the 3 whose key is not their first
/// attempt's (another key, none, another captured header) are unstable and unsafe (a
/// critical finding, the alert), the 2 the callee answered from its store are hits, and 9 of
/// the 11 writes carry a key (the flag alone does not count: 10 of 11 declare themselves).
#[tokio::test]
async fn idempotency_keys_kept_changed_and_replayed() {
    let mut s = Spans::default();
    fixtures::idempotency_keys(&mut s, 1);
    let r = report(&s).await;

    let pay = edge(&r, "app", "pay");
    assert_eq!(pay.retry_attempts, 5);
    assert_eq!(
        (
            pay.unstable_key_retries,
            pay.unsafe_retries,
            pay.idempotency_hits
        ),
        (3, 3, 2)
    );
    assert_eq!(findings(&r, "unsafe_retry"), 3);
    let coverage = &r.coverage.edges[0].shares;
    assert!(near(coverage.idempotency_key, 9.0 / 11.0), "{coverage:?}");
    assert!(near(coverage.idempotency, 10.0 / 11.0), "{coverage:?}");
    assert_eq!(
        fired_on_callees(&r, "StormglassUnsafeRetries"),
        [("pay".to_owned(), 3.0)]
    );
}

/// Per entry operation, what callers outside see: 200 requests to `edge` GET /, 10 of them
/// answered 502 (error_rate 0.05); 198 take 10 ms and 2 take 300 ms, so P99 (the 198th) is
/// 10 ms and P99.9 (the 200th) 300 ms, each within 2%.
#[tokio::test]
async fn entry_error_rate_and_latency() {
    let mut s = Spans::default();
    for i in 0..200u32 {
        let took = if i < 2 { 300.0 } else { 10.0 };
        let status = if i % 20 == 5 { 502 } else { 200 };
        s.server(i + 1, "edge", "GET /")
            .at(0.0, took)
            .with(vec![fixtures::route("/"), fixtures::http_status(status)])
            .add();
    }
    let r = report(&s).await;
    let entry = &r.entries[0];
    assert_eq!((entry.service.as_str(), entry.requests), ("edge", 200));
    assert_eq!(entry.error_rate, Some(0.05));
    assert!(near(entry.p99_ms, 10.0), "{entry:?}");
    assert!(near(entry.p999_ms, 300.0), "{entry:?}");
}

/// What-if on the 3x3x3 storm (gateway -> api -> svc -> db, 3 attempts per call on each
/// edge): db failing always gives 27 / 9 / 3 below the entry; failing half the time, the
/// geometric sums 1.75 at db's callers, then 1 + q + q^2 with q = 0.5^3 = 0.125 at svc's,
/// and with q = 0.125^3 at api's: 2.0 / 1.14 / 1.002, as worked out in docs/figures.md.
#[tokio::test]
async fn what_if_a_service_fails() {
    use stormglass_analytics::whatif::what_if;
    let mut s = Spans::default();
    fixtures::storm(&mut s, 1);
    let r = report(&s).await;
    let amplification = |w: &stormglass_analytics::whatif::WhatIf, service: &str| {
        w.layers
            .iter()
            .find(|l| l.service == service)
            .unwrap()
            .amplification
    };

    let always = what_if(&r, &[("db".into(), 1.0)], None);
    for (service, expected) in [("gateway", 1.0), ("api", 3.0), ("svc", 9.0), ("db", 27.0)] {
        assert_eq!(amplification(&always, service), expected, "{service}");
    }
    let db = always.layers.iter().find(|l| l.service == "db").unwrap();
    let baseline = r.layers.iter().find(|l| l.service == "db").unwrap();
    assert_eq!(
        db.requests_per_second,
        Some(baseline.baseline_attempts as f64 / r.window.seconds.unwrap() * 27.0)
    );

    let half = what_if(&r, &[("db".into(), 0.5)], None);
    let q_api: f64 = 0.125f64.powi(3);
    let at_api = 1.0 + q_api + q_api * q_api;
    let at_svc = at_api * (1.0 + 0.125 + 0.125 * 0.125);
    let at_db = at_svc * 1.75;
    for (service, expected) in [("api", at_api), ("svc", at_svc), ("db", at_db)] {
        let got = amplification(&half, service);
        assert!(
            (got - expected).abs() < 1e-12,
            "{service}: {got} vs {expected}"
        );
    }
    assert_eq!(
        [at_api, at_svc, at_db].map(|a| (a * 1000.0).round() / 1000.0),
        [1.002, 1.143, 2.0]
    );
    let edge = half.edges.iter().find(|e| e.callee == "db").unwrap();
    assert_eq!(
        (
            edge.max_attempts,
            edge.callee_failure_probability,
            edge.attempts_per_call
        ),
        (3, 0.5, 1.75)
    );
    // Nothing fails: every layer at 1.
    let none = what_if(&r, &[("db".into(), 0.0)], None);
    assert!(none.layers.iter().all(|l| l.amplification == 1.0));
}

/// What-if where a service calls an edge on some of its requests: api calls `good` on each
/// of its 4 requests and `bad` on one of them, so `bad` failing always fails a quarter of
/// api's requests and of the gateway's above it, not all of them.
#[tokio::test]
async fn what_if_weighs_an_edge_by_the_requests_that_call_it() {
    use fixtures::{http_status, peer, route, template};
    use stormglass_analytics::whatif::what_if;
    let mut s = Spans::default();
    for trace in 1..=4 {
        let g = (s.server(trace, "gateway", "GET /shop"))
            .at(0.0, 100.0)
            .with(vec![route("/shop"), http_status(200)])
            .add();
        let call = (s.client(trace, "gateway", "GET"))
            .under(g)
            .at(1.0, 99.0)
            .with(vec![peer("api"), template("/cart"), http_status(200)])
            .add();
        let api = (s.server(trace, "api", "GET /cart"))
            .under(call)
            .at(2.0, 98.0)
            .with(vec![route("/cart"), http_status(200)])
            .add();
        let callees: &[&str] = if trace == 1 {
            &["good", "bad"]
        } else {
            &["good"]
        };
        for (i, callee) in callees.iter().enumerate() {
            let t = 3.0 + 40.0 * i as f64;
            let out = (s.client(trace, "api", "GET"))
                .under(api)
                .at(t, t + 30.0)
                .with(vec![peer(callee), template("/item"), http_status(200)])
                .add();
            (s.server(trace, callee, "GET /item"))
                .under(out)
                .at(t + 1.0, t + 29.0)
                .with(vec![route("/item"), http_status(200)])
                .add();
        }
    }
    let r = report(&s).await;
    let answer = what_if(&r, &[("bad".into(), 1.0)], None);
    let success = |service: &str| {
        (answer.layers.iter())
            .find(|l| l.service == service)
            .unwrap()
            .success_probability
    };
    for (service, expected) in [
        ("bad", 0.0),
        ("api", 0.75),
        ("gateway", 0.75),
        ("good", 1.0),
    ] {
        assert!(
            (success(service) - expected).abs() < 1e-12,
            "{service}: {} vs {expected}",
            success(service)
        );
    }
}
