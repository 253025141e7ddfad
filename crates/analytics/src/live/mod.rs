//! Live analysis: the [`TraceSink`] that assembly releases complete traces to, and the
//! worker that analyses them as a stream of bounded chunks.
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

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{AsArray, RecordBatch};
use stormglass_assembly::{ReleasedTraces, TraceSink};
use stormglass_model::hash::KeyedHash;
use stormglass_model::{SPANS_SCHEMA, schema};
use stormglass_runtime::health::{error_chain, panic_message};
use stormglass_runtime::{Health, MemoryBudget, Reservation};
use tokio::sync::{Notify, watch};

mod config;
mod faults;
mod metrics;

pub use config::AnalyticsConfig;
pub use faults::Faults;
pub use metrics::AnalysisMetrics;

use crate::alerts::{self, AlertThresholds};
use crate::clock::ClockBounds;
use crate::counts::IntervalCounts;
use crate::engine::{AnalysisError, Engine, Partials, WindowContext};
use crate::report::{Finding, Report, ReportConfig, WindowBounds};

/// Told about every analysed interval: its partials (what this interval added, for
/// counters) and the window's new report (for gauges and alerts). Called on the analysis
/// thread, inside the runtime given to [`LiveAnalysis::with_runtime`] when there is one;
/// slow work (network) belongs in a spawned task.
pub trait IntervalObserver: Send + Sync {
    /// One interval analysed: what it adds to the counters (`counts`, complete) and the
    /// window's report with it.
    fn interval(&self, counts: &IntervalCounts, report: &Arc<Report>, now: SystemTime);

    /// Called once after the last interval at shutdown: publish what would otherwise wait
    /// for an interval that never comes.
    fn shutdown(&self, _now: SystemTime) {}

    /// The window was rebuilt from the archive at start ([`LiveAnalysis::restore`]):
    /// publish the window's figures (gauges, alerts), never its increments, which the
    /// process before the restart already counted.
    fn restored(&self, _report: &Arc<Report>, _now: SystemTime) {}
}

struct Interval {
    start: SystemTime,
    end: SystemTime,
    partials: Arc<Partials>,
    learned: Learned,
    _reservation: Reservation,
}

/// What later chunks of the window need from a chunk's partials (its clock bounds), read
/// once when the chunk is analysed rather than again for every chunk after.
#[derive(Default)]
struct Learned {
    clocks: ClockBounds,
}

impl Learned {
    fn add(&mut self, partials: &Partials) {
        partials.clock_bounds_into(&mut self.clocks);
    }

    fn merge_into(&self, context: &mut WindowContext) {
        for (pair, bound) in &self.clocks {
            crate::clock::add(&mut context.clocks, pair.clone(), *bound);
        }
    }
}

/// Which intervals with data a report was built from: the same key, the same figures.
#[derive(Clone, Debug, PartialEq)]
struct WindowKey {
    first: Option<SystemTime>,
    last: Option<SystemTime>,
    intervals: usize,
}

/// Released traces waiting for analysis.
#[derive(Default)]
struct Queue {
    items: VecDeque<ReleasedTraces>,
    bytes: usize,
    spans: usize,
}

/// The interval being filled: its chunks' partials so far, each with its reservation
/// against the budget (held until the interval joins the window, which reserves its own).
/// Every [`FOLD_CHUNKS`] chunks are put together as the window keeps them (one group,
/// merged and dictionary-encoded): at width each chunk names most of its edges anew, and
/// an interval's chunks held apart were ~2.5x the size of the same interval folded.
struct FillingInterval {
    start: SystemTime,
    chunks: Vec<(Partials, Reservation)>,
    /// How many of `chunks`, the first, are folded groups.
    folded: usize,
    learned: Learned,
}

/// Chunks folded into one group while an interval fills ([`FillingInterval`]).
const FOLD_CHUNKS: usize = 8;

