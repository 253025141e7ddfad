//! The report's tables as `analyze` prints them: each column's header beside the figure it
//! shows, so a header cannot drift from its value by position.

use crate::report::{EdgeFigures, EntryFigures, LayerFigures};

/// A figure as a table cell shows it; an absent figure prints as `-`, never as 0.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// A share, printed as a percentage with one decimal.
    Share(Option<f64>),
    /// A number with this many decimals.
    Number(Option<f64>, usize),
    /// A count.
    Count(u64),
    /// Counts shown together, as `a / b / c`.
    Counts(Vec<u64>),
    /// Text as it is.
    Text(String),
}

/// One column of a report table over rows of `T`.
pub struct Column<T: 'static> {
    pub header: &'static str,
    pub cell: fn(&T) -> Cell,
}

const fn column<T>(header: &'static str, cell: fn(&T) -> Cell) -> Column<T> {
    Column { header, cell }
}

fn edge_name(e: &EdgeFigures) -> Cell {
    Cell::Text(format!("{} -> {} {}", e.caller, e.callee, e.operation))
}

/// The edges table, one row per (caller, callee, operation).
pub static EDGE_COLUMNS: &[Column<EdgeFigures>] = &[
    column("edge", edge_name),
    column("calls", |e| Cell::Count(e.logical_calls)),
    column("attempts", |e| Cell::Count(e.attempts)),
    column("raw ok", |e| Cell::Share(e.raw_success_rate)),
    column("effective ok", |e| Cell::Share(e.effective_success_rate)),
    column("retry contrib", |e| Cell::Share(e.retry_contribution)),
    column("retry ratio", |e| Cell::Share(e.retry_ratio)),
    column("retry ok", |e| Cell::Share(e.retry_success_rate)),
    column("amp", |e| Cell::Number(e.edge_amplification, 2)),
    column("backoff", |e| {
        Cell::Text(match (&e.backoff, e.backoff_median_ms) {
            (Some(shape), Some(ms)) => format!("{shape} {ms:.0}ms"),
            (None, Some(ms)) => format!("{ms:.0}ms"),
            _ => "-".to_owned(),
        })
    }),
    column("synchronised", |e| Cell::Share(e.synchronised_retries)),
    column("timeout ms", |e| Cell::Number(e.timeout_ms, 0)),
    column("timed out", |e| Cell::Share(e.timeout_rate)),
    column("retried lost", |e| Cell::Share(e.retried_failed_share)),
    column("timeouts served ok", |e| {
        Cell::Share(e.timed_out_server_ok_share)
    }),
    column("no deadline", |e| Cell::Share(e.attempts_without_deadline)),
    column("client-error retries / early", |e| {
        Cell::Counts(vec![e.non_retryable_retries, e.retry_after_violations])
    }),
    column("out of budget / late", |e| {
        Cell::Counts(vec![e.out_of_budget_retries, e.retries_after_deadline])
    }),
    column("callee p99.9", |e| Cell::Number(e.callee_p999_ms, 0)),
    column("recommended", |e| Cell::Number(e.recommended_timeout_ms, 0)),
    column("cut off", |e| Cell::Share(e.timeout_kill_share)),
    column("unsafe / unstable key / key hits", |e| {
        Cell::Counts(vec![
            e.unsafe_retries,
            e.unstable_key_retries,
            e.idempotency_hits,
        ])
    }),
    column("writes re-run / overlapping / duplicates", |e| {
        Cell::Counts(vec![
            e.rerun_writes,
            e.overlapping_write_retries,
            e.duplicate_rejections,
        ])
    }),
    column("orphans / work", |e| {
        Cell::Text(format!(
            "{} / {:.3}s",
            e.orphan_pairs, e.orphan_work_seconds
        ))
    }),
    column("hidden / inferred / hedged", |e| {
        Cell::Counts(vec![
            e.hidden_attempts,
            e.inferred_attempts,
            e.hedged_attempts,
        ])
    }),
];

/// The layers table, one row per service.
pub static LAYER_COLUMNS: &[Column<LayerFigures>] = &[
    column("service", |l| Cell::Text(l.service.clone())),
    column("requests", |l| Cell::Count(l.requests)),
    column("amplification", |l| Cell::Number(l.amplification, 2)),
    column("p99 ms", |l| Cell::Number(l.p99_ms, 1)),
    column("p99.9 ms", |l| Cell::Number(l.p999_ms, 1)),
    column("tail ratio", |l| Cell::Number(l.tail_ratio, 2)),
    column("timed out", |l| Cell::Share(l.timeout_rate)),
];

/// The entry operations table, one row per entry (service, operation).
pub static ENTRY_COLUMNS: &[Column<EntryFigures>] = &[
    column("service", |e| Cell::Text(e.service.clone())),
    column("operation", |e| Cell::Text(e.operation.clone())),
    column("requests", |e| Cell::Count(e.requests)),
    column("errors", |e| Cell::Share(e.error_rate)),
    column("p99 ms", |e| Cell::Number(e.p99_ms, 1)),
    column("p99.9 ms", |e| Cell::Number(e.p999_ms, 1)),
    column("storm potential", |e| {
        Cell::Text(format!("{}", e.storm_potential))
    }),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A header names one column of its table.
    #[test]
    fn headers_are_unique() {
        fn unique<T>(columns: &[Column<T>]) {
            let headers: std::collections::BTreeSet<_> = columns.iter().map(|c| c.header).collect();
            assert_eq!(headers.len(), columns.len());
        }
        unique(EDGE_COLUMNS);
        unique(LAYER_COLUMNS);
        unique(ENTRY_COLUMNS);
    }
}
