//! Offline analysis of span files (`stormglass analyze`), in chunks of whole traces.
//!
//! A file is analysed as the live path analyses an interval: chunk by chunk, each chunk
//! holding whole traces, the chunks' partials merged by the report. One batch of a whole
//! file made every intermediate table as large as the file: gigabytes allocated, faulted
//! in, freed and faulted in again per query, which cost more than the queries' work.
//!
//! The chunks give the same figures as one batch would because what one trace's analysis
//! reads from other traces is taken from the whole file before any chunk is analysed: the
//! services that sent SERVER spans (`window_servers`) and the clock bounds of every service
//! pair ([`lineage::clock_bounds`]; bounds merge by MAX and MIN, so a chunk's own pairs
//! add nothing to them). Duplicate spans share a trace, hence a chunk, and are dropped there,
//! the first copy read kept.
//!
//! Chunks are made (split, concatenated, duplicates dropped, clock bounds found) on two
//! threads and analysed two at a time, each on its own engine (one thread each), chunk `k`
//! starting as soon as chunk `k - 2` is done. The order and the assignment of traces to chunks are fixed, so a file gives
//! the same report on every run and machine. Chunks carry only the columns the analysis
//! reads.

use arrow::array::{AsArray, RecordBatch, UInt32Array};

use stormglass_model::{SPANS_SCHEMA, schema as col};

use crate::clock::{self, ClockBounds};
use crate::engine::{
    AnalysisError, Engine, Params, Partials, WindowContext, server_services, timed,
};
use crate::parallel::{AT_ONCE, parallel_map};
use crate::{files, lineage};

/// Spans per chunk of a file: large enough that each query's fixed cost (a few ms per
/// chunk) is small next to its work, small enough that a chunk's tables stay in memory the
/// allocator reuses.
pub const CHUNK_SPANS: usize = 1 << 17;

/// The analysis of a file's spans.
#[derive(Debug)]
pub struct Analysed {
    pub partials: Partials,
    /// Spans read more than once (same trace and span id), counted once.
    pub duplicates: usize,
    /// Chunks the spans were analysed in.
    pub chunks: usize,
}

/// Analyse `batches` (a file's spans as read, duplicates included) in chunks of about
/// `chunk_spans` spans of whole traces. Spans that fit in one chunk are analysed as one
/// batch, on one engine of two partitions, as before there were chunks.
pub async fn analyse(
    params: &Params,
    batches: Vec<RecordBatch>,
    chunk_spans: usize,
) -> Result<Analysed, AnalysisError> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let count = rows.div_ceil(chunk_spans.max(1)).max(1);
    if count == 1 {
        let (chunk, duplicates) = files::one_batch(batches);
        return Ok(Analysed {
            partials: Engine::new(params.clone()).analyse(chunk).await?,
            duplicates,
            chunks: 1,
        });
    }
    let started = std::time::Instant::now();
    let servers = server_services(&batches);
    let pieces = by_trace(batches, count);
    timed("chunks: split", started);
    // Each chunk made whole (its pieces concatenated, duplicates dropped) and its clock
    // bounds found, on every lane.
    let prepared = parallel_map(pieces, |pieces| {
        let (chunk, duplicates) = files::without_duplicates(whole(&pieces));
        let bounds = lineage::clock_bounds(&chunk);
        (chunk, duplicates, bounds)
    });
    let mut clocks = ClockBounds::default();
    let mut duplicates = 0;
    let mut chunks = Vec::with_capacity(prepared.len());
    for (chunk, dropped, bounds) in prepared {
        for (pair, bound) in bounds {
            clock::add(&mut clocks, pair, bound);
        }
        duplicates += dropped;
        chunks.push(chunk);
    }
    let context = WindowContext {
        servers,
        clocks: vec![std::sync::Arc::new(clocks)],
    };
    timed("chunks", started);
    // Shared by every chunk's task, not copied into each: at width its clock bounds are
    // ~160,000 service pairs.
    let context = std::sync::Arc::new(context);

    let engines: Vec<Engine> = (0..AT_ONCE)
        .map(|_| Engine::new(params.clone()).on_one_thread())
        .collect();
    let analysed = chunks.len();
    let mut partials = Vec::with_capacity(analysed);
    // In flight, in chunk order: chunk k starts when chunk k - AT_ONCE is done, on its
    // engine.
    let mut running = std::collections::VecDeque::with_capacity(AT_ONCE);
    let mut chunks = chunks.into_iter().zip(engines.iter().cycle()).peekable();
    while chunks.peek().is_some() || !running.is_empty() {
        if running.len() < AT_ONCE
            && let Some((chunk, engine)) = chunks.next()
        {
            let (engine, context) = (engine.clone(), std::sync::Arc::clone(&context));
            running.push_back(tokio::spawn(async move {
                engine.analyse_in_window(chunk, &context).await
            }));
            continue;
        }
        let Some(task) = running.pop_front() else {
            break;
        };
        let chunk = match task.await {
            Ok(result) => result?,
            // A panic in a chunk's analysis is the analysis's own, as on one thread.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        partials.push(chunk);
    }
    let partials = match Partials::concat(partials) {
        Some(partials) => partials,
        // No spans at all: still every partial's schema.
        None => {
            let empty = RecordBatch::new_empty(SPANS_SCHEMA.clone());
            Engine::new(params.clone()).analyse(empty).await?
        }
    };
    Ok(Analysed {
        partials,
        duplicates,
        chunks: analysed,
    })
}

