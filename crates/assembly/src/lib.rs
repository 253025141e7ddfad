//! Trace assembly: hold spans by trace id until the trace is complete, then release it whole.
//!
//! Data flow: receivers hand encoded batches to [`Assembly`] (it is their `SpanSink`).
//! A batch is first put in the held form ([`stormglass_model::hold`]: only the columns the
//! analysis reads, the repetitive strings dictionary-encoded), its memory is reserved
//! against the process's budget (`limits.memory`), and it is stored once, shared by the
//! rows of the traces it holds: each open trace keeps `(batch, row)` pairs, and a batch is
//! freed, its reservation returned, with the last row pointing into it.
//!
//! Open traces live in [`SHARDS`] shards chosen by trace id, each behind its own lock, so
//! receivers storing different traces do not wait on one another. Each shard keeps two
//! queues in time order (last activity, first arrival): the release loop
//! ([`Assembly::run_blocking`], on its own thread) pops the traces idle for `assembly.idle` or
//! older than `assembly.max_age` from their fronts instead of scanning every open trace.
//! Released traces are gathered into batches of at most a chunk's bytes, widened back to
//! the span schema as they are ([`stormglass_model::widen_rows`]), and handed to a
//! [`TraceSink`] (the analysis) with their reservation.
//!
//! A batch whose rows are mostly released but still pinned by a few long-lived traces is
//! compacted: its live rows are copied into a small batch and the big one is freed, so one
//! long trace does not keep its neighbours' memory until `assembly.max_age`.
//!
//! Bounds: a batch that would cross `assembly.max_spans` or the memory budget is refused
//! whole with a retryable answer, never stored in part. A trace that grows to a quarter of
//! the analysis's share of the budget (at most 256 MiB) is released at once (`reason="max_size"`; its later spans are late), so no
//! released batch comes near Arrow's 2 GiB of string offsets per column. Released trace ids are remembered
//! (`assembly.released_ids`, sized from the budget by default, the oldest half forgotten when
//! full) so spans arriving after their trace are counted as late: at 5,000 traces a second a
//! 1 GiB budget remembers the last 200 s or more, rather than a fixed minute.
//! A span seen twice in an open trace (same span id: exporters retry requests whose answer
//! was lost, and re-send batches) is kept once and counted as a duplicate.
//! Accounting at any quiet moment: accepted = released + late + open + duplicates.

