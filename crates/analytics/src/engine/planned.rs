//! Every analysis query planned once per [`crate::Engine`] and re-run over each batch of spans.
//!
//! A live window is analysed in chunks (a 32nd of the analysis share of `limits.memory`,
//! ~45k spans at 1 GiB). Parsing, optimising and physically planning the 23 queries cost
//! about twice what running them does on such a chunk (timed per query in a dev build: 107
//! ms parsing, 440 ms planning, 237 ms running), so planning per chunk made a window of 1 M
//! spans cost ~3.5x what the same spans cost in one batch.
//!
//! So each table a query reads is a [`Slot`]: a one-partition stream whose batches are
//! swapped between runs. The plans are built once against the slots and re-run with
//! [`reset_plan_states`] (joins cache their build side, sorts their filters). Two choices
//! keep a re-run plan exact:
//! * a slot reports no statistics, so no optimiser rule can fold the row counts of the batch
//!   present at planning time into the plan (DataFusion answers `COUNT(*)` from exact
//!   statistics);
//! * dynamic filters are off: a join's filter pushed into its probe side would outlive the
//!   reset of the join (`reset_plan_states` documents the limitation). Scans of in-memory
//!   batches do not use them anyway.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::error::ArrowError;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::physical_plan::{
    ExecutionPlan, SendableRecordBatchStream, collect, execution_plan::reset_plan_states,
};
use datafusion::prelude::SessionContext;

use crate::queries::{self, Query};
use crate::table::{AnalysisError, Table};

/// A table whose batches change between runs of the plans that read it.
#[derive(Clone, Debug)]
struct Slot {
    schema: SchemaRef,
    batches: Arc<Mutex<Vec<RecordBatch>>>,
}

impl Slot {
    fn new(schema: &Schema) -> Slot {
        Slot {
            schema: relaxed(schema),
            batches: Arc::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<RecordBatch>> {
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold `batches`, each cast onto the slot's schema (see [`conform`]).
    fn fill(&self, batches: Vec<RecordBatch>) -> Result<(), ArrowError> {
        *self.held() = conform(&self.schema, batches)?;
        Ok(())
    }

    fn take(&self) -> Table {
        Table {
            schema: self.schema.clone(),
            batches: std::mem::take(&mut *self.held()),
        }
    }
}

impl PartitionStream for Slot {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _: Arc<TaskContext>) -> SendableRecordBatchStream {
        // Cloning batches clones `Arc`s to their buffers, not the data.
        let batches = self.held().clone();
        match MemoryStream::try_new(batches, self.schema.clone(), None) {
            Ok(stream) => Box::pin(stream),
            Err(e) => {
                unreachable!("a memory stream without projection only holds its batches: {e}")
            }
        }
    }
}

/// `schema` with every top-level field nullable: batches of different chunks and intervals
/// meet in one table, so it must admit them all.
pub(crate) fn relaxed(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ))
}

/// `batches` cast onto `schema`: a plan's declared types can differ from what it produces
/// (e.g. `Utf8` vs `Utf8View`), and spans read from Parquet come as `Utf8View`.
pub(crate) fn conform(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<Vec<RecordBatch>, ArrowError> {
    batches
        .into_iter()
        .map(|b| {
            let columns = b
                .columns()
                .iter()
                .zip(schema.fields())
                .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            RecordBatch::try_new(schema.clone(), columns)
        })
        .collect()
}

/// One query's physical plan.
struct Planned {
    query: &'static Query,
    plan: Arc<dyn ExecutionPlan>,
}

impl Planned {
    async fn new(ctx: &SessionContext, query: &'static Query) -> Result<Planned, AnalysisError> {
        let plan = async { ctx.sql(query.sql).await?.create_physical_plan().await }
            .await
            .map_err(|source| AnalysisError::query(query.name, source))?;
        Ok(Planned { query, plan })
    }

    async fn run(&self, ctx: &SessionContext) -> Result<Table, AnalysisError> {
        let started = std::time::Instant::now();
        let batches =
            async { collect(reset_plan_states(self.plan.clone())?, ctx.task_ctx()).await }
                .await
                .map_err(|source| AnalysisError::query(self.query.name, source))?;
        crate::table::timed(self.query.name, started);
        Ok(Table {
            schema: self.plan.schema(),
            batches,
        })
    }
}

/// The slots and the plans of one session.
pub(crate) struct Plans {
    ctx: SessionContext,
    /// Inputs first, then every derived table in [`queries::DERIVED`] order.
    slots: Vec<(&'static str, Slot)>,
    derived: Vec<Planned>,
    partials: Vec<Planned>,
}

impl fmt::Debug for Plans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plans")
            .field("slots", &self.slots.len())
            .field("queries", &(self.derived.len() + self.partials.len()))
            .finish()
    }
}

