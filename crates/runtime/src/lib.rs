//! What every stage of stormglass shares and no stage owns: the one memory budget
//! ([`budget`]) and what it reads of the process's memory ([`memory`]), health ([`health`]), secrets and bearer tokens ([`auth`]), TLS ([`tls`]),
//! graceful shutdown ([`shutdown`]), durations in configuration ([`duration`]), the
//! contract between the receivers and the stores of their batches ([`sink`]), and the retry
//! budget replay runs and the demo's clients obey ([`retry_budget`]).
//!
//! The stages (ingest -> archive -> assembly -> analytics -> export) depend on this crate,
//! never on each other for these.

pub mod auth;
pub mod budget;
pub mod config_tree;
pub mod duration;
pub mod health;
pub mod memory;
pub mod retry_budget;
pub mod shutdown;
pub mod sink;
pub mod tls;

pub use auth::{AuthConfig, BearerToken, Secret};
pub use budget::{MemoryBudget, OverBudget, Reservation};
pub use health::Health;
pub use sink::{Overload, SinkFull, SpanSink};
pub use tls::{Tls, TlsConfig, TlsError};
