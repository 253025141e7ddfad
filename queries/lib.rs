//! The analysis's SQL: one query per `.sql` file beside this one, each opening with a
//! comment that is its contract (what it computes, its inputs, its output columns). The
//! analytics crate registers them by name in the order they run.

macro_rules! files {
    ($($name:literal),* $(,)?) => {
        /// Every query file, as (name, SQL), by name.
        pub const FILES: &[(&str, &str)] = &[$(($name, include_str!(concat!($name, ".sql")))),*];
    };
}

files![
    "attempts",
    "budget_edges",
    "budget_served",
    "clock_skew",
    "coverage",
    "edge_causes",
    "edges",
    "entries",
    "entry_operations",
    "finding_counts",
    "findings",
    "late_latency",
    "layer_durations",
    "layer_operations",
    "layers",
    "logical_calls",
    "orphans",
    "partial_attempts",
    "partial_backoff",
    "partial_budgets",
    "partial_calls",
    "partial_clock_skew",
    "partial_edge_latency",
    "partial_edges",
    "partial_entries",
    "partial_entry_latency",
    "partial_findings",
    "partial_latency",
    "partial_layer_codes",
    "partial_layers",
    "partial_links",
    "partial_orphan_list",
    "partial_orphans",
    "partial_retry_budgets",
    "partial_sequences",
    "partial_sync",
    "partial_tail",
    "partial_timeout_values",
    "partial_timeouts",
    "partial_traces",
    "remaining_budgets",
    "replay_attempts",
    "replay_calls",
    "retry_budgets",
    "timeout_values",
    "trace_counts",
];

/// The SQL of the file `<name>.sql`; a name without a file fails the build where it is
/// asked for in a constant.
pub const fn sql(name: &str) -> &'static str {
    let mut i = 0;
    while i < FILES.len() {
        if same(FILES[i].0, name) {
            return FILES[i].1;
        }
        i += 1;
    }
    panic!("no query file of that name")
}

/// `a == b`, spelled out: comparing strings with `==` is not allowed in a `const fn`.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    /// FILES lists exactly the `.sql` files of this folder, in name order.
    #[test]
    fn files_are_the_folders_sql() {
        let mut names: Vec<String> = std::fs::read_dir(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                name.strip_suffix(".sql").map(str::to_owned)
            })
            .collect();
        names.sort();
        let listed: Vec<&str> = super::FILES.iter().map(|(name, _)| *name).collect();
        assert_eq!(listed, names);
    }

    /// `sql` answers a name with its file's text.
    #[test]
    fn sql_finds_a_file_by_name() {
        assert!(super::sql("edges").starts_with("-- edges:"));
    }
}
