//! Live analysis: the [`TraceSink`](stormglass_assembly::TraceSink) that assembly releases
//! complete traces to, and the worker that analyses them as a stream of bounded chunks.
//!
//! Data flow: released traces wait in a queue, their memory still reserved against the
//! budget. The worker ([`LiveAnalysis::spawn`], its own thread and runtime, so receivers
//! keep answering while it works) takes a chunk as soon as a chunk's worth of bytes is
//! queued (at most [`LiveAnalysis::chunk_bytes`], a fraction of the analysis's share of the
//! budget) and analyses it ([`Engine::analyse_in_window`]) into partial aggregates; at each
//! `analytics.interval` tick it analyses what is left, and the interval's partials (the
//! union of its chunks', exactly what one big batch would give, since every partial is
//! mergeable) join the window. The report is rebuilt from the merged window after every
//! interval, so cost follows the span rate, not the window length. Spans are dropped, and
//! their memory returned, as soon as their chunk is analysed.
//!
//! When analysis is slower than ingest, the queue holds its reservations, the budget
//! fills, and the receivers refuse retryably: memory stays bounded and exporters back off.
//!
//! A chunk whose analysis fails or panics is caught: counted in
//! `stormglass_analysis_failures_total` and `stormglass_internal_errors_total{task="analysis"}`,
//! `/healthz` fails until a chunk succeeds again, and its spans count as analysed (they
//! left assembly) but add nothing to the figures; the other chunks of the interval still
//! do, so counters stay consistent with the report.

mod chunks;
mod config;
mod faults;
mod metrics;
mod restore;
mod window;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use arrow::array::RecordBatch;
use stormglass_model::SPANS_SCHEMA;
use stormglass_runtime::health::error_chain;
use stormglass_runtime::{Health, MemoryBudget, Reservation};
use tokio::sync::{Notify, watch};

pub use config::AnalyticsConfig;
pub use faults::Faults;
pub use metrics::AnalysisMetrics;

use chunks::{FillingInterval, Queue};
use window::{Interval, Learned, WindowKey};

use crate::alerts::AlertThresholds;
use crate::clock::ClockBounds;
use crate::counts::IntervalCounts;
use crate::engine::{AnalysisError, Engine, Partials};
use crate::report::{Finding, Report, ReportConfig};

/// Told about every analysed interval: its partials (what this interval added, for
/// counters) and the window's new report (for gauges and alerts). Called on the analysis
/// thread, inside the runtime given to [`LiveAnalysis::with_runtime`] when there is one;
/// slow work (network) belongs in a spawned task.
pub trait IntervalObserver: Send + Sync {
    /// One interval analysed: what it adds to the counters (`counts`, complete) and the
    /// window's report with it; `None` when that report failed to build (the window's
    /// figures stay as last published, the counts are whole all the same).
    fn interval(&self, counts: &IntervalCounts, report: Option<&Arc<Report>>, now: SystemTime);

    /// Called once after the last interval at shutdown: publish what would otherwise wait
    /// for an interval that never comes.
    fn shutdown(&self, _now: SystemTime) {}

    /// The window was rebuilt from the archive at start ([`LiveAnalysis::restore`]):
    /// publish the window's figures (gauges, alerts), never its increments, which the
    /// process before the restart already counted.
    fn restored(&self, _report: &Arc<Report>, _now: SystemTime) {}
}

