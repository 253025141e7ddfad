//! `stormglass serve`: wire receivers -> assembly -> analysis -> exports, the API, and
//! shutdown. [`Collector`] is the running collector (also what `stormglass demo` starts).
//!
//! Threads: the receivers and the API run on the main tokio runtime ([`runtime`]);
//! assembly's release loop and the analysis worker each run on a thread of their own, so a
//! long analysis never delays an answer to an exporter. All of them share one memory budget
//! (`limits.memory`). The runtime's threads run at a lower CPU priority
//! (`limits.receiver_nice`) than assembly and analysis: when the cores are busy, the
//! pipeline's drain runs before its intake, so released spans are analysed as they come
//! instead of waiting behind requests, and a storm the analysis cannot keep up with fills
//! the budget and is refused at the door.
//!
//! Shutdown order matters for the accounting identity: on SIGINT/SIGTERM the receivers stop
//! first and finish in-flight requests, then assembly releases every open trace, then the
//! analysis runs its last interval over them, then the API stops. Releasing before the
//! receivers drained would turn in-flight spans into late ones.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus::Registry;
use stormglass_analytics::{AnalysisMetrics, Engine, Faults, LiveAnalysis, TraceSink};
use stormglass_archive::{Archive, ArchivingSink};
use stormglass_assembly::{Assembly, AssemblyMetrics};
use stormglass_export::{AlertEvaluator, FigureMetrics};
use stormglass_ingest::server::ServeError;
use stormglass_ingest::{IngestMetrics, Pipeline, ReceiverConfig, Receivers};
use stormglass_runtime::{BearerToken, Health, MemoryBudget, Tls};
use tokio::sync::watch;
use tokio::task::JoinError;
use tokio::task::JoinHandle;

use crate::api;
use crate::config::Config;

/// How often the process's resident size is re-read to size the data budget: a burst that
/// arrives between two readings is bounded by the request slots, each reserved before it
/// is read.
const FOOTPRINT_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// A running collector: receivers, assembly, live analysis with its exports, and the API.
pub struct Collector {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub api: SocketAddr,
    pub analysis: Arc<LiveAnalysis>,
    pub evaluator: Arc<AlertEvaluator>,
    /// How long a trace takes from its last span to the report: assembly idle + interval.
    settle: std::time::Duration,
    shutdown: crate::config::ShutdownConfig,
    archive: Option<Arc<Archive>>,
    assembly: Arc<Assembly>,
    receivers_task: JoinHandle<Result<(), ServeError>>,
    stop_receivers: watch::Sender<bool>,
    stop_assembly: watch::Sender<bool>,
    stop_analysis: watch::Sender<bool>,
    stop_api: watch::Sender<bool>,
    assembly_thread: std::thread::JoinHandle<()>,
    analysis_thread: std::thread::JoinHandle<()>,
    api_task: JoinHandle<std::io::Result<()>>,
}

