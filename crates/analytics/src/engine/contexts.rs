//! Sessions for `stormglass query` and file reads: the spans alone, or with every
//! derived and report table of one window.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::DataType;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use stormglass_model::SPANS_SCHEMA;

use super::{AnalysisError, Engine, Partials, WindowContext, register, register_table, run};
use crate::lineage::Detail;
use crate::queries;

impl Engine {
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
