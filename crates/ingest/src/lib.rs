//! OTLP receivers for stormglass.
//!
//! Data flow: a request arrives over OTLP/gRPC ([`grpc`], tonic) or OTLP/HTTP ([`http`],
//! axum), passes [`admission`] (a request slot and a reservation against the process's
//! `stormglass_runtime::budget`) before it is read, is checked against the limits and decoded, then goes through the shared
//! [`Pipeline`]: encoded into Arrow by the model crate, counted ([`metrics`]) and handed to a
//! `SpanSink` of the runtime crate (trace assembly). Refusals of any kind are one [`IngestError`], mapped once
//! to both transports' answers.

pub mod admission;
pub mod error;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod server;
pub mod sink;

pub use admission::{Admission, Admitted};
pub use error::{BodyEncoding, IngestError};
pub use metrics::{IngestMetrics, Transport};
pub use server::{ReceiverConfig, Receivers, ServeError};
pub use sink::Pipeline;