impl Collector {
    /// Bind every listener and start every task.
    pub async fn start(config: Config) -> anyhow::Result<Collector> {
        tracing::debug!(?config, "effective configuration");
        let registry = Registry::new();
        let (limit, how) = config
            .limits
            .memory
            .resolve(stormglass_runtime::memory::cgroup_limit());
        tracing::info!(limit_bytes = limit, "memory bound: {how}");
        let budget = MemoryBudget::register(limit, &registry)?;
        budget.follow_footprint(FOOTPRINT_EVERY, crate::release_free_memory)?;
        let health = Health::register(&registry)?;
        let tls = Tls::from_config(&config.tls, &registry)?;
        let ingest_metrics = IngestMetrics::register(&registry)?;
        let assembly_metrics = AssemblyMetrics::register(&registry)?;
        let figures = FigureMetrics::register(&registry, config.limits.max_series_per_metric)?;
        let evaluator = AlertEvaluator::register(
            &registry,
            config.notify.clone(),
            config.alerts.clone(),
            config.analytics.interval,
        )?;
        let faults = faults_from_env()?;
        let analysis = Arc::new(
            LiveAnalysis::with_budget(
                Engine::new(config.params()),
                config.alerts.clone(),
                config.analytics.clone(),
                AnalysisMetrics::register(&registry)?,
                budget.clone(),
                health.clone(),
            )
            .with_report_config(config.report.clone())
            .with_observer(figures)
            .with_observer(evaluator.clone())
            .with_runtime(tokio::runtime::Handle::current())
            .with_faults(faults),
        );
        let sink: Arc<dyn TraceSink> = analysis.clone();
        let assembly = Arc::new(Assembly::new(
            config.assembly.clone(),
            sink,
            assembly_metrics,
            budget.clone(),
        ));
        let archive = match &config.archive.dir {
            Some(dir) => {
                restore(&analysis, &config, dir, &budget).await;
                Some(Arc::new(Archive::start(
                    &config.archive,
                    dir,
                    budget.clone(),
                    health.clone(),
                    &registry,
                )?))
            }
            None => None,
        };
        let conventions = match &config.archive.dir {
            Some(dir) => config.conventions().with_key_secret(
                stormglass_archive::key_secret(dir).with_context(|| {
                    format!("archive.dir {}: the idempotency key secret", dir.display())
                })?,
            ),
            None => config.conventions(),
        };
        let conventions = Arc::new(conventions);
        let pipeline = match &archive {
            // Whole spans for the archive; assembly keeps only what the analysis reads.
            Some(archive) => Pipeline::new(
                Arc::new(ArchivingSink::new(
                    archive.clone(),
                    assembly.clone(),
                    budget.clone(),
                )),
                conventions,
                ingest_metrics,
            ),
            None => Pipeline::new(assembly.clone(), conventions, ingest_metrics).lean(),
        };

        let (stop_receivers, receivers_shutdown) = watch::channel(false);
        let (stop_assembly, assembly_shutdown) = watch::channel(false);
        let (stop_analysis, analysis_shutdown) = watch::channel(false);
        let (stop_api, api_shutdown) = watch::channel(false);

        let receiver_config = ReceiverConfig {
            grpc: config.listen.grpc,
            http: config.listen.http,
            max_request_bytes: config.limits.max_request_bytes,
            max_concurrent_requests: config.limits.max_concurrent_requests,
            memory: budget,
            tls: tls.clone(),
            token: BearerToken::new(config.auth.token.as_ref()),
            request_timeout: config.limits.request_timeout,
        };
        let receivers = Receivers::start(&receiver_config, pipeline, receivers_shutdown).await?;
        let (api_addr, api_task) = api::start(
            config.listen.api,
            api::router(
                registry,
                assembly.clone(),
                analysis.clone(),
                evaluator.clone(),
                health.clone(),
                BearerToken::new(config.auth.api_token.as_ref()),
                config.links.trace_url.as_deref(),
            ),
            tls.as_ref(),
            api_shutdown,
        )
        .await?;
        evaluator.set_api_url(&api::advertised_url(config.api_scheme(), api_addr));
        evaluator.set_trace_url(config.links.trace_url.clone());
        let assembly_thread = {
            let assembly = assembly.clone();
            std::thread::Builder::new()
                .name("stormglass-assembly".into())
                .spawn(move || assembly.run_blocking(assembly_shutdown, &health))
                .context("cannot start the assembly thread")?
        };
        let analysis_thread = analysis
            .clone()
            .spawn(analysis_shutdown)
            .context("cannot start the analysis thread")?;
        tracing::info!(
            grpc = %receivers.grpc_addr,
            http = %receivers.http_addr,
            api = %api_addr,
            "stormglass is listening"
        );
        Ok(Collector {
            grpc: receivers.grpc_addr,
            http: receivers.http_addr,
            api: api_addr,
            analysis,
            evaluator,
            settle: config.assembly.idle + config.analytics.interval,
            shutdown: config.shutdown.clone(),
            archive,
            assembly,
            receivers_task: tokio::spawn(receivers.wait()),
            stop_receivers,
            stop_assembly,
            stop_analysis,
            stop_api,
            assembly_thread,
            analysis_thread,
            api_task,
        })
    }

