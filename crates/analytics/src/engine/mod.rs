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

mod compact;
mod contexts;
mod params;
mod partials;
mod planned;
mod register;

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Field;
use datafusion::error::DataFusionError;
use datafusion::prelude::{SessionConfig, SessionContext};
use stormglass_model::SPANS_SCHEMA;

use crate::lineage::{
    self, ANALYSED_LINEAGE_SCHEMA, ATTEMPT_LINEAGE, ATTEMPT_LINEAGE_SCHEMA, CLOCK_PAIRS_SCHEMA,
    Detail, EDGE_NAMES, EDGE_NAMES_SCHEMA, LINEAGE, Lineage,
};
use crate::{clock, histogram, queries};
use params::window_servers;
use planned::Plans;
use register::register;

pub use crate::table::{AnalysisError, Table, into_rows, json_rows, rows, run, table, timed};
pub use params::{Params, WindowContext, server_services};
pub use partials::Partials;
pub(crate) use register::register_table;

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
        // An aggregate whose groups are nearly its rows (per edge at width: 161,000 groups
        // of 164,000 rows) stops pre-aggregating after this many rows instead of DataFusion's
        // 100,000, which a partition at width never reaches: the report's edges -18%.
        config
            .options_mut()
            .execution
            .skip_partial_aggregation_probe_rows_threshold = 8192;
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
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
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
