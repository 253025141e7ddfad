//! The DataFusion side of the analysis.
//!
//! Data flow: [`Engine::analyse`] holds `spans`, `lineage` (Rust) and `params` as tables,
//! materialises every derived table of [`queries::DERIVED`] in order, then runs
//! [`queries::PARTIALS`] over them: small, mergeable aggregates, the only thing kept per
//! chunk. Those queries are planned once per engine and re-run over each batch (see
//! [`planned`]). [`Engine::merge`] registers the union of a window's partials as
//! `p_*` tables and materialises [`queries::REPORT`]: the window's figures. Live analysis
//! calls `analyse_in_window` per chunk and `merge` over the window; offline analysis does
//! the same over a file's chunks of whole traces ([`crate::offline`]), so both read the
//! same SQL.

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::array::{Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::prelude::{SessionConfig, SessionContext};
use serde::Deserialize;

use stormglass_model::SPANS_SCHEMA;
use stormglass_model::schema as col;

use crate::clock::{self, ClockBounds};
use crate::histogram;
use crate::lineage::{
    self, ANALYSED_LINEAGE_SCHEMA, ATTEMPT_LINEAGE, ATTEMPT_LINEAGE_SCHEMA, CLOCK_PAIRS_SCHEMA,
    Detail, EDGE_NAMES, EDGE_NAMES_SCHEMA, LINEAGE, Lineage,
};
mod compact;
mod planned;

use crate::queries;
pub use crate::table::{AnalysisError, Table, into_rows, json_rows, rows, run, table, timed};
use planned::Plans;

/// `advice.*`, `orphans.*`, `deadlines.*` and `clocks.*`: the thresholds the SQL reads from
/// `params`.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub deadline_tolerance_ms: f64,
    pub orphan_grace_ms: f64,
    pub min_backoff_ms: f64,
    pub timeout_factor: f64,
    /// No timeout is advised below this (`advice.min_timeout_ms`).
    pub min_timeout_ms: f64,
    /// Clocks agreeing within this are not corrected (see [`crate::clock`]).
    pub clock_tolerance_ms: f64,
    /// A skew beyond this is a `clock_skew` finding.
    pub clock_skew_threshold_ms: f64,
    /// How unnumbered attempts join calls (`retries.*`). Read by the lineage, not the SQL.
    pub retries: lineage::RetryRules,
    /// An edge's backoff is classified from this many retried calls on.
    pub backoff_min_calls: f64,
    /// A 100 ms slot in which at least this many calls retried to one callee (and 3 times
    /// its mean) holds synchronised retries (`retries.synchronised_min_calls`).
    pub synchronised_min_calls: f64,
    /// The entry SLO's latency target (`alerts.entry_slo.latency_ms`): entries report the
    /// share of their requests within it.
    pub slo_latency_ms: f64,
    /// A given-up write's result unknown longer than this (`idempotency.unknown_after`)
    /// is counted in `unknown_results_over_limit`.
    pub unknown_after_ms: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            deadline_tolerance_ms: 1.0,
            orphan_grace_ms: 5.0,
            min_backoff_ms: 5.0,
            timeout_factor: 1.5,
            min_timeout_ms: 50.0,
            clock_tolerance_ms: 1.0,
            clock_skew_threshold_ms: 10.0,
            retries: lineage::RetryRules::default(),
            backoff_min_calls: 10.0,
            synchronised_min_calls: 5.0,
            slo_latency_ms: crate::alerts::EntrySlo::default().latency_ms,
            unknown_after_ms: 60_000.0,
        }
    }
}

/// What one chunk of a live window needs from the window's earlier chunks: the services
/// that sent SERVER spans (a callee is instrumented or not for the whole window) and the
/// clock bounds found so far (skew is estimated over the window). Offline, a file's chunks
/// get the whole file's servers and clock bounds ([`crate::offline`]); one batch, none.
#[derive(Clone, Debug, Default)]
pub struct WindowContext {
    pub servers: Vec<String>,
    pub clocks: ClockBounds,
}

