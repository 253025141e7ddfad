//! Where complete traces go when assembly releases them.

use std::sync::Mutex;

use arrow::array::RecordBatch;
use stormglass_runtime::{MemoryBudget, Reservation};

/// Complete traces released together: every span of each trace, a trace's rows contiguous,
/// traces in the order their first span arrived. The batch's memory stays reserved against
/// the budget for as long as the value (or the reservation taken out of it) lives.
#[derive(Debug)]
pub struct ReleasedTraces {
    pub batch: RecordBatch,
    pub traces: usize,
    pub reservation: Reservation,
}

impl ReleasedTraces {
    /// Released traces whose memory is reserved (unconditionally: they were admitted).
    pub fn reserved(batch: RecordBatch, traces: usize, budget: &MemoryBudget) -> Self {
        let reservation = budget.force(batch.get_array_memory_size());
        ReleasedTraces {
            batch,
            traces,
            reservation,
        }
    }
}

/// Receives released traces. The analysis implements it; tests use [`MemorySink`].
pub trait TraceSink: Send + Sync + 'static {
    fn release(&self, traces: ReleasedTraces);

    /// SERVER spans that arrived after their trace was released: the trace was analysed
    /// without them, but a callee stalled past `assembly.idle` reports exactly this way,
    /// and their durations are still its latency. Counted as late either way; by default
    /// nothing more is done with them.
    fn late_servers(&self, _spans: RecordBatch) {}
}

/// Keeps every released batch in memory, for tests and tools that read them back.
#[derive(Default)]
pub struct MemorySink {
    released: Mutex<Vec<ReleasedTraces>>,
    late_servers: Mutex<Vec<RecordBatch>>,
}

impl MemorySink {
    /// Take everything released so far.
    pub fn take(&self) -> Vec<ReleasedTraces> {
        std::mem::take(&mut *self.released.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Take every batch of late SERVER spans handed over so far.
    pub fn take_late_servers(&self) -> Vec<RecordBatch> {
        std::mem::take(&mut *self.late_servers.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl TraceSink for MemorySink {
    fn release(&self, traces: ReleasedTraces) {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(traces);
    }

    fn late_servers(&self, spans: RecordBatch) {
        self.late_servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(spans);
    }
}
