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
mod edges;
mod gauges;
mod histograms;
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
use edges::EdgeSeries;
use gauges::gauge_families;
use histograms::{Buckets, merge};

/// The label value overflowing series are folded into.
pub const OVERFLOW: &str = "__overflow__";

type Key = Vec<String>;

#[derive(Default)]
struct Family {
    series: BTreeMap<Key, f64>,
}

struct State {
    /// The counter families not labelled by the edge alone (theirs are in `edges`).
    counters: Vec<Family>,
    /// The counter families labelled by the edge alone, one column each
    /// ([`FigureMetrics::edge_columns`]).
    edges: EdgeSeries,
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
    /// Per family of [`COUNTERS`], its column in [`State::edges`] when its labels are
    /// [`EDGE`]'s; and per column, its family.
    edge_columns: Vec<Option<usize>>,
    edge_families: Vec<usize>,
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
        let edge_families: Vec<usize> = (0..COUNTERS.len())
            .filter(|&f| COUNTERS[f].labels == EDGE)
            .collect();
        let mut edge_columns = vec![None; COUNTERS.len()];
        for (column, &family) in edge_families.iter().enumerate() {
            edge_columns[family] = Some(column);
        }
        let figures = Arc::new(FigureMetrics {
            limit: max_series_per_metric.max(1),
            bounds: histogram::le_bounds(),
            descs,
            state: Mutex::new(State {
                counters: COUNTERS.iter().map(|_| Family::default()).collect(),
                edges: EdgeSeries::new(edge_families.len()),
                histograms: HISTOGRAMS.iter().map(|_| BTreeMap::new()).collect(),
                gauges: GAUGES.iter().map(|_| Family::default()).collect(),
                deferred: COUNTERS.iter().map(|_| HashMap::new()).collect(),
                deferred_histograms: HISTOGRAMS.iter().map(|_| HashMap::new()).collect(),
                gauges_of: None,
            }),
            edge_columns,
            edge_families,
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

    /// Apply the increments deferred by the last interval (new series start at 0).
    pub fn flush_deferred(&self) {
        let mut state = self.lock();
        Self::apply_deferred(&mut state);
    }

    fn apply_deferred(state: &mut State) {
        state.edges.apply_waiting();
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

    /// Add one interval's partial aggregates to the counters and the histograms.
    pub fn add_interval(&self, counts: &IntervalCounts) {
        let mut state = self.lock();
        let state = &mut *state;
        Self::apply_deferred(state);
        self.add_edges(state, counts);
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
        let folds: Vec<u64> = state.edges.take_folds().collect();
        for (column, n) in folds.into_iter().enumerate() {
            if n > 0 {
                let name = COUNTERS[self.edge_families[column]].name;
                self.metrics.overflow.with_label_values(&[name]).inc_by(n);
            }
        }
    }

    /// Each edge's counts, at one lookup per edge for all its families: the catalogue's
    /// counts, and 0 for the safety counters a later row may add to; and, for an edge new
    /// with room for its row ([`EdgeSeries::introduced`]), its zero series in the families
    /// labelled by more than the edge. Seen again, an edge has them or folds: six keys
    /// built, looked up and folded per edge each interval would change nothing.
    fn add_edges(&self, state: &mut State, counts: &IntervalCounts) {
        // The catalogue's counts are labelled by the edge (catalogue.rs), so each has a column.
        let columns: Vec<(usize, f64)> = (EDGE_COUNTS.iter().enumerate())
            .filter_map(|(i, c)| Some((self.edge_columns[edge_count_family(i)]?, c.unit.to_base())))
            .collect();
        let at_zero: Vec<usize> = [Counter::OutOfBudgetRetries, Counter::OrphanWork]
            .iter()
            .filter_map(|&c| self.edge_columns[c as usize])
            .collect();
        let spec = &COUNTERS[edge_count_family(0)];
        for r in &counts.edges {
            let edge = vec![r.caller.clone(), r.callee.clone(), r.operation.clone()];
            let row = state.edges.row(spec, edge, self.limit);
            for (&(column, unit), v) in columns.iter().zip(&r.values) {
                state.edges.add(column, row, v * unit);
            }
            for &column in &at_zero {
                state.edges.add(column, row, 0.0);
            }
            if !state.edges.introduced(row) {
                continue;
            }
            for outcome in ["ok", "failed", "pending"] {
                let labels = vec![
                    r.caller.clone(),
                    r.callee.clone(),
                    r.operation.clone(),
                    outcome.to_owned(),
                ];
                self.add_to(state, Counter::OrphanPairs as usize, labels, 0.0);
            }
            for (kind, _) in DEADLINE_VIOLATION_KINDS {
                let labels = vec![r.caller.clone(), r.callee.clone(), kind.to_owned()];
                self.add_to(state, Counter::DeadlineViolations as usize, labels, 0.0);
            }
        }
    }

    /// Add `v` to the series `labels` of the counter family at `family` in [`COUNTERS`].
    fn add_to(&self, state: &mut State, family: usize, labels: Vec<String>, v: f64) {
        let spec = &COUNTERS[family];
        if let Some(column) = self.edge_columns[family] {
            let row = state.edges.row(spec, labels, self.limit);
            state.edges.add(column, row, v);
            return;
        }
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

    fn families(&self) -> Vec<MetricFamily> {
        let state = self.lock();
        let mut out = Vec::new();
        let counter = |v| {
            let mut c = proto::Counter::default();
            c.set_value(v);
            let mut m = proto::Metric::default();
            m.set_counter(c);
            m
        };
        for (f, (spec, family)) in COUNTERS.iter().zip(&state.counters).enumerate() {
            let family = match self.edge_columns[f] {
                Some(column) => family_of(
                    spec,
                    MetricType::COUNTER,
                    state.edges.series(column),
                    counter,
                ),
                None => family_of(
                    spec,
                    MetricType::COUNTER,
                    family.series.iter().map(|(k, v)| (k, *v)),
                    counter,
                ),
            };
            out.push(family);
        }
        out.extend(self.histogram_families(&state));
        out.extend(gauge_families(&state));
        out
    }
}

impl IntervalObserver for FigureMetrics {
    fn interval(&self, counts: &IntervalCounts, report: Option<&Arc<Report>>, _now: SystemTime) {
        self.add_interval(counts);
        if let Some(report) = report {
            self.set_window(report);
        }
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

fn new_family(spec: &Spec, kind: MetricType) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(spec.name.to_owned());
    family.set_help(spec.help.to_owned());
    family.set_field_type(kind);
    family
}

fn family_of<'k>(
    spec: &Spec,
    kind: MetricType,
    series: impl Iterator<Item = (&'k Key, f64)>,
    metric: impl Fn(f64) -> proto::Metric,
) -> MetricFamily {
    let mut out = new_family(spec, kind);
    for (labels, v) in series {
        let mut m = metric(v);
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
