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
//! the first copy read kept. The one thing learned as the live path learns it is the
//! candidate timeouts of `partial_tail` (`window_timeouts`): from the chunks analysed
//! before, since they come out of the analysis itself; a candidate some earlier chunk did
//! not count is not used for the exact tail comparison (the report falls back to the
//! callee's P99.9 estimate), live and offline alike.
//!
//! Chunks are analysed two at a time, each on its own engine (one thread each), in a fixed
//! order with a fixed assignment of traces to chunks, so a file gives the same report on
//! every run and machine.

use arrow::array::{AsArray, RecordBatch, UInt32Array};

use stormglass_model::{SPANS_SCHEMA, schema as col};

use crate::engine::{AnalysisError, Engine, Params, Partials, WindowContext, timed};
use crate::{clock, files, lineage};

/// Spans per chunk of a file: large enough that each query's fixed cost (a few ms per
/// chunk) is small next to its work, small enough that a chunk's tables stay in memory the
/// allocator reuses.
pub const CHUNK_SPANS: usize = 1 << 17;

/// Chunks analysed at once, each on its own engine.
const AT_ONCE: usize = 2;

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
    let started = std::time::Instant::now();
    let mut duplicates = 0;
    let chunks: Vec<RecordBatch> = by_trace(batches, count)
        .into_iter()
        .map(|chunk| {
            let (chunk, dropped) = files::without_duplicates(chunk);
            duplicates += dropped;
            chunk
        })
        .collect();
    timed("chunks", started);
    if let [_] = &chunks[..] {
        let chunk = chunks.into_iter().next().unwrap_or_else(empty);
        return Ok(Analysed {
            partials: Engine::new(params.clone()).analyse(chunk).await?,
            duplicates,
            chunks: 1,
        });
    }
    let started = std::time::Instant::now();
    let mut context = WindowContext {
        servers: servers(&chunks),
        ..WindowContext::default()
    };
    for chunk in &chunks {
        for (pair, bound) in lineage::clock_bounds(chunk) {
            clock::add(&mut context.clocks, pair, bound);
        }
    }
    timed("chunks: window context", started);

    let engines: Vec<Engine> = (0..AT_ONCE)
        .map(|_| Engine::new(params.clone()).on_one_thread())
        .collect();
    let analysed = chunks.len();
    let mut partials = Vec::with_capacity(analysed);
    let mut chunks = chunks.into_iter();
    loop {
        let tasks: Vec<_> = chunks
            .by_ref()
            .take(AT_ONCE)
            .zip(&engines)
            .map(|(chunk, engine)| {
                let (engine, context) = (engine.clone(), context.clone());
                tokio::spawn(async move { engine.analyse_in_window(chunk, &context).await })
            })
            .collect();
        if tasks.is_empty() {
            break;
        }
        for task in tasks {
            let chunk = match task.await {
                Ok(result) => result?,
                // A panic in a chunk's analysis is the analysis's own, as on one thread.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            chunk.timeouts_into(&mut context.timeouts);
            partials.push(chunk);
        }
    }
    let partials = match Partials::concat(partials) {
        Some(partials) => partials,
        // No spans at all: still every partial's schema.
        None => Engine::new(params.clone()).analyse(empty()).await?,
    };
    Ok(Analysed {
        partials,
        duplicates,
        chunks: analysed,
    })
}

fn empty() -> RecordBatch {
    RecordBatch::new_empty(SPANS_SCHEMA.clone())
}

/// The spans of `batches` in `count` chunks, every span of a trace in the same chunk, rows
/// in the order read within a chunk; one chunk is the batches concatenated.
///
/// Each batch read is split into its pieces of every chunk (`take` within one batch, which
/// stays in cache), and each chunk's pieces are then concatenated (sequential copies).
/// Gathering each chunk's rows straight from every batch (`interleave`) was five times
/// slower: every row a cache miss somewhere in the whole file.
fn by_trace(batches: Vec<RecordBatch>, count: usize) -> Vec<RecordBatch> {
    if count <= 1 {
        return vec![concat(&batches)];
    }
    let mut pieces: Vec<Vec<RecordBatch>> = vec![Vec::with_capacity(batches.len()); count];
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); count];
    for batch in batches {
        let Some(traces) = batch
            .column_by_name(col::TRACE_ID)
            .and_then(|c| c.as_fixed_size_binary_opt())
        else {
            unreachable!("read batches follow SPANS_SCHEMA");
        };
        for (row, id) in traces.iter().enumerate() {
            // A batch's rows fit in u32: the readers make batches of thousands of rows.
            rows[chunk_of(id.unwrap_or_default(), count)].push(row as u32);
        }
        for (chunk, rows) in rows.iter_mut().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let indices = UInt32Array::from(std::mem::take(rows));
            match arrow::compute::take_record_batch(&batch, &indices) {
                Ok(piece) => pieces[chunk].push(piece),
                Err(e) => unreachable!("rows of a batch can be taken: {e}"),
            }
        }
    }
    pieces
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| concat(p))
        .collect()
}

fn concat(batches: &[RecordBatch]) -> RecordBatch {
    match arrow::compute::concat_batches(&SPANS_SCHEMA, batches) {
        Ok(batch) => batch,
        Err(e) => unreachable!("read batches share SPANS_SCHEMA: {e}"),
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

/// The services that sent SERVER spans, in any chunk.
fn servers(chunks: &[RecordBatch]) -> Vec<String> {
    let mut servers = std::collections::BTreeSet::new();
    for chunk in chunks {
        let column = |name| chunk.column_by_name(name).map(|c| c.as_string::<i32>());
        let (Some(kind), Some(service)) = (column(col::KIND), column(col::SERVICE_NAME)) else {
            unreachable!("chunks follow SPANS_SCHEMA");
        };
        for row in 0..chunk.num_rows() {
            if kind.value(row) == "server" && !servers.contains(service.value(row)) {
                servers.insert(service.value(row).to_owned());
            }
        }
    }
    servers.into_iter().collect()
}