/// The live analysis: a [`TraceSink`](stormglass_assembly::TraceSink) plus the worker.
pub struct LiveAnalysis {
    engine: Engine,
    thresholds: AlertThresholds,
    config: AnalyticsConfig,
    report_config: ReportConfig,
    metrics: AnalysisMetrics,
    budget: MemoryBudget,
    health: Health,
    faults: Arc<Faults>,
    chunk_bytes: usize,
    queue: Mutex<Queue>,
    wake: Notify,
    filling: tokio::sync::Mutex<FillingInterval>,
    /// Services that sent SERVER spans, with when they were last seen (window membership).
    servers: Mutex<BTreeMap<String, SystemTime>>,
    window: Mutex<VecDeque<Interval>>,
    /// The clock bounds of the window's intervals, intersected (see `add_to_window`).
    window_clocks: Mutex<Arc<ClockBounds>>,
    /// Late SERVER spans since the last interval (their durations only are analysed).
    late_servers: Mutex<Vec<(RecordBatch, Reservation)>>,
    /// The latest report; `None` while the next is built after this one was let go to
    /// stay within `limits.memory` (see `rebuild_report`) or after a build failed.
    latest: RwLock<Option<Arc<Report>>>,
    /// The window the latest report was built from, and its findings before they were
    /// bounded: a window that holds the same data reuses that report (see `rebuild_report`).
    built: Mutex<Option<(WindowKey, Vec<Finding>)>>,
    observers: Vec<Arc<dyn IntervalObserver>>,
    runtime: Option<tokio::runtime::Handle>,
}

impl LiveAnalysis {
    pub fn new(
        engine: Engine,
        thresholds: AlertThresholds,
        config: AnalyticsConfig,
        metrics: AnalysisMetrics,
    ) -> Self {
        Self::with_budget(
            engine,
            thresholds,
            config,
            metrics,
            MemoryBudget::unregistered(usize::MAX / 2),
            Health::unregistered(),
        )
    }

    /// A live analysis inside `budget`: DataFusion's pool and the chunk size come from the
    /// budget's analysis share; failures are reported to `health`.
    pub fn with_budget(
        engine: Engine,
        thresholds: AlertThresholds,
        config: AnalyticsConfig,
        metrics: AnalysisMetrics,
        budget: MemoryBudget,
        health: Health,
    ) -> Self {
        let share = budget.analysis_share();
        // The operators' hash tables are bounded by the pool; the chunk size bounds the
        // rest of the working set (see MemoryBudget::chunk_bytes).
        let chunk_bytes = budget.chunk_bytes();
        // The worker runs on one thread (see LiveAnalysis::spawn).
        let engine = engine.on_one_thread();
        let engine = if share < usize::MAX / 16 {
            engine.with_memory_limit(share / 2)
        } else {
            engine
        };
        LiveAnalysis {
            engine,
            thresholds,
            config,
            report_config: ReportConfig::default(),
            metrics,
            budget,
            health,
            faults: Arc::new(Faults::default()),
            chunk_bytes,
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            filling: tokio::sync::Mutex::new(FillingInterval {
                start: SystemTime::now(),
                chunks: Vec::new(),
                folded: 0,
                learned: Learned::default(),
            }),
            servers: Mutex::new(BTreeMap::new()),
            window: Mutex::new(VecDeque::new()),
            window_clocks: Mutex::default(),
            late_servers: Mutex::new(Vec::new()),
            latest: RwLock::new(Some(Arc::new(Report::default()))),
            built: Mutex::new(None),
            observers: Vec::new(),
            runtime: None,
        }
    }

    /// Tell `observer` about every interval from now on.
    pub fn with_observer(mut self, observer: Arc<dyn IntervalObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Run observers inside `runtime` (the receivers' one), so the tasks they spawn
    /// (notifications) outlive the analysis thread's runtime.
    pub fn with_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// List findings as `report.*` says (default: [`ReportConfig::default`]).
    pub fn with_report_config(mut self, config: ReportConfig) -> Self {
        self.report_config = config;
        self
    }

    /// Inject faults (tests of the live path only).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = Arc::new(faults);
        self
    }

    /// Analyse in chunks of at most `bytes` (tests; the default comes from the budget).
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }

