//! `stormglass analyze` and `stormglass query`: the live analysis's SQL over span files.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use stormglass_analytics::files::{self, Columns, LoadSummary};
use stormglass_analytics::report::{Report, WindowBounds};
use stormglass_analytics::{Engine, alerts, engine, offline};

use crate::config::Config;
use crate::gate::{FailOn, Failed};
use crate::table;

/// Output format of `analyze` and `query`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Load the files, reporting what was skipped on stderr; fails only when nothing loaded.
fn load(
    config: &Config,
    paths: &[PathBuf],
    columns: Columns,
) -> anyhow::Result<arrow::array::RecordBatch> {
    let (spans, summary) = files::load(paths, &config.conventions(), columns);
    report_skipped(&summary);
    if summary.spans == 0 && !summary.skipped.is_empty() {
        bail!("no spans could be read from {} file(s)", summary.files);
    }
    Ok(spans)
}

fn report_skipped(summary: &LoadSummary) {
    for skipped in &summary.skipped {
        eprintln!("stormglass: skipped {skipped}");
    }
    if !summary.skipped.is_empty() || summary.rejected_spans > 0 || summary.duplicates > 0 {
        eprintln!(
            "stormglass: read {} spans from {} file(s); skipped {} line(s)/file(s); rejected {} invalid span(s); kept {} duplicate span(s) once",
            summary.spans,
            summary.files,
            summary.skipped.len(),
            summary.rejected_spans,
            summary.duplicates
        );
    }
}

/// `stormglass analyze FILE...`: the report over every trace in the files.
pub async fn analyze(
    config: &Config,
    paths: &[PathBuf],
    format: Format,
    all_orphans: bool,
    fail_on: Option<&FailOn>,
) -> anyhow::Result<()> {
    let report = report(config, paths).await?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Table => print!("{}", table::report(&report, all_orphans)),
    }
    let failures = fail_on.map(|f| f.failures(&report)).unwrap_or_default();
    for failure in &failures {
        eprintln!("stormglass: fails the gate: {failure}");
    }
    if !failures.is_empty() {
        return Err(Failed(failures.len()).into());
    }
    Ok(())
}

/// `stormglass whatif --fail SERVICE=P... FILE...`: each layer's expected amplification if
/// requests to those services failed, from the retry policies in the files' traces.
pub async fn whatif(
    config: &Config,
    paths: &[PathBuf],
    failures: &[(String, f64)],
    format: Format,
) -> anyhow::Result<()> {
    let report = report(config, paths).await?;
    let known = |s: &str| report.layers.iter().any(|l| l.service == s);
    if let Some((unknown, _)) = failures.iter().find(|(s, _)| !known(s)) {
        let services: Vec<&str> = report.layers.iter().map(|l| l.service.as_str()).collect();
        bail!(
            "--fail {unknown}: no such service in the traces; they have {}",
            services.join(", ")
        );
    }
    let answer = stormglass_analytics::whatif::what_if(&report, failures);
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
        Format::Table => print!("{}", table::whatif(&answer)),
    }
    Ok(())
}

/// The report over every trace in the files, with its alert conditions.
async fn report(config: &Config, paths: &[PathBuf]) -> anyhow::Result<Report> {
    let started = std::time::Instant::now();
    // The report reads only what the analysis does.
    let (batches, mut summary) = files::read(paths, &config.conventions(), Columns::Analysed);
    engine::timed("read", started);
    if summary.spans == 0 && !summary.skipped.is_empty() {
        report_skipped(&summary);
        bail!("no spans could be read from {} file(s)", summary.files);
    }
    let params = config.params();
    let analysed = offline::analyse(&params, batches, offline::CHUNK_SPANS).await;
    if let Ok(analysed) = &analysed {
        summary.duplicates = analysed.duplicates;
        summary.spans -= analysed.duplicates;
    }
    report_skipped(&summary);
    let partials = Arc::new(analysed.context("analysis failed")?.partials);
    let engine = Engine::new(params);
    let started = std::time::Instant::now();
    let mut report = Report::build(&engine, &[partials], WindowBounds::default())
        .await
        .context("building the report failed")?;
    engine::timed("report", started);
    report.alerts = alerts::evaluate(&report, &config.alerts);
    Ok(report)
}

/// `stormglass query SQL --from FILE...`: ad hoc SQL over the span table, the derived
/// tables and the report tables of the files' spans.
pub async fn query(
    config: &Config,
    sql: &str,
    paths: &[PathBuf],
    format: Format,
) -> anyhow::Result<()> {
    let engine = Engine::new(config.params());
    let tables = Engine::tables_read(sql).context("the query is not valid")?;
    let ctx = if tables.iter().all(|t| t == "spans") {
        // Nothing derived is read: skip the analysis, and let DataFusion scan one Parquet
        // file directly, reading only the columns the query needs.
        let direct = match paths {
            [one] if one.extension().is_some_and(|e| e == "parquet") => {
                Engine::parquet_spans_context(one)
                    .await
                    .context("cannot read the spans")?
            }
            _ => None,
        };
        match direct {
            Some(ctx) => ctx,
            None => Engine::spans_context(load(config, paths, Columns::All)?)
                .context("cannot read the spans")?,
        }
    } else {
        let ctx = engine
            .query_context(load(config, paths, Columns::All)?)
            .await
            .context("analysis failed")?;
        stormglass_analytics::report::register_storm_potential(&ctx)
            .await
            .context("computing storm potential failed")?;
        ctx
    };
    let frame = ctx.sql(sql).await.context("the query is not valid")?;
    let batches = frame.collect().await.context("the query failed")?;
    let result = engine::Table {
        schema: batches
            .first()
            .map(|b| b.schema())
            .unwrap_or_else(|| Arc::new(arrow::datatypes::Schema::empty())),
        batches,
    };
    match format {
        Format::Table => println!(
            "{}",
            arrow::util::pretty::pretty_format_batches(&result.batches)?
        ),
        Format::Json => {
            let rows: Vec<serde_json::Value> = stormglass_analytics::engine::rows(&result);
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
    }
    Ok(())
}
