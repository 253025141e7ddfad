//! Trace assembly: hold spans by trace id until the trace is complete, then release it whole.
//!
//! Data flow: receivers hand encoded batches to [`Assembly`] (it is their `SpanSink`). The
//! batches are kept as they arrived; each open trace records only where its rows are
//! (`(batch, row)` pairs), so holding a span costs its Arrow bytes plus 16 bytes of index
//! and no per-span allocation; `stormglass_assembly_memory_bytes` reports the total. A release loop ([`Assembly::run`]) finds traces idle for
//! `assembly.idle` or older than `assembly.max_age`, gathers their rows into one batch with
//! Arrow's `interleave`, and hands it to a [`TraceSink`]. A stored batch is dropped once none
//! of its rows belong to an open trace.
//!
//! Bounds: `assembly.max_spans` counts spans of open traces; a batch that would cross it is
//! refused whole with a retryable answer, never stored in part. Released trace ids are
//! remembered for `assembly.late_memory` so spans arriving after their trace are counted as
//! late. Accounting at any quiet moment: accepted = released + late + open.

mod config;
mod ids;
mod metrics;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::interleave;
use stormglass_ingest::{SinkFull, SpanSink};
use stormglass_model::{SPANS_SCHEMA, schema};
use tokio::sync::watch;

pub use config::AssemblyConfig;
pub use metrics::{AssemblyMetrics, ReleaseReason};

use crate::sink::{ReleasedTraces, TraceSink};
use ids::TraceIdHash;

type TraceId = [u8; 16];
type BatchId = u64;

/// Buffers spans by trace id and releases complete traces to a [`TraceSink`].
pub struct Assembly {
    config: AssemblyConfig,
    state: Mutex<State>,
    metrics: AssemblyMetrics,
    sink: Arc<dyn TraceSink>,
}

#[derive(Default)]
struct State {
    batches: HashMap<BatchId, StoredBatch>,
    next_batch: BatchId,
    traces: HashMap<TraceId, OpenTrace, TraceIdHash>,
    open_spans: usize,
    /// Arrow memory of the stored batches.
    batch_bytes: usize,
    /// Released trace ids in two generations; the older is forgotten on rotation.
    released: [HashSet<TraceId, TraceIdHash>; 2],
    rotated_at: Option<Instant>,
}

struct StoredBatch {
    batch: RecordBatch,
    /// Its Arrow memory, counted in `State::batch_bytes` while stored.
    bytes: usize,
    /// Rows of this batch that belong to open traces.
    live: usize,
}

struct OpenTrace {
    first_seen: Instant,
    last_seen: Instant,
    rows: Vec<(BatchId, u32)>,
}

impl Assembly {
    pub fn new(config: AssemblyConfig, sink: Arc<dyn TraceSink>, metrics: AssemblyMetrics) -> Self {
        metrics.limit(config.max_spans);
        Assembly {
            config,
            state: Mutex::new(State::default()),
            metrics,
            sink,
        }
    }

    pub fn config(&self) -> &AssemblyConfig {
        &self.config
    }

    /// Spans and traces held now.
    pub fn open(&self) -> (usize, usize) {
        let state = self.lock();
        (state.open_spans, state.traces.len())
    }

    /// True while more spans can be accepted; `/readyz` reports it.
    pub fn has_room(&self) -> bool {
        self.lock().open_spans < self.config.max_spans
    }

