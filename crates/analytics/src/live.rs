//! Live analysis: the [`TraceSink`] that assembly releases complete traces to.
//!
//! Released batches wait in `pending` until the next `analytics.interval` tick; then they
//! are analysed together ([`Engine::analyse`]) into one interval's partial aggregates, the
//! spans are dropped, and the partials join the window (`analytics.window`, a queue of the
//! last intervals' partials). The report is rebuilt from the merged window after every
//! interval, so cost follows the span rate, not the window length.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::RecordBatch;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};
use serde::Deserialize;
use stormglass_model::SPANS_SCHEMA;
use tokio::sync::watch;

use crate::alerts::AlertThresholds;
use crate::duration;
use crate::engine::{AnalysisError, Engine, Partials};
use crate::report::{Report, WindowBounds};
use crate::sink::{ReleasedTraces, TraceSink};

/// `analytics.*` configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AnalyticsConfig {
    /// Length of the sliding window the figures describe.
    #[serde(with = "duration")]
    pub window: Duration,
    /// How often released traces are analysed (one partial per interval).
    #[serde(with = "duration")]
    pub interval: Duration,
}

impl Default for AnalyticsConfig {
    fn default() -> Self {
        AnalyticsConfig {
            window: Duration::from_secs(300),
            interval: Duration::from_secs(10),
        }
    }
}

impl AnalyticsConfig {
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.interval.is_zero() {
            problems.push((
                format!("{prefix}.interval"),
                "must be greater than 0 (e.g. 10s)".into(),
            ));
        }
        if self.window < self.interval {
            problems.push((
                format!("{prefix}.window"),
                "must be at least analytics.interval (e.g. 5m)".into(),
            ));
        }
        problems
    }
}

/// Analysis self-metrics.
#[derive(Clone)]
pub struct AnalysisMetrics {
    spans: IntCounter,
    pending: IntGauge,
    duration: Histogram,
    failures: IntCounter,
}

impl AnalysisMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let spans = IntCounter::new(
            "stormglass_analysis_spans_total",
            "Spans analysed (released by assembly and aggregated into an interval).",
        )?;
        let pending = IntGauge::new(
            "stormglass_analysis_pending_spans",
            "Released spans waiting for the next analysis interval.",
        )?;
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "stormglass_analysis_duration_seconds",
                "Time to analyse one interval and rebuild the window's report.",
            )
            .buckets(prometheus::exponential_buckets(0.005, 2.0, 14)?),
        )?;
        let failures = IntCounter::new(
            "stormglass_analysis_failures_total",
            "Analysis intervals that failed (their spans are counted as analysed but not in the report).",
        )?;
        registry.register(Box::new(spans.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        Ok(AnalysisMetrics {
            spans,
            pending,
            duration,
            failures,
        })
    }

    pub fn unregistered() -> Self {
        match Self::register(&Registry::new()) {
            Ok(m) => m,
            Err(e) => unreachable!("a fresh registry has no conflicting metrics: {e}"),
        }
    }
}

/// Told about every analysed interval: its partials (what this interval added, for
/// counters) and the window's new report (for gauges and alerts). Called on the analysis
/// task, inside the runtime; slow work (network) belongs in a spawned task.
pub trait IntervalObserver: Send + Sync {
    fn interval(&self, partials: &Partials, report: &Arc<Report>, now: SystemTime);
}

struct Interval {
    start: SystemTime,
    end: SystemTime,
    partials: Arc<Partials>,
}

/// The live analysis: a [`TraceSink`] plus the interval loop.
pub struct LiveAnalysis {
    engine: Engine,
    thresholds: AlertThresholds,
    config: AnalyticsConfig,
    metrics: AnalysisMetrics,
    pending: Mutex<Vec<RecordBatch>>,
    window: Mutex<VecDeque<Interval>>,
    latest: RwLock<Arc<Report>>,
    interval_started: Mutex<SystemTime>,
    observers: Vec<Arc<dyn IntervalObserver>>,
}

impl LiveAnalysis {
    pub fn new(
        engine: Engine,
        thresholds: AlertThresholds,
        config: AnalyticsConfig,
        metrics: AnalysisMetrics,
    ) -> Self {
        LiveAnalysis {
            engine,
            thresholds,
            config,
            metrics,
            pending: Mutex::new(Vec::new()),
            window: Mutex::new(VecDeque::new()),
            latest: RwLock::new(Arc::new(Report::default())),
            interval_started: Mutex::new(SystemTime::now()),
            observers: Vec::new(),
        }
    }

    /// Tell `observer` about every interval from now on.
    pub fn with_observer(mut self, observer: Arc<dyn IntervalObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// The latest window's report.
    pub fn report(&self) -> Arc<Report> {
        self.latest
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Analyse what was released since the last interval, ending the interval at `now`, and
    /// rebuild the window's report.
    pub async fn run_interval(&self, now: SystemTime) -> Result<Arc<Report>, AnalysisError> {
        let started = Instant::now();
        let batches = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        self.metrics.pending.set(0);
        let start = std::mem::replace(
            &mut *self
                .interval_started
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            now,
        );
        let spans = match arrow::compute::concat_batches(&SPANS_SCHEMA, &batches) {
            Ok(batch) => batch,
            Err(e) => unreachable!("released batches share SPANS_SCHEMA: {e}"),
        };
        drop(batches);
        let rows = spans.num_rows() as u64;
        let partials = match self.engine.analyse(spans).await {
            Ok(p) => Arc::new(p),
            Err(e) => {
                self.metrics.failures.inc();
                self.metrics.spans.inc_by(rows);
                return Err(e);
            }
        };
        self.metrics.spans.inc_by(rows);
        let (window, bounds) = {
            let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
            window.push_back(Interval {
                start,
                end: now,
                partials: partials.clone(),
            });
            let horizon = now.checked_sub(self.config.window).unwrap_or(UNIX_EPOCH);
            while window.front().is_some_and(|i| i.end <= horizon) {
                window.pop_front();
            }
            let bounds = WindowBounds {
                start_unix_ns: window.front().map(|i| unix_ns(i.start)),
                end_unix_ns: window.back().map(|i| unix_ns(i.end)),
            };
            let partials: Vec<Arc<Partials>> = window.iter().map(|i| i.partials.clone()).collect();
            (partials, bounds)
        };
        let report =
            Arc::new(Report::build(&self.engine, &window, bounds, &self.thresholds).await?);
        *self.latest.write().unwrap_or_else(|p| p.into_inner()) = report.clone();
        for observer in &self.observers {
            observer.interval(&partials, &report, now);
        }
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        Ok(report)
    }

    /// Run an interval every `analytics.interval` until `shutdown`, then a last one.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            // The guard `wait_for` returns must not live across the other arm's await.
            let stop = async { drop(shutdown.wait_for(|stop| *stop).await) };
            tokio::select! {
                _ = tick.tick() => self.interval_logged().await,
                _ = stop => break,
            }
        }
        self.interval_logged().await;
        tracing::info!("ran the last analysis at shutdown");
    }

    async fn interval_logged(&self) {
        if let Err(e) = self.run_interval(SystemTime::now()).await {
            tracing::error!(error = %e, source = ?std::error::Error::source(&e), "analysis interval failed");
        }
    }
}

impl TraceSink for LiveAnalysis {
    fn release(&self, traces: ReleasedTraces) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.push(traces.batch);
        self.metrics
            .pending
            .set(pending.iter().map(|b| b.num_rows() as i64).sum());
    }
}

fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
