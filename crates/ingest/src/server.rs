//! Binding and running both receivers until a shutdown signal.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::Admission;
use crate::sink::Pipeline;
use crate::{grpc, http};
use stormglass_runtime::auth::BearerToken;
use stormglass_runtime::budget::MemoryBudget;
use stormglass_runtime::shutdown::wait_for;
use stormglass_runtime::tls::Tls;

/// Where and how the receivers listen.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// Largest request accepted, measured after decompression.
    pub max_request_bytes: usize,
    /// Requests read, decoded and stored at once, over both transports.
    pub max_concurrent_requests: usize,
    /// The process's memory budget, which requests reserve before they are read.
    pub memory: MemoryBudget,
    /// TLS on both listeners (`tls.*`), when configured.
    pub tls: Option<Tls>,
    /// The bearer token every request must carry (`auth.token`), when configured.
    pub token: Option<BearerToken>,
    /// Longest a request's body may take to arrive (`limits.request_timeout`).
    pub request_timeout: std::time::Duration,
}

/// Receivers that are bound and serving.
pub struct Receivers {
    /// The bound gRPC address (the real port when configured with port 0).
    pub grpc_addr: SocketAddr,
    /// The bound HTTP address.
    pub http_addr: SocketAddr,
    tasks: JoinSet<Result<(), ServeError>>,
}

/// A receiver could not bind or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen for OTLP/{transport} on {addr}")]
    Bind {
        transport: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the OTLP/gRPC server failed")]
    Grpc(#[source] tonic::transport::Error),
    #[error("the OTLP/HTTP server failed")]
    Http(#[source] std::io::Error),
    #[error("cannot start TLS on the OTLP/{transport} listener")]
    Tls {
        transport: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl Receivers {
    /// Bind both listeners, then serve until `shutdown` turns true. Binding happens before
    /// this returns, so the addresses are live when the caller logs them.
    pub async fn start(
        config: &ReceiverConfig,
        pipeline: Pipeline,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Receivers, ServeError> {
        let bind = |transport, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind {
                    transport,
                    addr,
                    source,
                })
        };
        let grpc_listener = bind("gRPC", config.grpc).await?;
        let http_listener = bind("HTTP", config.http).await?;
        let local = |l: &TcpListener, transport, addr| {
            l.local_addr().map_err(|source| ServeError::Bind {
                transport,
                addr,
                source,
            })
        };
        let grpc_addr = local(&grpc_listener, "gRPC", config.grpc)?;
        let http_addr = local(&http_listener, "HTTP", config.http)?;

        let mut tasks = JoinSet::new();
        let metrics = pipeline.metrics().clone();
        let admission = Admission::new(
            config.memory.clone(),
            config.max_concurrent_requests,
            config.max_request_bytes,
        )
        .with_token(config.token.clone())
        .with_body_timeout(config.request_timeout);
        let admit = grpc::AdmissionLayer::new(admission.clone(), metrics.clone());
        let grpc_service = grpc::service(pipeline.clone(), config.max_request_bytes);
        let signal = wait_for(shutdown.clone());
        let grpc_router = tonic::transport::Server::builder()
            .layer(tower::util::MapResponseLayer::new(move |response| {
                grpc::remap_status(&metrics, response)
            }))
            .layer(admit)
            .add_service(grpc_service);
        let router = http::router(pipeline, admission);
        let http_shutdown = shutdown.clone();
        match &config.tls {
            None => {
                tasks.spawn(async move {
                    grpc_router
                        .serve_with_incoming_shutdown(
                            tonic::transport::server::TcpIncoming::from(grpc_listener),
                            signal,
                        )
                        .await
                        .map_err(ServeError::Grpc)
                });
                let http = serve_http(http_listener, router, http_shutdown);
                tasks.spawn(async move { http.await.map_err(ServeError::Http) });
            }
            Some(tls) => {
                let tls_error = |transport| move |source| ServeError::Tls { transport, source };
                let grpc_listener = tls
                    .listen(grpc_listener, "grpc", shutdown.clone())
                    .map_err(tls_error("gRPC"))?;
                let http_listener = tls
                    .listen(http_listener, "http", shutdown)
                    .map_err(tls_error("HTTP"))?;
                tasks.spawn(async move {
                    grpc_router
                        .serve_with_incoming_shutdown(grpc_listener.into_stream(), signal)
                        .await
                        .map_err(ServeError::Grpc)
                });
                let http = serve_http(http_listener, router, http_shutdown);
                tasks.spawn(async move { http.await.map_err(ServeError::Http) });
            }
        }
        Ok(Receivers {
            grpc_addr,
            http_addr,
            tasks,
        })
    }

    /// Wait until both servers have stopped (after shutdown, or on the first failure).
    pub async fn wait(mut self) -> Result<(), ServeError> {
        while let Some(joined) = self.tasks.join_next().await {
            match joined {
                Ok(result) => result?,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => {}
            }
        }
        Ok(())
    }
}

/// Serve `router` on `listener` (plain TCP or [`stormglass_runtime::tls::TlsListener`]) until `shutdown`,
/// finishing the requests in flight.
pub fn serve_http<L>(
    listener: L,
    router: axum::Router,
    shutdown: watch::Receiver<bool>,
) -> impl Future<Output = std::io::Result<()>> + Send + 'static
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    axum::serve(listener, router)
        .with_graceful_shutdown(wait_for(shutdown))
        .into_future()
}
