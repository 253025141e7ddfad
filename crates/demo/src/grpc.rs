//! The inventory service's gRPC protocol, `demo.Inventory/Reserve`, served and called with
//! tonic. The messages are prost structs declared here (no .proto build step); the server
//! and client follow what tonic's code generator writes for a unary method.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{NamedService, UnaryService};
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

pub const SERVICE: &str = "demo.Inventory";
pub const RESERVE: &str = "/demo.Inventory/Reserve";

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReserveRequest {
    #[prost(string, tag = "1")]
    pub sku: String,
    #[prost(uint32, tag = "2")]
    pub quantity: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReserveReply {
    #[prost(bool, tag = "1")]
    pub reserved: bool,
}

/// What the inventory server does for `Reserve`.
pub trait Reserve: Send + Sync + 'static {
    fn reserve(
        &self,
        request: tonic::Request<ReserveRequest>,
    ) -> BoxFuture<tonic::Response<ReserveReply>, tonic::Status>;
}

/// The tonic service routing `Reserve` to a [`Reserve`] implementation.
pub struct InventoryServer<R> {
    inner: Arc<R>,
}

impl<R> InventoryServer<R> {
    pub fn new(inner: Arc<R>) -> Self {
        InventoryServer { inner }
    }
}

impl<R> Clone for InventoryServer<R> {
    fn clone(&self) -> Self {
        InventoryServer {
            inner: self.inner.clone(),
        }
    }
}

impl<R> NamedService for InventoryServer<R> {
    const NAME: &'static str = SERVICE;
}

struct ReserveService<R>(Arc<R>);

impl<R: Reserve> UnaryService<ReserveRequest> for ReserveService<R> {
    type Response = ReserveReply;
    type Future = BoxFuture<tonic::Response<ReserveReply>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<ReserveRequest>) -> Self::Future {
        self.0.reserve(request)
    }
}

impl<R, B> Service<http::Request<B>> for InventoryServer<R>
where
    R: Reserve,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != RESERVE {
            let status = tonic::Status::unimplemented(format!("{} is not served", request.uri()));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let service = ReserveService(self.inner.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
            Ok(grpc.unary(service, request).await)
        })
    }
}

/// Call `Reserve` on `channel`.
pub async fn reserve(
    channel: Channel,
    request: tonic::Request<ReserveRequest>,
) -> Result<tonic::Response<ReserveReply>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("inventory not ready: {e}")))?;
    grpc.unary(
        request,
        http::uri::PathAndQuery::from_static(RESERVE),
        ProstCodec::default(),
    )
    .await
}
