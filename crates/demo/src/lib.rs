//! The stormglass demo: a small chain of services (gateway -> order -> inventory over gRPC
//! and payment over HTTP -> a simulated database) in one process on loopback, instrumented
//! with the real OpenTelemetry SDK and exporting through `opentelemetry-otlp`. Each
//! [`Scenario`] replays one failure mode stormglass finds with real retry loops, per-attempt
//! timeouts, deadline propagation and servers that honour cancellation or not.

pub mod chain;
pub mod grpc;
pub mod load;
pub mod retry;
pub mod scenario;
pub mod telemetry;

pub use chain::{Chain, ChainError, Counts};
pub use scenario::{EdgeSetting, Plan, Scenario};