impl Params {
    fn batch(&self) -> RecordBatch {
        let fields = [
            ("deadline_tolerance_ms", self.deadline_tolerance_ms),
            ("orphan_grace_ms", self.orphan_grace_ms),
            ("min_backoff_ms", self.min_backoff_ms),
            ("timeout_factor", self.timeout_factor),
            ("clock_tolerance_ms", self.clock_tolerance_ms),
            ("clock_skew_threshold_ms", self.clock_skew_threshold_ms),
            ("backoff_min_calls", self.backoff_min_calls),
            ("synchronised_min_calls", self.synchronised_min_calls),
            ("slo_latency_ms", self.slo_latency_ms),
            ("unknown_after_ms", self.unknown_after_ms),
        ];
        let schema = Schema::new(
            fields
                .iter()
                .map(|(name, _)| Field::new(*name, DataType::Float64, false))
                .collect::<Vec<_>>(),
        );
        let columns = fields
            .iter()
            .map(|(_, v)| Arc::new(Float64Array::from(vec![*v])) as _)
            .collect();
        match RecordBatch::try_new(Arc::new(schema), columns) {
            Ok(batch) => batch,
            Err(e) => unreachable!("params columns match their schema: {e}"),
        }
    }
}

/// One interval's partial aggregates, in [`queries::PARTIALS`] order, with what was analysed.
#[derive(Clone, Debug)]
pub struct Partials {
    pub(crate) tables: Vec<(&'static str, Table)>,
    pub spans: usize,
    pub traces: usize,
    /// Earliest span start and latest span end analysed (Unix ns), when any.
    pub span_range: Option<(i64, i64)>,
}

impl Partials {
    /// The partial tables of one analysis of `spans`, with what it covered: the spans,
    /// their `traces` distinct trace ids (the lineage's trace grouping counts them; in SQL,
    /// `COUNT(DISTINCT trace_id)` was ~7% of a chunk's queries), and the earliest start and
    /// latest end as sent.
    fn new(tables: Vec<(&'static str, Table)>, spans: &RecordBatch, traces: usize) -> Partials {
        let time = |name| {
            spans
                .column_by_name(name)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
        };
        let start = time(col::START_NS).and_then(arrow::compute::min);
        let end = time(col::END_NS).and_then(arrow::compute::max);
        Partials {
            tables,
            spans: spans.num_rows(),
            traces,
            span_range: start.zip(end),
        }
    }

    pub(crate) fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|(n, _)| *n == name).map(|(_, t)| t)
    }

    /// The rows partial table `name` holds (0 for none): what the window keeps of it.
    pub fn rows(&self, name: &str) -> usize {
        self.table(name).map_or(0, Table::rows)
    }

    /// Intersect this interval's clock bounds (`partial_clock_skew`) into `bounds`.
    pub fn clock_bounds_into(&self, bounds: &mut ClockBounds) {
        #[derive(Deserialize)]
        struct Row {
            caller: String,
            callee: String,
            low_ms: f64,
            high_ms: f64,
            pairs: u64,
        }
        let Some(table) = self.table("partial_clock_skew") else {
            return;
        };
        for r in rows::<Row>(table) {
            let bound = clock::Bound {
                low_ms: r.low_ms,
                high_ms: r.high_ms,
                pairs: r.pairs,
            };
            clock::add(bounds, (r.caller, r.callee), bound);
        }
    }

