//! The contract between the receivers and what stores their batches (trace assembly, the
//! archive): a sink stores a whole batch or refuses it whole, naming the bound it hit.

use std::time::Duration;

use arrow::array::RecordBatch;

/// Which bound a retryable refusal hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overload {
    /// `limits.memory`: the bytes held would cross the budget.
    Memory,
    /// `assembly.max_spans`: the spans held would cross the count.
    Spans,
    /// `limits.max_concurrent_requests`: too many requests in flight.
    Concurrency,
}

impl Overload {
    /// The `reason` label of the refusal counters.
    pub fn reason(self) -> &'static str {
        match self {
            Overload::Memory => "memory_limit",
            Overload::Spans => "max_spans",
            Overload::Concurrency => "concurrency",
        }
    }

    /// What the bound is, for the refusal's message.
    pub fn describe(self) -> &'static str {
        match self {
            Overload::Memory => "memory budget (limits.memory)",
            Overload::Spans => "span limit (assembly.max_spans)",
            Overload::Concurrency => {
                "limit of concurrent requests (limits.max_concurrent_requests)"
            }
        }
    }
}

/// The sink is over one of its bounds: nothing was stored, the client should retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkFull {
    /// When a retry is likely to succeed.
    pub retry_after: Duration,
    /// The bound that would have been crossed.
    pub limit: Overload,
}

/// Receives every batch of valid spans. Implementations either store the whole batch or
/// refuse it whole: a batch is never partly kept.
pub trait SpanSink: Send + Sync + 'static {
    fn accept(&self, batch: RecordBatch) -> Result<(), SinkFull>;
}
