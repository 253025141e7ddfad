//! Building a window's report from its merged partials: each report table read into its
//! typed rows, the figures a second query adds joined by edge, storm potential added.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use datafusion::prelude::SessionContext;
use serde::Deserialize;

use stormglass_model::hash::KeyedMap as Fast;

use super::storm::{Link, plain_batches, storm_potential};
use super::{
    Coverage, CoverageShares, EdgeCoverage, EdgeFigures, EntryFigures, Finding, LayerFigures,
    MAX_LISTED_OPERATIONS, MAX_LISTED_ORPHANS, OperationLatency, Orphan, Report, ServiceCoverage,
    TraceCounts, Traces, Window,
};
use crate::engine::{AnalysisError, Engine, Partials, Table, into_rows, rows, run, table};

/// A merged window's report tables ([`crate::queries::REPORT`]) for [`Report::build`],
/// each run when first needed and held only while a later query or the build reads it: at
/// width they were ~700 MiB held at once, beside the rows made of them. A held table is
/// read back as it was made, in its query's order: a scan of it spreads its batches over
/// the session's partitions and returns them as they come, and the edges listed at width
/// changed from run to run among edges of equal impact.
struct ReportTables {
    ctx: SessionContext,
    held: HashMap<&'static str, Table>,
}

impl ReportTables {
    /// Run the report query `name` and hold its table for the queries that read it.
    async fn hold(&mut self, name: &'static str) -> Result<(), AnalysisError> {
        let table = run(&self.ctx, Self::query(name)).await?;
        crate::engine::register_table(&self.ctx, name, table.clone())?;
        self.held.insert(name, table);
        Ok(())
    }

    /// Report table `name`: the held one, no longer held; a partial of the window
    /// (`p_links`), read and dropped; else run now.
    async fn take(&mut self, name: &'static str) -> Result<Table, AnalysisError> {
        if let Some(held) = self.held.remove(name) {
            self.forget(name)?;
            return Ok(held);
        }
        if !self.ctx.table_exist(name).unwrap_or(false) {
            return run(&self.ctx, Self::query(name)).await;
        }
        let read = table(&self.ctx, name).await?;
        self.forget(name)?;
        Ok(read)
    }

    /// Stop holding `name` (a table no later query reads).
    fn forget(&mut self, name: &str) -> Result<(), AnalysisError> {
        self.held.remove(name);
        self.ctx
            .deregister_table(name)
            .map(drop)
            .map_err(|e| AnalysisError::query(name, e))
    }

    fn query(name: &str) -> &'static crate::queries::Query {
        match crate::queries::REPORT.iter().find(|q| q.name == name) {
            Some(query) => query,
            None => unreachable!("{name} is a report query"),
        }
    }
}

/// Window bounds: given ones (live), else the analysed spans' range (offline).
#[derive(Clone, Copy, Debug, Default)]
pub struct WindowBounds {
    pub start_unix_ns: Option<i64>,
    pub end_unix_ns: Option<i64>,
}