impl Plans {
    /// Plan every query in `ctx` over slots named and shaped as `inputs`.
    pub(crate) async fn new(
        ctx: SessionContext,
        inputs: &[(&'static str, SchemaRef)],
    ) -> Result<Plans, AnalysisError> {
        let mut slots = Vec::new();
        for (name, schema) in inputs {
            slots.push((*name, register(&ctx, name, schema)?));
        }
        let mut derived = Vec::with_capacity(queries::DERIVED.len());
        for query in queries::DERIVED {
            let planned = Planned::new(&ctx, query).await?;
            slots.push((
                query.name,
                register(&ctx, query.name, &planned.plan.schema())?,
            ));
            derived.push(planned);
        }
        let mut partials = Vec::with_capacity(queries::PARTIALS.len());
        for query in queries::PARTIALS {
            partials.push(Planned::new(&ctx, query).await?);
        }
        Ok(Plans {
            ctx,
            slots,
            derived,
            partials,
        })
    }

    /// Hold `batches` as input `name` until [`Plans::clear`] or [`Plans::take`].
    pub(crate) fn fill(&self, name: &str, batches: Vec<RecordBatch>) -> Result<(), AnalysisError> {
        let Some((_, slot)) = self.slots.iter().find(|(n, _)| *n == name) else {
            unreachable!("every input is planned: {name}");
        };
        slot.fill(batches)
            .map_err(|e| AnalysisError::query(name, e))
    }

    /// Materialise every derived table of the inputs held.
    pub(crate) async fn derive(&self) -> Result<(), AnalysisError> {
        let outputs = &self.slots[self.slots.len() - self.derived.len()..];
        for (planned, (_, slot)) in self.derived.iter().zip(outputs) {
            let table = planned.run(&self.ctx).await?;
            slot.fill(table.batches)
                .map_err(|e| AnalysisError::query(planned.query.name, e))?;
        }
        Ok(())
    }

    /// Every partial of the derived tables, in [`queries::PARTIALS`] order.
    pub(crate) async fn partials(&self) -> Result<Vec<(&'static str, Table)>, AnalysisError> {
        let mut tables = Vec::with_capacity(self.partials.len());
        for planned in &self.partials {
            tables.push((planned.query.name, planned.run(&self.ctx).await?));
        }
        Ok(tables)
    }

    /// Every table held, inputs and derived, emptying the slots.
    pub(crate) fn take(&self) -> Vec<(&'static str, Table)> {
        self.slots
            .iter()
            .map(|(name, slot)| (*name, slot.take()))
            .collect()
    }

    /// Every query's physical plan, derived tables first.
    #[cfg(test)]
    pub(crate) fn plans(&self) -> impl Iterator<Item = (&'static str, &Arc<dyn ExecutionPlan>)> {
        self.derived
            .iter()
            .chain(&self.partials)
            .map(|p| (p.query.name, &p.plan))
    }

    /// Drop every batch held, so nothing outlives its analysis.
    pub(crate) fn clear(&self) {
        for (_, slot) in &self.slots {
            slot.held().clear();
        }
    }
}

fn register(ctx: &SessionContext, name: &str, schema: &Schema) -> Result<Slot, AnalysisError> {
    let slot = Slot::new(schema);
    let table = StreamingTable::try_new(slot.schema.clone(), vec![Arc::new(slot.clone())])
        .map_err(|source| AnalysisError::query(name, source))?;
    ctx.register_table(name, Arc::new(table))
        .map_err(|source| AnalysisError::query(name, source))?;
    Ok(slot)
}