    /// The partials of several chunks as one: every partial is mergeable by union (the
    /// report sums or de-duplicates, as it does across a window's intervals), so this only
    /// collects the batches. `None` for no chunks.
    pub fn concat(chunks: Vec<Partials>) -> Option<Partials> {
        let mut chunks = chunks.into_iter();
        let mut merged = chunks.next()?;
        for chunk in chunks {
            for ((_, into), (_, from)) in merged.tables.iter_mut().zip(chunk.tables) {
                into.batches.extend(from.batches);
            }
            merged.spans += chunk.spans;
            merged.traces += chunk.traces;
            merged.span_range = match (merged.span_range, chunk.span_range) {
                (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
                (a, b) => a.or(b),
            };
        }
        Some(merged)
    }

    /// Each table as one batch with buffers of exact size (DataFusion's output batches
    /// carry spare capacity, a few hundred KiB per table, which a window of many chunks
    /// would otherwise hold for its whole length), and the counts of the tables in
    /// [`compact::NARROWED`] in the smallest integer type that holds them: done per chunk,
    /// as it is analysed, since an interval's chunks wait for its end.
    pub fn compact(self) -> Partials {
        self.compacted(false)
    }

    /// For what the window keeps, one interval's chunks ([`Partials::compact`]ed): each
    /// table as one batch again, its strings dictionary-encoded where that is smaller (at
    /// width its rows repeat each caller, callee and operation across the chunks). The
    /// tables in [`compact::NARROWED`] are put together column by column
    /// ([`compact::concat_narrowed`]), never widened whole.
    pub fn compact_for_window(self) -> Partials {
        self.compacted(true)
    }

    fn compacted(mut self, encode: bool) -> Partials {
        for (name, table) in &mut self.tables {
            let rows = table.rows();
            if rows == 0 {
                table.batches.clear();
                continue;
            }
            let narrowed = compact::NARROWED.contains(name);
            if encode && narrowed {
                if let Ok(one) = compact::concat_narrowed(&table.schema, &table.batches) {
                    table.batches = vec![one];
                }
                continue;
            }
            let plain: Result<Vec<RecordBatch>, _> =
                table.batches.iter().map(crate::table::plain).collect();
            let exact = plain.and_then(|batches| {
                let schema = batches
                    .first()
                    .map_or(table.schema.clone(), RecordBatch::schema);
                let one = arrow::compute::concat_batches(&schema, &batches)?;
                // `take` allocates exactly what the rows need (concat of one batch does not copy).
                let all = 0..u32::try_from(rows).unwrap_or(u32::MAX);
                let exact = arrow::compute::take_record_batch(
                    &one,
                    &arrow::array::UInt32Array::from_iter_values(all),
                )?;
                if encode {
                    compact::dictionary_encoded(&exact)
                } else if narrowed {
                    compact::narrowed(&exact)
                } else {
                    Ok(exact)
                }
            });
            if let Ok(one) = exact {
                table.batches = vec![one];
            }
        }
        self
    }

    /// Nothing was analysed and no table holds a row (an interval without input).
    pub fn is_empty(&self) -> bool {
        self.spans == 0 && self.tables.iter().all(|(_, t)| t.rows() == 0)
    }

    /// Arrow memory held by the partial tables.
    pub fn memory_bytes(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|(_, t)| &t.batches)
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }
}

/// Runs the analysis queries. Clones share one set of plans (and DataFusion memory pool),
/// used by one analysis at a time.
#[derive(Clone, Debug, Default)]
pub struct Engine {
    pub params: Params,
    memory_limit: Option<usize>,
    /// Plan for one partition: the analysis runs on one thread (see [`Engine::on_one_thread`]).
    one_thread: bool,
    plans: Arc<PlanCache>,
}

/// The plans, built on first use, and the turn to use them: their tables hold one
/// analysis's batches at a time.
#[derive(Debug, Default)]
struct PlanCache {
    plans: tokio::sync::OnceCell<Plans>,
    turn: tokio::sync::Mutex<()>,
}

/// The plans with one analysis's inputs held; dropping it empties every table, so no
/// batch outlives its analysis, even one that failed or was cancelled.
struct AnalysisInputs<'a> {
    plans: &'a Plans,
    _turn: tokio::sync::MutexGuard<'a, ()>,
    /// `lineage` with every column ([`Detail::Query`]), for the session a user queries: the
    /// plans read the analysed columns alone.
    lineage: Option<RecordBatch>,
    /// Distinct trace ids in the spans.
    traces: usize,
}

impl AnalysisInputs<'_> {
    /// Every table, as [`Plans::take`], with `lineage` in full when it was built so.
    fn take(&mut self) -> Vec<(&'static str, Table)> {
        let mut tables = self.plans.take();
        let lineage = tables.iter_mut().find(|(name, _)| *name == LINEAGE);
        if let (Some(full), Some((_, table))) = (self.lineage.take(), lineage) {
            *table = Table {
                schema: full.schema(),
                batches: vec![full],
            };
        }
        tables
    }
}

