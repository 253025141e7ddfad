//! Offline input: span files for `stormglass analyze` and `stormglass query`.
//!
//! Formats, by file name:
//! * `.parquet`: Parquet written with the span schema (the archive format);
//! * `.json`, `.jsonl`, `.ndjson`: OTLP/JSON, either one `ExportTraceServiceRequest` per
//!   line (the OpenTelemetry Collector file exporter's format) or one JSON document;
//! * anything else: one binary OTLP `ExportTraceServiceRequest` (protobuf).
//!
//! An unreadable file, line or document is reported, naming the file and line, and skipped;
//! the rest is still loaded. Invalid spans are counted as rejected, as the receivers do.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use prost::Message;
use stormglass_model::{Conventions, SPANS_SCHEMA, SpanBatchBuilder, schema};

/// What loading found, besides the spans.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadSummary {
    pub files: usize,
    pub spans: usize,
    /// Spans rejected as invalid (bad ids, end before start), with the first reason.
    pub rejected_spans: u64,
    /// Lines, documents or files skipped, each as "FILE:LINE: why" or "FILE: why".
    pub skipped: Vec<String>,
    /// Spans read more than once (same trace and span id), kept once.
    pub duplicates: usize,
}

/// The files to read: each path as given, except that a directory stands for the archive
/// files in it (`spans-*.parquet`, oldest first, what `archive.dir` holds).
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let archived = stormglass_archive::list(path)
                .map_err(|e| format!("{}: cannot list the archive: {e}", path.display()))?;
            files.extend(archived.into_iter().map(|f| f.path));
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Which columns of the spans a load keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Columns {
    /// Every column: what a query over `spans` may read.
    All,
    /// The columns the analysis reads; the [`schema::NOT_ANALYSED`] ones are emptied (the
    /// lean form the live path holds, [`schema::lean`]), and a Parquet file's are never
    /// decoded. `stormglass analyze` reads a file this way.
    Analysed,
}

/// Load every file into one batch of spans, each (trace id, span id) once; a directory is
/// read as an archive ([`expand`]).
pub fn load(
    paths: &[PathBuf],
    conventions: &Conventions,
    columns: Columns,
) -> (RecordBatch, LoadSummary) {
    let (batches, mut summary) = read(paths, conventions, columns);
    let (batch, duplicates) = one_batch(batches);
    summary.duplicates = duplicates;
    summary.spans = batch.num_rows();
    (batch, summary)
}

/// `batches` as one batch, each (trace id, span id) once ([`without_duplicates`]), and how
/// many copies were dropped.
pub fn one_batch(batches: Vec<RecordBatch>) -> (RecordBatch, usize) {
    let batch = match arrow::compute::concat_batches(&SPANS_SCHEMA, &batches) {
        Ok(batch) => batch,
        Err(e) => unreachable!("loaded batches share SPANS_SCHEMA: {e}"),
    };
    drop(batches);
    without_duplicates(batch)
}

/// Read every file into batches of spans as they are in the files, duplicates included
/// (`summary.spans` counts every row read); a directory is read as an archive ([`expand`]).
pub fn read(
    paths: &[PathBuf],
    conventions: &Conventions,
    columns: Columns,
) -> (Vec<RecordBatch>, LoadSummary) {
    let mut summary = LoadSummary::default();
    let mut batches = Vec::new();
    let paths = match expand(paths) {
        Ok(paths) => paths,
        Err(why) => {
            summary.skipped.push(why);
            Vec::new()
        }
    };
    for path in &paths {
        summary.files += 1;
        let before = batches.len();
        let name = path.display().to_string();
        let result = match extension(path).as_str() {
            "parquet" => load_parquet(path, columns, &mut batches),
            "json" | "jsonl" | "ndjson" => load_json(path, conventions, &mut batches, &mut summary),
            _ => load_protobuf(path, conventions, &mut batches, &mut summary),
        };
        if let Err(why) = result {
            summary.skipped.push(format!("{name}: {why}"));
        }
        if columns == Columns::Analysed {
            // Encoded OTLP is whole; drop what the analysis never reads right away.
            for batch in &mut batches[before..] {
                *batch = schema::lean(batch);
            }
        }
    }
    summary.spans = batches.iter().map(RecordBatch::num_rows).sum();
    (batches, summary)
}

