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
//! Cardinality: each metric holds at most `limits.max_series_per_metric` series, a histogram's
//! buckets, `_sum` and `_count` included (54 per label set: 37 label sets at 2,000). A new series
//! beyond that is folded into `operation="__overflow__"` (the caller and callee kept), and if
//! that series is new too, into a series whose caller, callee, service, operation and cause
//! are all `__overflow__`; the remaining labels (outcome, attempt) are closed sets, so the
//! folded series are bounded. `cause` is the span's free text (any retry reason an SDK
//! writes), so it folds like the identities. Folded updates are counted in `stormglass_export_overflow_total`. A
//! ratio cannot be folded: gauge series beyond the limit are left out, and how many were is
//! `stormglass_export_dropped_series`.

mod catalogue;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use stormglass_analytics::counts::{DEADLINE_VIOLATION_KINDS, IntervalCounts};
use stormglass_analytics::figures::EDGE_COUNTS;
use stormglass_analytics::{IntervalObserver, Report, histogram};

use catalogue::*;

/// The label value overflowing series are folded into.
pub const OVERFLOW: &str = "__overflow__";

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
    /// Per family, the series created this interval and their increments, applied at the
    /// next one: every update of a new series waits with it (one folded into an
    /// `__overflow__` series created this interval too), summed per series, so what waits
    /// is bounded by the series, not by the updates (millions an interval at width).
    deferred: Vec<HashMap<Key, f64>>,
    deferred_histograms: Vec<HashMap<Key, Buckets>>,
    /// The figures the gauges hold ([`Report::figures`]); a report of the same figures
    /// leaves them as they are.
    gauges_of: Option<u64>,
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
                deferred: COUNTERS.iter().map(|_| HashMap::new()).collect(),
                deferred_histograms: HISTOGRAMS.iter().map(|_| HashMap::new()).collect(),
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
        for (family, deferred) in state.deferred.iter_mut().enumerate() {
            for (key, v) in deferred.drain() {
                *state.counters[family].series.entry(key).or_default() += v;
            }
        }
        for (family, deferred) in state.deferred_histograms.iter_mut().enumerate() {
            for (key, b) in deferred.drain() {
                merge(state.histograms[family].entry(key).or_default(), &b);
            }
        }
    }

    pub fn add_interval(&self, counts: &IntervalCounts) {
        let mut state = self.lock();
        let state = &mut *state;
        Self::apply_deferred(state);
        // Families by index in COUNTERS: a Counter's own, or a catalogue entry's.
        let mut add =
            |family: usize, labels: Vec<String>, v: f64| self.add_to(state, family, labels, v);

        for r in &counts.calls {
            let labels = vec![
                r.caller.clone(),
                r.callee.clone(),
                r.operation.clone(),
                r.first_outcome.clone(),
                r.final_outcome.clone(),
            ];
            add(Counter::LogicalCalls as usize, labels, r.calls);
        }
        for r in &counts.attempts {
            let labels = vec![
                r.caller.clone(),
                r.callee.clone(),
                r.operation.clone(),
                r.attempt.clone(),
                r.outcome.clone(),
                r.cause.clone(),
            ];
            add(Counter::Attempts as usize, labels, r.attempts);
        }
        for r in &counts.entries {
            let entry = vec![r.service.clone(), r.operation.clone()];
            add(Counter::EntryRequests as usize, entry.clone(), r.requests);
            add(Counter::EntryFailedRequests as usize, entry, r.failed);
        }
        for r in &counts.layers {
            add(
                Counter::LayerAttempts as usize,
                vec![r.service.clone()],
                r.received,
            );
            add(
                Counter::LayerBaseline as usize,
                vec![r.service.clone()],
                r.baseline,
            );
        }
        for r in &counts.layer_responses {
            let labels = vec![r.service.clone(), r.status_code.clone(), r.outcome.clone()];
            add(Counter::LayerResponses as usize, labels, r.n);
        }
        for r in &counts.edges {
            let edge = vec![r.caller.clone(), r.callee.clone(), r.operation.clone()];
            for (i, (count, v)) in EDGE_COUNTS.iter().zip(&r.values).enumerate() {
                add(edge_count_family(i), edge.clone(), v * count.unit.to_base());
            }
            add(Counter::OutOfBudgetRetries as usize, edge.clone(), 0.0);
            add(Counter::OrphanWork as usize, edge.clone(), 0.0);
            for outcome in ["ok", "failed", "pending"] {
                let mut labels = edge.clone();
                labels.push(outcome.to_owned());
                add(Counter::OrphanPairs as usize, labels, 0.0);
            }
            for (kind, _) in DEADLINE_VIOLATION_KINDS {
                add(
                    Counter::DeadlineViolations as usize,
                    vec![r.caller.clone(), r.callee.clone(), kind.to_owned()],
                    0.0,
                );
            }
        }
        for r in &counts.out_of_budget {
            add(
                Counter::OutOfBudgetRetries as usize,
                vec![r.caller.clone(), r.callee.clone(), r.operation.clone()],
                r.retries,
            );
        }
        for r in &counts.orphans {
            let edge = vec![r.caller.clone(), r.callee.clone(), r.operation.clone()];
            let mut labels = edge.clone();
            labels.push(r.server_outcome.clone());
            add(Counter::OrphanPairs as usize, labels, r.pairs);
            add(Counter::OrphanWork as usize, edge, r.work_ms / 1e3);
        }
        for r in &counts.deadline_violations {
            add(
                Counter::DeadlineViolations as usize,
                vec![r.caller.clone(), r.callee.clone(), r.kind.to_owned()],
                r.count,
            );
        }
        for r in &counts.traces {
            add(
                Counter::MultiLayer as usize,
                vec![r.service.clone()],
                r.multi_layer_retry_traces,
            );
            add(
                Counter::BrokenTraces as usize,
                vec![r.service.clone()],
                r.broken_traces,
            );
        }

        let latency = counts
            .latency
            .iter()
            .map(|r| (vec![r.service.clone()], r.le, r.n, r.seconds));
        self.add_histograms(state, Histogram::LayerDuration, latency);
        let entry_latency = counts.entry_latency.iter().map(|r| {
            (
                vec![r.service.clone(), r.operation.clone()],
                r.le,
                r.n,
                r.seconds,
            )
        });
        self.add_histograms(state, Histogram::EntryDuration, entry_latency);
        let budgets = counts.budgets.iter().map(|r| {
            (
                vec![r.caller.clone(), r.callee.clone(), r.operation.clone()],
                r.le,
                r.n,
                r.seconds,
            )
        });
        self.add_histograms(state, Histogram::RemainingBudget, budgets);
    }

    /// Add `v` to the series `labels` of the counter family at `family` in [`COUNTERS`].
    fn add_to(&self, state: &mut State, family: usize, labels: Vec<String>, v: f64) {
        let spec = &COUNTERS[family];
        let series = &mut state.counters[family].series;
        let key = if series.contains_key(&labels) {
            labels
        } else {
            self.folded(spec, series, labels, self.limit)
        };
        if let Some(waiting) = state.deferred[family].get_mut(&key) {
            *waiting += v;
            return;
        }
        match series.get_mut(&key) {
            Some(total) => *total += v,
            None => {
                series.insert(key.clone(), 0.0);
                state.deferred[family].insert(key, v);
            }
        }
    }

    /// The key a new series of `spec` is stored under ([`fold`]) when a family may hold
    /// `limit` keys, counting each fold.
    fn folded<V>(&self, spec: &Spec, series: &BTreeMap<Key, V>, labels: Key, limit: usize) -> Key {
        match fold(spec, series, labels, limit) {
            Folded::No(key) => key,
            Folded::Yes(key) => {
                self.metrics.overflow.with_label_values(&[spec.name]).inc();
                key
            }
        }
    }

    /// Keys a histogram family may hold: each exposes a series per bucket, `_sum` and
    /// `_count`, and together they stay within the limit (at least one key).
    fn histogram_limit(&self) -> usize {
        (self.limit / (self.bounds.len() + 3)).max(1)
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
        let key = if series.contains_key(&key) {
            key
        } else {
            self.folded(spec, series, key, self.histogram_limit())
        };
        if let Some(waiting) = state.deferred_histograms[family].get_mut(&key) {
            merge(waiting, &b);
            return;
        }
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
                state.deferred_histograms[family].insert(key, b);
            }
        }
    }

    /// Replace the gauges with the figures of a window's report (unless they already hold
    /// them: an idle window's reused report).
    pub fn set_window(&self, report: &Report) {
        if report.figures.is_some() && self.lock().gauges_of == report.figures {
            return;
        }
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
            set(
                Gauge::SynchronisedRetries,
                edge.clone(),
                e.synchronised_retries,
            );
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
        let mut state = self.lock();
        state.gauges = gauges;
        state.gauges_of = report.figures;
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
    fn interval(&self, counts: &IntervalCounts, report: &Arc<Report>, _now: SystemTime) {
        self.add_interval(counts);
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