impl std::ops::Deref for AnalysisInputs<'_> {
    type Target = Plans;

    fn deref(&self) -> &Plans {
        self.plans
    }
}

impl Drop for AnalysisInputs<'_> {
    fn drop(&mut self) {
        self.plans.clear();
    }
}

impl Engine {
    pub fn new(params: Params) -> Self {
        Engine {
            params,
            ..Engine::default()
        }
    }

    /// Bound what DataFusion's operators (joins, aggregations, sorts) may hold at once:
    /// live, the analysis's share of `limits.memory`. DataFusion's memory pool for one
    /// analysis is unbounded without it (offline).
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = Some(bytes);
        self.plans = Arc::default();
        self
    }

    /// Plan every query for one partition: the live analysis runs on its worker's one
    /// thread, where two partitions only repartitioned each input (hash or round robin,
    /// copying every row) to run nowhere in parallel.
    pub fn on_one_thread(mut self) -> Self {
        self.one_thread = true;
        self.plans = Arc::default();
        self
    }

    /// A session for this engine's analysis, in its memory pool.
    fn session(&self) -> SessionContext {
        Self::session_with(self.memory_limit, self.partitions())
    }

    fn partitions(&self) -> usize {
        // Two otherwise: the batches analysed are one interval's, and the machines small.
        if self.one_thread { 1 } else { 2 }
    }

    /// A session outside any engine (a query over files), on two partitions.
    fn file_session() -> SessionContext {
        Self::session_with(None, 2)
    }

    fn session_with(memory_limit: Option<usize>, partitions: usize) -> SessionContext {
        let mut config = SessionConfig::new()
            .with_target_partitions(partitions)
            .with_information_schema(true);
        if let Some(bytes) = memory_limit {
            // A sort reserves this much of the pool for its merge before it takes a row:
            // DataFusion's default, 10 MiB, is more than the whole pool of a small budget
            // (4 MiB at `limits.memory: 32MiB`), where every chunk's analysis failed.
            config = config.with_sort_spill_reservation_bytes((bytes / 8).min(10 << 20));
        }
        let runtime = memory_limit.and_then(|bytes| {
            datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
                .with_memory_limit(bytes, 1.0)
                .build_arc()
                .inspect_err(|e| tracing::error!(error = %e, "no DataFusion memory pool"))
                .ok()
        });
        let ctx = match runtime {
            Some(runtime) => SessionContext::new_with_config_rt(config, runtime),
            None => SessionContext::new_with_config(config),
        };
        histogram::register(&ctx);
        clock::register(&ctx);
        ctx
    }

    /// The plans, planned on first use, holding the inputs of `spans` in `window`: the
    /// `window_*` tables, and clocks corrected by the window's bounds.
    async fn load(
        &self,
        spans: RecordBatch,
        window: &WindowContext,
        detail: Detail,
    ) -> Result<AnalysisInputs<'_>, AnalysisError> {
        let plans = self
            .plans
            .plans
            .get_or_try_init(|| async {
                // Dynamic filters would outlive a re-run's reset (see `planned`).
                let ctx = self.session();
                ctx.state_ref()
                    .write()
                    .config_mut()
                    .options_mut()
                    .optimizer
                    .enable_dynamic_filter_pushdown = false;
                let inputs = [
                    ("spans", SPANS_SCHEMA.clone()),
                    (LINEAGE, ANALYSED_LINEAGE_SCHEMA.clone()),
                    (ATTEMPT_LINEAGE, ATTEMPT_LINEAGE_SCHEMA.clone()),
                    (EDGE_NAMES, EDGE_NAMES_SCHEMA.clone()),
                    ("clock_pairs", CLOCK_PAIRS_SCHEMA.clone()),
                    ("params", self.params.batch().schema()),
                    ("window_servers", window_servers(&[]).schema()),
                ];
                Plans::new(ctx, &inputs).await
            })
            .await?;
        let turn = self.plans.turn.lock().await;
        let started = std::time::Instant::now();
        let Lineage {
            batch: lineage,
            attempts,
            edges,
            clock_pairs,
            traces,
        } = lineage::lineage_in_window(
            &spans,
            &window.clocks,
            self.params.clock_tolerance_ms,
            self.params.retries,
            detail,
        );
        timed("lineage (Rust)", started);
        // The plans read the analysed columns; a query session gets the full table back
        // (`AnalysisInputs::take`).
        let (analysed, full) = match detail {
            Detail::Analysis => (lineage, None),
            Detail::Query => {
                let indices: Vec<usize> = ANALYSED_LINEAGE_SCHEMA
                    .fields()
                    .iter()
                    .filter_map(|f| lineage.schema().index_of(f.name()).ok())
                    .collect();
                let analysed = lineage
                    .project(&indices)
                    .map_err(|e| AnalysisError::query(LINEAGE, e))?;
                (analysed, Some(lineage))
            }
        };
        let loaded = AnalysisInputs {
            plans,
            _turn: turn,
            lineage: full,
            traces,
        };
        loaded.fill("spans", vec![spans])?;
        loaded.fill(LINEAGE, vec![analysed])?;
        loaded.fill(ATTEMPT_LINEAGE, vec![attempts])?;
        loaded.fill(EDGE_NAMES, vec![edges])?;
        loaded.fill("clock_pairs", vec![clock_pairs])?;
        loaded.fill("params", vec![self.params.batch()])?;
        loaded.fill("window_servers", vec![window_servers(&window.servers)])?;
        Ok(loaded)
    }

    /// A session over `spans` with `lineage`, `params` and every derived table registered.
    pub async fn derive(&self, spans: RecordBatch) -> Result<SessionContext, AnalysisError> {
        let mut loaded = self
            .load(spans, &WindowContext::default(), Detail::Query)
            .await?;
        loaded.derive().await?;
        self.session_of(loaded.take())
    }

    /// A session with `tables` registered.
    fn session_of(&self, tables: Vec<(&str, Table)>) -> Result<SessionContext, AnalysisError> {
        let ctx = self.session();
        for (name, table) in tables {
            register(&ctx, name, table.schema, table.batches)?;
        }
        Ok(ctx)
    }

    /// Derive and aggregate one batch of spans.
    pub async fn analyse(&self, spans: RecordBatch) -> Result<Partials, AnalysisError> {
        self.analyse_in_window(spans, &WindowContext::default())
            .await
    }

    /// `partial_latency` rows for late SERVER spans ([`queries::LATE_LATENCY`]).
    pub async fn late_latency(&self, spans: RecordBatch) -> Result<Table, AnalysisError> {
        let ctx = self.session();
        register(&ctx, "spans", spans.schema(), vec![spans])?;
        run(&ctx, &queries::LATE_LATENCY).await
    }

    /// Derive and aggregate one chunk of a live window (see [`WindowContext`]).
    pub async fn analyse_in_window(
        &self,
        spans: RecordBatch,
        window: &WindowContext,
    ) -> Result<Partials, AnalysisError> {
        let loaded = self.load(spans.clone(), window, Detail::Analysis).await?;
        loaded.derive().await?;
        Ok(Partials::new(
            loaded.partials().await?,
            &spans,
            loaded.traces,
        ))
    }

    /// A session with the union of `window`'s partials as `p_*` tables: the report tables
    /// ([`queries::REPORT`]) are run by their reader, one at a time, so that each is held
    /// only while it is read (at width the report tables at once were ~700 MiB).
    pub async fn merge(&self, window: &[Arc<Partials>]) -> Result<SessionContext, AnalysisError> {
        // Outside the pool: the report reads only partials, small and bounded by the window.
        let ctx = Self::session_with(None, self.partitions());
        let params = self.params.batch();
        register(&ctx, "params", params.schema(), vec![params])?;
        self.register_partials(&ctx, window).await?;
        Ok(ctx)
    }

    /// Merge the chunks' rows of each table in [`compact::MERGED`] to one row per key, in
    /// place, before [`Partials::compact_for_window`]: the merge the report does across
    /// the window, done once per interval, so the window and the interval's counts hold an
    /// edge once. A table that fails to merge keeps its rows (still right, only larger).
    pub async fn merge_chunks(&self, partials: &mut Partials) -> Result<(), AnalysisError> {
        use datafusion::common::Column;
        use datafusion::functions_aggregate::expr_fn::{max, min, sum};
        use datafusion::logical_expr::Expr;
        for (name, table) in &mut partials.tables {
            let Some(merge) = compact::MERGED.iter().find(|m| m.table == *name) else {
                continue;
            };
            if table.batches.len() < 2 {
                continue;
            }
            let failed = |e: DataFusionError| AnalysisError::query(name, e);
            let ctx = Self::session_with(None, self.partitions());
            Self::register_narrowed(&ctx, "chunks", &table.schema, &table.batches).await?;
            let column = |name: &str| Expr::Column(Column::from_name(name));
            let fields = table.schema.fields();
            let is_key = |f: &&Arc<Field>| merge.keys.contains(&f.name().as_str());
            let keys = fields.iter().filter(is_key).map(|f| column(f.name()));
            let aggregates = (fields.iter().filter(|f| !is_key(f)))
                .map(|f| {
                    let (name, c) = (f.name().as_str(), column(f.name()));
                    let merged = if merge.maxima.contains(&name) {
                        max(c)
                    } else if merge.minima.contains(&name) {
                        min(c)
                    } else {
                        sum(c)
                    };
                    merged.alias(name)
                })
                .collect();
            let in_order: Vec<Expr> = fields.iter().map(|f| column(f.name())).collect();
            let merged = ctx
                .table("chunks")
                .await
                .and_then(|t| t.aggregate(keys.collect(), aggregates))
                .and_then(|t| t.select(in_order))
                .map_err(failed)?
                .collect()
                .await
                .map_err(failed)?;
            table.batches =
                planned::conform(&table.schema, merged).map_err(|e| failed(e.into()))?;
        }
        Ok(())
    }

    /// The tables `sql` reads (CTE names excluded), or the parser's error.
    pub fn tables_read(sql: &str) -> Result<Vec<String>, DataFusionError> {
        let state = Self::file_session().state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(sql, &dialect)?;
        Ok(state
            .resolve_table_references(&statement)?
            .iter()
            .map(|t| t.table().to_owned())
            .collect())
    }

    /// A session with only `spans`, scanned by DataFusion from one Parquet file (only the
    /// columns and row groups a query needs), or `None` when the file's columns are not
    /// the span schema's.
    pub async fn parquet_spans_context(
        path: &std::path::Path,
    ) -> Result<Option<SessionContext>, DataFusionError> {
        let Some(path) = path.to_str() else {
            return Ok(None);
        };
        let ctx = Self::file_session();
        let options = datafusion::prelude::ParquetReadOptions::default();
        ctx.register_parquet("spans", path, options).await?;
        let schema = ctx.table("spans").await?.schema().as_arrow().clone();
        let fits = schema.fields().len() == SPANS_SCHEMA.fields().len()
            && schema
                .fields()
                .iter()
                .zip(SPANS_SCHEMA.fields())
                .all(|(a, b)| a.name() == b.name() && same_type(a.data_type(), b.data_type()));
        if fits {
            return Ok(Some(ctx));
        }
        tracing::info!(
            file = path,
            "the Parquet file's columns differ from the span schema; loading it instead"
        );
        tracing::debug!(file = ?schema, expected = ?SPANS_SCHEMA);
        Ok(None)
    }

    /// A session with only `spans`: what a query that reads nothing else needs.
    pub fn spans_context(spans: RecordBatch) -> Result<SessionContext, AnalysisError> {
        let ctx = Self::file_session();
        register(&ctx, "spans", spans.schema(), vec![spans])?;
        Ok(ctx)
    }

    /// One session over `spans` with the derived tables and the report tables (`edges`,
    /// `layers`, ...) of that data as one window: what `stormglass query` runs SQL against.
    pub async fn query_context(&self, spans: RecordBatch) -> Result<SessionContext, AnalysisError> {
        let (ctx, partials) = {
            let mut loaded = self
                .load(spans.clone(), &WindowContext::default(), Detail::Query)
                .await?;
            loaded.derive().await?;
            let partials = Partials::new(loaded.partials().await?, &spans, loaded.traces);
            (self.session_of(loaded.take())?, partials)
        };
        self.register_partials(&ctx, &[Arc::new(partials)]).await?;
        for query in queries::REPORT {
            register_table(&ctx, query.name, run(&ctx, query).await?)?;
        }
        Ok(ctx)
    }

    /// Register a narrowed table's window `batches` as `name` at the query's types in
    /// `schema`: the batches held at their [`compact::common_schema`], under a view that
    /// casts each batch as a query scans it, so the counts are not held wide for the
    /// report's length.
    async fn register_narrowed(
        ctx: &SessionContext,
        name: &str,
        schema: &Schema,
        batches: &[RecordBatch],
    ) -> Result<(), AnalysisError> {
        use datafusion::common::Column;
        use datafusion::logical_expr::{Expr, cast};
        let failed = |e: DataFusionError| AnalysisError::query(name, e);
        let common = Arc::new(compact::common_schema(schema, batches));
        let batches = planned::conform(&common, batches.to_vec())
            .map_err(|e| AnalysisError::query(name, e))?;
        let narrow = format!("{name}_narrow");
        register(ctx, &narrow, common.clone(), batches)?;
        let columns: Vec<Expr> = (schema.fields().iter().zip(common.fields()))
            .map(|(wide, held)| {
                let column = Expr::Column(Column::from_name(wide.name()));
                let numeric = matches!(wide.data_type(), DataType::Float64 | DataType::Int64);
                if numeric && held.data_type() != wide.data_type() {
                    cast(column, wide.data_type().clone()).alias(wide.name())
                } else {
                    column
                }
            })
            .collect();
        let view = ctx
            .table(narrow.as_str())
            .await
            .and_then(|t| t.select(columns))
            .map_err(failed)?
            .into_view();
        ctx.register_table(name, view).map_err(failed)?;
        Ok(())
    }

    /// Register each partial's rows over `window` as its `p_*` table.
    async fn register_partials(
        &self,
        ctx: &SessionContext,
        window: &[Arc<Partials>],
    ) -> Result<(), AnalysisError> {
        // An empty window still needs every partial's schema: take them from empty data.
        let empty;
        let window = if window.is_empty() {
            let spans = RecordBatch::new_empty(stormglass_model::SPANS_SCHEMA.clone());
            empty = [Arc::new(self.analyse(spans).await?)];
            &empty[..]
        } else {
            window
        };
        for query in queries::PARTIALS {
            let mut schema = None;
            let mut batches = Vec::new();
            for partials in window {
                if let Some(table) = partials.table(query.name) {
                    schema.get_or_insert_with(|| table.schema.clone());
                    batches.extend(table.batches.iter().cloned());
                }
            }
            let Some(schema) = schema else {
                unreachable!("every Partials holds every partial query");
            };
            let name = queries::merged_name(query.name);
            if compact::NARROWED.contains(&query.name) {
                Self::register_narrowed(ctx, &name, &schema, &batches).await?;
            } else {
                register(ctx, &name, schema, batches)?;
            }
        }
        Ok(())
    }
}

