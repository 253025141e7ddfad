//! OTLP receivers for stormglass.
//!
//! Data flow: a request arrives over OTLP/gRPC ([`grpc`], tonic) or OTLP/HTTP ([`http`],
//! axum), is checked against the limits and decoded, then goes through the shared
//! [`Pipeline`]: encoded into Arrow by the model crate, counted ([`metrics`]) and handed to a
//! [`SpanSink`] (trace assembly). Refusals of any kind are one [`IngestError`], mapped once
//! to both transports' answers.

pub mod error;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod server;
pub mod sink;

pub use error::{BodyEncoding, IngestError};
pub use metrics::{IngestMetrics, Transport};
pub use server::{ReceiverConfig, Receivers, ServeError};
pub use sink::{Pipeline, SinkFull, SpanSink};