mod config;
mod metrics;
pub mod sink;

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow::array::{ArrayAccessor, AsArray, RecordBatch, StringArray, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::UInt8Type;
use stormglass_model::{HELD_SCHEMA, hold, schema, widen_rows};
use stormglass_runtime::health::panic_message;
use stormglass_runtime::{Health, MemoryBudget, Overload, Reservation, SinkFull, SpanSink};
use tokio::sync::watch;

pub use config::AssemblyConfig;
pub use metrics::{AssemblyMetrics, ReleaseReason};
pub use sink::{MemorySink, ReleasedTraces, TraceSink};

use stormglass_model::hash::KeyedHash;

type TraceId = [u8; 16];

/// Number of independently locked parts of the open-trace map.
pub const SHARDS: usize = 16;

/// Index and map memory per held span, on top of its Arrow bytes: the `(batch, row)` pair
/// and a share of the trace's map entry and queue entries. Reserved with the batch.
const INDEX_BYTES_PER_SPAN: usize = size_of::<Row>() + 16;

/// Up to this many spans, a trace finds duplicates by scanning its rows' span ids; beyond,
/// it keeps them in a set.
const SCAN_SPANS: usize = 32;

/// A batch compacts once at most 1/`COMPACT_WHEN` of its rows are still open...
const COMPACT_WHEN: usize = 8;
/// ...and it holds at least this much memory (smaller ones are not worth the copy).
const COMPACT_MIN_BYTES: usize = 64 << 10;

/// Memory of one remembered released trace id (16 bytes in a hash set: control bytes and
/// spare capacity included), for sizing `assembly.released_ids` from the budget.
pub const RELEASED_ID_BYTES: usize = 32;

/// Upper bound of a released chunk, far below Arrow's 2 GiB of string offsets per column.
const MAX_CHUNK_BYTES: usize = 256 << 20;

/// Buffers spans by trace id and releases complete traces to a [`TraceSink`].
pub struct Assembly {
    config: AssemblyConfig,
    shards: Vec<Mutex<Shard>>,
    hash: KeyedHash,
    metrics: AssemblyMetrics,
    sink: Arc<dyn TraceSink>,
    budget: MemoryBudget,
    /// Largest batch handed to the sink at once (Arrow bytes, estimated from the sources).
    chunk_bytes: usize,
    /// A trace reaching this many bytes is released at once (`reason="max_size"`).
    max_trace_bytes: usize,
    open_spans: AtomicUsize,
    open_traces: AtomicUsize,
    /// Arrow memory of the stored batches.
    held_bytes: Arc<AtomicUsize>,
}

/// A stored batch, shared by the rows of open traces that point into it; freed, with its
/// reservation, when the last of them goes.
struct StoredBatch {
    batch: RecordBatch,
    bytes: usize,
    held: Arc<AtomicUsize>,
    _reservation: Reservation,
}

impl Drop for StoredBatch {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

type Row = (Arc<StoredBatch>, u32);

struct Shard {
    traces: HashMap<TraceId, OpenTrace, KeyedHash>,
    /// (last activity, id) in time order; an entry is stale once the trace saw later activity.
    idle: VecDeque<(Instant, TraceId)>,
    /// (first arrival, id) in time order.
    age: VecDeque<(Instant, TraceId)>,
    /// Traces that reached the chunk size, released at the next round.
    full: Vec<TraceId>,
    /// Released trace ids in two generations; when the newer is full, the older is
    /// forgotten and the newer takes its place.
    released: [HashSet<TraceId, KeyedHash>; 2],
    /// Ids per generation: the shard's part of `assembly.released_ids`, halved.
    ids_per_generation: usize,
}

struct OpenTrace {
    first_seen: Instant,
    last_seen: Instant,
    rows: Vec<Row>,
    /// Span ids of `rows`, once the trace is too long to scan them (see [`SCAN_SPANS`]).
    span_ids: Option<HashSet<u64, KeyedHash>>,
    /// Arrow bytes of its rows, estimated from their batches' average row.
    bytes: usize,
}

impl Assembly {
    pub fn new(
        config: AssemblyConfig,
        sink: Arc<dyn TraceSink>,
        metrics: AssemblyMetrics,
        budget: MemoryBudget,
    ) -> Self {
        let released_ids = match config.released_ids {
            0 => budget.limit() / 32 / RELEASED_ID_BYTES,
            n => n,
        };
        metrics.limit(config.max_spans, released_ids);
        let ids_per_generation = (released_ids / SHARDS / 2).max(1);
        let hash = KeyedHash::default();
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    traces: HashMap::with_hasher(hash),
                    idle: VecDeque::new(),
                    age: VecDeque::new(),
                    full: Vec::new(),
                    released: [HashSet::with_hasher(hash), HashSet::with_hasher(hash)],
                    ids_per_generation,
                })
            })
            .collect();
        let chunk_bytes = budget.chunk_bytes().min(MAX_CHUNK_BYTES);
        let max_trace_bytes = (budget.analysis_share() / 4).clamp(chunk_bytes, MAX_CHUNK_BYTES);
        Assembly {
            config,
            shards,
            hash,
            metrics,
            sink,
            budget,
            chunk_bytes,
            max_trace_bytes,
            open_spans: AtomicUsize::new(0),
            open_traces: AtomicUsize::new(0),
            held_bytes: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn config(&self) -> &AssemblyConfig {
        &self.config
    }

    /// Spans and traces held now.
    pub fn open(&self) -> (usize, usize) {
        (
            self.open_spans.load(Ordering::Relaxed),
            self.open_traces.load(Ordering::Relaxed),
        )
    }

    /// True while more spans can be accepted; `/readyz` reports it.
    pub fn has_room(&self) -> bool {
        self.open_spans.load(Ordering::Relaxed) < self.config.max_spans && !self.budget.refusing()
    }

    /// Memory held for open traces: the stored batches' Arrow buffers plus the index.
    pub fn memory_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Relaxed)
            + self.open_spans.load(Ordering::Relaxed) * INDEX_BYTES_PER_SPAN
    }

    /// Store a batch of spans that arrived at `now`, or refuse it whole.
    pub fn accept_at(&self, batch: RecordBatch, now: Instant) -> Result<(), SinkFull> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        // Checked against the whole batch before anything is stored: refuse whole or keep whole.
        let before = self.open_spans.fetch_add(rows, Ordering::Relaxed);
        if before + rows > self.config.max_spans {
            self.open_spans.fetch_sub(rows, Ordering::Relaxed);
            return Err(SinkFull {
                retry_after: self.config.idle.max(Duration::from_secs(1)),
                limit: Overload::Spans,
            });
        }
        let batch = hold(&batch);
        let bytes = batch.get_array_memory_size();
        let reservation = match self.budget.try_reserve(bytes + rows * INDEX_BYTES_PER_SPAN) {
            Ok(r) => r,
            Err(_) => {
                self.open_spans.fetch_sub(rows, Ordering::Relaxed);
                return Err(SinkFull {
                    retry_after: Duration::from_secs(1),
                    limit: Overload::Memory,
                });
            }
        };
        self.held_bytes.fetch_add(bytes, Ordering::Relaxed);
        let stored = Arc::new(StoredBatch {
            batch,
            bytes,
            held: self.held_bytes.clone(),
            _reservation: reservation,
        });
        let ids = trace_ids(&stored.batch);
        let span_ids = span_ids(&stored.batch);
        let row_bytes = bytes / rows;
        let mut by_shard: Vec<Vec<u32>> = vec![Vec::new(); SHARDS];
        for row in 0..rows {
            by_shard[self.shard_of(&trace_id(ids, row))].push(row as u32);
        }
        let (mut late, mut opened, mut duplicates) = (0, 0, 0);
        // (batch, row) of the late SERVER spans, as widen_rows reads them.
        let mut late_servers: Vec<(usize, usize)> = Vec::new();
        let kinds = match stored
            .batch
            .column_by_name(schema::KIND)
            .and_then(|c| c.as_dictionary_opt::<UInt8Type>())
            .and_then(|c| c.downcast_dict::<StringArray>())
        {
            Some(kinds) => kinds,
            None => unreachable!("held batches follow HELD_SCHEMA"),
        };
        for (index, rows) in by_shard.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let mut shard = self.shard(index);
            for &row in rows {
                let id = trace_id(ids, row as usize);
                if shard.is_released(&id) {
                    late += 1;
                    if kinds.value(row as usize) == "server" {
                        late_servers.push((0, row as usize));
                    }
                    continue;
                }
                let shard = &mut *shard;
                let trace = match shard.traces.entry(id) {
                    Entry::Occupied(open) => {
                        let trace = open.into_mut();
                        if trace.last_seen != now {
                            trace.last_seen = now;
                            shard.idle.push_back((now, id));
                        }
                        trace
                    }
                    Entry::Vacant(vacant) => {
                        opened += 1;
                        shard.idle.push_back((now, id));
                        shard.age.push_back((now, id));
                        vacant.insert(OpenTrace {
                            first_seen: now,
                            last_seen: now,
                            rows: Vec::new(),
                            span_ids: None,
                            bytes: 0,
                        })
                    }
                };
                let span = span_id(span_ids, row as usize);
                if !trace.insert_span_id(span, self.hash) {
                    duplicates += 1;
                    continue;
                }
                trace.rows.push((stored.clone(), row));
                let was = trace.bytes;
                trace.bytes += row_bytes;
                if was < self.max_trace_bytes && trace.bytes >= self.max_trace_bytes {
                    shard.full.push(id);
                }
            }
        }
        self.open_spans
            .fetch_sub(late + duplicates, Ordering::Relaxed);
        self.open_traces.fetch_add(opened, Ordering::Relaxed);
        // Late SERVER spans still describe their service's latency (a stalled callee).
        let late_servers =
            (!late_servers.is_empty()).then(|| widen_rows(&[&stored.batch], &late_servers));
        drop(stored);
        self.publish();
        if late > 0 {
            self.metrics.late(late as u64);
        }
        if let Some(spans) = late_servers {
            self.sink.late_servers(spans);
        }
        if duplicates > 0 {
            self.metrics.duplicates(duplicates as u64);
        }
        Ok(())
    }

    /// Release every trace that is due at `now`: idle for `idle` or older than `max_age`.
    /// Returns the number of traces released.
    pub fn release_due(&self, now: Instant) -> usize {
        let mut due = Vec::new();
        for index in 0..SHARDS {
            let mut shard = self.shard(index);
            shard.take_due(now, &self.config, &mut due);
        }
        self.release(due)
    }

    /// Release every open trace (graceful shutdown). Returns the number released.
    pub fn release_all(&self) -> usize {
        let mut due = Vec::new();
        for index in 0..SHARDS {
            let mut shard = self.shard(index);
            let ids: Vec<TraceId> = shard.traces.keys().copied().collect();
            for id in ids {
                if let Some(trace) = shard.take(id) {
                    due.push((id, trace, ReleaseReason::Shutdown));
                }
            }
            shard.idle.clear();
            shard.age.clear();
            shard.full.clear();
        }
        self.release(due)
    }

    /// Hand `due` traces to the sink, in first-seen order, in chunks of at most
    /// `chunk_bytes`; then compact the batches they leave mostly empty.
    fn release(&self, mut due: Vec<(TraceId, OpenTrace, ReleaseReason)>) -> usize {
        if due.is_empty() {
            return 0;
        }
        due.sort_by_key(|(id, t, _)| (t.first_seen, *id));
        let traces = due.len();
        let spans: usize = due.iter().map(|(_, t, _)| t.rows.len()).sum();
        self.open_spans.fetch_sub(spans, Ordering::Relaxed);
        self.open_traces.fetch_sub(traces, Ordering::Relaxed);
        for reason in [
            ReleaseReason::Idle,
            ReleaseReason::MaxAge,
            ReleaseReason::MaxSize,
            ReleaseReason::Shutdown,
        ] {
            let (n, rows) = due
                .iter()
                .filter(|(_, _, r)| *r == reason)
                .fold((0, 0), |(n, rows), (_, t, _)| (n + 1, rows + t.rows.len()));
            if n > 0 {
                self.metrics.released(reason, n as u64, rows as u64);
            }
        }
        let mut touched: Vec<Arc<StoredBatch>> = Vec::new();
        let mut chunk: Vec<OpenTrace> = Vec::new();
        let mut chunk_bytes = 0;
        for (_, trace, _) in due {
            // Held bytes: the widened batch is larger (~1.4x: plain strings), still far
            // below Arrow's 2 GiB offsets, and the analysis re-chunks by its own bytes.
            chunk_bytes += trace
                .rows
                .iter()
                .map(|(b, _)| b.bytes / b.batch.num_rows().max(1))
                .sum::<usize>();
            chunk.push(trace);
            if chunk_bytes >= self.chunk_bytes {
                self.hand_over(std::mem::take(&mut chunk), &mut touched);
                chunk_bytes = 0;
            }
        }
        self.hand_over(chunk, &mut touched);
        for batch in touched {
            // Ours is the one reference that is not an open row.
            let live = Arc::strong_count(&batch) - 1;
            if live > 0
                && live * COMPACT_WHEN <= batch.batch.num_rows()
                && batch.bytes >= COMPACT_MIN_BYTES
            {
                self.compact(&batch);
            }
        }
        self.publish();
        traces
    }

    /// Gather `traces` into one batch and give it to the sink; remember their source batches.
    fn hand_over(&self, traces: Vec<OpenTrace>, touched: &mut Vec<Arc<StoredBatch>>) {
        if traces.is_empty() {
            return;
        }
        let mut local: HashMap<*const StoredBatch, usize> = HashMap::new();
        let mut sources: Vec<Arc<StoredBatch>> = Vec::new();
        let mut positions = Vec::new();
        for trace in &traces {
            for (batch, row) in &trace.rows {
                let index = *local.entry(Arc::as_ptr(batch)).or_insert_with(|| {
                    sources.push(batch.clone());
                    sources.len() - 1
                });
                positions.push((index, *row as usize));
            }
        }
        let count = traces.len();
        drop(traces);
        let batch = gather(&sources, &positions);
        for source in sources {
            if !touched.iter().any(|t| Arc::ptr_eq(t, &source)) {
                touched.push(source);
            }
        }
        self.sink
            .release(ReleasedTraces::reserved(batch, count, &self.budget));
    }

    /// Copy the rows of `old` that open traces still point to into a new batch, and point
    /// them there, so `old` is freed.
    fn compact(&self, old: &Arc<StoredBatch>) {
        let ids = trace_ids(&old.batch);
        let mut traces = HashSet::with_hasher(self.hash);
        let mut live: Vec<u32> = Vec::new();
        for row in 0..old.batch.num_rows() {
            let id = trace_id(ids, row);
            if !traces.insert(id) {
                continue;
            }
            let shard = self.shard(self.shard_of(&id));
            if let Some(trace) = shard.traces.get(&id) {
                live.extend(
                    trace
                        .rows
                        .iter()
                        .filter(|(b, _)| Arc::ptr_eq(b, old))
                        .map(|(_, r)| *r),
                );
            }
        }
        if live.is_empty() {
            return;
        }
        live.sort_unstable();
        let indices = UInt32Array::from(live.clone());
        let batch = match take_record_batch(&old.batch, &indices) {
            Ok(batch) => batch,
            Err(e) => unreachable!("rows of a batch can be taken: {e}"),
        };
        let bytes = batch.get_array_memory_size();
        self.held_bytes.fetch_add(bytes, Ordering::Relaxed);
        let new = Arc::new(StoredBatch {
            batch,
            bytes,
            held: self.held_bytes.clone(),
            _reservation: self.budget.force(bytes + live.len() * INDEX_BYTES_PER_SPAN),
        });
        let moved: HashMap<u32, u32> = live
            .iter()
            .enumerate()
            .map(|(i, r)| (*r, i as u32))
            .collect();
        for id in traces {
            let mut shard = self.shard(self.shard_of(&id));
            if let Some(trace) = shard.traces.get_mut(&id) {
                for row in trace.rows.iter_mut() {
                    if Arc::ptr_eq(&row.0, old)
                        && let Some(&to) = moved.get(&row.1)
                    {
                        *row = (new.clone(), to);
                    }
                }
            }
        }
        self.metrics.compacted();
    }

    /// Run the release loop on the calling thread until `shutdown` turns true, then release
    /// everything left. A panic inside a round is caught, counted in `health`, and the loop
    /// goes on.
    pub fn run_blocking(&self, shutdown: watch::Receiver<bool>, health: &Health) {
        let tick = self.config.tick();
        let guarded =
            |round: &dyn Fn() -> usize| match std::panic::catch_unwind(AssertUnwindSafe(round)) {
                Ok(_) => health.ok("assembly"),
                Err(panic) => health.failed("assembly", &panic_message(&*panic)),
            };
        while !*shutdown.borrow() {
            std::thread::sleep(tick);
            guarded(&|| self.release_due(Instant::now()));
        }
        guarded(&|| {
            let released = self.release_all();
            tracing::info!(traces = released, "released every open trace at shutdown");
            released
        });
    }

    fn shard_of(&self, id: &TraceId) -> usize {
        // Middle bits: the maps inside a shard index by the low bits and tag by the top ones.
        ((self.hash.hash_one(id) >> 40) as usize) % SHARDS
    }

    fn shard(&self, index: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing the collector, so poisoning is ignored.
        self.shards[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self) {
        let (spans, traces) = self.open();
        self.metrics.open(spans, traces, self.memory_bytes());
    }
}

