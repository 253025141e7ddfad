//! Released traces queued, taken in chunks, analysed into the interval being filled.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use arrow::array::RecordBatch;
use stormglass_assembly::{ReleasedTraces, TraceSink};
use stormglass_model::SPANS_SCHEMA;
use stormglass_runtime::Reservation;
use stormglass_runtime::health::{error_chain, panic_message};

use super::LiveAnalysis;
use super::window::Learned;
use crate::engine::{Partials, server_services};

/// Released traces waiting for analysis.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) items: VecDeque<ReleasedTraces>,
    pub(super) bytes: usize,
    pub(super) spans: usize,
}

/// The interval being filled: its chunks' partials so far, each with its reservation
/// against the budget (held until the interval joins the window, which reserves its own).
/// Every [`FOLD_CHUNKS`] chunks are put together as the window keeps them (one group,
/// merged and dictionary-encoded): at width each chunk names most of its edges anew, and
/// an interval's chunks held apart were ~2.5x the size of the same interval folded.
pub(super) struct FillingInterval {
    pub(super) start: SystemTime,
    pub(super) chunks: Vec<(Partials, Reservation)>,
    /// How many of `chunks`, the first, are folded groups.
    pub(super) folded: usize,
    pub(super) learned: Learned,
}

/// Chunks folded into one group while an interval fills ([`FillingInterval`]).
pub(super) const FOLD_CHUNKS: usize = 8;

