//! The figure metrics of docs/metrics.md, as one Prometheus collector.
//!
//! * Counters grow from each analysed interval's partial aggregates (what that interval's
//!   completed traces added), so they sum exactly across instances.
//! * `stormglass_layer_duration_seconds` is a histogram with the fixed bounds of
//!   [`histogram::le_bounds`] (1 ms .. 60 s, factor <= 1.25); its bucket counts are exact
//!   (`le` is computed per span by comparison, not read back from the log buckets) and its
//!   sum is the exact sum of durations.
//! * Gauges are replaced from each window's report; a figure that is null in the report
//!   (empty denominator) has no series.
//!
//! A series appears at 0 and its first increment is applied one interval later, so
//! Prometheus' `rate()`/`increase()` see it start from 0 instead of missing the first
//! interval's count. Every edge's safety counters (`unsafe_retries`, orphans, deadline
//! violations, ...) exist from the edge's first interval, at 0 until something happens.
//!
//! Cardinality: each metric holds at most `limits.max_series_per_metric` series. A new series
//! beyond that is folded into `operation="__overflow__"` (the caller and callee kept), and if
//! that series is new too, into a series whose caller, callee, service, operation and cause
//! are all `__overflow__`; the remaining labels (outcome, attempt) are closed sets, so the
//! folded series are bounded. `cause` is the span's free text (any retry reason an SDK
//! writes), so it folds like the identities. Folded updates are counted in `stormglass_export_overflow_total`. A
//! ratio cannot be folded: gauge series beyond the limit are left out, and how many were is
//! `stormglass_export_dropped_series`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::SystemTime;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use stormglass_analytics::{IntervalObserver, Partials, Report, histogram};

/// The label value overflowing series are folded into.
pub const OVERFLOW: &str = "__overflow__";

/// Labels whose values come from the spans (unbounded sets; folded on overflow).
const IDENTITY: [&str; 5] = ["caller", "callee", "service", "operation", "cause"];

const EDGE: &[&str] = &["caller", "callee", "operation"];
const SERVICE: &[&str] = &["service"];

struct Spec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

