//! The API server: `/` (the built-in page: budget topology, alerts, per-edge figures),
//! `/metrics` (Prometheus text exposition of the process registry),
//! `/healthz` (the process is up and none of its tasks is failing: 503 naming the task
//! after a caught panic or error, until it works again), `/readyz` (it is accepting spans:
//! under `assembly.max_spans` and not refusing for the memory budget) and `/api/v1/report` (the latest window's report, the
//! JSON of docs/commands.md, its worst edges and layers unless asked for all or filtered), `/api/v1/alerts` (the built-in evaluator's pending and firing
//! alerts), `/runbooks` (the runbook of every alert, where their `runbook_url` points). With
//! `auth.api_token` set, every route but `/healthz`, `/readyz` (probes carry no token) and
//! `/runbooks` (opened from alert notifications) requires `authorization: Bearer <token>` and answers 401 without it; with
//! `tls.*` set, the API is served over TLS like the receivers.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use stormglass_analytics::LiveAnalysis;
use stormglass_analytics::advice::Advice;
use stormglass_analytics::report::{DEFAULT_LIMIT, Report, Selection};
use stormglass_assembly::Assembly;
use stormglass_export::AlertEvaluator;
use stormglass_ingest::server::serve_http;
use stormglass_runtime::{BearerToken, Health, Tls};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone)]
struct ApiState {
    registry: Registry,
    assembly: Arc<Assembly>,
    analysis: Arc<LiveAnalysis>,
    evaluator: Arc<AlertEvaluator>,
    health: Health,
    /// The built-in page, `links.trace_url` filled in (shared by every response, not copied).
    page: Bytes,
    /// The advice made from the latest window's report, made once per window (the page
    /// asks for it on every refresh).
    advice: Arc<Mutex<Option<AdviceOf>>>,
}

/// Advice and the report it was made from, held weakly: a strong hold would make the
/// analysis copy the whole report to update its window in place.
type AdviceOf = (std::sync::Weak<Report>, Arc<Advice>);

impl ApiState {
    /// The advice for `report`, made once per report.
    fn advice_of(&self, report: &Arc<Report>) -> Arc<Advice> {
        let mut cached = self.advice.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((of, advice)) = cached.as_ref()
            && of.upgrade().is_some_and(|of| Arc::ptr_eq(&of, report))
        {
            return advice.clone();
        }
        let advice = Arc::new(stormglass_analytics::advice::advise(
            report,
            &self.analysis.advice_params(),
        ));
        *cached = Some((Arc::downgrade(report), advice.clone()));
        advice
    }
}

/// The built-in page (`GET /`), embedded in the binary: no asset from the network.
const PAGE: &str = include_str!("page.html");

/// The page with `links.trace_url` filled in as a JavaScript string (or null), escaped so
/// that no template can close the script.
fn page(trace_url: Option<&str>) -> Bytes {
    let template = serde_json::to_string(&trace_url)
        .unwrap_or_else(|_| "null".to_owned())
        .replace("</", "<\\/");
    Bytes::from(PAGE.replace("__STORMGLASS_TRACE_URL__", &template))
}

pub fn router(
    registry: Registry,
    assembly: Arc<Assembly>,
    analysis: Arc<LiveAnalysis>,
    evaluator: Arc<AlertEvaluator>,
    health: Health,
    token: Option<BearerToken>,
    trace_url: Option<&str>,
) -> Router {
    let mut protected = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/api/v1/report", get(report))
        .route("/api/v1/alerts", get(alerts))
        .route("/api/v1/whatif", get(whatif))
        .route("/api/v1/advice", get(advice));
    if let Some(token) = token {
        protected = protected.layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let admitted = token.admits(request.headers().get(header::AUTHORIZATION));
                async move {
                    if admitted {
                        next.run(request).await
                    } else {
                        (
                            StatusCode::UNAUTHORIZED,
                            [(header::WWW_AUTHENTICATE, "Bearer")],
                            "missing or wrong bearer token: send the header authorization: Bearer <auth.api_token>\n",
                        )
                            .into_response()
                    }
                }
            },
        ));
    }
    protected
        .route("/healthz", get(healthz))
        .route("/readyz", get(ready))
        .route("/runbooks", get(runbooks))
        .with_state(ApiState {
            registry,
            assembly,
            analysis,
            evaluator,
            health,
            page: page(trace_url),
            advice: Arc::default(),
        })
}

async fn index(State(state): State<ApiState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        state.page,
    )
        .into_response()
}

/// The URL others reach the API at, for links in alerts: the bound address, or this
/// machine's host name when bound to every interface (`0.0.0.0`, `[::]`).
pub fn advertised_url(scheme: &str, addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        format!("{scheme}://{host}:{}", addr.port())
    } else {
        format!("{scheme}://{addr}")
    }
}

async fn runbooks() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        crate::runbooks::PAGE.as_str(),
    )
        .into_response()
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

/// `/api/v1/report[?limit=N][&service=S][&caller=S][&callee=S][&all=true]`: the latest
/// window's report, by default its worst [`DEFAULT_LIMIT`] edges and layers with `listing`
/// saying how many there are (400 naming what is expected for a malformed parameter).
async fn report(
    State(state): State<ApiState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    match selection(query.as_deref().unwrap_or_default(), &[]) {
        Ok(selection) => match state.analysis.report() {
            Some(report) => json(&report.select(&selection)),
            None => rebuilding(),
        },
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

/// 503 + `Retry-After`: no report to answer with, while the next is built: the last was
/// let go so that the build stays within `limits.memory` (a wide window under memory
/// pressure), or none has been built yet, or the last build failed (/healthz says).
fn rebuilding() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        "the window's report is being built (the last one was let go to stay within \
         limits.memory, or its build failed: /healthz names a failing analysis); retry \
         shortly\n",
    )
        .into_response()
}

