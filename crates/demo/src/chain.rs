//! The demo chain in one process on loopback: gateway (HTTP) -> order (HTTP) -> inventory
//! (gRPC) and payment (HTTP) -> a simulated database, each server on its own port, each
//! service with its own tracer provider. [`Chain::run`] drives entry requests at a rate for a
//! bounded time.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use opentelemetry::KeyValue;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::codegen::BoxFuture;
use tonic::transport::{Channel, Endpoint};

use crate::grpc::{self, InventoryServer, ReserveReply, ReserveRequest};
use crate::retry::{self, Attempt, Call, DEADLINE_HEADER, Incoming, Outcome, ServerSpan, Shape};
use crate::scenario::{Plan, Scenario};
use crate::telemetry::Telemetry;

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("cannot listen on loopback: {0}")]
    Listen(#[from] std::io::Error),
    #[error(transparent)]
    Exporter(#[from] crate::telemetry::ExporterError),
    #[error("cannot build an HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("cannot reach the inventory gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// What the chain counted, to check stormglass' figures against.
#[derive(Debug, Default)]
pub struct Stats {
    /// Entry requests sent, and how they ended at the gateway.
    pub requests: AtomicU64,
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    /// Load-loop ticks skipped because too many requests were in flight.
    pub skipped: AtomicU64,
    /// Retries of POST /charge sent without an idempotency key.
    pub unsafe_retries: AtomicU64,
    /// Payment requests answered 503 on purpose.
    pub payment_unavailable: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub skipped: u64,
    pub unsafe_retries: u64,
    pub payment_unavailable: u64,
}

impl Stats {
    pub fn counts(&self) -> Counts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            requests: get(&self.requests),
            succeeded: get(&self.succeeded),
            failed: get(&self.failed),
            skipped: get(&self.skipped),
            unsafe_retries: get(&self.unsafe_retries),
            payment_unavailable: get(&self.payment_unavailable),
        }
    }
}

/// Per-call counters for deterministic latencies.
#[derive(Default)]
struct Calls {
    order: AtomicU64,
    inventory: AtomicU64,
    payment: AtomicU64,
    select: AtomicU64,
    insert: AtomicU64,
}

fn next(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed) + 1
}

struct Services {
    plan: Plan,
    telemetry: Telemetry,
    http: reqwest::Client,
    order_url: String,
    payment_url: String,
    inventory: Channel,
    started: Instant,
    calls: Calls,
    stats: Arc<Stats>,
}

/// The running chain.
pub struct Chain {
    pub scenario: Scenario,
    pub gateway: SocketAddr,
    services: Arc<Services>,
    stop: watch::Sender<bool>,
    servers: JoinSet<()>,
}

impl Chain {
    /// Start every service of `scenario` on free loopback ports, exporting spans to
    /// stormglass' OTLP/gRPC (`grpc`) and OTLP/HTTP (`http`) addresses.
    pub async fn start(scenario: Scenario, grpc: &str, http: &str) -> Result<Chain, ChainError> {
        Chain::start_with(scenario, scenario.plan(), grpc, http).await
    }