/// The live analysis: a [`TraceSink`] plus the worker.
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
    /// Late SERVER spans since the last interval (their durations only are analysed).
    late_servers: Mutex<Vec<(RecordBatch, Reservation)>>,
    latest: RwLock<Arc<Report>>,
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
            late_servers: Mutex::new(Vec::new()),
            latest: RwLock::new(Arc::new(Report::default())),
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

    /// The latest window's report.
    pub fn report(&self) -> Arc<Report> {
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
        let report = self.rebuild_report().await?;
        if !self.observers.is_empty() {
            let counted = Instant::now();
            let counts = partials.counts(&report);
            crate::table::timed("interval counts", counted);
            let _inside = self.runtime.as_ref().map(|r| r.enter());
            for observer in &self.observers {
                let observed = Instant::now();
                observer.interval(&counts, &report, now);
                crate::table::timed("observer", observed);
            }
        }
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        Ok(report)
    }

    /// Add an interval's partials to the window and drop the intervals that left it.
    fn add_to_window(
        &self,
        start: SystemTime,
        end: SystemTime,
        partials: Arc<Partials>,
        learned: Learned,
        now: SystemTime,
    ) {
        let reservation = self.budget.force(partials.memory_bytes());
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        window.push_back(Interval {
            start,
            end,
            partials,
            learned,
            _reservation: reservation,
        });
        let horizon = now.checked_sub(self.config.window).unwrap_or(UNIX_EPOCH);
        while window.front().is_some_and(|i| i.end <= horizon) {
            window.pop_front();
        }
        self.servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, seen| *seen > horizon);
    }

    /// Rebuild the report from the window's intervals and make it the latest. When the
    /// window holds the same data as the last build (intervals that analysed nothing came,
    /// none with data left: input has stopped), that build is reused with the new bounds,
    /// so an idle collector does not merge a wide window again every interval.
    async fn rebuild_report(&self) -> Result<Arc<Report>, AnalysisError> {
        let (window, bounds, key) = {
            let window = self.window.lock().unwrap_or_else(|p| p.into_inner());
            let bounds = WindowBounds {
                start_unix_ns: window.front().map(|i| unix_ns(i.start)),
                end_unix_ns: window.back().map(|i| unix_ns(i.end)),
            };
            let with_data: Vec<&Interval> =
                window.iter().filter(|i| !i.partials.is_empty()).collect();
            let key = WindowKey {
                first: with_data.first().map(|i| i.start),
                last: with_data.last().map(|i| i.end),
                intervals: with_data.len(),
            };
            let partials: Vec<Arc<Partials>> = window.iter().map(|i| i.partials.clone()).collect();
            (partials, bounds, key)
        };
        let reused = self
            .built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|(built, _)| *built == key)
            .map(|(_, findings)| findings.clone());
        let Some(findings) = reused else {
            // The last build's findings are kept only for its reuse: not beside the new ones.
            self.built.lock().unwrap_or_else(|p| p.into_inner()).take();
            let mut report = Report::build(&self.engine, &window, bounds).await?;
            self.metrics.builds.inc();
            report.figures = Some(self.metrics.builds.get());
            *self.built.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((key, report.findings.clone()));
            self.evaluate(&mut report);
            let report = Arc::new(report);
            *self.latest.write().unwrap_or_else(|p| p.into_inner()) = report.clone();
            return Ok(report);
        };
        // In place: a copy of a wide report each idle interval was a few hundred MiB and
        // most of the idle CPU (`make_mut` copies only while a reader holds it).
        let mut latest = self.latest.write().unwrap_or_else(|p| p.into_inner());
        let report = Arc::make_mut(&mut latest);
        report.window = Report::window_of(&window, bounds);
        report.findings = findings;
        self.evaluate(report);
        Ok(latest.clone())
    }

    /// The alerts of `report` (its findings all there), then its findings bounded.
    fn evaluate(&self, report: &mut Report) {
        let started = Instant::now();
        report.alerts = alerts::evaluate(report, &self.thresholds);
        crate::table::timed("alerts", started);
        report.bound_findings(self.report_config.max_findings_per_kind);
    }

    /// Rebuild the window from spans archived before a restart (`archive.dir`), so the
    /// figures, gauges and alerts do not start blank after a deploy or a crash.
    ///
    /// Each trace joins the interval its last span ended in (counted back from `now` in
    /// `analytics.interval` steps; traces that ended before the window are left out), and
    /// each interval is analysed as the live path would have, in chunks of whole traces.
    /// Observers are told through [`IntervalObserver::restored`], never
    /// [`IntervalObserver::interval`]: gauges and alerts come back, counters do not count
    /// the restored spans again (they restart from zero, as Prometheus expects of a
    /// restarted process). `spans` come from [`crate::files::load_archive_since`], lean
    /// and bounded. Returns the spans restored.
    pub async fn restore(
        &self,
        spans: RecordBatch,
        now: SystemTime,
    ) -> Result<usize, AnalysisError> {
        let interval = self.config.interval;
        let buckets = (self.config.window.as_nanos() / interval.as_nanos().max(1)).max(1) as usize;
        let by_bucket = restore_buckets(&spans, now, interval, buckets);
        let bytes_per_row = spans.get_array_memory_size() / spans.num_rows().max(1);
        let rows_per_chunk = (self.chunk_bytes / bytes_per_row.max(1)).max(1);
        let mut restored = 0;
        for (bucket, traces) in by_bucket.into_iter().enumerate().rev() {
            if traces.is_empty() {
                continue;
            }
            let end = now
                .checked_sub(interval * u32::try_from(bucket).unwrap_or(u32::MAX))
                .unwrap_or(UNIX_EPOCH);
            let start = end.checked_sub(interval).unwrap_or(UNIX_EPOCH);
            let mut chunks = Vec::new();
            let mut learned = Learned::default();
            let mut rows: Vec<u32> = Vec::new();
            let mut traces = traces.into_iter().peekable();
            while let Some(trace) = traces.next() {
                rows.extend(trace);
                if rows.len() < rows_per_chunk && traces.peek().is_some() {
                    continue;
                }
                let indices = arrow::array::UInt32Array::from(std::mem::take(&mut rows));
                let chunk = match arrow::compute::take_record_batch(&spans, &indices) {
                    Ok(chunk) => chunk,
                    Err(e) => unreachable!("rows of a batch can be taken: {e}"),
                };
                restored += chunk.num_rows();
                {
                    let mut known = self.servers.lock().unwrap_or_else(|p| p.into_inner());
                    for service in server_services(&chunk) {
                        known.insert(service, end);
                    }
                }
                let mut context = self.window_context().await;
                learned.merge_into(&mut context);
                let partials = self.engine.analyse_in_window(chunk, &context).await?;
                learned.add(&partials);
                chunks.push(partials.compact());
            }
            if let Some(mut partials) = Partials::concat(chunks) {
                self.merge_chunks(&mut partials).await;
                self.add_to_window(
                    start,
                    end,
                    Arc::new(partials.compact_for_window()),
                    learned,
                    now,
                );
            }
        }
        let report = self.rebuild_report().await?;
        let _inside = self.runtime.as_ref().map(|r| r.enter());
        for observer in &self.observers {
            observer.restored(&report, now);
        }
        Ok(restored)
    }

    /// `chunks` as one group of the interval, as the window keeps them, with its own
    /// reservation (the chunks' are returned).
    async fn folded(&self, chunks: Vec<(Partials, Reservation)>) -> (Partials, Reservation) {
        let (chunks, _reserved): (Vec<Partials>, Vec<Reservation>) = chunks.into_iter().unzip();
        let Some(mut group) = Partials::concat(chunks) else {
            unreachable!("a group folds at least one chunk");
        };
        self.merge_chunks(&mut group).await;
        let group = group.compact_for_window();
        let reservation = self.budget.force(group.memory_bytes());
        (group, reservation)
    }

    /// [`Engine::merge_chunks`]; a failure is counted and leaves the partials as they were.
    async fn merge_chunks(&self, partials: &mut Partials) {
        if let Err(e) = self.engine.merge_chunks(partials).await {
            self.metrics.failures.inc();
            self.health.failed("analysis", &error_chain(&e));
        }
    }

    /// Add the late SERVER spans' durations to the interval's latency partial. A failure
    /// is counted and leaves the partials as they were.
    async fn with_late_latency(&self, mut partials: Partials) -> Partials {
        let late =
            std::mem::take(&mut *self.late_servers.lock().unwrap_or_else(|p| p.into_inner()));
        if late.is_empty() {
            return partials;
        }
        let (late, _reserved): (Vec<RecordBatch>, Vec<Reservation>) = late.into_iter().unzip();
        let spans = match arrow::compute::concat_batches(&SPANS_SCHEMA, &late) {
            Ok(spans) => spans,
            Err(e) => unreachable!("late spans share SPANS_SCHEMA: {e}"),
        };
        match self.engine.late_latency(spans).await {
            Ok(rows) => {
                if let Some((_, latency)) = partials
                    .tables
                    .iter_mut()
                    .find(|(name, _)| *name == "partial_latency")
                {
                    latency.batches.extend(rows.batches);
                }
            }
            Err(e) => {
                self.metrics.failures.inc();
                self.health.failed("analysis", &error_chain(&e));
            }
        }
        partials
    }

    /// Analyse the next chunk: a full one, or with `all` whatever is queued. Returns the
    /// bytes taken from the queue, `None` when there was nothing to analyse.
    async fn analyse_next(&self, all: bool) -> Option<usize> {
        let (batch, reservation, spans, taken) = self.take_chunk(all)?;
        let started = Instant::now();
        let window = self.window_context().await;
        let seen = server_services(&batch);
        let engine = self.engine.clone();
        let faults = self.faults.clone();
        // On its own task, so that a panic inside DataFusion or the lineage is caught.
        let analysed = tokio::spawn(async move {
            if !faults.delay.is_zero() {
                tokio::time::sleep(faults.delay).await;
            }
            if faults
                .panics
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                panic!("injected analysis panic (STORMGLASS_TEST_FAULTS)");
            }
            engine.analyse_in_window(batch, &window).await
        })
        .await;
        drop(reservation);
        self.metrics.spans.inc_by(spans as u64);
        match analysed {
            Ok(Ok(partials)) => {
                let now = SystemTime::now();
                {
                    let mut known = self.servers.lock().unwrap_or_else(|p| p.into_inner());
                    for service in seen {
                        known.insert(service, now);
                    }
                }
                let mut current = self.filling.lock().await;
                current.learned.add(&partials);
                let partials = partials.compact();
                let reservation = self.budget.force(partials.memory_bytes());
                current.chunks.push((partials, reservation));
                if current.chunks.len() - current.folded >= FOLD_CHUNKS {
                    let from = current.folded;
                    let group = self.folded(current.chunks.split_off(from)).await;
                    current.chunks.push(group);
                    current.folded += 1;
                }
                self.health.ok("analysis");
            }
            Ok(Err(e)) => {
                self.metrics.failures.inc();
                let detail = error_chain(&e);
                self.health.failed("analysis", &detail);
            }
            Err(joined) => {
                self.metrics.failures.inc();
                let detail = match joined.try_into_panic() {
                    Ok(panic) => panic_message(&*panic),
                    Err(e) => e.to_string(),
                };
                self.health.failed("analysis", &detail);
            }
        }
        self.metrics
            .chunk_duration
            .observe(started.elapsed().as_secs_f64());
        Some(taken)
    }

    /// What the next chunk needs from the window: the services seen serving, and the clock
    /// bounds of the window's intervals and of the current one's
    /// chunks so far.
    async fn window_context(&self) -> WindowContext {
        let servers: Vec<String> = self
            .servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        let mut context = WindowContext {
            servers,
            ..WindowContext::default()
        };
        for interval in self.window.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            interval.learned.merge_into(&mut context);
        }
        self.filling.lock().await.learned.merge_into(&mut context);
        context
    }

    /// Take queued traces up to a chunk's bytes, as one batch with its reservation: when a
    /// whole chunk is queued, or with `all` whenever anything is.
    fn take_chunk(&self, all: bool) -> Option<(RecordBatch, Reservation, usize, usize)> {
        let (items, taken) = {
            let mut queue = self.lock_queue();
            if queue.items.is_empty() || (!all && queue.bytes < self.chunk_bytes) {
                return None;
            }
            let mut items = Vec::new();
            let mut bytes = 0;
            while let Some(size) = queue.items.front().map(|i| i.reservation.bytes()) {
                if !items.is_empty() && bytes + size > self.chunk_bytes {
                    break;
                }
                let Some(item) = queue.items.pop_front() else {
                    break;
                };
                bytes += size;
                queue.bytes -= size;
                queue.spans -= item.batch.num_rows();
                items.push(item);
            }
            self.metrics
                .pending
                .set(i64::try_from(queue.spans).unwrap_or(i64::MAX));
            (items, bytes)
        };
        let spans = items.iter().map(|i| i.batch.num_rows()).sum();
        if items.len() == 1 {
            let item = items.into_iter().next()?;
            return Some((item.batch, item.reservation, spans, taken));
        }
        let batches: Vec<&RecordBatch> = items.iter().map(|i| &i.batch).collect();
        // Bounded by the chunk size, far below Arrow's 2 GiB offsets.
        let batch = match arrow::compute::concat_batches(&SPANS_SCHEMA, batches) {
            Ok(batch) => batch,
            Err(e) => unreachable!("released batches share SPANS_SCHEMA: {e}"),
        };
        let reservation = self.budget.force(batch.get_array_memory_size());
        drop(items);
        Some((batch, reservation, spans, taken))
    }

    /// Released spans waiting for analysis (what a bounded shutdown leaves unanalysed).
    pub fn pending_spans(&self) -> usize {
        self.lock_queue().spans
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
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

impl TraceSink for LiveAnalysis {
    fn late_servers(&self, spans: RecordBatch) {
        // A service sending SERVER spans is instrumented, even when they come late.
        let now = SystemTime::now();
        {
            let mut known = self.servers.lock().unwrap_or_else(|p| p.into_inner());
            for service in server_services(&spans) {
                known.insert(service, now);
            }
        }
        let reservation = self.budget.force(spans.get_array_memory_size());
        self.late_servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((spans, reservation));
    }

    fn release(&self, traces: ReleasedTraces) {
        let full = {
            let mut queue = self.lock_queue();
            queue.bytes += traces.reservation.bytes();
            queue.spans += traces.batch.num_rows();
            queue.items.push_back(traces);
            self.metrics
                .pending
                .set(i64::try_from(queue.spans).unwrap_or(i64::MAX));
            queue.bytes >= self.chunk_bytes
        };
        if full {
            self.wake.notify_one();
        }
    }
}

/// The rows of `spans` by interval, newest first (`buckets` of `interval` counted back from
/// `now`), each as its traces' rows: a trace joins the interval its last span ended in;
/// traces that ended before the window are left out, those "ending" after `now` (a fast
/// clock) join the newest.
fn restore_buckets(
    spans: &RecordBatch,
    now: SystemTime,
    interval: Duration,
    buckets: usize,
) -> Vec<Vec<Vec<u32>>> {
    let (Some(traces), Some(ends)) = (
        spans
            .column_by_name(schema::TRACE_ID)
            .and_then(|c| c.as_fixed_size_binary_opt()),
        spans
            .column_by_name(schema::END_NS)
            .and_then(|c| c.as_primitive_opt::<arrow::datatypes::Int64Type>()),
    ) else {
        unreachable!("spans follow SPANS_SCHEMA");
    };
    let mut by_trace: std::collections::HashMap<&[u8], (i64, Vec<u32>), KeyedHash> =
        std::collections::HashMap::default();
    for row in 0..spans.num_rows() {
        let entry = by_trace
            .entry(traces.value(row))
            .or_insert((i64::MIN, Vec::new()));
        entry.0 = entry.0.max(ends.value(row));
        entry.1.push(row as u32);
    }
    let now_ns = unix_ns(now);
    let step = i64::try_from(interval.as_nanos())
        .unwrap_or(i64::MAX)
        .max(1);
    let mut out = vec![Vec::new(); buckets];
    let mut traces: Vec<(i64, Vec<u32>)> = by_trace.into_values().collect();
    traces.sort_by_key(|(end, rows)| (*end, rows[0]));
    for (end, rows) in traces {
        let bucket = (now_ns.saturating_sub(end).max(0) / step) as usize;
        if let Some(slot) = out.get_mut(bucket) {
            slot.push(rows);
        }
    }
    out
}

/// Services with a SERVER span in `batch`.
fn server_services(batch: &RecordBatch) -> Vec<String> {
    let (Some(kind), Some(service)) = (
        batch
            .column_by_name(schema::KIND)
            .and_then(|c| c.as_string_opt::<i32>()),
        batch
            .column_by_name(schema::SERVICE_NAME)
            .and_then(|c| c.as_string_opt::<i32>()),
    ) else {
        return Vec::new();
    };
    let mut seen: Vec<String> = Vec::new();
    for row in 0..batch.num_rows() {
        if kind.value(row) == "server" {
            let name = service.value(row);
            if !seen.iter().any(|s| s == name) {
                seen.push(name.to_owned());
            }
        }
    }
    seen
}

fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
