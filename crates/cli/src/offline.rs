//! `stormglass analyze` and `stormglass query`: the live analysis's SQL over span files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use stormglass_analytics::budget_table;
use stormglass_analytics::files::{self, Columns, LoadSummary};
use stormglass_analytics::report::{Report, Selection, WindowBounds};
use stormglass_analytics::{Engine, SessionContext, alerts, engine, offline};
use stormglass_export::advice as emit;

use crate::CheckFailed;
use crate::budget;
use crate::config::Config;
use crate::gate::FailOn;
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
    selection: &Selection,
    all_orphans: bool,
    fail_on: Option<&FailOn>,
) -> anyhow::Result<()> {
    let report = report(config, paths).await?;
    // The gate reads the whole report; the reader gets the part selected.
    let started = std::time::Instant::now();
    let shown = report.select(selection);
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&shown)?),
        Format::Table => print!("{}", table::report(&shown, all_orphans)),
    }
    engine::timed("output", started);
    let failures = fail_on.map(|f| f.failures(&report)).unwrap_or_default();
    // The process ends with the command: the report's memory goes back with it, not row by
    // row (at 160,000 edges freeing its rows was ~1% of the instructions `analyze` ran).
    std::mem::forget(report);
    for failure in &failures {
        eprintln!("stormglass: fails the gate: {failure}");
    }
    if !failures.is_empty() {
        return Err(CheckFailed(format!(
            "--fail-on: {} finding(s) or alert(s) hold",
            failures.len()
        ))
        .into());
    }
    Ok(())
}

/// `stormglass whatif --fail SERVICE=P... FILE...`: each layer's expected amplification if
/// requests to those services failed, from the retry policies in the files' traces.
/// What `stormglass advise` prints.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum AdviceFormat {
    /// One line per edge and layer.
    Text,
    /// The advice as JSON (docs/advice.md names the fields).
    Json,
    /// The budget table `stormglass check-budget` reads.
    Budget,
    /// gRPC service configs, one per caller's channel to a callee.
    Grpc,
    /// Envoy routes (`retry_policy`) and clusters (`retry_budget`), per caller and callee.
    Envoy,
    /// Istio VirtualServices and DestinationRules (`retryBudget`), per callee.
    Istio,
    /// Gateway API HTTPRoutes (`timeouts`, `retry`) and the experimental
    /// XBackendTrafficPolicy (`retryConstraint`), per callee.
    GatewayApi,
    /// Linkerd's retry and timeout annotations, per callee Service.
    Linkerd,
}

/// How `replay` and `whatif` run a policy's retry budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BudgetAs {
    /// A share of the calls over 10 s (Linkerd's `retryBudget`, Gateway API's
    /// `retryConstraint`).
    #[value(alias = "gateway-api")]
    Linkerd,
    /// A share of the requests in flight (Envoy's and Istio's `retry_budget`).
    #[value(alias = "istio")]
    Envoy,
}

/// The policy in `path`, its budgets run as `budget_as` says.
fn read_budgeted(
    (path, budget_as): (&Path, BudgetAs),
) -> anyhow::Result<stormglass_analytics::policy::Policy> {
    let policy = read_policy(path)?;
    Ok(match budget_as {
        BudgetAs::Envoy => policy.with_concurrency_budgets(),
        BudgetAs::Linkerd => policy,
    })
}

/// `stormglass replay --policy FILE FILE|DIR...`: the files' calls under the policy.
pub async fn replay(
    config: &Config,
    paths: &[PathBuf],
    policy: (&Path, BudgetAs),
    format: Format,
    selection: &Selection,
) -> anyhow::Result<()> {
    let policy = read_budgeted(policy)?;
    let ctx = traffic(config, paths).await?;
    let (calls, attempts) = stormglass_analytics::replay::traffic(&ctx, &policy)
        .await
        .context("reading the traffic")?;
    let replayed =
        stormglass_analytics::replay::replay(&calls, &attempts, &policy).listed(selection);
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&replayed)?),
        Format::Table => print!("{}", table::replay(&replayed)),
    }
    Ok(())
}