    /// Largest chunk analysed at once, in Arrow bytes of released spans.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// The latest window's report; `None` while the next is built after it was let go to
    /// keep the build within `limits.memory` (a wide window under memory pressure).
    pub fn report(&self) -> Option<Arc<Report>> {
        self.latest
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What the advice assumes: the analysis's own `advice.*` parameters.
    pub fn advice_params(&self) -> crate::advice::AdviceParams {
        crate::advice::AdviceParams::from(&self.engine.params)
    }

    /// Analyse everything released so far, end the interval at `now`, and rebuild the
    /// window's report.
    pub async fn run_interval(&self, now: SystemTime) -> Result<Arc<Report>, AnalysisError> {
        let started = Instant::now();
        // What was queued when the interval ended; later releases go to the next interval,
        // so a steady stream cannot keep an interval from finishing.
        let mut left = self.lock_queue().bytes;
        while left > 0 {
            match self.analyse_next(true).await {
                Some(bytes) => left = left.saturating_sub(bytes.max(1)),
                None => break,
            }
        }
        let chunks = {
            let mut current = self.filling.lock().await;
            let start = std::mem::replace(&mut current.start, now);
            let learned = std::mem::take(&mut current.learned);
            current.folded = 0;
            (start, std::mem::take(&mut current.chunks), learned)
        };
        let (start, chunks, learned) = chunks;
        let (chunks, _reserved): (Vec<Partials>, Vec<Reservation>) = chunks.into_iter().unzip();
        let partials = match Partials::concat(chunks) {
            Some(p) => p,
            None => {
                self.engine
                    .analyse(RecordBatch::new_empty(SPANS_SCHEMA.clone()))
                    .await?
            }
        };
        let mut partials = self.with_late_latency(partials).await;
        self.merge_chunks(&mut partials).await;
        let partials = Arc::new(partials.compact_for_window());
        self.add_to_window(start, now, partials.clone(), learned, now);
        let built = self.rebuild_report().await;
        // The interval's counts are its partials': a failed build loses none of them. Its
        // out-of-budget retries are then judged by the last report's medians; that report,
        // stale, is let go after (the API answers 503 until a build succeeds).
        let judged = built.as_ref().ok().cloned().or_else(|| self.report());
        if built.is_err() {
            *self.latest.write().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if !self.observers.is_empty() {
            let counted = Instant::now();
            let counts = partials.counts(judged.as_deref());
            crate::table::timed("interval counts", counted);
            let _inside = self.runtime.as_ref().map(|r| r.enter());
            for observer in &self.observers {
                let observed = Instant::now();
                observer.interval(&counts, built.as_ref().ok(), now);
                crate::table::timed("observer", observed);
            }
        }
        let report = built?;
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        Ok(report)
    }

    /// Start the worker on its own thread and runtime: chunks as they fill, an interval
    /// every `analytics.interval` until `shutdown`, then a last one over everything queued.
    pub fn spawn(
        self: Arc<Self>,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("stormglass-analysis".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        self.health
                            .failed("analysis", &format!("cannot start its runtime: {e}"));
                        return;
                    }
                };
                runtime.block_on(self.run(shutdown));
            })
    }

    /// The worker loop (see [`LiveAnalysis::spawn`]).
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut next = tokio::time::Instant::now() + self.config.interval;
        loop {
            let stopping = *shutdown.borrow() || shutdown.has_changed().is_err();
            if stopping || tokio::time::Instant::now() >= next {
                self.interval_logged().await;
                if stopping {
                    break;
                }
                while next <= tokio::time::Instant::now() {
                    next += self.config.interval;
                }
                continue;
            }
            if self.analyse_next(false).await.is_some() {
                continue;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(next) => {}
                _ = shutdown.changed() => {}
            }
        }
        {
            let _inside = self.runtime.as_ref().map(|r| r.enter());
            let now = SystemTime::now();
            for observer in &self.observers {
                observer.shutdown(now);
            }
        }
        tracing::info!("ran the last analysis at shutdown");
    }

    async fn interval_logged(&self) {
        if let Err(e) = self.run_interval(SystemTime::now()).await {
            self.metrics.failures.inc();
            self.health.failed("analysis", &error_chain(&e));
        }
    }
}
