//! The readable form of a report (`stormglass analyze`, the default format): one aligned
//! table per section. Absent figures print as `-`, never as 0.

use std::fmt::Write;

use stormglass_analytics::figures::columns::{
    Cell, Column, EDGE_COLUMNS, ENTRY_COLUMNS, LAYER_COLUMNS,
};
use stormglass_analytics::report::{CoverageShares, Report};

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn number(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

/// Columns padded to their widest cell.
fn grid(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "  {}", text.join("  ").trim_end());
    };
    line(&mut out, headers.to_vec());
    for row in rows {
        line(&mut out, row.iter().map(String::as_str).collect());
    }
    out
}

/// A catalogue table ([`stormglass_analytics::figures::columns`]): its headers, a row per item.
fn columns<T>(columns: &[Column<T>], items: &[T]) -> String {
    let headers: Vec<&str> = columns.iter().map(|c| c.header).collect();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| {
            columns
                .iter()
                .map(|c| match (c.cell)(item) {
                    Cell::Share(v) => percent(v),
                    Cell::Number(v, decimals) => number(v, decimals),
                    Cell::Count(n) => n.to_string(),
                    Cell::Counts(counts) => {
                        let counts: Vec<String> = counts.iter().map(u64::to_string).collect();
                        counts.join(" / ")
                    }
                    Cell::Text(text) => text,
                })
                .collect()
        })
        .collect();
    grid(&headers, &rows)
}

/// Orphan pairs the table lists unless told to list all: the largest by work after cancel.
pub const LISTED_ORPHANS: usize = 20;

/// The line saying a list was cut to its worst entries, and how to see the rest.
fn listed(listing: Option<&stormglass_analytics::report::Listing>) -> String {
    match listing {
        Some(l) if l.truncated => {
            let layers = match l.layers {
                0 => String::new(),
                n => format!(", {} of {n} layers", l.layers_listed),
            };
            let entries = match (l.entries, l.entries_listed) {
                (Some(n), Some(listed)) if n > 0 => {
                    format!(", {listed} of {n} entry operations")
                }
                _ => String::new(),
            };
            let services = match (l.services, l.services_listed) {
                (Some(n), Some(listed)) if listed < n => {
                    format!(" (coverage of {listed} of {n} services: the listed ones)")
                }
                _ => String::new(),
            };
            format!(
                "The worst {} of {} edges{layers}{entries}{services} ({}); --limit N or --all \
                 for more.\n\n",
                l.edges_listed, l.edges, l.order
            )
        }
        _ => String::new(),
    }
}