/// The spans of `batches` as `count` chunks' pieces, every span of a trace in the same
/// chunk, each chunk's pieces in the order read (chunks without spans left out).
///
/// Each batch read is split into its pieces of every chunk ([`split`]: reads within one
/// batch, which stays in cache); the pieces are concatenated later, per chunk ([`whole`]:
/// sequential copies). Gathering each chunk's rows straight from every batch
/// (`interleave`) was several times slower: every row a cache miss somewhere in the whole
/// file. The batches are split on every lane, each lane a contiguous run of them, so the
/// order read is kept.
fn by_trace(batches: Vec<RecordBatch>, count: usize) -> Vec<Vec<RecordBatch>> {
    let per_lane = batches.len().div_ceil(AT_ONCE).max(1);
    let mut runs = Vec::new();
    let mut batches = batches.into_iter();
    loop {
        let run: Vec<RecordBatch> = batches.by_ref().take(per_lane).collect();
        if run.is_empty() {
            break;
        }
        runs.push(run);
    }
    let mut pieces: Vec<Vec<RecordBatch>> = vec![Vec::new(); count];
    for run in parallel_map(runs, |run| split(run, count)) {
        for (chunk, run_pieces) in run.into_iter().enumerate() {
            pieces[chunk].extend(run_pieces);
        }
    }
    pieces.retain(|p| !p.is_empty());
    pieces
}

/// Each of `batches` split into its rows of each of `count` chunks: one `take` per column
/// of a batch puts its rows in chunk order (a counting sort of its traces), and each chunk's
/// piece is a slice of that. Within a piece each trace's rows are together, in the order
/// read: OTLP requests group spans by service, so a file's traces are interleaved, and the
/// lineage, which walks each trace's rows, missed the cache on most of them: grouped, its
/// logical calls' step took a quarter less (`STORMGLASS_QUERY_TIMINGS=1 stormglass analyze`
/// of the 10 M span benchmark file, three alternated pairs, the same report). The
/// [`col::NOT_ANALYSED`] columns are not carried: [`whole`] empties them.
fn split(batches: Vec<RecordBatch>, count: usize) -> Vec<Vec<RecordBatch>> {
    let mut pieces: Vec<Vec<RecordBatch>> = vec![Vec::new(); count];
    let analysed = analysed_columns();
    for batch in batches {
        let Some(traces) = batch
            .column_by_name(col::TRACE_ID)
            .and_then(|c| c.as_fixed_size_binary_opt())
        else {
            unreachable!("read batches follow SPANS_SCHEMA");
        };
        let groups = lineage::TraceGroups::new(traces);
        let chunks: Vec<usize> = groups
            .traces()
            .map(|rows| chunk_of(traces.value(rows[0]), count))
            .collect();
        // starts[c]..starts[c + 1]: chunk c's rows in the sorted order.
        let mut starts = vec![0; count + 1];
        for (rows, &chunk) in groups.traces().zip(&chunks) {
            starts[chunk + 1] += rows.len();
        }
        for chunk in 0..count {
            starts[chunk + 1] += starts[chunk];
        }
        let mut next = starts.clone();
        let mut order = vec![0u32; batch.num_rows()];
        for (rows, &chunk) in groups.traces().zip(&chunks) {
            for &row in rows {
                // A batch's rows fit in u32: the readers make batches of thousands of rows.
                order[next[chunk]] = row as u32;
                next[chunk] += 1;
            }
        }
        let sorted = batch
            .project(&analysed)
            .and_then(|b| arrow::compute::take_record_batch(&b, &UInt32Array::from(order)));
        let sorted = match sorted {
            Ok(sorted) => sorted,
            Err(e) => unreachable!("rows of a batch can be taken: {e}"),
        };
        for chunk in 0..count {
            let rows = starts[chunk + 1] - starts[chunk];
            if rows > 0 {
                pieces[chunk].push(sorted.slice(starts[chunk], rows));
            }
        }
    }
    pieces
}