/// A policy file (`--policy`): the JSON of `stormglass advise --format json`.
pub fn read_policy(path: &Path) -> anyhow::Result<stormglass_analytics::policy::Policy> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    stormglass_analytics::policy::Policy::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// `stormglass advise FILE|DIR...`: the advice for the files' traffic.
/// The advice in `format`: the text lists what `selection` selects (as `analyze` does, the
/// worst 200 edges by default, with the totals); JSON (the policy `replay`, `whatif` and
/// `demo` read) and the configurations cover every edge its filters select, whatever its
/// limit: a policy or a configuration cut short would leave edges without their settings.
pub async fn advise(
    config: &Config,
    paths: &[PathBuf],
    format: AdviceFormat,
    selection: Selection,
) -> anyhow::Result<()> {
    let selection = match format {
        AdviceFormat::Text => selection,
        _ => Selection {
            limit: None,
            ..selection
        },
    };
    // The report and the whole advice are let go before the output is written: at width
    // the configurations' text and values are hundreds of MB of their own.
    let advice = {
        let report = report(config, paths).await?;
        let params = stormglass_analytics::advice::AdviceParams::from(&config.params());
        let advice = stormglass_analytics::advice::advise(&report, &params);
        advice.listed(&report.select(&selection))
    };
    let json = |v: &serde_json::Value| serde_json::to_string_pretty(v).map(|t| t + "\n");
    let text = match format {
        AdviceFormat::Text => table::advice(&advice),
        AdviceFormat::Json => serde_json::to_string_pretty(&advice)? + "\n",
        AdviceFormat::Budget => emit::budget_file(&advice),
        AdviceFormat::Grpc => json(&emit::grpc_service_configs(&advice))?,
        AdviceFormat::Envoy => serde_saphyr::to_string(&emit::envoy(&advice))?,
        AdviceFormat::Istio => emit::yaml_documents(&emit::istio(&advice)),
        AdviceFormat::GatewayApi => emit::yaml_documents(&emit::gateway_api(&advice)),
        AdviceFormat::Linkerd => emit::yaml_documents(&emit::linkerd(&advice)),
    };
    print!("{text}");
    Ok(())
}

pub async fn whatif(
    config: &Config,
    paths: &[PathBuf],
    failures: &[(String, f64)],
    policy: Option<(&Path, BudgetAs)>,
    format: Format,
    selection: &Selection,
) -> anyhow::Result<()> {
    let policy = policy.map(read_budgeted).transpose()?;
    let report = report(config, paths).await?;
    if let Some(unknown) = stormglass_analytics::whatif::unknown_service(&report, failures) {
        // The first few by name: a fleet's thousands would bury the answer.
        const NAMED: usize = 20;
        let services: Vec<&str> = report.layers.iter().map(|l| l.service.as_str()).collect();
        let more = match services.len().saturating_sub(NAMED) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        bail!(
            "--fail {unknown}: no such service in the traces; they have {}{more}",
            services[..services.len().min(NAMED)].join(", ")
        );
    }
    let answer =
        stormglass_analytics::whatif::what_if(&report, failures, policy.as_ref()).listed(selection);
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
        Format::Table => print!("{}", table::whatif(&answer)),
    }
    Ok(())
}

/// `stormglass check-budget FILE [--against FILE...]`: the violations with their numbers,
/// errors first, at most `limit` of them; an error-level one fails.
pub async fn check_budget(
    config: &Config,
    file: &Path,
    against: &[PathBuf],
    limit: Option<usize>,
) -> anyhow::Result<()> {
    let declared = budget::read(file).map_err(anyhow::Error::msg)?;
    let mut found = budget_table::check(&declared);
    if !against.is_empty() {
        let ctx = traffic(config, against).await?;
        let observed = budget_table::observed(&ctx, &declared)
            .await
            .context("reading the traffic")?;
        found.extend(budget_table::against(
            &declared,
            &observed,
            config.advice.timeout_factor,
        ));
    }
    found.sort_by_key(|v| v.level != budget_table::Level::Error);
    let errors = found
        .iter()
        .filter(|v| v.level == budget_table::Level::Error)
        .count();
    let shown = found.len().min(limit.unwrap_or(usize::MAX));
    for v in &found[..shown] {
        println!("{v}");
    }
    if shown < found.len() {
        println!(
            "... and {} more violation(s) (--limit N or --all lists them)",
            found.len() - shown
        );
    }
    println!(
        "{} edge(s) declared: {errors} error(s), {} warning(s)",
        declared.edges.len(),
        found.len() - errors
    );
    if errors > 0 {
        return Err(CheckFailed(format!("check-budget: {errors} error-level violation(s)")).into());
    }
    Ok(())
}

/// `stormglass check-budget --emit FILE...`: a budget file from the files' traffic.
pub async fn emit_budget(config: &Config, paths: &[PathBuf]) -> anyhow::Result<()> {
    let ctx = traffic(config, paths).await?;
    let read = async {
        let observed = budget_table::observed(&ctx, &budget_table::Declared::default()).await?;
        Ok::<_, stormglass_analytics::engine::AnalysisError>((
            observed,
            budget_table::sequential_in(&ctx).await?,
        ))
    };
    let (observed, sequential) = read.await.context("reading the traffic")?;
    print!("{}", budget::emit(&observed, &sequential));
    Ok(())
}

/// One analysis of the files' spans, every table queryable.
async fn traffic(config: &Config, paths: &[PathBuf]) -> anyhow::Result<SessionContext> {
    Engine::new(config.params())
        .query_context(load(config, paths, Columns::All)?)
        .await
        .context("analysis failed")
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
    let started = std::time::Instant::now();
    let analysed = offline::analyse(&params, batches, offline::CHUNK_SPANS).await;
    engine::timed("analyse", started);
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
    let started = std::time::Instant::now();
    report.alerts = alerts::evaluate(&report, &config.alerts);
    report.bound_findings(config.report.max_findings_per_kind);
    engine::timed("alerts", started);
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
            let rows = stormglass_analytics::engine::json_rows(&result);
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
    }
    Ok(())
}