pub fn report(r: &Report, all_orphans: bool) -> String {
    let mut out = String::new();
    let w = &r.window;
    let _ = writeln!(
        out,
        "Window {} .. {}: {} traces, {} spans, {} entry requests, {} with retries in several layers\n",
        w.start.as_deref().unwrap_or("-"),
        w.end.as_deref().unwrap_or("-"),
        w.traces,
        w.spans,
        r.traces.entry_requests,
        r.traces.multi_layer_retry_traces
    );
    out += &listed(r.listing.as_ref());

    let _ = writeln!(out, "Edges (caller -> callee operation)");
    out += &columns(EDGE_COLUMNS, &r.edges);

    let _ = writeln!(out, "\nLayers");
    out += &columns(LAYER_COLUMNS, &r.layers);

    let _ = writeln!(out, "\nEntry operations");
    out += &columns(ENTRY_COLUMNS, &r.entries);

    let _ = writeln!(
        out,
        "\nInstrumentation coverage (share of attempts whose spans carry it; see docs/instrumenting.md)"
    );
    let coverage_row = |name: String, shares: &CoverageShares| {
        let mut row = vec![name, shares.attempts.to_string()];
        row.extend(shares.named().iter().map(|(_, share)| percent(*share)));
        row
    };
    let mut rows: Vec<Vec<String>> = r
        .coverage
        .services
        .iter()
        .map(|c| coverage_row(format!("{} (all calls)", c.service), &c.shares))
        .collect();
    rows.extend(r.coverage.edges.iter().map(|c| {
        coverage_row(
            format!("{} -> {} {}", c.caller, c.callee, c.operation),
            &c.shares,
        )
    }));
    out += &grid(
        &[
            "caller",
            "attempts",
            "attempt number",
            "cause",
            "deadline",
            "idempotency",
            "idempotency key",
            "server spans",
            "from server spans",
            "inferred",
        ],
        &rows,
    );

    let _ = writeln!(out, "\nFindings");
    // Per kind, how many the window holds where a kind lists only its highest counts
    // (`report.max_findings_per_kind`): at width, a few hundred of ~160,000.
    if (r.finding_totals.iter()).any(|t| t.listed < t.findings) {
        let rows: Vec<Vec<String>> = (r.finding_totals.iter())
            .map(|t| {
                vec![
                    t.severity.clone(),
                    t.kind.clone(),
                    t.findings.to_string(),
                    t.listed.to_string(),
                    t.count.to_string(),
                ]
            })
            .collect();
        out += &grid(&["severity", "kind", "findings", "listed", "count"], &rows);
        let _ = writeln!(out, "\nListed, the highest counts of each kind first");
    }
    let rows: Vec<Vec<String>> = r
        .findings
        .iter()
        .map(|f| {
            vec![
                f.severity.clone(),
                f.kind.clone(),
                format!("{} -> {} {}", f.caller, f.callee, f.operation),
                f.count.to_string(),
                f.detail.clone().unwrap_or_default(),
            ]
        })
        .collect();
    out += &grid(&["severity", "kind", "where", "count", "example"], &rows);

    let _ = writeln!(out, "\nOrphan pairs (caller gave up, callee kept working)");
    // The largest first (pairs whose server span never arrived, without a measure, last).
    let mut orphans: Vec<_> = r.orphans.iter().collect();
    orphans.sort_by(|a, b| {
        let work = |o: &&stormglass_analytics::report::Orphan| o.work_after_cancel_ms;
        work(b)
            .partial_cmp(&work(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    if !all_orphans {
        orphans.truncate(LISTED_ORPHANS);
    }
    // Every pair is counted on its edge; the report lists the most recent ones.
    let counted: u64 = r.edges.iter().map(|e| e.orphan_pairs).sum();
    let pairs = counted.max(r.orphans.len() as u64);
    let rows: Vec<Vec<String>> = orphans
        .iter()
        .map(|o| {
            vec![
                o.trace_id.clone(),
                format!("{} -> {} {}", o.caller, o.callee, o.operation),
                number(o.work_after_cancel_ms, 1),
                o.server_outcome.clone(),
            ]
        })
        .collect();
    out += &grid(
        &["trace", "edge", "work after cancel ms", "server outcome"],
        &rows,
    );
    let rest = pairs.saturating_sub(rows.len() as u64);
    if rest > 0 {
        let _ = writeln!(
            out,
            "  ... and {rest} more (`--all` lists every one the report holds; the JSON has them)"
        );
    }

    let _ = writeln!(out, "\nAlerts whose condition holds");
    let rows: Vec<Vec<String>> = r
        .alerts
        .iter()
        .map(|a| {
            let labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            vec![
                a.severity.clone(),
                a.name.clone(),
                labels.join(","),
                number(Some(a.value), 3),
            ]
        })
        .collect();
    out += &grid(&["severity", "alert", "labels", "value"], &rows);
    out
}

/// The what-if as readable tables: layers, then edges.
/// `stormglass advise`: each edge's advised settings and why, each layer's amplification
/// observed and under the advice, and the budgets the advice cannot fit in.
pub fn advice(a: &stormglass_analytics::advice::Advice) -> String {
    let mut out = listed(a.listing.as_ref());
    out += "Edges\n";
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v} ms"));
    let rows: Vec<Vec<String>> = a
        .edges
        .iter()
        .map(|e| {
            vec![
                format!("{} -> {}", e.caller, e.callee),
                e.operation.clone(),
                ms(e.timeout_ms),
                e.max_attempts.to_string(),
                format!("{} ms x2, full jitter", e.backoff.initial_ms),
                format!(
                    "{:.0}%, {}/s",
                    e.retry_budget_ratio * 100.0,
                    e.retry_budget_min_per_second
                ),
                e.attempts_reason.clone(),
            ]
        })
        .collect();
    out += &grid(
        &[
            "edge",
            "operation",
            "timeout",
            "attempts",
            "backoff",
            "retry budget",
            "why",
        ],
        &rows,
    );
    for e in a.edges.iter().filter(|e| !e.reasons.is_empty()) {
        let _ = writeln!(
            out,
            "  {} -> {} {}: {}",
            e.caller,
            e.callee,
            e.operation,
            e.reasons.join("; ")
        );
    }
    let _ = writeln!(out, "\nLayers");
    let rows: Vec<Vec<String>> = a
        .layers
        .iter()
        .map(|l| {
            vec![
                l.service.clone(),
                number(l.amplification, 2),
                format!("<= {:.2}", l.amplification_advised),
            ]
        })
        .collect();
    out += &grid(&["service", "amplification", "under the advice"], &rows);
    if !a.sequential.is_empty() {
        let _ = writeln!(
            out,
            "\nCalled one after another, fitted into the caller's budget together"
        );
        for (service, callees) in &a.sequential {
            let _ = writeln!(out, "{service}: {}", callees.join(", "));
        }
    }
    for f in &a.findings {
        let _ = writeln!(out, "{}: {}", f.kind, f.message);
    }
    out
}

/// `stormglass replay`: per edge what the policy would have changed.
pub fn replay(r: &stormglass_analytics::replay::Replay) -> String {
    let t = &r.totals;
    let mut out = format!(
        "Replayed over {:.1} s: {:.0} -> {:.0} calls, {:.0} -> {:.0} attempts ({}% load \
         saved), {:.1} retries dropped ({:.1} by budgets), {:.1} successes lost (and {:.1} \
         above them)\n\n",
        r.seconds,
        t.counts.calls,
        t.counts.calls_replayed,
        t.counts.attempts,
        t.counts.attempts_replayed,
        number(t.load_saved.map(|s| s * 100.0), 1),
        t.counts.retries_dropped,
        t.counts.retries_dropped_by_budget,
        t.counts.successes_lost,
        t.counts.successes_lost_below,
    );
    out += &listed(Some(&r.listing));
    let rows: Vec<Vec<String>> = r
        .edges
        .iter()
        .map(|e| {
            vec![
                format!("{} -> {}", e.caller, e.callee),
                e.operation.clone(),
                e.max_attempts
                    .map_or_else(|| "as seen".to_owned(), |m| m.to_string()),
                e.budget.unwrap_or("-").replace('_', " "),
                format!("{:.0} -> {:.0}", e.counts.calls, e.counts.calls_replayed),
                format!(
                    "{:.0} -> {:.0}",
                    e.counts.attempts, e.counts.attempts_replayed
                ),
                format!("{:.1}", e.counts.retries_dropped),
                format!("{:.1}", e.counts.attempts_not_called),
                format!("{:.1}", e.counts.successes_lost),
                format!("{:.1}", e.counts.successes_lost_below),
                format!(
                    "{} -> {}",
                    number(e.success_rate, 4),
                    number(e.success_rate_replayed, 4)
                ),
                number(e.load_saved.map(|s| s * 100.0), 1),
            ]
        })
        .collect();
    out += &grid(
        &[
            "edge",
            "operation",
            "attempts",
            "budget",
            "calls",
            "attempts sent",
            "retries dropped",
            "not called",
            "successes lost",
            "lost below",
            "success rate",
            "load saved %",
        ],
        &rows,
    );
    out
}

pub fn whatif(w: &stormglass_analytics::whatif::WhatIf) -> String {
    let mut out = listed(Some(&w.listing));
    out += "Layers if the failures happened\n";
    let rows: Vec<Vec<String>> = w
        .layers
        .iter()
        .map(|l| {
            vec![
                l.service.clone(),
                format!("{:.3}", l.amplification),
                format!("{:.4}", l.success_probability),
                number(l.requests_per_second, 1),
            ]
        })
        .collect();
    out += &grid(
        &["service", "amplification", "succeeds", "requests/s"],
        &rows,
    );
    let _ = writeln!(out, "\nEdges");
    let rows: Vec<Vec<String>> = w
        .edges
        .iter()
        .map(|e| {
            vec![
                format!("{} -> {}", e.caller, e.callee),
                e.operation.clone(),
                e.max_attempts.to_string(),
                number(e.retry_budget_per_call, 3),
                format!("{:.4}", e.callee_failure_probability),
                format!("{:.3}", e.attempts_per_call),
            ]
        })
        .collect();
    out += &grid(
        &[
            "edge",
            "operation",
            "max attempts",
            "budget (retries per call)",
            "callee fails",
            "attempts per call",
        ],
        &rows,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormglass_analytics::report::{FindingTotal, Orphan};

    /// Where a kind of finding lists only its highest counts, the table says per kind how
    /// many the window holds; where every finding is listed, it lists them alone.
    #[test]
    fn findings_say_how_many_each_kind_holds() {
        let total = |kind: &str, findings: u64, listed: u64| FindingTotal {
            kind: kind.into(),
            severity: "warning".into(),
            findings,
            listed,
            count: 3 * findings,
        };
        let mut wide = Report {
            finding_totals: vec![total("not_propagated", 1, 1), total("clock_skew", 900, 100)],
            ..Report::default()
        };
        let text = report(&wide, false);
        let row = text.lines().find(|l| l.contains("clock_skew")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            ["warning", "clock_skew", "900", "100", "2700"],
            "{text}"
        );
        assert!(text.contains("highest counts of each kind first"), "{text}");
        wide.finding_totals[1].listed = 900;
        let text = report(&wide, false);
        assert!(!text.contains("clock_skew"), "{text}");
    }

    /// The table lists the 20 orphan pairs with the most work after cancel and counts the
    /// rest; `--all` lists every one.
    #[test]
    fn orphans_table_lists_the_largest() {
        let storm = Report {
            orphans: (0..25)
                .map(|i| Orphan {
                    trace_id: format!("trace-{i:02}"),
                    caller: "web".into(),
                    callee: "api".into(),
                    operation: "GET".into(),
                    work_after_cancel_ms: Some(f64::from(i)),
                    server_outcome: "ok".into(),
                })
                .collect(),
            ..Report::default()
        };
        let text = report(&storm, false);
        assert!(text.contains("trace-24"), "{text}");
        assert!(text.contains("trace-05"), "{text}");
        assert!(!text.contains("trace-04"), "{text}");
        assert!(text.contains("... and 5 more"), "{text}");
        let all = report(&storm, true);
        assert!(all.contains("trace-00") && !all.contains("more ("), "{all}");
    }
}
