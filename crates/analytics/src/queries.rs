//! The registry of the queries by stage: `queries/*.sql`, embedded by the
//! `stormglass-queries` package beside them, so the binary runs from anywhere.
//!
//! Three stages, each query reading only tables of earlier stages:
//! * [`DERIVED`]: views over one batch of spans (plus `lineage`, `lineage_attempts`,
//!   `edge_names` and `params`), materialised once per analysis so later queries do not recompute them;
//! * [`PARTIALS`]: mergeable per-interval aggregates over the derived tables;
//! * [`REPORT`]: figures over a window, from the merged partials (`p_<name>` tables);
//! * [`COMMANDS`]: what a command reads from those tables (`check-budget`, `replay`).
//!
//! The one-row `params` table is always the left side of its join (`FROM params p CROSS
//! JOIN attempts a`): DataFusion's cross join emits one batch per row of its left side, so
//! `attempts a CROSS JOIN params p` fed every operator after it one-row batches
//! (`EXPLAIN ANALYZE` of `findings`: 110,600 batches for 110,600 rows).

/// A named query; its header comment is its contract.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    pub name: &'static str,
    pub sql: &'static str,
}

macro_rules! query {
    ($name:literal) => {
        Query {
            name: $name,
            sql: stormglass_queries::sql($name),
        }
    };
}

/// Derived tables, in dependency order.
pub const DERIVED: &[Query] = &[
    query!("attempts"),
    query!("logical_calls"),
    query!("entries"),
    query!("orphans"),
    query!("findings"),
    query!("timeout_values"),
    query!("layer_durations"),
];

/// Per-interval partial aggregates; each is registered as `p_<name minus "partial_">` for
/// the report.
pub const PARTIALS: &[Query] = &[
    query!("partial_edges"),
    query!("partial_calls"),
    query!("partial_attempts"),
    query!("partial_timeouts"),
    query!("partial_timeout_values"),
    query!("partial_layers"),
    query!("partial_layer_codes"),
    query!("partial_latency"),
    query!("partial_edge_latency"),
    query!("partial_backoff"),
    query!("partial_sync"),
    query!("partial_entries"),
    query!("partial_entry_latency"),
    query!("partial_traces"),
    query!("partial_findings"),
    query!("partial_orphans"),
    query!("partial_orphan_list"),
    query!("partial_links"),
    query!("partial_sequences"),
    query!("partial_clock_skew"),
    query!("partial_tail"),
    query!("partial_budgets"),
    query!("partial_retry_budgets"),
];

/// Window figures, in dependency order.
pub const REPORT: &[Query] = &[
    query!("layers"),
    query!("layer_operations"),
    query!("clock_skew"),
    query!("retry_budgets"),
    query!("edges"),
    query!("edge_causes"),
    query!("entry_operations"),
    query!("trace_counts"),
    query!("finding_counts"),
    query!("coverage"),
    query!("remaining_budgets"),
];

/// `partial_latency` rows for late SERVER spans (see the file's header).
pub const LATE_LATENCY: Query = query!("late_latency");

/// What `check-budget` and `replay` read from a query context (the derived and report
/// tables of one window, see [`crate::engine::Engine::query_context`]).
pub const BUDGET_EDGES: Query = query!("budget_edges");
pub const BUDGET_SERVED: Query = query!("budget_served");
pub const REPLAY_CALLS: Query = query!("replay_calls");
pub const REPLAY_ATTEMPTS: Query = query!("replay_attempts");

/// Every query over a query context, for the registry's tests.
pub const COMMANDS: &[Query] = &[BUDGET_EDGES, BUDGET_SERVED, REPLAY_CALLS, REPLAY_ATTEMPTS];

/// The table name a partial is merged under in the report stage.
pub fn merged_name(partial: &str) -> String {
    format!("p_{}", partial.strip_prefix("partial_").unwrap_or(partial))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every query joins `params` from the left (see the module comment); joined from the
    /// right, it would turn the rest of the query into one-row batches.
    #[test]
    fn params_is_joined_from_the_left() {
        for query in DERIVED
            .iter()
            .chain(PARTIALS)
            .chain(REPORT)
            .chain(COMMANDS)
            .chain([&LATE_LATENCY])
        {
            let code: Vec<&str> = query
                .sql
                .lines()
                .map(|line| line.split("--").next().unwrap_or(""))
                .collect();
            let words = code.join(" ");
            let words: Vec<&str> = words.split_whitespace().collect();
            assert!(
                !words.join(" ").contains("CROSS JOIN params"),
                "{}: write `FROM params p CROSS JOIN ...`",
                query.name
            );
        }
    }
}
