//! What a query hands on: a materialised [`Table`], the [`AnalysisError`] naming the query
//! that failed, and the helpers that run, read and time queries. Below the engine and its
//! plans, so both (and the lineage) use them without depending on each other.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::prelude::SessionContext;
use serde::de::DeserializeOwned;

use crate::queries::Query;

/// A query failed; names the query so the SQL file is easy to find.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error("query {name} failed")]
    Query {
        name: String,
        #[source]
        source: DataFusionError,
    },
}

impl AnalysisError {
    /// Query (or table) `name` failed with `source`, a DataFusion or Arrow error.
    pub fn query(name: &str, source: impl Into<DataFusionError>) -> AnalysisError {
        AnalysisError::Query {
            name: name.to_owned(),
            source: source.into(),
        }
    }
}

/// A materialised table: its schema (kept even when empty) and batches.
#[derive(Clone, Debug)]
pub struct Table {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

impl Table {
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Rows of any table as JSON objects, via Arrow's JSON writer (nulls kept, binary as hex,
/// maps as objects): `stormglass query`'s output, whatever its columns. One batch at a
/// time: the text of a wide table at once was hundreds of MB on top of the rows it became.
pub fn json_rows(table: &Table) -> Vec<serde_json::Value> {
    let mut rows = Vec::with_capacity(table.rows());
    let mut buffer = Vec::new();
    for batch in &table.batches {
        if batch.num_rows() == 0 {
            continue;
        }
        buffer.clear();
        {
            let mut writer = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::JsonArray>(&mut buffer);
            if let Err(e) = writer.write(batch) {
                unreachable!("query results hold only JSON-representable types: {e}");
            }
            if let Err(e) = writer.finish() {
                unreachable!("finishing a JSON array cannot fail on a Vec: {e}");
            }
        }
        match serde_json::from_slice::<Vec<serde_json::Value>>(&buffer) {
            Ok(batch_rows) => rows.extend(batch_rows),
            Err(e) => unreachable!("Arrow's JSON writer writes JSON: {e}"),
        }
    }
    rows
}

/// Rows of a table as `T`, deserialized from the Arrow columns directly (serde_arrow), one
/// batch at a time.
pub fn rows<T: DeserializeOwned + Send>(table: &Table) -> Vec<T> {
    into_rows(table.clone())
}

/// Rows past which a table's batches are read on the analysis's threads: below, a thread
/// costs more than it saves.
const PARALLEL_ROWS: usize = 16_384;

/// [`rows`], each batch dropped once read: a wide table is not held whole beside its rows.
/// A wide table's batches are read on [`crate::parallel::AT_ONCE`] threads, in order
/// (serde_arrow reads ~30 ns a cell: the report's edges at 160,000 were ~290 ms alone), one
/// batch per thread, their rows moved into the result before the next are read (read all
/// at once, the rows were held twice: ~130 MiB each for those edges).
pub fn into_rows<T: DeserializeOwned + Send>(table: Table) -> Vec<T> {
    let started = std::time::Instant::now();
    let total = table.rows();
    let read = |batch: RecordBatch| -> Vec<T> {
        if batch.num_rows() == 0 {
            return Vec::new();
        }
        let batch =
            plain(&batch).unwrap_or_else(|e| unreachable!("strings cast to plain strings: {e}"));
        match serde_arrow::from_record_batch::<Vec<T>>(&batch) {
            Ok(batch_rows) => batch_rows,
            Err(e) => unreachable!("rows follow their query's header contract: {e}"),
        }
    };
    let mut rows = Vec::with_capacity(total);
    if total >= PARALLEL_ROWS && table.batches.len() > 1 {
        let mut batches = table.batches.into_iter();
        loop {
            let group: Vec<RecordBatch> = batches.by_ref().take(crate::parallel::AT_ONCE).collect();
            if group.is_empty() {
                break;
            }
            for batch_rows in crate::parallel::parallel_map(group, read) {
                rows.extend(batch_rows);
            }
        }
    } else {
        for batch in table.batches {
            rows.extend(read(batch));
        }
    }
    timed(std::any::type_name::<T>(), started);
    rows
}

/// `batch` with its dictionary-encoded and view string columns as plain `Utf8`: batches
/// of one table compacted at different times then concatenate, and serde_arrow reads them
/// at its speed (DataFusion's view columns, a `concat` or `first_value` result, read ~9x
/// slower per row: a quarter of the report at 160,000 edges).
pub(crate) fn plain(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    recast(batch, |field, column| {
        let strings = match field.data_type() {
            DataType::Utf8View => true,
            DataType::Dictionary(_, values) => **values == DataType::Utf8,
            _ => false,
        };
        strings
            .then(|| arrow::compute::cast(column, &DataType::Utf8))
            .transpose()
    })
}

/// `batch` with the array `recast` gives for a column (of the same length) in its place,
/// the field's type following it; `batch` itself where it gives none.
pub(crate) fn recast(
    batch: &RecordBatch,
    mut recast: impl FnMut(&Field, &ArrayRef) -> Result<Option<ArrayRef>, ArrowError>,
) -> Result<RecordBatch, ArrowError> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    let mut changed = false;
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        match recast(field, column)? {
            Some(new) => {
                fields.push(
                    field
                        .as_ref()
                        .clone()
                        .with_data_type(new.data_type().clone()),
                );
                columns.push(new);
                changed = true;
            }
            None => {
                fields.push(field.as_ref().clone());
                columns.push(column.clone());
            }
        }
    }
    if !changed {
        return Ok(batch.clone());
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// Run one registered query to completion.
pub async fn run(ctx: &SessionContext, query: &Query) -> Result<Table, AnalysisError> {
    let failed = |source| AnalysisError::query(query.name, source);
    let started = std::time::Instant::now();
    let frame = ctx.sql(query.sql).await.map_err(failed)?;
    let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
    let batches = if plan_wanted(query.name) {
        let plan = frame.create_physical_plan().await.map_err(failed)?;
        let batches = datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx())
            .await
            .map_err(failed)?;
        let shown = DisplayableExecutionPlan::with_metrics(plan.as_ref()).indent(true);
        eprintln!("-- {}\n{shown}", query.name);
        batches
    } else {
        frame.collect().await.map_err(failed)?
    };
    timed(query.name, started);
    Ok(Table { schema, batches })
}

/// The environment switches of the analysis's diagnostics ([`timed`], [`plan_wanted`]):
/// the configuration reads every other `STORMGLASS_*` variable as a key.
pub const SWITCHES: [&str; 2] = [QUERY_TIMINGS, QUERY_PLANS];
const QUERY_TIMINGS: &str = "STORMGLASS_QUERY_TIMINGS";
const QUERY_PLANS: &str = "STORMGLASS_QUERY_PLANS";

/// Whether `STORMGLASS_QUERY_PLANS` (a query's name, or `all`) asks for `query`'s plan with
/// its metrics: the rows and compute time of each operator, to find where a query's time goes.
fn plan_wanted(query: &str) -> bool {
    std::env::var(QUERY_PLANS).is_ok_and(|v| v == "all" || v == query)
}

/// Log how long `what` took since `started`; printed with `STORMGLASS_QUERY_TIMINGS` set,
/// with the process's resident memory after it (where /proc tells), to find a step's peak.
pub fn timed(what: &str, started: std::time::Instant) {
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(what, elapsed_ms, "analysis step ran");
    if std::env::var_os(QUERY_TIMINGS).is_some() {
        let resident = stormglass_runtime::memory::resident_bytes()
            .map_or(String::new(), |b| format!(" {:>7} MiB", b >> 20));
        eprintln!("{what:<28} {elapsed_ms:>9.1} ms{resident}");
    }
}

/// Read a materialised table of a session.
pub async fn table(ctx: &SessionContext, name: &str) -> Result<Table, AnalysisError> {
    let failed = |source| AnalysisError::query(name, source);
    let frame = ctx.table(name).await.map_err(failed)?;
    let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
    let batches = frame.collect().await.map_err(failed)?;
    Ok(Table { schema, batches })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use serde::Deserialize;

    use super::*;

    /// A table wide enough to be read on two threads comes back in its batches' order.
    #[test]
    fn wide_tables_read_in_order() {
        #[derive(Deserialize)]
        struct Row {
            n: i64,
            name: String,
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        let batch = |from: i64| {
            let n: Vec<i64> = (from..from + 7_000).collect();
            let names: Vec<String> = n.iter().map(|i| format!("edge-{i}")).collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(n)),
                    Arc::new(StringArray::from(names)),
                ],
            )
            .unwrap()
        };
        let table = Table {
            schema: schema.clone(),
            batches: (0..5).map(|b| batch(b * 7_000)).collect(),
        };
        assert!(table.rows() >= PARALLEL_ROWS);
        let rows: Vec<Row> = into_rows(table);
        assert_eq!(rows.len(), 35_000);
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(
                (row.n, row.name.as_str()),
                (i as i64, format!("edge-{i}").as_str())
            );
        }
    }
}