/// The report selection a query string asks for; `also` names the endpoint's own keys.
fn selection(query: &str, also: &[&str]) -> Result<Selection, String> {
    let mut selection = Selection {
        limit: Some(DEFAULT_LIMIT),
        ..Selection::default()
    };
    let mut all = false;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let value = value.into_owned();
        match key.as_ref() {
            "limit" => {
                selection.limit = Some(value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("limit={value}: expected a number of edges and layers above 0")
                })?)
            }
            "all" => {
                all = value
                    .parse()
                    .map_err(|_| format!("all={value}: expected true or false"))?
            }
            "service" => selection.service = Some(value),
            "caller" => selection.caller = Some(value),
            "callee" => selection.callee = Some(value),
            other if also.contains(&other) => {}
            other => {
                let own: String = also.iter().map(|key| format!("{key}, ")).collect();
                return Err(format!(
                    "{other}: unknown parameter; expected {own}limit, service, caller, callee \
                     or all"
                ));
            }
        }
    }
    if all {
        selection.limit = None;
    }
    Ok(selection)
}

/// `/api/v1/advice[?limit=N][&service=S][&caller=S][&callee=S][&all=true]`: the advice for
/// the latest window (made from all of it), listing the edges and layers the same query
/// lists of `/api/v1/report`.
async fn advice(
    State(state): State<ApiState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    match selection(query.as_deref().unwrap_or_default(), &[]) {
        Ok(selection) => {
            let Some(report) = state.analysis.report() else {
                return rebuilding();
            };
            json(&state.advice_of(&report).listed(&report.select(&selection)))
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

/// `/api/v1/whatif?fail=SERVICE:P[&fail=...][&limit=N][&service=S][&caller=S][&callee=S]
/// [&all=true]`: the what-if over the latest window's report, the worst layers and edges
/// under the failures listed as `/api/v1/report` lists (400 with what is expected for a
/// missing or malformed `fail`, or a service the window has not seen).
async fn whatif(
    State(state): State<ApiState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let bad = |message: String| (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response();
    let query = query.unwrap_or_default();
    let selection = match selection(&query, &["fail"]) {
        Ok(selection) => selection,
        Err(e) => return bad(e),
    };
    let failures: Result<Vec<(String, f64)>, String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == "fail")
        .map(|(_, value)| stormglass_analytics::whatif::parse_failure(&value))
        .collect();
    let failures = match failures {
        Ok(f) if !f.is_empty() => f,
        Ok(_) => return bad("expected ?fail=SERVICE:P, e.g. ?fail=db:1 (repeatable)".into()),
        Err(e) => return bad(e),
    };
    let Some(report) = state.analysis.report() else {
        return rebuilding();
    };
    if let Some(unknown) = stormglass_analytics::whatif::unknown_service(&report, &failures) {
        return bad(format!("fail={unknown}: no such service in the window"));
    }
    json(&stormglass_analytics::whatif::what_if(&report, &failures, None).listed(&selection))
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

/// Bind the API listener and serve until `shutdown` (over `tls` when set); returns the
/// bound address.
pub async fn start(
    addr: SocketAddr,
    router: Router,
    tls: Option<&Tls>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for the API on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let task = match tls {
        None => tokio::spawn(serve_http(listener, router, shutdown)),
        Some(tls) => {
            let listener = tls.listen(listener, "api", shutdown.clone())?;
            tokio::spawn(serve_http(listener, router, shutdown))
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The report's query parameters: the default limit, filters, `all`, an endpoint's own
    /// keys, and a 400's text.
    #[test]
    fn report_parameters_select() {
        assert_eq!(selection("", &[]).unwrap().limit, Some(DEFAULT_LIMIT));
        let around = selection("service=db&limit=5", &[]).unwrap();
        assert_eq!(around.service.as_deref(), Some("db"));
        assert_eq!(around.limit, Some(5));
        assert_eq!(selection("all=true&caller=web", &[]).unwrap().limit, None);
        assert!(selection("limit=0", &[]).unwrap_err().contains("above 0"));
        assert!(
            selection("edges=1", &[])
                .unwrap_err()
                .contains("unknown parameter")
        );
        let whatif = selection("fail=db:1&limit=3", &["fail"]).unwrap();
        assert_eq!(whatif.limit, Some(3));
        assert!(selection("fail=db:1", &[]).is_err());
    }

    /// The trace link template is written into the page as a JavaScript string: no
    /// template, however hostile, can close the script; none is `null`.
    #[test]
    fn page_embeds_the_trace_url_safely() {
        let text = |p: Bytes| String::from_utf8(p.to_vec()).unwrap();
        let hostile = text(page(Some(
            "http://x/</script><script>alert(1)</script>{trace_id}",
        )));
        assert!(!hostile.contains("</script><script>alert(1)"));
        assert!(hostile.contains(
            r#"const TRACE_URL = "http://x/<\/script><script>alert(1)<\/script>{trace_id}";"#
        ));
        assert!(text(page(None)).contains("const TRACE_URL = null;"));
        assert!(!PAGE.is_empty() && !text(page(None)).contains("__STORMGLASS_TRACE_URL__"));
    }
}