impl SpanSink for Assembly {
    fn accept(&self, batch: RecordBatch) -> Result<(), SinkFull> {
        self.accept_at(batch, Instant::now())
    }
}

impl OpenTrace {
    /// Record `span` as held; false when the trace already holds it.
    fn insert_span_id(&mut self, span: u64, hash: KeyedHash) -> bool {
        if let Some(ids) = &mut self.span_ids {
            return ids.insert(span);
        }
        let held = |(batch, row): &Row| span_id(span_ids(&batch.batch), *row as usize);
        if self.rows.iter().any(|r| held(r) == span) {
            return false;
        }
        if self.rows.len() >= SCAN_SPANS {
            let mut ids = HashSet::with_capacity_and_hasher(self.rows.len() * 2, hash);
            ids.extend(self.rows.iter().map(held));
            ids.insert(span);
            self.span_ids = Some(ids);
        }
        true
    }
}

impl Shard {
    fn is_released(&self, id: &TraceId) -> bool {
        self.released
            .iter()
            .any(|generation| generation.contains(id))
    }

    /// Remove an open trace and remember its id as released.
    fn take(&mut self, id: TraceId) -> Option<OpenTrace> {
        let trace = self.traces.remove(&id)?;
        if self.released[0].len() >= self.ids_per_generation {
            self.released.swap(0, 1);
            self.released[0].clear();
        }
        self.released[0].insert(id);
        Some(trace)
    }