impl Report {
    /// Merge `window` and build its report: every figure; `alerts` stays empty for
    /// [`crate::alerts::evaluate`] to fill.
    pub async fn build(
        engine: &Engine,
        window: &[Arc<Partials>],
        bounds: WindowBounds,
    ) -> Result<Report, AnalysisError> {
        let mut tables = ReportTables {
            ctx: engine.merge(window).await?,
            held: Default::default(),
        };
        // What later queries read first (`edges` reads the layers, clock skew and retry
        // budgets; `finding_counts` reads `edges`), then each table read into its rows
        // and dropped, the widest first.
        for name in [
            "layers",
            "layer_operations",
            "clock_skew",
            "retry_budgets",
            "edges",
            "finding_counts",
        ] {
            tables.hold(name).await?;
        }
        tables.forget("clock_skew")?;
        tables.forget("retry_budgets")?;
        let findings: Vec<Finding> = into_rows(tables.take("finding_counts").await?);
        let mut edges: Vec<EdgeFigures> = into_rows(tables.take("edges").await?);
        #[derive(Deserialize)]
        struct Cause {
            caller: String,
            callee: String,
            operation: String,
            cause: String,
            retries: u64,
        }
        let causes: Vec<Cause> = into_rows(tables.take("edge_causes").await?);
        #[derive(Deserialize)]
        struct Remaining {
            caller: String,
            callee: String,
            operation: String,
            remaining_budget_ms: Option<f64>,
        }
        let remaining: Vec<Remaining> = into_rows(tables.take("remaining_budgets").await?);
        let (causes, remaining) = {
            let index = EdgeIndex::new(&edges);
            let causes: Vec<(usize, Cause)> = causes
                .into_iter()
                .filter_map(|c| Some((index.get(&c.caller, &c.callee, &c.operation)?, c)))
                .collect();
            let remaining: Vec<(usize, Option<f64>)> = remaining
                .into_iter()
                .filter_map(|r| {
                    let i = index.get(&r.caller, &r.callee, &r.operation)?;
                    Some((i, r.remaining_budget_ms))
                })
                .collect();
            (causes, remaining)
        };
        for (i, cause) in causes {
            edges[i].retries_by_cause.insert(cause.cause, cause.retries);
        }
        for (i, ms) in remaining {
            edges[i].remaining_budget_ms = ms;
        }
        let mut layers: Vec<LayerFigures> = into_rows(tables.take("layers").await?);
        #[derive(Deserialize)]
        struct Operation {
            service: String,
            #[serde(flatten)]
            latency: OperationLatency,
        }
        let by_service: HashMap<String, usize> = layers
            .iter()
            .enumerate()
            .map(|(i, l)| (l.service.clone(), i))
            .collect();
        for row in into_rows::<Operation>(tables.take("layer_operations").await?) {
            if let Some(&i) = by_service.get(&row.service) {
                layers[i].operations.push(row.latency);
            }
        }
        for layer in &mut layers {
            layer.operations_total = layer.operations.len() as u64;
            if layer.operations.len() > MAX_LISTED_OPERATIONS {
                layer
                    .operations
                    .sort_by_key(|o| std::cmp::Reverse(o.requests));
                layer.operations.truncate(MAX_LISTED_OPERATIONS);
                layer
                    .operations
                    .sort_by(|a, b| a.operation.cmp(&b.operation));
            }
        }
        let mut entries: Vec<EntryFigures> = into_rows(tables.take("entry_operations").await?);
        // Storm potential is a walk in Rust: on a thread of its own while the queries after
        // it run (at width each takes ~150 ms).
        let links = tables.take("p_links").await?;
        let storm = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let links = plain_batches(&links);
            let potential = storm_potential(&Link::read(&links), &edges);
            crate::table::timed("storm potential", started);
            (edges, potential)
        });
        let by_service: Vec<TraceCounts> = into_rows(tables.take("trace_counts").await?);
        let traces = Traces {
            entry_requests: by_service.iter().map(|t| t.entry_requests).sum(),
            multi_layer_retry_traces: by_service.iter().map(|t| t.multi_layer_retry_traces).sum(),
            broken: by_service.iter().map(|t| t.broken_traces).sum(),
            by_service,
        };
        let mut orphans: Vec<Orphan> = window
            .iter()
            .rev()
            .filter_map(|p| p.table("partial_orphan_list"))
            .flat_map(rows::<Orphan>)
            .take(MAX_LISTED_ORPHANS)
            .collect();
        orphans.sort_by(|a, b| a.trace_id.cmp(&b.trace_id));
        let sequential_calls =
            crate::budget_table::sequential(into_rows(tables.take("p_sequences").await?));
        // The shares' fields spelled out, not `#[serde(flatten)]`: flattening buffers every
        // row into a map first, a tenth of the report at 178,000 edges.
        #[derive(Deserialize)]
        struct CoverageRow {
            level: String,
            service: String,
            callee: Option<String>,
            operation: Option<String>,
            attempts: u64,
            attempt_number: Option<f64>,
            cause: Option<f64>,
            deadline: Option<f64>,
            idempotency: Option<f64>,
            idempotency_key: Option<f64>,
            server_spans: Option<f64>,
            from_server_spans: Option<f64>,
            inferred: Option<f64>,
        }
        let covered = into_rows::<CoverageRow>(tables.take("coverage").await?);
        let mut coverage = Coverage {
            services: Vec::new(),
            edges: Vec::with_capacity(covered.len()),
        };
        for row in covered {
            let shares = CoverageShares {
                attempts: row.attempts,
                attempt_number: row.attempt_number,
                cause: row.cause,
                deadline: row.deadline,
                idempotency: row.idempotency,
                idempotency_key: row.idempotency_key,
                server_spans: row.server_spans,
                from_server_spans: row.from_server_spans,
                inferred: row.inferred,
            };
            match (row.level.as_str(), row.callee, row.operation) {
                ("edge", Some(callee), Some(operation)) => coverage.edges.push(EdgeCoverage {
                    caller: row.service,
                    callee,
                    operation,
                    shares,
                }),
                _ => coverage.services.push(ServiceCoverage {
                    service: row.service,
                    shares,
                }),
            }
        }
        // By name, as the edges are: the query leaves its rows unordered (a sort here is
        // cheaper than DataFusion's sort and merge at width).
        coverage.edges.sort_unstable_by(|a, b| {
            (&a.caller, &a.callee, &a.operation).cmp(&(&b.caller, &b.callee, &b.operation))
        });
        coverage
            .services
            .sort_unstable_by(|a, b| a.service.cmp(&b.service));

        let (edges, potential) = match storm.await {
            Ok(done) => done,
            // A panic in the walk is the build's own, as on this thread.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        for entry in &mut entries {
            entry.storm_potential = potential
                .get(&(entry.service.clone(), entry.operation.clone()))
                .copied()
                .unwrap_or(1.0);
        }

        let mut report = Report {
            window: Report::window_of(window, bounds),
            edges,
            layers,
            entries,
            traces,
            orphans,
            findings,
            finding_totals: Vec::new(),
            coverage,
            alerts: Vec::new(),
            listing: None,
            figures: None,
            sequential_calls,
        };
        report.bound_findings(usize::MAX);
        Ok(report)
    }
}