    /// How long after its last span a trace shows in the report (plus one interval).
    pub fn settle_time(&self) -> std::time::Duration {
        self.settle + std::time::Duration::from_secs(1)
    }

    /// Serve until SIGINT/SIGTERM (or a receiver fails), then stop in order.
    pub async fn run_until_signal(mut self) -> anyhow::Result<()> {
        let finished = tokio::select! {
            signal = shutdown_signal() => {
                tracing::info!(signal = signal?, "shutting down: draining receivers");
                None
            }
            joined = &mut self.receivers_task => Some(joined),
        };
        let drain = self.shutdown.drain;
        self.shutdown(finished, drain).await
    }

    /// Stop in order: receivers (finishing in-flight requests), assembly (releasing every
    /// open trace), the last analysis, the API; without a drain (the demo's stop).
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown(None, std::time::Duration::ZERO).await
    }

    async fn shutdown(
        self,
        receivers_finished: Option<Result<Result<(), ServeError>, JoinError>>,
        drain: std::time::Duration,
    ) -> anyhow::Result<()> {
        let _ = self.stop_receivers.send(true);
        let receivers = match receivers_finished {
            Some(joined) => joined,
            None => self.receivers_task.await,
        };
        if let Some(archive) = self.archive.clone() {
            // Every accepted span is appended by now: close the last file.
            tokio::task::spawn_blocking(move || archive.finish())
                .await
                .context("closing the archive failed")?;
            tracing::info!("archive closed");
        }
        let _ = self.stop_assembly.send(true);
        join(self.assembly_thread, "assembly").await?;
        let (open_spans, _) = self.assembly.open();
        tracing::info!(open_spans, "assembly drained");
        let _ = self.stop_analysis.send(true);
        // The last analysis (every released trace, the final counters, resolved alerts),
        // bounded by shutdown.timeout.
        let analysed = tokio::time::timeout(
            self.shutdown.timeout,
            join(self.analysis_thread, "analysis"),
        )
        .await;
        match analysed {
            Ok(joined) => joined?,
            Err(_) => tracing::error!(
                timeout = ?self.shutdown.timeout,
                unanalysed_spans = self.analysis.pending_spans(),
                "the last analysis did not finish within shutdown.timeout; stopping without it"
            ),
        }
        self.evaluator.finish_sending().await;
        if !drain.is_zero() {
            tracing::info!(
                ?drain,
                "serving /metrics until the last scrape (shutdown.drain)"
            );
            tokio::time::sleep(drain).await;
        }
        let _ = self.stop_api.send(true);
        self.api_task.await.context("the API task failed")??;
        receivers
            .context("the receivers task failed")?
            .context("a receiver failed")?;
        Ok(())
    }
}

/// Rebuild the analysis window from the archive's last `analytics.window` (plus one
/// `archive.flush`, for traces whose first spans went to the file before). A failure is
/// logged: the collector still starts, with an empty window.
async fn restore(
    analysis: &LiveAnalysis,
    config: &Config,
    dir: &std::path::Path,
    budget: &MemoryBudget,
) {
    if !dir.is_dir() {
        return;
    }
    let now = std::time::SystemTime::now();
    let since = now
        .checked_sub(config.analytics.window + config.archive.flush)
        .unwrap_or(std::time::UNIX_EPOCH);
    let started = std::time::Instant::now();
    let (spans, left_out) = match stormglass_analytics::files::load_archive_since(
        dir,
        since,
        budget.analysis_share(),
    ) {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::error!("cannot restore the window from the archive: {e}");
            return;
        }
    };
    if spans.num_rows() == 0 {
        return;
    }
    let _held = budget.force(spans.get_array_memory_size());
    match analysis.restore(spans, now).await {
        Ok(restored) => tracing::info!(
            restored_spans = restored,
            files_left_out = left_out,
            took = ?started.elapsed(),
            "rebuilt the window from the archive"
        ),
        Err(e) => tracing::error!("cannot restore the window from the archive: {e}"),
    }
}