impl LiveAnalysis {
    /// Analyse the next chunk: a full one, or with `all` whatever is queued. Returns the
    /// bytes taken from the queue, `None` when there was nothing to analyse.
    pub(super) async fn analyse_next(&self, all: bool) -> Option<usize> {
        let (batch, reservation, spans, taken) = self.take_chunk(all)?;
        let started = Instant::now();
        let window = self.window_context().await;
        crate::table::timed("window context", started);
        let seen = server_services(std::slice::from_ref(&batch));
        let engine = self.engine.clone();
        let faults = self.faults.clone();
        // On its own task, so that a panic inside DataFusion or the lineage is caught.
        let analysed = tokio::spawn(async move {
            if !faults.delay.is_zero() {
                tokio::time::sleep(faults.delay).await;
            }
            if faults
                .panics
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                panic!("injected analysis panic (STORMGLASS_TEST_FAULTS)");
            }
            engine.analyse_in_window(batch, &window).await
        })
        .await;
        drop(reservation);
        self.metrics.spans.inc_by(spans as u64);
        match analysed {
            Ok(Ok(partials)) => {
                let now = SystemTime::now();
                {
                    let mut known = self.servers.lock().unwrap_or_else(|p| p.into_inner());
                    for service in seen {
                        known.insert(service, now);
                    }
                }
                let mut current = self.filling.lock().await;
                current.learned.add(&partials);
                let partials = partials.compact();
                let reservation = self.budget.force(partials.memory_bytes());
                current.chunks.push((partials, reservation));
                if current.chunks.len() - current.folded >= FOLD_CHUNKS {
                    let from = current.folded;
                    let group = self.folded(current.chunks.split_off(from)).await;
                    current.chunks.push(group);
                    current.folded += 1;
                }
                self.health.ok("analysis");
            }
            Ok(Err(e)) => {
                self.metrics.failures.inc();
                let detail = error_chain(&e);
                self.health.failed("analysis", &detail);
            }
            Err(joined) => {
                self.metrics.failures.inc();
                let detail = match joined.try_into_panic() {
                    Ok(panic) => panic_message(&*panic),
                    Err(e) => e.to_string(),
                };
                self.health.failed("analysis", &detail);
            }
        }
        self.metrics
            .chunk_duration
            .observe(started.elapsed().as_secs_f64());
        Some(taken)
    }

    /// Take queued traces up to a chunk's bytes, as one batch with its reservation: when a
    /// whole chunk is queued, or with `all` whenever anything is.
    pub(super) fn take_chunk(&self, all: bool) -> Option<(RecordBatch, Reservation, usize, usize)> {
        let (items, taken) = {
            let mut queue = self.lock_queue();
            if queue.items.is_empty() || (!all && queue.bytes < self.chunk_bytes) {
                return None;
            }
            let mut items = Vec::new();
            let mut bytes = 0;
            while let Some(size) = queue.items.front().map(|i| i.reservation.bytes()) {
                if !items.is_empty() && bytes + size > self.chunk_bytes {
                    break;
                }
                let Some(item) = queue.items.pop_front() else {
                    break;
                };
                bytes += size;
                queue.bytes -= size;
                queue.spans -= item.batch.num_rows();
                items.push(item);
            }
            self.metrics
                .pending
                .set(i64::try_from(queue.spans).unwrap_or(i64::MAX));
            (items, bytes)
        };
        let spans = items.iter().map(|i| i.batch.num_rows()).sum();
        if items.len() == 1 {
            let item = items.into_iter().next()?;
            return Some((item.batch, item.reservation, spans, taken));
        }
        let batches: Vec<&RecordBatch> = items.iter().map(|i| &i.batch).collect();
        // Bounded by the chunk size, far below Arrow's 2 GiB offsets.
        let batch = match arrow::compute::concat_batches(&SPANS_SCHEMA, batches) {
            Ok(batch) => batch,
            Err(e) => unreachable!("released batches share SPANS_SCHEMA: {e}"),
        };
        let reservation = self.budget.force(batch.get_array_memory_size());
        drop(items);
        Some((batch, reservation, spans, taken))
    }

    /// Released spans waiting for analysis (what a bounded shutdown leaves unanalysed).
    pub fn pending_spans(&self) -> usize {
        self.lock_queue().spans
    }

    pub(super) fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `chunks` as one group of the interval, as the window keeps them, with its own
    /// reservation (the chunks' are returned).
    pub(super) async fn folded(
        &self,
        chunks: Vec<(Partials, Reservation)>,
    ) -> (Partials, Reservation) {
        let (chunks, _reserved): (Vec<Partials>, Vec<Reservation>) = chunks.into_iter().unzip();
        let Some(mut group) = Partials::concat(chunks) else {
            unreachable!("a group folds at least one chunk");
        };
        self.merge_chunks(&mut group).await;
        let group = group.compact_for_window();
        let reservation = self.budget.force(group.memory_bytes());
        (group, reservation)
    }

    /// [`Engine::merge_chunks`](crate::engine::Engine::merge_chunks); a failure is counted and
    /// leaves the partials as they were.
    pub(super) async fn merge_chunks(&self, partials: &mut Partials) {
        if let Err(e) = self.engine.merge_chunks(partials).await {
            self.metrics.failures.inc();
            self.health.failed("analysis", &error_chain(&e));
        }
    }

    /// Add the late SERVER spans' durations to the interval's latency partial. A failure
    /// is counted and leaves the partials as they were.
    pub(super) async fn with_late_latency(&self, mut partials: Partials) -> Partials {
        let late =
            std::mem::take(&mut *self.late_servers.lock().unwrap_or_else(|p| p.into_inner()));
        if late.is_empty() {
            return partials;
        }
        let (late, _reserved): (Vec<RecordBatch>, Vec<Reservation>) = late.into_iter().unzip();
        let spans = match arrow::compute::concat_batches(&SPANS_SCHEMA, &late) {
            Ok(spans) => spans,
            Err(e) => unreachable!("late spans share SPANS_SCHEMA: {e}"),
        };
        match self.engine.late_latency(spans).await {
            Ok(rows) => {
                if let Some((_, latency)) = partials
                    .tables
                    .iter_mut()
                    .find(|(name, _)| *name == "partial_latency")
                {
                    latency.batches.extend(rows.batches);
                }
            }
            Err(e) => {
                self.metrics.failures.inc();
                self.health.failed("analysis", &error_chain(&e));
            }
        }
        partials
    }
}

impl TraceSink for LiveAnalysis {
    fn late_servers(&self, spans: RecordBatch) {
        // A service sending SERVER spans is instrumented, even when they come late.
        let now = SystemTime::now();
        {
            let mut known = self.servers.lock().unwrap_or_else(|p| p.into_inner());
            for service in server_services(std::slice::from_ref(&spans)) {
                known.insert(service, now);
            }
        }
        let reservation = self.budget.force(spans.get_array_memory_size());
        self.late_servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((spans, reservation));
    }

    fn release(&self, traces: ReleasedTraces) {
        let full = {
            let mut queue = self.lock_queue();
            queue.bytes += traces.reservation.bytes();
            queue.spans += traces.batch.num_rows();
            queue.items.push_back(traces);
            self.metrics
                .pending
                .set(i64::try_from(queue.spans).unwrap_or(i64::MAX));
            queue.bytes >= self.chunk_bytes
        };
        if full {
            self.wake.notify_one();
        }
    }
}