/// The spans with each (trace id, span id) kept once, its first copy, as live assembly
/// keeps them; and how many copies were dropped.
pub fn without_duplicates(batch: RecordBatch) -> (RecordBatch, usize) {
    use arrow::array::AsArray;
    let column = |name| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_fixed_size_binary_opt())
    };
    let (Some(traces), Some(spans)) = (column(schema::TRACE_ID), column(schema::SPAN_ID)) else {
        unreachable!("loaded batches follow SPANS_SCHEMA");
    };
    let repeated = crate::lineage::repeated_rows(traces, spans);
    if repeated.is_empty() {
        return (batch, 0);
    }
    let mut dropped = repeated.iter().peekable();
    let keep: Vec<u32> = (0..batch.num_rows())
        .filter(|&row| dropped.next_if_eq(&&row).is_none())
        .map(|row| row as u32)
        .collect();
    let duplicates = repeated.len();
    let indices = arrow::array::UInt32Array::from(keep);
    match arrow::compute::take_record_batch(&batch, &indices) {
        Ok(kept) => (kept, duplicates),
        Err(e) => unreachable!("rows of a batch can be taken: {e}"),
    }
}

fn extension(path: &Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

fn encode(
    requests: &[ExportTraceServiceRequest],
    conventions: &Conventions,
    batches: &mut Vec<RecordBatch>,
    summary: &mut LoadSummary,
) {
    let mut builder = SpanBatchBuilder::new(conventions);
    for request in requests {
        builder.append_request(&stormglass_model::wire::from_proto(request));
    }
    let (batch, report) = builder.finish();
    summary.rejected_spans += report.rejected;
    batches.push(batch);
}

fn load_json(
    path: &Path,
    conventions: &Conventions,
    batches: &mut Vec<RecordBatch>,
    summary: &mut LoadSummary,
) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    // One document (possibly pretty-printed) first; else one request per line.
    if let Ok(request) = serde_json::from_str::<ExportTraceServiceRequest>(&text) {
        encode(&[request], conventions, batches, summary);
        return Ok(());
    }
    let mut requests = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<ExportTraceServiceRequest>(line) {
            Ok(request) => requests.push(request),
            Err(e) => summary.skipped.push(format!(
                "{}:{}: not an OTLP/JSON request: {e}",
                path.display(),
                number + 1
            )),
        }
    }
    encode(&requests, conventions, batches, summary);
    Ok(())
}

fn load_protobuf(
    path: &Path,
    conventions: &Conventions,
    batches: &mut Vec<RecordBatch>,
    summary: &mut LoadSummary,
) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let request = ExportTraceServiceRequest::decode(bytes.as_slice())
        .map_err(|e| format!("not a binary OTLP ExportTraceServiceRequest: {e}"))?;
    encode(&[request], conventions, batches, summary);
    Ok(())
}

fn load_parquet(
    path: &Path,
    columns: Columns,
    batches: &mut Vec<RecordBatch>,
) -> Result<(), String> {
    let file = File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
        .map_err(|e| format!("not a readable Parquet file: {e}"))?;
    let fields = metadata.schema().fields().clone();
    let expected = SPANS_SCHEMA.fields();
    // The schema only grows at its end: a file from an older stormglass has a prefix.
    let prefix = fields.len() <= expected.len()
        && fields
            .iter()
            .zip(expected.iter())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if !prefix {
        return Err("its schema is not the stormglass span schema".into());
    }
    let read = |name: &str| columns == Columns::All || !schema::NOT_ANALYSED.contains(&name);
    let kept: Vec<usize> = (0..fields.len())
        .filter(|&i| read(fields[i].name()))
        .collect();
    // The row groups in contiguous runs, one per lane, read at once; the runs' batches in
    // the file's order.
    let groups = metadata.metadata().num_row_groups();
    let per_lane = groups.div_ceil(crate::parallel::AT_ONCE).max(1);
    let runs: Vec<Vec<usize>> = (0..groups)
        .step_by(per_lane)
        .map(|first| (first..groups.min(first + per_lane)).collect())
        .collect();
    let read_run = |run: Vec<usize>| -> (Vec<RecordBatch>, Result<(), String>) {
        let mut read_batches = Vec::new();
        let result = File::open(path)
            .map_err(|e| format!("cannot read: {e}"))
            .and_then(|file| {
                let builder =
                    ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata.clone());
                let mask = ProjectionMask::roots(builder.parquet_schema(), kept.clone());
                builder
                    .with_projection(mask)
                    .with_row_groups(run)
                    // Fewer, larger batches than the default 1,024 rows: each batch costs
                    // a split into chunks (`crate::offline`) and a concat.
                    .with_batch_size(1 << 16)
                    .build()
                    .map_err(|e| format!("not a readable Parquet file: {e}"))
            })
            .and_then(|reader| {
                for batch in reader {
                    let batch = batch.map_err(|e| format!("corrupt Parquet data: {e}"))?;
                    read_batches.push(spans_of(&fields, &read, &batch)?);
                }
                Ok(())
            });
        (read_batches, result)
    };
    for (read_batches, result) in crate::parallel::parallel_map(runs, read_run) {
        batches.extend(read_batches);
        result?;
    }
    Ok(())
}