impl Report {
    /// The `window` of a report over `window`'s partials: `bounds` where given (live), else
    /// the analysed spans' range (offline).
    pub fn window_of(window: &[Arc<Partials>], bounds: WindowBounds) -> Window {
        let spans: usize = window.iter().map(|p| p.spans).sum();
        let traces: usize = window.iter().map(|p| p.traces).sum();
        let range =
            window
                .iter()
                .filter_map(|p| p.span_range)
                .fold(None, |acc, (s, e)| match acc {
                    None => Some((s, e)),
                    Some((a, b)) => Some((a.min(s), b.max(e))),
                });
        let start = bounds.start_unix_ns.or(range.map(|r| r.0));
        let end = bounds.end_unix_ns.or(range.map(|r| r.1));
        Window {
            start: start.map(rfc3339),
            end: end.map(rfc3339),
            seconds: start.zip(end).map(|(s, e)| (e - s).max(0) as f64 / 1e9),
            traces: traces as u64,
            spans: spans as u64,
        }
    }
}

/// The position of each edge (caller, callee, operation) in the report's `edges`, for the
/// figures a second query adds to them: one hash lookup per row, whatever the width.
struct EdgeIndex<'e> {
    positions: Fast<(&'e str, &'e str, &'e str), usize>,
}

impl<'e> EdgeIndex<'e> {
    fn new(edges: &[EdgeFigures]) -> EdgeIndex<'_> {
        let positions = edges
            .iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    (e.caller.as_str(), e.callee.as_str(), e.operation.as_str()),
                    i,
                )
            })
            .collect();
        EdgeIndex { positions }
    }

    fn get(&self, caller: &str, callee: &str, operation: &str) -> Option<usize> {
        self.positions.get(&(caller, callee, operation)).copied()
    }
}

fn rfc3339(unix_ns: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_nanos(u64::try_from(unix_ns).unwrap_or(0));
    humantime::format_rfc3339_millis(time).to_string()
}