/// The span schema's columns the analysis reads, by index.
fn analysed_columns() -> Vec<usize> {
    let fields = SPANS_SCHEMA.fields();
    (0..fields.len())
        .filter(|&i| !col::NOT_ANALYSED.contains(&fields[i].name().as_str()))
        .collect()
}

/// One chunk's pieces (the analysed columns, [`split`]) as one batch of the span schema,
/// the columns the analysis never reads emptied.
fn whole(pieces: &[RecordBatch]) -> RecordBatch {
    let rows = pieces.iter().map(RecordBatch::num_rows).sum();
    let mut read = analysed_columns().into_iter().enumerate().peekable();
    let columns = SPANS_SCHEMA
        .fields()
        .iter()
        .enumerate()
        .map(
            |(index, field)| match read.next_if(|&(_, column)| column == index) {
                Some((piece_column, _)) => {
                    let arrays: Vec<&dyn arrow::array::Array> = pieces
                        .iter()
                        .map(|p| p.column(piece_column).as_ref())
                        .collect();
                    arrow::compute::concat(&arrays)
                }
                None => Ok(col::emptied(field.name(), rows)),
            },
        );
    match columns
        .collect::<Result<Vec<_>, _>>()
        .and_then(|columns| RecordBatch::try_new(SPANS_SCHEMA.clone(), columns))
    {
        Ok(chunk) => chunk,
        Err(e) => unreachable!("pieces share the analysed columns of SPANS_SCHEMA: {e}"),
    }
}

/// The chunk of a trace id: a fixed hash of it (splitmix64's finaliser over both halves;
/// the ids of tests and of some tracers count up, differing in a few bits), so the same
/// file always splits the same way.
fn chunk_of(trace_id: &[u8], count: usize) -> usize {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let mut bytes = [0u8; 16];
    let n = trace_id.len().min(16);
    bytes[..n].copy_from_slice(&trace_id[..n]);
    let id = u128::from_le_bytes(bytes);
    (mix(id as u64 ^ mix((id >> 64) as u64)) % count as u64) as usize
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use stormglass_model::{Conventions, encode_request};
    use stormglass_testkit::otlp::{request, span};

    use super::*;

    /// Interleaved traces in one batch read (requests group spans by service): a chunk's
    /// piece holds each trace's rows together, traces and rows in the order read.
    #[test]
    fn split_puts_each_traces_rows_together_in_the_order_read() {
        let spans = [(1, 1), (2, 2), (1, 3), (3, 4), (2, 5), (1, 6)]
            .map(|(trace, id)| span(trace, id, "op", 2, 0, 1, vec![]));
        let (batch, report) = encode_request(
            &Conventions::default(),
            &request(vec![("svc", spans.to_vec())]),
        );
        assert_eq!(report.rejected, 0);
        let pieces = split(vec![batch], 1);
        let piece = &pieces[0][0];
        let ids = piece
            .column_by_name(col::SPAN_ID)
            .unwrap()
            .as_fixed_size_binary();
        let read: Vec<u8> = ids.iter().map(|id| id.unwrap()[7]).collect();
        assert_eq!(read, vec![1, 3, 6, 2, 5, 4]);
    }
}