    /// Move every due trace into `due`: first those past `max_age`, then the idle ones.
    fn take_due(
        &mut self,
        now: Instant,
        config: &AssemblyConfig,
        due: &mut Vec<(TraceId, OpenTrace, ReleaseReason)>,
    ) {
        for id in std::mem::take(&mut self.full) {
            if let Some(trace) = self.take(id) {
                due.push((id, trace, ReleaseReason::MaxSize));
            }
        }
        while let Some(&(first_seen, id)) = self.age.front() {
            if now.saturating_duration_since(first_seen) < config.max_age {
                break;
            }
            self.age.pop_front();
            if self
                .traces
                .get(&id)
                .is_some_and(|t| t.first_seen == first_seen)
                && let Some(trace) = self.take(id)
            {
                due.push((id, trace, ReleaseReason::MaxAge));
            }
        }
        while let Some(&(seen, id)) = self.idle.front() {
            if now.saturating_duration_since(seen) < config.idle {
                break;
            }
            self.idle.pop_front();
            if self.traces.get(&id).is_some_and(|t| t.last_seen == seen)
                && let Some(trace) = self.take(id)
            {
                due.push((id, trace, ReleaseReason::Idle));
            }
        }
    }
}

fn trace_ids(batch: &RecordBatch) -> &arrow::array::FixedSizeBinaryArray {
    match batch
        .column_by_name(schema::TRACE_ID)
        .and_then(|c| c.as_fixed_size_binary_opt())
    {
        Some(ids) => ids,
        None => unreachable!("held batches follow HELD_SCHEMA"),
    }
}