/// Wait for a worker thread without blocking the runtime.
async fn join(thread: std::thread::JoinHandle<()>, name: &str) -> anyhow::Result<()> {
    let joined = tokio::task::spawn_blocking(move || thread.join())
        .await
        .with_context(|| format!("waiting for the {name} thread failed"))?;
    joined.map_err(|_| anyhow::anyhow!("the {name} thread panicked"))
}

/// The runtime the receivers, the API and the alert evaluator run on: one worker per core,
/// each thread at the nice value of the thread that builds it (which starts the assembly
/// and analysis threads) plus `receiver_nice`; see the module docs and docs/operating.md
/// ("Benchmarks") for what it changed. The value is computed once, here: a thread inherits
/// its creator's nice value, so adding to each new thread's own would lower blocking-pool
/// threads (started from the already lowered workers) twice.
pub fn runtime(receiver_nice: u8) -> std::io::Result<tokio::runtime::Runtime> {
    let nice = lowered(receiver_nice);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("stormglass-io")
        .on_thread_start(move || {
            if let Some(nice) = nice {
                set_nice(nice);
            }
        })
        .build()
}

/// The calling thread's nice value plus `by` (capped at 19), or `None` to leave it.
#[cfg(target_os = "linux")]
fn lowered(by: u8) -> Option<i32> {
    if by == 0 {
        return None;
    }
    match rustix::process::getpriority_process(None) {
        Ok(nice) => Some((nice + i32::from(by)).min(19)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the CPU priority; the receivers keep it");
            None
        }
    }
}

/// Set the calling thread's nice value. On Linux a thread's nice value is its own
/// (`setpriority(PRIO_PROCESS, 0)` changes the calling thread only); raising it needs no
/// privilege.
#[cfg(target_os = "linux")]
fn set_nice(nice: i32) {
    if let Err(e) = rustix::process::setpriority_process(None, nice) {
        tracing::warn!(error = %e, "cannot lower the receivers' CPU priority (limits.receiver_nice)");
    }
}

/// Elsewhere a process has one priority: the receivers keep the process's.
#[cfg(not(target_os = "linux"))]
fn lowered(_by: u8) -> Option<i32> {
    None
}

#[cfg(not(target_os = "linux"))]
fn set_nice(_nice: i32) {}

pub async fn run(config: Config) -> anyhow::Result<()> {
    let collector = Collector::start(config).await?;
    // One machine-readable line on stdout, for scripts and tests that start us on port 0.
    println!(
        "stormglass listening grpc={} http={} api={}",
        collector.grpc, collector.http, collector.api
    );
    collector.run_until_signal().await
}

/// Resolves with the name of the first SIGINT or SIGTERM.
pub async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => {
            result.context("cannot listen for SIGINT")?;
            Ok("SIGINT")
        }
        _ = term.recv() => Ok("SIGTERM"),
    }
}

/// The live-path tests' faults (`STORMGLASS_TEST_FAULTS`), read only in a build with the
/// `test-faults` feature, which tests/run.sh turns on: no other binary can be made to fail.
#[cfg(feature = "test-faults")]
fn faults_from_env() -> anyhow::Result<Faults> {
    match std::env::var("STORMGLASS_TEST_FAULTS") {
        Ok(text) => {
            Faults::parse(&text).map_err(|e| anyhow::anyhow!("STORMGLASS_TEST_FAULTS: {e}"))
        }
        Err(_) => Ok(Faults::default()),
    }
}

#[cfg(not(feature = "test-faults"))]
fn faults_from_env() -> anyhow::Result<Faults> {
    Ok(Faults::default())
}
