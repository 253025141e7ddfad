//! `stormglass serve`: wire receivers -> assembly -> sink, the API, and shutdown.
//!
//! Shutdown order matters for the accounting identity: on SIGINT/SIGTERM the receivers stop
//! first and finish in-flight requests, then assembly releases every open trace, then the
//! analysis runs its last interval over them, then the API stops. Releasing before the
//! receivers drained would turn in-flight spans into late ones.

use std::sync::Arc;

use anyhow::Context;
use prometheus::Registry;
use stormglass_analytics::{
    AnalysisMetrics, Assembly, AssemblyMetrics, Engine, LiveAnalysis, TraceSink,
};
use stormglass_export::{AlertEvaluator, FigureMetrics};
use stormglass_ingest::{IngestMetrics, Pipeline, ReceiverConfig, Receivers};
use stormglass_model::Conventions;
use tokio::sync::watch;

use crate::api;
use crate::config::Config;

pub async fn run(config: Config) -> anyhow::Result<()> {
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
    // One machine-readable line on stdout, for scripts and tests that start us on port 0.
    println!(
        "stormglass listening grpc={} http={} api={}",
        receivers.grpc_addr, receivers.http_addr, api_addr
    );

    let mut receivers_done = Box::pin(receivers.wait());
    let receiver_result = tokio::select! {
        signal = shutdown_signal() => {
            tracing::info!(signal = signal?, "shutting down: draining receivers");
            let _ = stop_receivers.send(true);
            receivers_done.await
        }
        result = &mut receivers_done => result,
    };

    let _ = stop_assembly.send(true);
    assembly_task.await.context("the assembly task failed")?;
    let (open_spans, _) = assembly.open();
    tracing::info!(open_spans, "assembly drained");
    let _ = stop_analysis.send(true);
    analysis_task.await.context("the analysis task failed")?;
    let _ = stop_api.send(true);
    api_task.await.context("the API task failed")??;
    receiver_result.context("a receiver failed")?;
    Ok(())
}

/// Resolves with the name of the first SIGINT or SIGTERM.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
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