/// A batch read with `fields`' columns where `read`, rebuilt on the span schema: the columns
/// not read emptied, columns the file predates filled.
fn spans_of(
    fields: &arrow::datatypes::Fields,
    read: &impl Fn(&str) -> bool,
    batch: &RecordBatch,
) -> Result<RecordBatch, String> {
    let rows = batch.num_rows();
    // The file's columns in order, the ones not read emptied.
    let mut read_columns = batch.columns().iter();
    let columns = fields
        .iter()
        .map(|f| match read(f.name()) {
            true => read_columns.next().cloned(),
            false => Some(schema::emptied(f.name(), rows)),
        })
        .collect::<Option<Vec<_>>>()
        .ok_or("fewer columns than its schema")?;
    // Rebuilt on the canonical schema (nullability metadata), missing columns filled.
    schema::upgrade(columns, rows)
        .map_err(|e| format!("its columns do not fit the span schema: {e}"))
}

/// The spans of the archive files in `dir` closed at or after `since`, in the lean form the
/// live path holds ([`stormglass_model::lean`]), each (trace id, span id) once: what
/// [`crate::LiveAnalysis::restore`] rebuilds the window from. Files are read newest first
/// while their spans fit in `max_bytes`; returns the spans and the files left out (older
/// ones, past the bound, or unreadable: each logged).
pub fn load_archive_since(
    dir: &Path,
    since: std::time::SystemTime,
    max_bytes: usize,
) -> Result<(RecordBatch, usize), String> {
    let files = stormglass_archive::list(dir)
        .map_err(|e| format!("{}: cannot list the archive: {e}", dir.display()))?;
    let recent: Vec<_> = files.into_iter().filter(|f| f.closed >= since).collect();
    let mut batches = Vec::new();
    let mut bytes = 0;
    let mut left_out = 0;
    for (read, file) in recent.iter().rev().enumerate() {
        let mut spans = Vec::new();
        if let Err(why) = load_parquet(&file.path, Columns::Analysed, &mut spans) {
            tracing::warn!(file = %file.path.display(), "not restored: {why}");
            left_out += 1;
            continue;
        }
        let size: usize = spans.iter().map(RecordBatch::get_array_memory_size).sum();
        if bytes + size > max_bytes {
            left_out += recent.len() - read;
            tracing::warn!(
                files = recent.len() - read,
                max_bytes,
                "older archive files not restored: the window's spans exceed the analysis's share of limits.memory"
            );
            break;
        }
        bytes += size;
        batches.extend(spans);
    }
    let batch = match arrow::compute::concat_batches(&SPANS_SCHEMA, &batches) {
        Ok(batch) => batch,
        Err(e) => unreachable!("archived batches share SPANS_SCHEMA: {e}"),
    };
    Ok((without_duplicates(batch).0, left_out))
}

/// Write spans as Parquet with the span schema (the archive format `load` reads back).
pub fn write_parquet(
    path: &Path,
    spans: &RecordBatch,
) -> Result<(), parquet::errors::ParquetError> {
    write_parquet_batches(path, std::iter::once(spans.clone()))
}