/// True when `read` (a Parquet file's type as DataFusion reads it) holds what `expected`
/// (the span schema's) does: DataFusion reads Parquet strings as `Utf8View`, which answers
/// every query as `Utf8` does.
fn same_type(read: &DataType, expected: &DataType) -> bool {
    match (read, expected) {
        (DataType::Utf8View, DataType::Utf8) => true,
        (DataType::Map(a, _), DataType::Map(b, _)) => same_type(a.data_type(), b.data_type()),
        (DataType::Struct(a), DataType::Struct(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|(a, b)| a.name() == b.name() && same_type(a.data_type(), b.data_type()))
        }
        _ => read == expected,
    }
}

/// The `window_servers` table: one `service` per row.
fn window_servers(servers: &[String]) -> RecordBatch {
    let schema = Schema::new(vec![Field::new("service", DataType::Utf8, false)]);
    let column = StringArray::from_iter_values(servers);
    match RecordBatch::try_new(Arc::new(schema), vec![Arc::new(column)]) {
        Ok(batch) => batch,
        Err(e) => unreachable!("one string column matches its schema: {e}"),
    }
}

/// Register a materialised `table` as `name` in `ctx`.
pub(crate) fn register_table(
    ctx: &SessionContext,
    name: &str,
    table: Table,
) -> Result<(), AnalysisError> {
    register(ctx, name, table.schema, table.batches)
}

