//! `stormglass serve`: wire receivers -> assembly -> analysis -> exports, the API, and
//! shutdown. [`Collector`] is the running collector (also what `stormglass demo` starts).
//!
//! Shutdown order matters for the accounting identity: on SIGINT/SIGTERM the receivers stop
//! first and finish in-flight requests, then assembly releases every open trace, then the
//! analysis runs its last interval over them, then the API stops. Releasing before the
//! receivers drained would turn in-flight spans into late ones.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus::Registry;
use stormglass_analytics::{
    AnalysisMetrics, Assembly, AssemblyMetrics, Engine, LiveAnalysis, TraceSink,
};
use stormglass_export::{AlertEvaluator, FigureMetrics};
use stormglass_ingest::server::ServeError;
use stormglass_ingest::{IngestMetrics, Pipeline, ReceiverConfig, Receivers};
use stormglass_model::Conventions;
use tokio::sync::watch;
use tokio::task::JoinError;
use tokio::task::JoinHandle;

use crate::api;
use crate::config::Config;

/// A running collector: receivers, assembly, live analysis with its exports, and the API.
pub struct Collector {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub api: SocketAddr,
    pub analysis: Arc<LiveAnalysis>,
    pub evaluator: Arc<AlertEvaluator>,
    /// How long a trace takes from its last span to the report: assembly idle + interval.
    settle: std::time::Duration,
    assembly: Arc<Assembly>,
    receivers_task: JoinHandle<Result<(), ServeError>>,
    stop_receivers: watch::Sender<bool>,
    stop_assembly: watch::Sender<bool>,
    stop_analysis: watch::Sender<bool>,
    stop_api: watch::Sender<bool>,
    assembly_task: JoinHandle<()>,
    analysis_task: JoinHandle<()>,
    api_task: JoinHandle<std::io::Result<()>>,
}

impl Collector {
    /// Bind every listener and start every task.
    pub async fn start(config: Config) -> anyhow::Result<Collector> {
        tracing::debug!(?config, "effective configuration");
        let registry = Registry::new();
        let ingest_metrics = IngestMetrics::register(&registry)?;
        let assembly_metrics = AssemblyMetrics::register(&registry)?;
        let figures = FigureMetrics::register(&registry, config.limits.max_series_per_metric)?;
        let evaluator = AlertEvaluator::register(
            &registry,
            config.notify.clone(),
            config.alerts.clone(),
            config.analytics.interval,
        )?;
        let analysis = Arc::new(
            LiveAnalysis::new(
                Engine::new(config.params()),
                config.alerts.clone(),
                config.analytics.clone(),
                AnalysisMetrics::register(&registry)?,
            )
            .with_observer(figures)
            .with_observer(evaluator.clone()),
        );
        let sink: Arc<dyn TraceSink> = analysis.clone();
        let assembly = Arc::new(Assembly::new(
            config.assembly.clone(),
            sink,
            assembly_metrics,
        ));
        let pipeline = Pipeline::new(
            assembly.clone(),
            Arc::new(Conventions::default()),
            ingest_metrics,
        );

        let (stop_receivers, receivers_shutdown) = watch::channel(false);
        let (stop_assembly, assembly_shutdown) = watch::channel(false);
        let (stop_analysis, analysis_shutdown) = watch::channel(false);
        let (stop_api, api_shutdown) = watch::channel(false);

        let receiver_config = ReceiverConfig {
            grpc: config.listen.grpc,
            http: config.listen.http,
            max_request_bytes: config.limits.max_request_bytes,
        };
        let receivers = Receivers::start(&receiver_config, pipeline, receivers_shutdown).await?;
        let (api_addr, api_task) = api::start(
            config.listen.api,
            api::router(
                registry,
                assembly.clone(),
                analysis.clone(),
                evaluator.clone(),
            ),
            api_shutdown,
        )
        .await?;
        evaluator.set_generator_url(format!("http://{api_addr}/api/v1/alerts"));
        let assembly_task = tokio::spawn(assembly.clone().run(assembly_shutdown));
        let analysis_task = tokio::spawn(analysis.clone().run(analysis_shutdown));
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
            assembly,
            receivers_task: tokio::spawn(receivers.wait()),
            stop_receivers,
            stop_assembly,
            stop_analysis,
            stop_api,
            assembly_task,
            analysis_task,
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
        self.shutdown(finished).await
    }

    /// Stop in order: receivers (finishing in-flight requests), assembly (releasing every
    /// open trace), the last analysis, the API.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown(None).await
    }

    async fn shutdown(
        self,
        receivers_finished: Option<Result<Result<(), ServeError>, JoinError>>,
    ) -> anyhow::Result<()> {
        let _ = self.stop_receivers.send(true);
        let receivers = match receivers_finished {
            Some(joined) => joined,
            None => self.receivers_task.await,
        };
        let _ = self.stop_assembly.send(true);
        self.assembly_task
            .await
            .context("the assembly task failed")?;
        let (open_spans, _) = self.assembly.open();
        tracing::info!(open_spans, "assembly drained");
        let _ = self.stop_analysis.send(true);
        self.analysis_task
            .await
            .context("the analysis task failed")?;
        let _ = self.stop_api.send(true);
        self.api_task.await.context("the API task failed")??;
        receivers
            .context("the receivers task failed")?
            .context("a receiver failed")?;
        Ok(())
    }
}

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
