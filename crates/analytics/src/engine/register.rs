//! Tables into a session: a window's partials as `p_*` tables, narrowed counts under a
//! casting view, materialised tables.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use super::{AnalysisError, Engine, Partials, Table, compact, planned};
use crate::queries;

impl Engine {
    /// Register a narrowed table's window `batches` as `name` at the query's types in
    /// `schema`: the batches held at their [`compact::common_schema`], under a view that
    /// casts each batch as a query scans it, so the counts are not held wide for the
    /// report's length.
    pub(super) async fn register_narrowed(
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
    pub(super) async fn register_partials(
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
pub(super) fn register(
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