const fn spec(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Spec {
    Spec { name, help, labels }
}

/// Declares one kind of metric family from one list: an enum whose variants index that
/// kind's state (`as usize`), `ALL` in the list's order, `spec()` (name, help, labels: the
/// catalogue), and the static of every spec in that order.
macro_rules! families {
    ($(#[$doc:meta])* $kind:ident, $specs:ident { $($variant:ident => $spec:expr,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum $kind {
            $($variant,)*
        }

        impl $kind {
            const ALL: &[$kind] = &[$($kind::$variant,)*];

            const fn spec(self) -> Spec {
                match self {
                    $($kind::$variant => $spec,)*
                }
            }
        }

        static $specs: LazyLock<Vec<Spec>> =
            LazyLock::new(|| $kind::ALL.iter().map(|k| k.spec()).collect());
    };
}

families! {
    /// The counter families, in docs/metrics.md's order.
    Counter, COUNTERS {
        LogicalCalls => spec(
            "stormglass_logical_calls_total",
            "Logical calls (a call and all its attempts) completed, by first and final outcome (ok/failed).",
            &[
                "caller",
                "callee",
                "operation",
                "first_outcome",
                "final_outcome",
            ],
        ),
        Attempts => spec(
            "stormglass_attempts_total",
            "Attempts, first or retry, by outcome class and cause (a retry's cause; none for first attempts).",
            &[
                "caller",
                "callee",
                "operation",
                "attempt",
                "outcome",
                "cause",
            ],
        ),
        EntryRequests => spec(
            "stormglass_entry_requests_total",
            "Requests entering the system (root SERVER/CONSUMER spans), by entry service and operation.",
            &["service", "operation"],
        ),
        LayerAttempts => spec(
            "stormglass_layer_attempts_total",
            "Attempts (and entry requests) received by a layer; divided by the baseline it is the amplification.",
            SERVICE,
        ),
        LayerBaseline => spec(
            "stormglass_layer_baseline_attempts_total",
            "Attempts a layer would have received with no retry anywhere upstream.",
            SERVICE,
        ),
        OrphanPairs => spec(
            "stormglass_orphan_pairs_total",
            "Cancelled or timed-out attempts whose callee kept working, by the callee's outcome (ok/failed/pending).",
            &["caller", "callee", "operation", "server_outcome"],
        ),
        OrphanWork => spec(
            "stormglass_orphan_work_seconds_total",
            "Seconds callees kept working after their caller cancelled or timed out.",
            EDGE,
        ),
        UnsafeRetries => spec(
            "stormglass_unsafe_retries_total",
            "Retries of non-idempotent operations without an idempotency key.",
            EDGE,
        ),
        TimeoutRetriesOnWrites => spec(
            "stormglass_timeout_retries_on_writes_total",
            "Retries caused by a deadline on non-idempotent operations (double-write risk).",
            EDGE,
        ),
        ImmediateRetries => spec(
            "stormglass_immediate_retries_total",
            "Retries started sooner than advice.min_backoff_ms after the previous attempt.",
            EDGE,
        ),
        DeadlineViolations => spec(
            "stormglass_deadline_violations_total",
            "Deadline budget violations: inversion, overcommit, not_propagated.",
            &["caller", "callee", "kind"],
        ),
        MultiLayer => spec(
            "stormglass_multi_layer_retry_traces_total",
            "Traces in which two or more distinct callers retried, by entry service.",
            SERVICE,
        ),
        BrokenTraces => spec(
            "stormglass_broken_traces_total",
            "Traces with a span whose parent never arrived (a subtree that looks like its own entry), by the service of that span.",
            SERVICE,
        ),
        BudgetedAttempts => spec(
            "stormglass_budgeted_attempts_total",
            "Attempts that carry a budget (a deadline): the attempts stormglass_timeout_seconds is the median of.",
            EDGE,
        ),
        DeadlineSeconds => spec(
            "stormglass_attempt_deadline_seconds_total",
            "Sum of the budgets of budgeted attempts: divided by stormglass_budgeted_attempts_total it is the edge's mean timeout.",
            EDGE,
        ),
        HiddenAttempts => spec(
            "stormglass_hidden_attempts_total",
            "Attempts read from SERVER spans that carry no attempt number: re-sends below the caller's CLIENT span (client library, proxy), calls from uninstrumented callers.",
            EDGE,
        ),
        InferredAttempts => spec(
            "stormglass_inferred_attempts_total",
            "Attempts joined to their call as an application loop's retries (unnumbered sibling CLIENT spans after a retryable failure).",
            EDGE,
        ),
        HedgedAttempts => spec(
            "stormglass_hedged_attempts_total",
            "Hedged attempts: started before an earlier attempt of the call had ended (counted as attempts, not as retries).",
            EDGE,
        ),
        InstanceRetries => spec(
            "stormglass_instance_retries_total",
            "Retries whose SERVER span's instance and the previous attempt's are both known (service.instance.id, else host.name).",
            EDGE,
        ),
        OtherInstanceRetries => spec(
            "stormglass_other_instance_retries_total",
            "Retries that reached another instance than the attempt before: divided by stormglass_instance_retries_total, the share of retries that moved.",
            EDGE,
        ),
    }
}

families! {
    /// The histogram families.
    Histogram, HISTOGRAMS {
        LayerDuration => spec(
            "stormglass_layer_duration_seconds",
            "Layer latency: SERVER span durations per service (client-observed for uninstrumented callees).",
            SERVICE,
        ),
        RemainingBudget => spec(
            "stormglass_remaining_budget_seconds",
            "The caller's remaining budget when an attempt starts: the deadline of its nearest budgeted ancestor minus the time already spent (0 when spent).",
            EDGE,
        ),
    }
}

families! {
    /// The gauge families.
    Gauge, GAUGES {
        EffectiveSuccess => spec(
            "stormglass_effective_success_ratio",
            "Window: logical calls whose first attempt succeeded / logical calls.",
            EDGE,
        ),
        RawSuccess => spec(
            "stormglass_raw_success_ratio",
            "Window: logical calls whose final attempt succeeded / logical calls.",
            EDGE,
        ),
        RetryContribution => spec(
            "stormglass_retry_contribution_ratio",
            "Window: successful logical calls that needed a retry / successful logical calls.",
            EDGE,
        ),
        RetrySuccess => spec(
            "stormglass_retry_success_ratio",
            "Window: successful retry attempts / retry attempts.",
            EDGE,
        ),
        RetryRatio => spec(
            "stormglass_retry_ratio",
            "Window: retry attempts / first attempts.",
            EDGE,
        ),
        Amplification => spec(
            "stormglass_amplification_ratio",
            "Window: attempts received by the layer / attempts it would receive with no retry upstream.",
            SERVICE,
        ),
        StormPotential => spec(
            "stormglass_storm_potential_ratio",
            "Window: product of (max attempt number + 1) along the deepest call chain below the entry operation.",
            &["service", "operation"],
        ),
        LayerP99 => spec(
            "stormglass_layer_latency_p99_seconds",
            "Window: P99 layer latency (log-bucketed, within 2%).",
            SERVICE,
        ),
        LayerP999 => spec(
            "stormglass_layer_latency_p999_seconds",
            "Window: P99.9 layer latency (log-bucketed, within 2%).",
            SERVICE,
        ),
        TailRatio => spec(
            "stormglass_layer_tail_ratio",
            "Window: P99.9 / P99 layer latency.",
            SERVICE,
        ),
        Timeout => spec(
            "stormglass_timeout_seconds",
            "Window: median deadline the caller gives the callee's operation.",
            EDGE,
        ),
        RecommendedTimeout => spec(
            "stormglass_recommended_timeout_seconds",
            "Window: callee P99.9 x advice.timeout_factor.",
            EDGE,
        ),
        CalleeP999 => spec(
            "stormglass_callee_latency_p999_seconds",
            "Window: the callee's P99.9 latency, per edge (what stormglass_timeout_seconds is compared with).",
            EDGE,
        ),
        ClockSkew => spec(
            "stormglass_clock_skew_seconds",
            "Window: how far the callee's clock reads ahead of the caller's, estimated from their answered calls (corrected before orphan and deadline checks).",
            &["caller", "callee"],
        ),
        Coverage => spec(
            "stormglass_instrumentation_coverage_ratio",
            "Window: share of the edge's attempts whose spans carry what a figure needs, by field (attempt_number, cause, deadline, idempotency, server_spans; and how attempts were found: from_server_spans, inferred).",
            &["caller", "callee", "operation", "field"],
        ),
    }
}

type Key = Vec<String>;

#[derive(Default)]
struct Family {
    series: BTreeMap<Key, f64>,
}

#[derive(Clone, Default)]
struct Buckets {
    /// Non-cumulative counts per `le` index; the last is +Inf. Sums of sampling weights,
    /// so fractional; rounded when exposed (the cumulative counts, not each bucket).
    counts: Vec<f64>,
    sum: f64,
}

#[derive(Default)]
struct State {
    counters: Vec<Family>,
    /// Per histogram family, the buckets of each series.
    histograms: Vec<BTreeMap<Key, Buckets>>,
    gauges: Vec<Family>,
    /// Increments of series created in the last interval, applied at the next one.
    deferred: Vec<(usize, Key, f64)>,
    deferred_histograms: Vec<(usize, Key, Buckets)>,
}

/// Self-metrics of the exporter.
#[derive(Clone)]
struct ExportMetrics {
    overflow: IntCounterVec,
    dropped_gauges: IntGaugeVec,
}

/// The figure metrics: a [`Collector`] for `/metrics` and an [`IntervalObserver`] fed by the
/// live analysis.
pub struct FigureMetrics {
    limit: usize,
    bounds: Vec<f64>,
    descs: Vec<Desc>,
    state: Mutex<State>,
    metrics: ExportMetrics,
}

impl FigureMetrics {
    /// Register the figure metrics and their self-metrics in `registry`.
    pub fn register(
        registry: &Registry,
        max_series_per_metric: usize,
    ) -> prometheus::Result<Arc<Self>> {
        let overflow = IntCounterVec::new(
            Opts::new(
                "stormglass_export_overflow_total",
                "Updates folded into __overflow__ series because a metric reached limits.max_series_per_metric.",
            ),
            &["metric"],
        )?;
        let dropped_gauges = IntGaugeVec::new(
            Opts::new(
                "stormglass_export_dropped_series",
                "Gauge series of the latest window left out because the metric reached limits.max_series_per_metric.",
            ),
            &["metric"],
        )?;
        registry.register(Box::new(overflow.clone()))?;
        registry.register(Box::new(dropped_gauges.clone()))?;
        // At 0 from the start, per metric: counters and histograms fold, gauges drop.
        for spec in COUNTERS.iter().chain(HISTOGRAMS.iter()) {
            overflow.with_label_values(&[spec.name]);
        }
        for spec in GAUGES.iter() {
            dropped_gauges.with_label_values(&[spec.name]).set(0);
        }
        let descs = COUNTERS
            .iter()
            .chain(HISTOGRAMS.iter())
            .chain(GAUGES.iter())
            .map(|s| {
                Desc::new(
                    s.name.to_owned(),
                    s.help.to_owned(),
                    s.labels.iter().map(|l| (*l).to_owned()).collect(),
                    HashMap::new(),
                )
            })
            .collect::<prometheus::Result<Vec<_>>>()?;
        let figures = Arc::new(FigureMetrics {
            limit: max_series_per_metric.max(1),
            bounds: histogram::le_bounds(),
            descs,
            state: Mutex::new(State {
                counters: COUNTERS.iter().map(|_| Family::default()).collect(),
                histograms: HISTOGRAMS.iter().map(|_| BTreeMap::new()).collect(),
                gauges: GAUGES.iter().map(|_| Family::default()).collect(),
                ..State::default()
            }),
            metrics: ExportMetrics {
                overflow,
                dropped_gauges,
            },
        });
        registry.register(Box::new(SharedCollector(figures.clone())))?;
        Ok(figures)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add one interval's partial aggregates to the counters and the histogram.
    /// Apply the increments deferred by the last interval (new series start at 0).
    pub fn flush_deferred(&self) {
        let mut state = self.lock();
        Self::apply_deferred(&mut state);
    }

    fn apply_deferred(state: &mut State) {
        for (family, key, v) in std::mem::take(&mut state.deferred) {
            *state.counters[family].series.entry(key).or_default() += v;
        }
        for (family, key, b) in std::mem::take(&mut state.deferred_histograms) {
            merge(state.histograms[family].entry(key).or_default(), &b);
        }
    }

    pub fn add_interval(&self, partials: &Partials) {
        let mut state = self.lock();
        let state = &mut *state;
        Self::apply_deferred(state);
        let mut add =
            |family: Counter, labels: Vec<String>, v: f64| self.add(state, family, labels, v);

        let counts = partials.counts();
        for r in counts.calls {
            let labels = vec![
                r.caller,
                r.callee,
                r.operation,
                r.first_outcome,
                r.final_outcome,
            ];
            add(Counter::LogicalCalls, labels, r.calls);
        }
        for r in counts.attempts {
            let labels = vec![
                r.caller,
                r.callee,
                r.operation,
                r.attempt,
                r.outcome,
                r.cause,
            ];
            add(Counter::Attempts, labels, r.attempts);
        }
        for r in counts.entries {
            add(
                Counter::EntryRequests,
                vec![r.service, r.operation],
                r.requests,
            );
        }
        for r in counts.layers {
            add(Counter::LayerAttempts, vec![r.service.clone()], r.received);
            add(Counter::LayerBaseline, vec![r.service], r.baseline);
        }
        for r in counts.edges {
            let edge = vec![r.caller.clone(), r.callee.clone(), r.operation.clone()];
            add(Counter::UnsafeRetries, edge.clone(), r.unsafe_retries);
            add(
                Counter::TimeoutRetriesOnWrites,
                edge.clone(),
                r.timeout_retries_on_writes,
            );
            add(Counter::ImmediateRetries, edge.clone(), r.immediate_retries);
            add(Counter::BudgetedAttempts, edge.clone(), r.budgeted_attempts);
            add(
                Counter::DeadlineSeconds,
                edge.clone(),
                r.deadline_ms_total / 1e3,
            );
            add(Counter::HiddenAttempts, edge.clone(), r.hidden_attempts);
            add(Counter::InferredAttempts, edge.clone(), r.inferred_attempts);
            add(Counter::HedgedAttempts, edge.clone(), r.hedged_attempts);
            add(Counter::InstanceRetries, edge.clone(), r.instance_retries);
            add(
                Counter::OtherInstanceRetries,
                edge.clone(),
                r.other_instance_retries,
            );
            add(Counter::OrphanWork, edge.clone(), 0.0);
            for outcome in ["ok", "failed", "pending"] {
                let mut labels = edge.clone();
                labels.push(outcome.to_owned());
                add(Counter::OrphanPairs, labels, 0.0);
            }
            for kind in ["inversion", "overcommit", "not_propagated"] {
                add(
                    Counter::DeadlineViolations,
                    vec![r.caller.clone(), r.callee.clone(), kind.to_owned()],
                    0.0,
                );
            }
        }
        for r in counts.orphans {
            let edge = vec![r.caller, r.callee, r.operation];
            let mut labels = edge.clone();
            labels.push(r.server_outcome);
            add(Counter::OrphanPairs, labels, r.pairs);
            add(Counter::OrphanWork, edge, r.work_ms / 1e3);
        }
        for r in counts.findings {
            let kind = match r.kind.as_str() {
                "deadline_inversion" => "inversion",
                "overcommit" => "overcommit",
                "not_propagated" => "not_propagated",
                _ => continue,
            };
            add(
                Counter::DeadlineViolations,
                vec![r.caller, r.callee, kind.to_owned()],
                r.count,
            );
        }
        for r in counts.traces {
            add(
                Counter::MultiLayer,
                vec![r.service.clone()],
                r.multi_layer_retry_traces,
            );
            add(Counter::BrokenTraces, vec![r.service], r.broken_traces);
        }

        let latency = counts
            .latency
            .into_iter()
            .map(|r| (vec![r.service], r.le, r.n, r.seconds));
        self.add_histograms(state, Histogram::LayerDuration, latency);
        let budgets = counts
            .budgets
            .into_iter()
            .map(|r| (vec![r.caller, r.callee, r.operation], r.le, r.n, r.seconds));
        self.add_histograms(state, Histogram::RemainingBudget, budgets);
    }

    fn add(&self, state: &mut State, family: Counter, labels: Vec<String>, v: f64) {
        let (spec, family) = (&COUNTERS[family as usize], family as usize);
        let series = &mut state.counters[family].series;
        if let Some(total) = series.get_mut(&labels) {
            *total += v;
            return;
        }
        let key = self.folded(spec, series, labels);
        match series.get_mut(&key) {
            Some(total) => *total += v,
            None => {
                series.insert(key.clone(), 0.0);
                if v != 0.0 {
                    state.deferred.push((family, key, v));
                }
            }
        }
    }

    /// The key a new series of `spec` is stored under ([`fold`]), counting each fold.
    fn folded<V>(&self, spec: &Spec, series: &BTreeMap<Key, V>, labels: Key) -> Key {
        match fold(spec, series, labels, self.limit) {
            Folded::No(key) => key,
            Folded::Yes(key) => {
                self.metrics.overflow.with_label_values(&[spec.name]).inc();
                key
            }
        }
    }

    /// Add one interval's rows (series key, `le` index, count, sum) to a histogram family.
    fn add_histograms(
        &self,
        state: &mut State,
        family: Histogram,
        rows: impl Iterator<Item = (Key, i64, f64, f64)>,
    ) {
        let width = self.bounds.len() + 1;
        let mut interval: BTreeMap<Key, Buckets> = BTreeMap::new();
        for (key, le, n, seconds) in rows {
            let b = interval.entry(key).or_insert_with(|| Buckets {
                counts: vec![0.0; width],
                sum: 0.0,
            });
            b.counts[usize::try_from(le).unwrap_or(0).min(width - 1)] += n;
            b.sum += seconds;
        }
        for (key, b) in interval {
            self.add_histogram(state, family, key, b);
        }
    }

    fn add_histogram(&self, state: &mut State, family: Histogram, key: Key, b: Buckets) {
        let (spec, family) = (&HISTOGRAMS[family as usize], family as usize);
        let series = &mut state.histograms[family];
        if let Some(existing) = series.get_mut(&key) {
            merge(existing, &b);
            return;
        }
        let key = self.folded(spec, series, key);
        match series.get_mut(&key) {
            Some(existing) => merge(existing, &b),
            None => {
                let width = b.counts.len();
                series.insert(
                    key.clone(),
                    Buckets {
                        counts: vec![0.0; width],
                        sum: 0.0,
                    },
                );
                state.deferred_histograms.push((family, key, b));
            }
        }
    }

    /// Replace the gauges with the figures of a window's report.
    pub fn set_window(&self, report: &Report) {
        let mut gauges: Vec<Family> = GAUGES.iter().map(|_| Family::default()).collect();
        let mut set = |family: Gauge, labels: Vec<String>, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                gauges[family as usize].series.insert(labels, v);
            }
        };
        let seconds = |ms: Option<f64>| ms.map(|ms| ms / 1e3);
        for e in &report.edges {
            let edge = vec![e.caller.clone(), e.callee.clone(), e.operation.clone()];
            set(
                Gauge::EffectiveSuccess,
                edge.clone(),
                e.effective_success_rate,
            );
            set(Gauge::RawSuccess, edge.clone(), e.raw_success_rate);
            set(Gauge::RetryContribution, edge.clone(), e.retry_contribution);
            set(Gauge::RetrySuccess, edge.clone(), e.retry_success_rate);
            set(Gauge::RetryRatio, edge.clone(), e.retry_ratio);
            set(Gauge::Timeout, edge.clone(), seconds(e.timeout_ms));
            set(
                Gauge::RecommendedTimeout,
                edge.clone(),
                seconds(e.recommended_timeout_ms),
            );
            set(Gauge::CalleeP999, edge, seconds(e.callee_p999_ms));
            set(
                Gauge::ClockSkew,
                vec![e.caller.clone(), e.callee.clone()],
                seconds(e.clock_skew_ms),
            );
        }
        for l in &report.layers {
            let service = vec![l.service.clone()];
            set(Gauge::Amplification, service.clone(), l.amplification);
            set(Gauge::LayerP99, service.clone(), seconds(l.p99_ms));
            set(Gauge::LayerP999, service.clone(), seconds(l.p999_ms));
            set(Gauge::TailRatio, service, l.tail_ratio);
        }
        for c in &report.coverage.edges {
            for (field, share) in c.shares.named() {
                let labels = vec![
                    c.caller.clone(),
                    c.callee.clone(),
                    c.operation.clone(),
                    field.to_owned(),
                ];
                set(Gauge::Coverage, labels, share);
            }
        }
        for e in &report.entries {
            set(
                Gauge::StormPotential,
                vec![e.service.clone(), e.operation.clone()],
                Some(e.storm_potential),
            );
        }
        for (spec, family) in GAUGES.iter().zip(gauges.iter_mut()) {
            let dropped = family.series.len().saturating_sub(self.limit);
            if dropped > 0 {
                let kept = family.series.keys().nth(self.limit).cloned();
                if let Some(first_dropped) = kept {
                    family.series.split_off(&first_dropped);
                }
            }
            self.metrics
                .dropped_gauges
                .with_label_values(&[spec.name])
                .set(i64::try_from(dropped).unwrap_or(i64::MAX));
        }
        self.lock().gauges = gauges;
    }

    fn families(&self) -> Vec<MetricFamily> {
        let state = self.lock();
        let mut out = Vec::new();
        for (spec, family) in COUNTERS.iter().zip(&state.counters) {
            out.push(family_of(spec, MetricType::COUNTER, family, |v| {
                let mut c = proto::Counter::default();
                c.set_value(v);
                let mut m = proto::Metric::default();
                m.set_counter(c);
                m
            }));
        }
        for (spec, family) in HISTOGRAMS.iter().zip(&state.histograms) {
            let mut histograms = new_family(spec, MetricType::HISTOGRAM);
            for (key, b) in family {
                let mut cumulative = 0.0;
                let mut buckets = Vec::with_capacity(self.bounds.len());
                for (bound, n) in self.bounds.iter().zip(&b.counts) {
                    cumulative += n;
                    let mut bucket = proto::Bucket::default();
                    bucket.set_upper_bound(*bound);
                    bucket.set_cumulative_count(cumulative.round() as u64);
                    buckets.push(bucket);
                }
                let mut h = proto::Histogram::default();
                h.set_bucket(buckets);
                h.set_sample_count(b.counts.iter().sum::<f64>().round() as u64);
                h.set_sample_sum(b.sum);
                let mut m = proto::Metric::default();
                m.set_histogram(h);
                m.set_label(label_pairs(spec.labels, key));
                histograms.mut_metric().push(m);
            }
            out.push(histograms);
        }
        for (spec, family) in GAUGES.iter().zip(&state.gauges) {
            out.push(family_of(spec, MetricType::GAUGE, family, |v| {
                let mut g = proto::Gauge::default();
                g.set_value(v);
                let mut m = proto::Metric::default();
                m.set_gauge(g);
                m
            }));
        }
        out
    }
}