    /// [`Chain::start`] with `plan` instead of the scenario's own (its clients obeying a
    /// policy file: [`Plan::with_settings`]).
    pub async fn start_with(
        scenario: Scenario,
        plan: Plan,
        grpc: &str,
        http: &str,
    ) -> Result<Chain, ChainError> {
        let telemetry = Telemetry::new(grpc, http)?;
        let (stop, stopped) = watch::channel(false);
        let mut servers = JoinSet::new();
        let listen = || TcpListener::bind("127.0.0.1:0");
        let (order, payment, inventory, gateway) = (
            listen().await?,
            listen().await?,
            listen().await?,
            listen().await?,
        );
        let (order_addr, payment_addr, inventory_addr, gateway_addr) = (
            order.local_addr()?,
            payment.local_addr()?,
            inventory.local_addr()?,
            gateway.local_addr()?,
        );
        let services = Arc::new(Services {
            plan,
            telemetry,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .build()?,
            order_url: format!("http://{order_addr}/orders"),
            payment_url: format!("http://{payment_addr}/charge"),
            inventory: Endpoint::from_shared(format!("http://{inventory_addr}"))?.connect_lazy(),
            started: Instant::now(),
            calls: Calls::default(),
            stats: Arc::new(Stats::default()),
        });

        let serve = |listener: TcpListener, router: Router, servers: &mut JoinSet<()>| {
            let mut stopped = stopped.clone();
            servers.spawn(async move {
                let shutdown = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                if let Err(e) = axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown)
                    .await
                {
                    tracing::error!(error = %e, "a demo HTTP server failed");
                }
            });
        };
        serve(
            gateway,
            Router::new()
                .route("/checkout", get(checkout))
                .with_state(services.clone()),
            &mut servers,
        );
        serve(
            order,
            Router::new()
                .route("/orders", post(orders))
                .with_state(services.clone()),
            &mut servers,
        );
        serve(
            payment,
            Router::new()
                .route("/charge", post(charge))
                .with_state(services.clone()),
            &mut servers,
        );
        let inventory_server = InventoryServer::new(Arc::new(Inventory(services.clone())));
        let mut stopped_grpc = stopped.clone();
        servers.spawn(async move {
            let shutdown = async move {
                let _ = stopped_grpc.wait_for(|s| *s).await;
            };
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(inventory_server)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(inventory),
                    shutdown,
                )
                .await
            {
                tracing::error!(error = %e, "the demo gRPC server failed");
            }
        });
        Ok(Chain {
            scenario,
            gateway: gateway_addr,
            services,
            stop,
            servers,
        })
    }

    pub fn stats(&self) -> Counts {
        self.services.stats.counts()
    }

    /// Send `rate` entry requests per second for `duration` (or until `stop` turns true),
    /// at most `max_in_flight` at once, then wait (bounded) for those in flight and export
    /// every span.
    pub async fn run(
        &self,
        rate: f64,
        duration: Duration,
        max_in_flight: usize,
        mut stop: watch::Receiver<bool>,
    ) -> Counts {
        let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let end = tokio::time::Instant::now() + duration;
        let url = format!("http://{}/checkout", self.gateway);
        let mut in_flight = JoinSet::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tokio::time::sleep_until(end) => break,
                _ = stop.wait_for(|s| *s) => break,
            }
            if tokio::time::Instant::now() >= end {
                break;
            }
            while in_flight.try_join_next().is_some() {}
            let stats = self.services.stats.clone();
            if in_flight.len() >= max_in_flight {
                stats.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let client = self.services.http.clone();
            let url = url.clone();
            stats.requests.fetch_add(1, Ordering::Relaxed);
            in_flight.spawn(async move {
                let ok = matches!(client.get(&url).send().await, Ok(r) if r.status().is_success());
                let counter = if ok { &stats.succeeded } else { &stats.failed };
                counter.fetch_add(1, Ordering::Relaxed);
            });
        }
        let drain = async { while in_flight.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(30), drain)
            .await
            .is_err()
        {
            tracing::warn!("demo requests still in flight after 30 s; abandoning them");
        }
        // Servers that ignore deadlines may still be working; let them finish their spans.
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.services.telemetry.flush();
        self.stats()
    }

    /// Stop the servers and flush every span.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        while self.servers.join_next().await.is_some() {}
        let services = self.services.clone();
        let _ = tokio::task::spawn_blocking(move || services.telemetry.shutdown()).await;
    }
}

fn status(outcome: Outcome) -> StatusCode {
    StatusCode::from_u16(outcome.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn http_attributes(method: &'static str, route: &'static str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("http.request.method", method),
        KeyValue::new("http.route", route),
    ]
}

/// Run `work` within the server's received deadline when the scenario honours deadlines;
/// returns the outcome and whether the work was cut off.
async fn bounded(
    plan: &Plan,
    deadline: Option<Instant>,
    work: impl Future<Output = Outcome>,
) -> (Outcome, bool) {
    match deadline.filter(|_| plan.honour_deadlines) {
        Some(deadline) => {
            match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), work).await {
                Ok(outcome) => (outcome, false),
                Err(_) => (Outcome::Deadline, true),
            }
        }
        None => (work.await, false),
    }
}

async fn http_post(client: &reqwest::Client, url: &str, attempt: Attempt) -> Outcome {
    match client.post(url).headers(attempt.headers).send().await {
        Ok(response) => Outcome::from_http_status(response.status().as_u16()),
        Err(_) => Outcome::Unavailable,
    }
}

