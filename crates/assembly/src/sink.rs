//! Where complete traces go when assembly releases them.

use std::sync::Mutex;

use arrow::array::RecordBatch;
use stormglass_ingest::{MemoryBudget, Reservation};

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
}

/// Keeps every released batch in memory, for tests and tools that read them back.
#[derive(Default)]
pub struct MemorySink {
    released: Mutex<Vec<ReleasedTraces>>,
}

impl MemorySink {
    /// Take everything released so far.
    pub fn take(&self) -> Vec<ReleasedTraces> {
        std::mem::take(&mut *self.released.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl TraceSink for MemorySink {
    fn release(&self, traces: ReleasedTraces) {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(traces);
    }
}