    /// Store a batch of spans that arrived at `now`.
    pub fn accept_at(&self, batch: RecordBatch, now: Instant) -> Result<(), SinkFull> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let Some(ids) = batch
            .column_by_name(schema::TRACE_ID)
            .and_then(|c| c.as_fixed_size_binary_opt())
        else {
            unreachable!("batches come from the model encoder and follow SPANS_SCHEMA");
        };
        let mut state = self.lock();
        state.rotate_released(now, self.config.late_memory);
        // Checked against the whole batch before anything is stored: refuse whole or keep whole.
        if state.open_spans + rows > self.config.max_spans {
            return Err(SinkFull {
                retry_after: self.config.idle.max(Duration::from_secs(1)),
            });
        }
        let batch_id = state.next_batch;
        state.next_batch += 1;
        let mut live = 0;
        let mut late = 0;
        for row in 0..rows {
            let Ok(id) = TraceId::try_from(ids.value(row)) else {
                unreachable!("trace_id is FixedSizeBinary(16)");
            };
            if state
                .released
                .iter()
                .any(|generation| generation.contains(&id))
            {
                late += 1;
                continue;
            }
            let trace = state.traces.entry(id).or_insert_with(|| OpenTrace {
                first_seen: now,
                last_seen: now,
                rows: Vec::new(),
            });
            trace.last_seen = now;
            trace.rows.push((batch_id, row as u32));
            live += 1;
        }
        if live > 0 {
            let bytes = batch.get_array_memory_size();
            state.batch_bytes += bytes;
            state
                .batches
                .insert(batch_id, StoredBatch { batch, bytes, live });
            state.open_spans += live;
        }
        self.metrics
            .open(state.open_spans, state.traces.len(), state.memory_bytes());
        drop(state);
        if late > 0 {
            self.metrics.late(late);
        }
        Ok(())
    }

    /// Release every trace that is due at `now`: idle for `idle` or older than `max_age`.
    /// Returns the number of traces released.
    pub fn release_due(&self, now: Instant) -> usize {
        let idle = self.config.idle;
        let max_age = self.config.max_age;
        let mut by_reason = Vec::new();
        {
            let state = self.lock();
            for (id, trace) in &state.traces {
                if now.saturating_duration_since(trace.first_seen) >= max_age {
                    by_reason.push((*id, ReleaseReason::MaxAge));
                } else if now.saturating_duration_since(trace.last_seen) >= idle {
                    by_reason.push((*id, ReleaseReason::Idle));
                }
            }
        }
        let mut released = 0;
        for reason in [ReleaseReason::MaxAge, ReleaseReason::Idle] {
            let ids: Vec<TraceId> = by_reason
                .iter()
                .filter(|(_, r)| *r == reason)
                .map(|(id, _)| *id)
                .collect();
            released += self.release(&ids, reason);
        }
        released
    }

    /// Release every open trace (graceful shutdown). Returns the number released.
    pub fn release_all(&self) -> usize {
        let ids: Vec<TraceId> = self.lock().traces.keys().copied().collect();
        self.release(&ids, ReleaseReason::Shutdown)
    }

    /// Release `ids` (ignoring any no longer open) as one batch, in first-seen order.
    fn release(&self, ids: &[TraceId], reason: ReleaseReason) -> usize {
        if ids.is_empty() {
            return 0;
        }
        let (sources, positions, traces) = {
            let mut state = self.lock();
            let mut taken: Vec<(TraceId, OpenTrace)> = ids
                .iter()
                .filter_map(|id| state.traces.remove(id).map(|t| (*id, t)))
                .collect();
            taken.sort_by_key(|(id, t)| (t.first_seen, *id));
            let (sources, positions) = state.take_rows(&taken);
            let now_released = &mut state.released[0];
            now_released.extend(taken.iter().map(|(id, _)| *id));
            self.metrics
                .open(state.open_spans, state.traces.len(), state.memory_bytes());
            (sources, positions, taken.len())
        };
        if traces == 0 {
            return 0;
        }
        let batch = gather(&sources, &positions);
        self.metrics
            .released(reason, traces as u64, batch.num_rows() as u64);
        self.sink.release(ReleasedTraces { batch, traces });
        traces
    }

    /// Run the release loop until `shutdown` turns true, then release everything left.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.tick());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.release_due(Instant::now());
                }
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
        let released = self.release_all();
        tracing::info!(traces = released, "released every open trace at shutdown");
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing the collector, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SpanSink for Assembly {
    fn accept(&self, batch: RecordBatch) -> Result<(), SinkFull> {
        self.accept_at(batch, Instant::now())
    }
}

impl State {
    /// Memory held: the stored batches' Arrow buffers plus the maps and row index (by
    /// their element sizes; allocator overhead and the rows vectors' spare capacity are not
    /// counted).
    fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        let trace_entry = size_of::<TraceId>() + size_of::<OpenTrace>() + 1;
        let batch_entry = size_of::<BatchId>() + size_of::<StoredBatch>() + 1;
        self.batch_bytes
            + self.traces.capacity() * trace_entry
            + self.batches.capacity() * batch_entry
            + self.open_spans * size_of::<(BatchId, u32)>()
    }

    /// Forget the older generation of released ids once the current one is `memory` old.
    fn rotate_released(&mut self, now: Instant, memory: Duration) {
        let rotated_at = *self.rotated_at.get_or_insert(now);
        if now.saturating_duration_since(rotated_at) >= memory {
            self.released.swap(0, 1);
            self.released[0].clear();
            self.rotated_at = Some(now);
        }
    }

    /// Detach the rows of `taken` traces: the batches they live in (cloned handles) and,
    /// per row, (index into those batches, row). Frees batches left without live rows.
    fn take_rows(
        &mut self,
        taken: &[(TraceId, OpenTrace)],
    ) -> (Vec<RecordBatch>, Vec<(usize, usize)>) {
        let mut local: HashMap<BatchId, usize> = HashMap::new();
        let mut sources = Vec::new();
        let mut positions = Vec::new();
        for (_, trace) in taken {
            for &(batch_id, row) in &trace.rows {
                let index = *local.entry(batch_id).or_insert_with(|| {
                    sources.push(self.batches[&batch_id].batch.clone());
                    sources.len() - 1
                });
                positions.push((index, row as usize));
                if let Some(stored) = self.batches.get_mut(&batch_id) {
                    stored.live -= 1;
                    if stored.live == 0 {
                        self.batch_bytes -= stored.bytes;
                        self.batches.remove(&batch_id);
                    }
                }
            }
        }
        self.open_spans -= positions.len();
        (sources, positions)
    }
}

/// Build one batch from rows of several batches, column by column.
fn gather(sources: &[RecordBatch], positions: &[(usize, usize)]) -> RecordBatch {
    let columns: Vec<ArrayRef> = (0..SPANS_SCHEMA.fields().len())
        .map(|c| {
            let arrays: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
            match interleave(&arrays, positions) {
                Ok(array) => array,
                Err(e) => unreachable!("columns of one schema interleave: {e}"),
            }
        })
        .collect();
    match RecordBatch::try_new(SPANS_SCHEMA.clone(), columns) {
        Ok(batch) => batch,
        Err(e) => unreachable!("gathered columns follow SPANS_SCHEMA: {e}"),
    }
}

#[cfg(test)]
mod tests;
