//! OTLP receivers for stormglass.
//!
//! Data flow: a request arrives over OTLP/gRPC ([`grpc`], tonic) or OTLP/HTTP ([`http`],
//! axum), passes [`admission`] (a request slot and a reservation against the process's
//! [`budget`]) before it is read, is checked against the limits and decoded, then goes through the shared
//! [`Pipeline`]: encoded into Arrow by the model crate, counted ([`metrics`]) and handed to a
//! [`SpanSink`] (trace assembly). Refusals of any kind are one [`IngestError`], mapped once
//! to both transports' answers.

pub mod admission;
pub mod auth;
pub mod budget;
pub mod error;
pub mod grpc;
pub mod health;
pub mod http;
pub mod metrics;
pub mod server;
pub mod sink;
pub mod tls;

pub use admission::{Admission, Admitted};
pub use auth::{AuthConfig, BearerToken, Secret};
pub use budget::{MemoryBudget, OverBudget, Reservation};
pub use error::{BodyEncoding, IngestError, Overload};
pub use health::Health;
pub use metrics::{IngestMetrics, Transport};
pub use server::{ReceiverConfig, Receivers, ServeError};
pub use sink::{Pipeline, SinkFull, SpanSink};
pub use tls::{Tls, TlsConfig, TlsError};
