//! The window rebuilt from archived spans after a restart.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::array::{AsArray, RecordBatch};
use stormglass_model::hash::KeyedHash;
use stormglass_model::schema;

use super::LiveAnalysis;
use super::window::{Learned, unix_ns};
use crate::engine::{AnalysisError, Partials, server_services};

impl LiveAnalysis {
    /// Rebuild the window from spans archived before a restart (`archive.dir`), so the
    /// figures, gauges and alerts do not start blank after a deploy or a crash.
    ///
    /// Each trace joins the interval its last span ended in (counted back from `now` in
    /// `analytics.interval` steps; traces that ended before the window are left out), and
    /// each interval is analysed as the live path would have, in chunks of whole traces.
    /// Observers are told through [`IntervalObserver::restored`], never
    /// [`IntervalObserver::interval`]: gauges and alerts come back, counters do not count
    /// the restored spans again (they restart from zero, as Prometheus expects of a
    /// restarted process). `spans` come from [`crate::files::load_archive_since`], lean
    /// and bounded. Returns the spans restored.
    ///
    /// [`IntervalObserver::restored`]: super::IntervalObserver::restored
    /// [`IntervalObserver::interval`]: super::IntervalObserver::interval
    pub async fn restore(
        &self,
        spans: RecordBatch,
        now: SystemTime,
    ) -> Result<usize, AnalysisError> {
        let interval = self.config.interval;
        let buckets = (self.config.window.as_nanos() / interval.as_nanos().max(1)).max(1) as usize;
        let by_bucket = restore_buckets(&spans, now, interval, buckets);
        let bytes_per_row = spans.get_array_memory_size() / spans.num_rows().max(1);
        let rows_per_chunk = (self.chunk_bytes / bytes_per_row.max(1)).max(1);
        let mut restored = 0;
        for (bucket, traces) in by_bucket.into_iter().enumerate().rev() {
            if traces.is_empty() {
                continue;
            }
            let end = now
                .checked_sub(interval * u32::try_from(bucket).unwrap_or(u32::MAX))
                .unwrap_or(UNIX_EPOCH);
            let start = end.checked_sub(interval).unwrap_or(UNIX_EPOCH);
            let mut chunks = Vec::new();
            let mut learned = Learned::default();
            let mut rows: Vec<u32> = Vec::new();
            let mut traces = traces.into_iter().peekable();
            while let Some(trace) = traces.next() {
                rows.extend(trace);
                if rows.len() < rows_per_chunk && traces.peek().is_some() {
                    continue;
                }
                let indices = arrow::array::UInt32Array::from(std::mem::take(&mut rows));
                let chunk = match arrow::compute::take_record_batch(&spans, &indices) {
                    Ok(chunk) => chunk,
                    Err(e) => unreachable!("rows of a batch can be taken: {e}"),
                };
                restored += chunk.num_rows();
                {
                    let mut known = self.servers.lock().unwrap_or_else(|p| p.into_inner());
                    for service in server_services(std::slice::from_ref(&chunk)) {
                        known.insert(service, end);
                    }
                }
                let mut context = self.window_context().await;
                context.clocks.push(learned.clocks.clone());
                let partials = self.engine.analyse_in_window(chunk, &context).await?;
                // Its bounds shared no more, so written in place, not copied.
                drop(context);
                learned.add(&partials);
                chunks.push(partials.compact());
            }
            if let Some(mut partials) = Partials::concat(chunks) {
                self.merge_chunks(&mut partials).await;
                self.add_to_window(
                    start,
                    end,
                    Arc::new(partials.compact_for_window()),
                    learned,
                    now,
                );
            }
        }
        let report = self.rebuild_report().await?;
        let _inside = self.runtime.as_ref().map(|r| r.enter());
        for observer in &self.observers {
            observer.restored(&report, now);
        }
        Ok(restored)
    }
}

/// The rows of `spans` by interval, newest first (`buckets` of `interval` counted back from
/// `now`), each as its traces' rows: a trace joins the interval its last span ended in;
/// traces that ended before the window are left out, those "ending" after `now` (a fast
/// clock) join the newest.
fn restore_buckets(
    spans: &RecordBatch,
    now: SystemTime,
    interval: Duration,
    buckets: usize,
) -> Vec<Vec<Vec<u32>>> {
    let (Some(traces), Some(ends)) = (
        spans
            .column_by_name(schema::TRACE_ID)
            .and_then(|c| c.as_fixed_size_binary_opt()),
        spans
            .column_by_name(schema::END_NS)
            .and_then(|c| c.as_primitive_opt::<arrow::datatypes::Int64Type>()),
    ) else {
        unreachable!("spans follow SPANS_SCHEMA");
    };
    let mut by_trace: std::collections::HashMap<&[u8], (i64, Vec<u32>), KeyedHash> =
        std::collections::HashMap::default();
    for row in 0..spans.num_rows() {
        let entry = by_trace
            .entry(traces.value(row))
            .or_insert((i64::MIN, Vec::new()));
        entry.0 = entry.0.max(ends.value(row));
        entry.1.push(row as u32);
    }
    let now_ns = unix_ns(now);
    let step = i64::try_from(interval.as_nanos())
        .unwrap_or(i64::MAX)
        .max(1);
    let mut out = vec![Vec::new(); buckets];
    let mut traces: Vec<(i64, Vec<u32>)> = by_trace.into_values().collect();
    traces.sort_by_key(|(end, rows)| (*end, rows[0]));
    for (end, rows) in traces {
        let bucket = (now_ns.saturating_sub(end).max(0) / step) as usize;
        if let Some(slot) = out.get_mut(bucket) {
            slot.push(rows);
        }
    }
    out
}
