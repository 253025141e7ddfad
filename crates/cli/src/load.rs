//! `stormglass load`: drive an OTLP receiver (stormglass or any other collector) with
//! synthetic SDK-shaped traces and report throughput and the server's CPU and memory; or
//! measure the decode floor; or write the same traces to a Parquet file for `analyze` and
//! `query` benchmarks.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use stormglass_demo::load::{self, DecodeReport, LoadConfig, LoadReport, Payloads};
use stormglass_model::synth::{Generator, Shape};
use stormglass_model::{Conventions, encode_request};

/// Send load and print the report (JSON with `json`).
pub async fn send(
    config: LoadConfig,
    shape: Shape,
    spans_per_request: usize,
    payloads: usize,
    json: bool,
) -> anyhow::Result<()> {
    let payloads = Arc::new(Payloads::generate(shape, spans_per_request, payloads));
    let report = load::run(&config, payloads).await?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", describe(&config, &report));
    }
    if report.accepted_spans == 0 {
        anyhow::bail!(
            "the receiver accepted no spans{}",
            report
                .first_error
                .map(|e| format!(" (first error: {e})"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

fn describe(config: &LoadConfig, r: &LoadReport) -> String {
    let mut text = format!(
        "sent {} requests over {:?} to {} with {} in flight for {:.1} s\n\
         spans: {} accepted, {} refused, {} rejected, {} failed; {:.0} spans/s accepted\n\
         payload: {:.0} bytes per span, {:.1} spans per trace\n",
        r.requests,
        config.protocol,
        config.endpoint,
        r.concurrency,
        r.wall_seconds,
        r.accepted_spans,
        r.refused_spans,
        r.rejected_spans,
        r.failed_spans,
        r.spans_per_second,
        r.bytes_per_span,
        r.spans_per_trace,
    );
    if let Some(e) = &r.first_error {
        text += &format!("first error: {e}\n");
    }
    if let Some(s) = &r.server {
        text += &format!(
            "server pid {}: {:.2} CPU-s, {:.0} spans per CPU-s, RSS {:.1} MiB (peak {:.1} MiB)\n",
            s.pid,
            s.cpu_seconds,
            s.spans_per_cpu_second,
            s.rss_bytes as f64 / 1048576.0,
            s.peak_rss_bytes as f64 / 1048576.0,
        );
    }
    text
}

/// Measure the decode floor on one thread and print it.
pub fn decode_floor(
    shape: Shape,
    spans_per_request: usize,
    payloads: usize,
    duration: std::time::Duration,
    json: bool,
) -> anyhow::Result<()> {
    let payloads = Payloads::generate(shape, spans_per_request, payloads);
    let report: DecodeReport = load::decode_floor(&payloads, duration);
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "prost decode: {:.0} spans per CPU-s; decode + Arrow encoding: {:.0} spans per CPU-s \
             ({:.0} bytes per span, {:.1} spans per trace)",
            report.decode_spans_per_cpu_second,
            report.decode_and_arrow_spans_per_cpu_second,
            report.bytes_per_span,
            report.spans_per_trace
        );
    }
    Ok(())
}

/// Write at least `spans` spans of whole synthetic traces to `path` as Parquet with the
/// span schema.
pub fn write_parquet(path: &Path, shape: Shape, spans: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let conventions = Conventions::default();
    // Fixed start, so the same shape and seed always write the same file.
    let mut generator = Generator::new(shape, 1_764_000_000_000_000_000);
    let mut written = 0u64;
    let batches = std::iter::from_fn(|| {
        (written < spans).then(|| {
            let request = generator.request(65_536.min((spans - written) as usize));
            let (batch, _) = encode_request(&conventions, &request);
            written += batch.num_rows() as u64;
            batch
        })
    });
    stormglass_analytics::files::write_parquet_batches(path, batches)
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!(
        "stormglass: wrote {written} spans to {} in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
