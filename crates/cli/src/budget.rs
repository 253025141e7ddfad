//! `stormglass check-budget`'s files: the budget table read (YAML, or TOML), and one
//! written from traffic (`--emit`). Its rules are in
//! [`stormglass_analytics::budget_table`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use stormglass_analytics::budget_table::{Declared, Observed, parse};

use stormglass_runtime::config_tree;

/// Read a budget file (YAML, or TOML by its `.toml` name): every problem at once, each with
/// its path (`edges[1].timeout: ...`).
pub fn read(path: &Path) -> Result<Declared, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let format = if path.extension().is_some_and(|e| e == "toml") {
        config_tree::Format::Toml
    } else {
        config_tree::Format::Yaml
    };
    let tree = config_tree::parse(&text, format).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&tree).map_err(|errors| {
        let lines: Vec<String> = errors
            .iter()
            .map(|(at, why)| format!("  {at}: {why}"))
            .collect();
        format!(
            "{}: invalid budget file:\n{}",
            path.display(),
            lines.join("\n")
        )
    })
}

/// A budget file written from traffic: each observed edge's timeout (the recommended one,
/// P99.9 x the timeout factor, where none was observed) and most attempts per call, and
/// the services' sequential calls seen.
pub fn emit(observed: &[Observed], sequential: &BTreeMap<String, Vec<String>>) -> String {
    #[derive(Serialize)]
    struct EdgeOut {
        caller: String,
        callee: String,
        timeout: String,
        attempts: u32,
    }
    #[derive(Serialize)]
    struct FileOut<'a> {
        edges: Vec<EdgeOut>,
        sequential: &'a BTreeMap<String, Vec<String>>,
    }
    let edges = observed
        .iter()
        .filter_map(|o| {
            let ms = o.timeout_ms.or(o.recommended_timeout_ms)?;
            Some(EdgeOut {
                caller: o.caller.clone(),
                callee: o.callee.clone(),
                timeout: format!("{}ms", ms.ceil()),
                attempts: o.max_attempts,
            })
        })
        .collect();
    let file = FileOut { edges, sequential };
    format!(
        "# Written by `stormglass check-budget --emit` from observed traffic: each edge's timeout\n\
         # (P99.9 x advice.timeout_factor where no timeout was seen) and most attempts per call.\n{}",
        serde_saphyr::to_string(&file).unwrap_or_default()
    )
}