/// Write batches of spans, one after another, as one Parquet file with the span schema.
pub fn write_parquet_batches(
    path: &Path,
    batches: impl IntoIterator<Item = RecordBatch>,
) -> Result<(), parquet::errors::ParquetError> {
    let file = File::create(path)?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, SPANS_SCHEMA.clone(), None)?;
    for batch in batches {
        writer.write(&batch)?;
    }
    writer.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray};
    use arrow::compute::concat_batches;
    use stormglass_model::encode_request;
    use stormglass_testkit::otlp as testing;

    /// An archive file written before a column was appended (here: before `weight`) still
    /// loads, the missing column filled with its meaning for old spans; a directory reads
    /// as its archive files, skipping anything else in it.
    #[test]
    fn older_archive_files_load_with_appended_columns_filled() {
        let scratch = tempfile::Builder::new()
            .prefix("stormglass-files-")
            .tempdir()
            .unwrap();
        let dir = scratch.path();
        let (spans, _) = encode_request(&Conventions::default(), &testing::retry_fixture());
        let weight = spans.schema().index_of(schema::WEIGHT).unwrap();
        let before_weight = spans.project(&(0..weight).collect::<Vec<_>>()).unwrap();
        assert_eq!(
            before_weight.schema().fields().last().unwrap().name(),
            "attributes"
        );
        let file = File::create(dir.join("spans-20250101T000000.000Z-0.parquet")).unwrap();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, before_weight.schema(), None).unwrap();
        writer.write(&before_weight).unwrap();
        writer.close().unwrap();
        write_parquet(&dir.join("spans-20260101T000000.000Z-0.parquet"), &spans).unwrap();
        std::fs::write(
            dir.join("spans-20270101T000000.000Z-0.parquet.tmp"),
            b"torn",
        )
        .unwrap();

        let (loaded, summary) = load(&[dir.to_path_buf()], &Conventions::default(), Columns::All);
        assert_eq!(summary.files, 2, "{summary:?}");
        assert!(summary.skipped.is_empty(), "{summary:?}");
        // The same spans twice: kept once, from the older file, with weight 1.
        assert_eq!(summary.duplicates, spans.num_rows());
        assert_eq!(loaded.num_rows(), spans.num_rows());
        let weights = loaded
            .column_by_name(schema::WEIGHT)
            .unwrap()
            .as_primitive::<arrow::datatypes::Float64Type>();
        assert_eq!(weights.null_count(), 0);
        assert!(weights.values().iter().all(|w| *w == 1.0));
        // Columns appended after `weight` are null in the older file's spans.
        let instances = loaded.column_by_name(schema::INSTANCE).unwrap();
        assert_eq!(instances.null_count(), loaded.num_rows());

        // A file whose columns are not a prefix of the span schema is refused, by name.
        let other = spans.project(&[1, 0]).unwrap();
        let path = dir.join("other.parquet");
        let file = File::create(&path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, other.schema(), None).unwrap();
        writer.write(&other).unwrap();
        writer.close().unwrap();
        let (_, summary) = load(&[path], &Conventions::default(), Columns::All);
        assert_eq!(summary.skipped.len(), 1);
        assert!(
            summary.skipped[0].contains("not the stormglass span schema"),
            "{summary:?}"
        );
    }

    /// A Parquet file of several row groups, read by several lanes at once, gives every
    /// span in the file's order; read for the analysis, the columns it never reads come
    /// back emptied (the lean form) and the others as written.
    #[test]
    fn parquet_row_groups_read_in_order_and_lean() {
        let scratch = tempfile::Builder::new()
            .prefix("stormglass-groups-")
            .tempdir()
            .unwrap();
        let dir = scratch.path();
        let (spans, _) = encode_request(&Conventions::default(), &testing::retry_fixture());
        let spans =
            arrow::compute::concat_batches(&SPANS_SCHEMA, &[spans.clone(), spans.clone(), spans])
                .unwrap();
        let path = dir.join("groups.parquet");
        let properties = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(4))
            .build();
        let mut writer = parquet::arrow::ArrowWriter::try_new(
            File::create(&path).unwrap(),
            SPANS_SCHEMA.clone(),
            Some(properties),
        )
        .unwrap();
        writer.write(&spans).unwrap();
        writer.close().unwrap();

        let (all, summary) = read(
            std::slice::from_ref(&path),
            &Conventions::default(),
            Columns::All,
        );
        assert!(summary.skipped.is_empty(), "{summary:?}");
        assert_eq!(concat_batches(&SPANS_SCHEMA, &all).unwrap(), spans);
        let (analysed, _) = read(&[path], &Conventions::default(), Columns::Analysed);
        assert_eq!(
            concat_batches(&SPANS_SCHEMA, &analysed).unwrap(),
            schema::lean(&spans)
        );
    }
}
