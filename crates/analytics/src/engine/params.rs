//! The thresholds the SQL reads (`params`) and a live window's context.

use std::sync::Arc;

use stormglass_model::hash::KeyedSet;
use stormglass_model::schema as col;

use crate::clock::ClockBounds;
use crate::lineage;
use arrow::array::{AsArray, Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

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
/// clock bounds found so far (skew is estimated over the window), as parts to intersect:
/// live, the window's intervals' and the filling interval's chunks' (shared, not merged
/// anew for every chunk: at width each part holds up to ~160,000 service pairs). Offline,
/// a file's chunks get the whole file's servers and clock bounds ([`crate::offline`]); one
/// batch, none.
#[derive(Clone, Debug, Default)]
pub struct WindowContext {
    pub servers: Vec<String>,
    pub clocks: Vec<Arc<ClockBounds>>,
}

impl Params {
    pub(super) fn batch(&self) -> RecordBatch {
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

/// The services that sent SERVER spans in `batches` (span batches), sorted: a window's
/// `servers`.
pub fn server_services(batches: &[RecordBatch]) -> Vec<String> {
    // Hashed, and sorted once at the end: a sorted set costs ~log2(services) string
    // comparisons per SERVER span (14 at width).
    let mut servers: KeyedSet<&str> = KeyedSet::default();
    for batch in batches {
        let column = |name| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_string_opt::<i32>())
        };
        let (Some(kind), Some(service)) = (column(col::KIND), column(col::SERVICE_NAME)) else {
            continue;
        };
        for row in 0..batch.num_rows() {
            if kind.value(row) == "server" {
                servers.insert(service.value(row));
            }
        }
    }
    let mut servers: Vec<String> = servers.into_iter().map(str::to_owned).collect();
    servers.sort_unstable();
    servers
}

/// The `window_servers` table: one `service` per row.
pub(super) fn window_servers(servers: &[String]) -> RecordBatch {
    let schema = Schema::new(vec![Field::new("service", DataType::Utf8, false)]);
    let column = StringArray::from_iter_values(servers);
    match RecordBatch::try_new(Arc::new(schema), vec![Arc::new(column)]) {
        Ok(batch) => batch,
        Err(e) => unreachable!("one string column matches its schema: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use stormglass_model::{Conventions, encode_request};
    use stormglass_testkit::otlp::{request, span};

    use super::server_services;

    /// The services that sent SERVER spans in any of several batches: each named once,
    /// sorted; a service with CLIENT spans only is none of them.
    #[test]
    fn serving_services_are_named_once_and_sorted() {
        const SERVER: i32 = 2;
        const CLIENT: i32 = 3;
        let batch = |services: &[(&str, i32)]| {
            let spans = services
                .iter()
                .enumerate()
                .map(|(i, (service, kind))| {
                    (
                        *service,
                        vec![span(1, i as u8 + 1, "op", *kind, 0, 1, vec![])],
                    )
                })
                .collect();
            let (batch, report) = encode_request(&Conventions::default(), &request(spans));
            assert_eq!(report.rejected, 0);
            batch
        };
        let batches = [
            batch(&[("orders", SERVER), ("gateway", CLIENT), ("payment", SERVER)]),
            batch(&[("ledger", SERVER), ("orders", SERVER), ("api", SERVER)]),
            batch(&[("inventory", SERVER), ("gateway", CLIENT)]),
        ];
        let named = ["api", "inventory", "ledger", "orders", "payment"];
        assert_eq!(server_services(&batches), named);
        assert!(server_services(&[]).is_empty());
    }
}