/// Position of `span_id` in [`HELD_SCHEMA`], looked up once (duplicate scans read it per row).
static SPAN_ID_COLUMN: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
    HELD_SCHEMA
        .index_of(schema::SPAN_ID)
        .unwrap_or_else(|e| unreachable!("the span schema has span_id: {e}"))
});

fn span_ids(batch: &RecordBatch) -> &arrow::array::FixedSizeBinaryArray {
    match batch.column(*SPAN_ID_COLUMN).as_fixed_size_binary_opt() {
        Some(ids) => ids,
        None => unreachable!("held batches follow HELD_SCHEMA"),
    }
}

fn span_id(ids: &arrow::array::FixedSizeBinaryArray, row: usize) -> u64 {
    match <[u8; 8]>::try_from(ids.value(row)) {
        Ok(id) => u64::from_le_bytes(id),
        Err(_) => unreachable!("span_id is FixedSizeBinary(8)"),
    }
}

fn trace_id(ids: &arrow::array::FixedSizeBinaryArray, row: usize) -> TraceId {
    match TraceId::try_from(ids.value(row)) {
        Ok(id) => id,
        Err(_) => unreachable!("trace_id is FixedSizeBinary(16)"),
    }
}

/// Build one batch from rows of several held batches, in the span schema.
fn gather(sources: &[Arc<StoredBatch>], positions: &[(usize, usize)]) -> RecordBatch {
    let held: Vec<&RecordBatch> = sources.iter().map(|b| &b.batch).collect();
    widen_rows(&held, positions)
}

#[cfg(test)]
mod tests;