/// A database call: the simulated database takes `latency`; the attempt's timeout (in
/// [`retry::call`]) cuts it off.
async fn database(latency: std::time::Duration) -> Outcome {
    tokio::time::sleep(latency).await;
    Outcome::Ok
}

async fn checkout(State(s): State<Arc<Services>>, headers: HeaderMap) -> StatusCode {
    let plan = &s.plan;
    let mut incoming = Incoming::from_headers(&headers);
    incoming.budget_ms = Some(plan.entry_budget_ms as i64);
    incoming.deadline = Some(Instant::now() + Duration::from_millis(plan.entry_budget_ms));
    let tracer = &s.telemetry.gateway;
    let server = ServerSpan::start(
        tracer,
        "GET /checkout",
        &incoming,
        true,
        false,
        http_attributes("GET", "/checkout"),
    );
    let call = Call {
        tracer,
        parent: server.context(),
        name: "POST /orders",
        callee: "order",
        shape: Shape::Sibling,
        attributes: http_attributes("POST", "/orders"),
    };
    let (outcome, _) = retry::call(call, &plan.gateway_order, incoming.deadline, |a| {
        http_post(&s.http, &s.order_url, a)
    })
    .await;
    server.finish(outcome, false);
    status(outcome)
}

/// Handlers run on the request's own task: when the caller goes away, hyper and tonic drop
/// them, and cancellation reaches the work (its spans end as cancelled). A server that
/// ignores cancellation runs the work on a detached task, which finishes regardless.
async fn handle<F>(honour_cancellation: bool, work: F) -> Outcome
where
    F: Future<Output = Outcome> + Send + 'static,
{
    if honour_cancellation {
        work.await
    } else {
        tokio::spawn(work).await.unwrap_or(Outcome::ServerError)
    }
}

async fn orders(State(s): State<Arc<Services>>, headers: HeaderMap) -> StatusCode {
    status(handle(s.plan.honour_deadlines, serve_order(s, headers)).await)
}

async fn serve_order(s: Arc<Services>, headers: HeaderMap) -> Outcome {
    let plan = &s.plan;
    let incoming = Incoming::from_headers(&headers);
    let tracer = &s.telemetry.order;
    let server = ServerSpan::start(
        tracer,
        "POST /orders",
        &incoming,
        true,
        false,
        http_attributes("POST", "/orders"),
    );
    let n = next(&s.calls.order);
    let work = async {
        tokio::time::sleep(plan.order_work.of(n)).await;
        let reserve = Call {
            tracer,
            parent: server.context(),
            name: "demo.Inventory/Reserve",
            callee: "inventory",
            shape: Shape::CallSpan,
            attributes: vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", grpc::SERVICE),
                KeyValue::new("rpc.method", "Reserve"),
            ],
        };
        let (reserved, _) = retry::call(reserve, &plan.order_inventory, incoming.deadline, |a| {
            reserve_attempt(s.inventory.clone(), a)
        })
        .await;
        if reserved != Outcome::Ok {
            return reserved;
        }
        let charge = Call {
            tracer,
            parent: server.context(),
            name: "POST /charge",
            callee: "payment",
            shape: Shape::Sibling,
            attributes: http_attributes("POST", "/charge"),
        };
        let (charged, attempts) =
            retry::call(charge, &plan.order_payment, incoming.deadline, |a| {
                http_post(&s.http, &s.payment_url, a)
            })
            .await;
        if !plan.order_payment.idempotency_key {
            s.stats
                .unsafe_retries
                .fetch_add(u64::from(attempts.saturating_sub(1)), Ordering::Relaxed);
        }
        charged
    };
    let (outcome, cut) = bounded(plan, incoming.deadline, work).await;
    server.finish(outcome, cut);
    outcome
}

/// One gRPC attempt: the budget travels as `grpc-timeout`, the trace context as metadata.
async fn reserve_attempt(channel: Channel, mut attempt: Attempt) -> Outcome {
    let propagate = attempt.headers.remove(DEADLINE_HEADER).is_some();
    let mut request = tonic::Request::from_parts(
        tonic::metadata::MetadataMap::from_headers(attempt.headers),
        tonic::Extensions::default(),
        ReserveRequest {
            sku: "sku-1".into(),
            quantity: 1,
        },
    );
    if propagate {
        request.set_timeout(attempt.timeout);
    }
    match grpc::reserve(channel, request).await {
        Ok(_) => Outcome::Ok,
        Err(status) => Outcome::from_grpc_code(status.code()),
    }
}

