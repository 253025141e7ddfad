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
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use prost::Message;
use stormglass_model::{Conventions, SPANS_SCHEMA, SpanBatchBuilder};

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

/// Load every file into one batch of spans.
pub fn load(paths: &[PathBuf], conventions: &Conventions) -> (RecordBatch, LoadSummary) {
    let mut summary = LoadSummary::default();
    let mut batches = Vec::new();
    for path in paths {
        summary.files += 1;
        let name = path.display().to_string();
        let result = match extension(path).as_str() {
            "parquet" => load_parquet(path, &mut batches),
            "json" | "jsonl" | "ndjson" => load_json(path, conventions, &mut batches, &mut summary),
            _ => load_protobuf(path, conventions, &mut batches, &mut summary),
        };
        if let Err(why) = result {
            summary.skipped.push(format!("{name}: {why}"));
        }
    }
    let batch = match arrow::compute::concat_batches(&SPANS_SCHEMA, &batches) {
        Ok(batch) => batch,
        Err(e) => unreachable!("loaded batches share SPANS_SCHEMA: {e}"),
    };
    let (batch, duplicates) = without_duplicates(batch);
    summary.duplicates = duplicates;
    summary.spans = batch.num_rows();
    (batch, summary)
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
    let (Some(traces), Some(spans)) = (
        column(stormglass_model::schema::TRACE_ID),
        column(stormglass_model::schema::SPAN_ID),
    ) else {
        unreachable!("loaded batches follow SPANS_SCHEMA");
    };
    let mut seen = std::collections::HashSet::with_capacity(batch.num_rows());
    let keep: Vec<u32> = (0..batch.num_rows())
        .filter(|&row| seen.insert((traces.value(row), spans.value(row))))
        .map(|row| row as u32)
        .collect();
    let duplicates = batch.num_rows() - keep.len();
    if duplicates == 0 {
        return (batch, 0);
    }
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
        builder.append_request(request);
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

fn load_parquet(path: &Path, batches: &mut Vec<RecordBatch>) -> Result<(), String> {
    let file = File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| format!("not a readable Parquet file: {e}"))?;
    for batch in reader {
        let batch = batch.map_err(|e| format!("corrupt Parquet data: {e}"))?;
        let fields = batch.schema().fields().clone();
        let expected = SPANS_SCHEMA.fields();
        let same = fields.len() == expected.len()
            && fields
                .iter()
                .zip(expected.iter())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            return Err("its schema is not the stormglass span schema".into());
        }
        // Same names and types; rebuild on the canonical schema (nullability metadata).
        match RecordBatch::try_new(SPANS_SCHEMA.clone(), batch.columns().to_vec()) {
            Ok(b) => batches.push(b),
            Err(e) => return Err(format!("its columns do not fit the span schema: {e}")),
        }
    }
    Ok(())
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
