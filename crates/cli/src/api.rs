//! The API server: `/metrics` (Prometheus text exposition of the process registry),
//! `/healthz` (the process is up and none of its tasks is failing: 503 naming the task
//! after a caught panic or error, until it works again), `/readyz` (it is accepting spans:
//! under `assembly.max_spans` and not refusing for the memory budget) and `/api/v1/report` (the latest window's report, the
//! JSON of METRICS.md), `/api/v1/alerts` (the built-in evaluator's pending and firing
//! alerts).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use stormglass_analytics::LiveAnalysis;
use stormglass_assembly::Assembly;
use stormglass_export::AlertEvaluator;
use stormglass_ingest::Health;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone)]
struct ApiState {
    registry: Registry,
    assembly: Arc<Assembly>,
    analysis: Arc<LiveAnalysis>,
    evaluator: Arc<AlertEvaluator>,
    health: Health,
}

pub fn router(
    registry: Registry,
    assembly: Arc<Assembly>,
    analysis: Arc<LiveAnalysis>,
    evaluator: Arc<AlertEvaluator>,
    health: Health,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(ready))
        .route("/api/v1/report", get(report))
        .route("/api/v1/alerts", get(alerts))
        .with_state(ApiState {
            registry,
            assembly,
            analysis,
            evaluator,
            health,
        })
}

async fn healthz(State(state): State<ApiState>) -> Response {
    let failing = state.health.failing();
    if failing.is_empty() {
        return (StatusCode::OK, "ok\n").into_response();
    }
    let mut body = String::from("unhealthy:\n");
    for (task, detail) in failing {
        body.push_str(&format!("  {task}: {detail}\n"));
    }
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

async fn report(State(state): State<ApiState>) -> Response {
    json(state.analysis.report().as_ref())
}

async fn alerts(State(state): State<ApiState>) -> Response {
    json(&serde_json::json!({ "alerts": state.evaluator.alerts() }))
}

fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the response failed: {e}\n"),
        )
            .into_response(),
    }
}

/// Bind the API listener and serve until `shutdown`; returns the bound address.
pub async fn start(
    addr: SocketAddr,
    router: Router,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for the API on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(stormglass_ingest::server::wait_for(shutdown))
            .await
    });
    Ok((bound, task))
}

async fn metrics(State(state): State<ApiState>) -> Response {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&state.registry.gather(), &mut body) {
        Ok(()) => (
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

async fn ready(State(state): State<ApiState>) -> Response {
    if state.assembly.has_room() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: at assembly.max_spans or the memory budget (limits.memory); exporters are being asked to retry\n",
        )
            .into_response()
    }
}