struct Inventory(Arc<Services>);

impl grpc::Reserve for Inventory {
    fn reserve(
        &self,
        request: tonic::Request<ReserveRequest>,
    ) -> BoxFuture<tonic::Response<ReserveReply>, tonic::Status> {
        let s = self.0.clone();
        let headers = request.metadata().clone().into_headers();
        Box::pin(async move {
            match handle(s.plan.honour_deadlines, serve_inventory(s, headers)).await {
                Outcome::Ok => Ok(tonic::Response::new(ReserveReply { reserved: true })),
                outcome => Err(tonic::Status::new(outcome.grpc_code(), outcome.class())),
            }
        })
    }
}

async fn serve_inventory(s: Arc<Services>, headers: HeaderMap) -> Outcome {
    let plan = &s.plan;
    let incoming = Incoming::from_headers(&headers);
    let tracer = &s.telemetry.inventory;
    let server = ServerSpan::start(
        tracer,
        "demo.Inventory/Reserve",
        &incoming,
        true,
        true,
        vec![
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", grpc::SERVICE),
            KeyValue::new("rpc.method", "Reserve"),
        ],
    );
    // A stop-the-world pause holds every request that arrives during it.
    if let Some(pause) = plan.inventory_pause {
        let since = s.started.elapsed();
        if since >= pause.first_after {
            let into = (since - pause.first_after).as_nanos() % pause.every.as_nanos();
            let into = Duration::from_nanos(into as u64);
            if into < pause.length {
                tokio::time::sleep(pause.length - into).await;
            }
        }
    }
    let n = next(&s.calls.inventory);
    let work = async {
        tokio::time::sleep(plan.inventory_work.of(n)).await;
        let select = Call {
            tracer,
            parent: server.context(),
            name: "SELECT stock",
            callee: "db",
            shape: Shape::Sibling,
            attributes: db_attributes("SELECT"),
        };
        let (outcome, _) = retry::call(select, &plan.inventory_db, incoming.deadline, |_| {
            database(plan.db_select.of(next(&s.calls.select)))
        })
        .await;
        outcome
    };
    let (outcome, cut) = bounded(plan, incoming.deadline, work).await;
    server.finish(outcome, cut);
    outcome
}

fn db_attributes(operation: &'static str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("db.system.name", "postgresql"),
        KeyValue::new("db.operation.name", operation),
    ]
}

async fn charge(State(s): State<Arc<Services>>, headers: HeaderMap) -> StatusCode {
    status(handle(s.plan.honour_deadlines, serve_payment(s, headers)).await)
}

async fn serve_payment(s: Arc<Services>, headers: HeaderMap) -> Outcome {
    let plan = &s.plan;
    let mut incoming = Incoming::from_headers(&headers);
    if plan.payment_drops_deadline {
        incoming.deadline = None;
        incoming.budget_ms = None;
    }
    let tracer = &s.telemetry.payment;
    let server = ServerSpan::start(
        tracer,
        "POST /charge",
        &incoming,
        true,
        false,
        http_attributes("POST", "/charge"),
    );
    let n = next(&s.calls.payment);
    if plan
        .payment_unavailable_every
        .is_some_and(|every| n.is_multiple_of(every))
    {
        s.stats.payment_unavailable.fetch_add(1, Ordering::Relaxed);
        server.finish(Outcome::Unavailable, false);
        return Outcome::Unavailable;
    }
    let work = async {
        tokio::time::sleep(plan.payment_work.of(n)).await;
        let insert = Call {
            tracer,
            parent: server.context(),
            name: "INSERT payment",
            callee: "db",
            shape: Shape::Sibling,
            attributes: db_attributes("INSERT"),
        };
        let (outcome, _) = retry::call(insert, &plan.payment_db, incoming.deadline, |_| {
            database(plan.db_insert.of(next(&s.calls.insert)))
        })
        .await;
        outcome
    };
    let (outcome, cut) = bounded(plan, incoming.deadline, work).await;
    server.finish(outcome, cut);
    outcome
}