/// Register batches as a table. The registered schema is the batches' own (a plan's
/// declared types can differ from what it produces, e.g. `Utf8` vs `Utf8View`), relaxed to
/// all-nullable top-level fields, and every batch is cast onto it: partials of different
/// intervals meet in one table, so it must admit them all.
fn register(
    ctx: &SessionContext,
    name: &str,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(), AnalysisError> {
    let failed = |source| AnalysisError::query(name, source);
    let base = batches.first().map_or(schema, RecordBatch::schema);
    let relaxed = planned::relaxed(&base);
    let batches = planned::conform(&relaxed, batches).map_err(|e| AnalysisError::query(name, e))?;
    let table = MemTable::try_new(relaxed, vec![batches]).map_err(failed)?;
    ctx.register_table(name, Arc::new(table)).map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use stormglass_model::{Conventions, encode_request};
    use stormglass_testkit::otlp::retry_fixture;

    use super::*;

    /// Plans re-run over many batches: after an analysis no table of the plans holds a
    /// row (its spans are freed when it ends), and a second run gives the same partials.
    #[tokio::test]
    async fn analysis_leaves_no_batch_held() {
        let (spans, _) = encode_request(&Conventions::default(), &retry_fixture());
        let engine = Engine::default();
        let first = engine.analyse(spans.clone()).await.unwrap();
        assert!(first.spans > 0 && first.traces > 0, "{first:?}");
        let Some(plans) = engine.plans.plans.get() else {
            panic!("analysing plans the queries");
        };
        for (name, table) in plans.take() {
            assert_eq!(table.rows(), 0, "{name} outlived its analysis");
        }
        let again = engine.analyse(spans).await.unwrap();
        assert_eq!((again.spans, again.traces), (first.spans, first.traces));
        assert_eq!(again.span_range, first.span_range);
        for ((name, a), (_, b)) in first.tables.iter().zip(&again.tables) {
            assert_eq!(a.rows(), b.rows(), "{name}");
        }
    }

    /// `stormglass query` sees `lineage` with every documented column, the same rows the
    /// analysis's plans read in their four: an analysis after a query (same plans) still
    /// gives the same partials.
    #[tokio::test]
    async fn queried_lineage_has_every_column() {
        let (spans, _) = encode_request(&Conventions::default(), &retry_fixture());
        let engine = Engine::default();
        let ctx = engine.query_context(spans.clone()).await.unwrap();
        let lineage = ctx.table(LINEAGE).await.unwrap();
        let names: Vec<String> = lineage
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let documented: Vec<String> = lineage::LINEAGE_SCHEMA
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, documented);
        let rows = ctx
            .sql("SELECT COUNT(*) AS n FROM lineage WHERE root_span_id IS NOT NULL AND depth >= 0")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let counted = rows[0]
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(usize::try_from(counted.value(0)).unwrap(), spans.num_rows());
        let partials = engine.analyse(spans).await.unwrap();
        assert!(partials.spans > 0, "{partials:?}");
    }

    /// The live engine (one thread) plans no repartitioning, which on two partitions
    /// copied each input to run nowhere in parallel.
    #[tokio::test]
    async fn one_thread_plans_no_repartitioning() {
        let (spans, _) = encode_request(&Conventions::default(), &retry_fixture());
        let engine = Engine::default().on_one_thread();
        engine.analyse(spans).await.unwrap();
        let Some(plans) = engine.plans.plans.get() else {
            panic!("analysing plans the queries");
        };
        for (name, plan) in plans.plans() {
            let text = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(false)
                .to_string();
            assert!(!text.contains("RepartitionExec"), "{name}:\n{text}");
        }
    }
}