impl IntervalObserver for FigureMetrics {
    fn interval(&self, partials: &Partials, report: &Arc<Report>, _now: SystemTime) {
        self.add_interval(partials);
        self.set_window(report);
    }

    /// The last interval's increments of new series were deferred to the next one, which
    /// never comes: apply them, so the last scrape (during `shutdown.drain`) sees them.
    fn shutdown(&self, _now: SystemTime) {
        self.flush_deferred();
    }

    /// Gauges from the rebuilt window; the counters restart from zero.
    fn restored(&self, report: &Arc<Report>, _now: SystemTime) {
        self.set_window(report);
    }
}

/// The registry owns a collector by value; this one shares the state with the observer.
struct SharedCollector(Arc<FigureMetrics>);

impl Collector for SharedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.0.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.families()
    }
}

enum Folded {
    No(Key),
    Yes(Key),
}

/// The key a new series is stored under, given the limit (see the module docs).
fn fold<V>(spec: &Spec, series: &BTreeMap<Key, V>, labels: Key, limit: usize) -> Folded {
    if series.len() < limit {
        return Folded::No(labels);
    }
    let replace = |labels: &Key, which: &[&str]| -> Key {
        spec.labels
            .iter()
            .zip(labels)
            .map(|(name, value)| {
                if which.contains(name) {
                    OVERFLOW.to_owned()
                } else {
                    value.clone()
                }
            })
            .collect()
    };
    if spec.labels.contains(&"operation") {
        let by_operation = replace(&labels, &["operation"]);
        if series.contains_key(&by_operation) {
            return Folded::Yes(by_operation);
        }
    }
    Folded::Yes(replace(&labels, &IDENTITY))
}

fn merge(into: &mut Buckets, from: &Buckets) {
    if into.counts.len() < from.counts.len() {
        into.counts.resize(from.counts.len(), 0.0);
    }
    for (a, b) in into.counts.iter_mut().zip(&from.counts) {
        *a += b;
    }
    into.sum += from.sum;
}

fn new_family(spec: &Spec, kind: MetricType) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(spec.name.to_owned());
    family.set_help(spec.help.to_owned());
    family.set_field_type(kind);
    family
}

fn family_of(
    spec: &Spec,
    kind: MetricType,
    family: &Family,
    metric: impl Fn(f64) -> proto::Metric,
) -> MetricFamily {
    let mut out = new_family(spec, kind);
    for (labels, v) in &family.series {
        let mut m = metric(*v);
        m.set_label(label_pairs(spec.labels, labels));
        out.mut_metric().push(m);
    }
    out
}

fn label_pairs(names: &[&str], values: &[String]) -> Vec<proto::LabelPair> {
    names
        .iter()
        .zip(values)
        .map(|(name, value)| {
            let mut pair = proto::LabelPair::default();
            pair.set_name((*name).to_owned());
            pair.set_value(value.clone());
            pair
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(values: &[&str]) -> Key {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    /// Each family's variant sits at its own place in `ALL` (what indexes the state), and
    /// no name is used twice.
    #[test]
    fn catalogue_is_indexed_by_its_variants() {
        assert!(
            Counter::ALL
                .iter()
                .enumerate()
                .all(|(i, c)| *c as usize == i)
        );
        assert!(
            Histogram::ALL
                .iter()
                .enumerate()
                .all(|(i, h)| *h as usize == i)
        );
        assert!(Gauge::ALL.iter().enumerate().all(|(i, g)| *g as usize == i));
        let mut names: Vec<&str> = COUNTERS
            .iter()
            .chain(HISTOGRAMS.iter())
            .chain(GAUGES.iter())
            .map(|s| s.name)
            .collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all);
    }

    /// Over the limit, a new edge folds into operation="__overflow__" when that series
    /// exists, otherwise into the all-identity overflow series; existing series still grow.
    #[test]
    fn folding_keeps_series_bounded() {
        let spec = &Counter::UnsafeRetries.spec();
        let mut series = BTreeMap::new();
        series.insert(key(&["a", "b", "op1"]), 1.0);
        let Folded::Yes(first) = fold(spec, &series, key(&["a", "b", "op2"]), 1) else {
            panic!("over the limit must fold");
        };
        assert_eq!(first, key(&[OVERFLOW, OVERFLOW, OVERFLOW]));
        series.insert(key(&["a", "b", OVERFLOW]), 0.0);
        let Folded::Yes(second) = fold(spec, &series, key(&["a", "b", "op3"]), 1) else {
            panic!("over the limit must fold");
        };
        assert_eq!(second, key(&["a", "b", OVERFLOW]));
        assert!(matches!(
            fold(spec, &series, key(&["x", "y", "z"]), 10),
            Folded::No(_)
        ));
    }

    /// Closed-set labels (attempt kind, outcome) survive folding; cause, free text, folds.
    #[test]
    fn folding_keeps_closed_labels() {
        let spec = &Counter::Attempts.spec();
        let series: BTreeMap<Key, f64> =
            [(key(&["a", "b", "op", "first", "ok", "none"]), 1.0)].into();
        let Folded::Yes(folded) = fold(
            spec,
            &series,
            key(&["c", "d", "op", "retry", "deadline", "deadline"]),
            1,
        ) else {
            panic!("over the limit must fold");
        };
        assert_eq!(
            folded,
            key(&[OVERFLOW, OVERFLOW, OVERFLOW, "retry", "deadline", OVERFLOW])
        );
    }
}
