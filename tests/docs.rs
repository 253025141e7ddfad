//! The documentation holds: every relative link in the README, docs/, benches/README.md
//! and CHANGELOG.md resolves (to a file, and to a heading where it names one), the
//! metrics reference (docs/metrics.md and the self-metrics of docs/operating.md) lists
//! exactly the families `/metrics` exports, the figures reference (docs/figures.md) every
//! figure of a report's edges, layers and entries, `stormglass query`'s help and reference
//! every report table, and the crates depend on each other as docs/architecture.md says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use common::scenario::Services;
use common::{Server, get, repo_root};
use stormglass_export::rules::heading_anchor;

/// The Markdown files a user reads.
fn pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages.extend(["README.md", "benches/README.md", "CHANGELOG.md"].map(|p| root.join(p)));
    pages
}

/// Every `](target)` of a Markdown text.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_owned());
        }
    }
    out
}

fn anchors(page: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(page)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| heading_anchor(l.trim_start_matches('#').trim()))
        .collect()
}

/// Every relative link of the README and docs resolves, headings included; the README
/// stays a front door (~250 lines) and links every docs page.
#[test]
fn relative_links_resolve() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, heading) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", page.display()));
            } else if !heading.is_empty() && !anchors(&target).contains(heading) {
                broken.push(format!("{}: {link} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));

    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    assert!(readme.lines().count() <= 250, "the README is a front door");
    for page in pages()
        .iter()
        .filter(|p| p.parent().unwrap().ends_with("docs"))
    {
        let name = page.file_name().unwrap().to_string_lossy();
        assert!(
            readme.contains(&format!("(docs/{name})")),
            "the README does not lead to docs/{name}"
        );
    }
}

/// Families that exist only in some configurations: the TLS handshake failures (with TLS
/// on). Every other family is on `/metrics` once the storm below has been analysed; the
/// counters of events it does not cause (refusals, notifications, folded series) are there
/// at 0 from the start.
const WITH_TLS_ONLY: &[&str] = &["stormglass_tls_handshake_failures_total"];

/// The metric families the reference documents: the names in the first column of the
/// tables of docs/metrics.md and docs/operating.md.
fn documented() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for page in ["docs/metrics.md", "docs/operating.md"] {
        let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
        for line in text.lines().filter(|l| l.starts_with("| `stormglass_")) {
            let first = line.split('|').nth(1).unwrap();
            for name in first.split('`').filter(|w| w.starts_with("stormglass_")) {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// After a retry storm through the archive, with a latency baseline, `/metrics` exports
/// exactly the documented families (TLS's only with TLS on).
#[test]
fn metrics_reference_lists_what_metrics_exports() {
    let scratch = common::temp_dir("docs-metrics");
    let dir = scratch.path();
    let baseline = dir.join("baseline.json");
    std::fs::write(
        &baseline,
        r#"{"layers": [{"service": "db", "p999_ms": 20.0}]}"#,
    )
    .unwrap();
    let archive = dir.join("archive");
    let server = Server::start(&[
        ("STORMGLASS_ALERTS__BASELINE", baseline.to_str().unwrap()),
        ("STORMGLASS_ASSEMBLY__IDLE", "300ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
        ("STORMGLASS_ARCHIVE__DIR", archive.to_str().unwrap()),
        ("STORMGLASS_ARCHIVE__FLUSH", "1s"),
        ("STORMGLASS_SHUTDOWN__DRAIN", "0s"),
    ]);
    let services = Services::new(&server.grpc);
    services.storm(SystemTime::now());
    services.flush();
    server.wait_until("the storm's figures", |s| {
        s.metric("stormglass_layer_attempts_total", &["service=\"db\""]) > 0.0
    });
    let (_, text) = get(&format!("http://{}/metrics", server.api));
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let documented = documented();
    let undocumented: Vec<&String> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "exported, not documented: {undocumented:?}"
    );
    let missing: Vec<&String> = documented
        .difference(&exported)
        .filter(|name| !WITH_TLS_ONLY.contains(&name.as_str()))
        .collect();
    assert!(missing.is_empty(), "documented, not exported: {missing:?}");
}

/// Each figures table of docs/figures.md, by its header's first cell: the report list
/// whose rows it defines, and the fields that name a row rather than define a figure.
const FIGURE_TABLES: [(&str, &str, &[&str]); 3] = [
    (
        "| figure |",
        "edges",
        &["caller", "callee", "operation", "logical_calls", "attempts"],
    ),
    ("| layer figure |", "layers", &["service"]),
    ("| entry figure |", "entries", &["service", "operation"]),
];

/// The figures tables of docs/figures.md (per edge, layer and entry operation) list
/// exactly the figures of their rows in the JSON report: a figure added to the report
/// without its line, or a line left for a figure gone, fails here.
#[test]
fn figures_reference_lists_every_figure() {
    let scratch = common::temp_dir("docs-figures");
    let dir = scratch.path();
    let mut spans = stormglass_testkit::fixtures::Spans::default();
    stormglass_testkit::fixtures::storm(&mut spans, 1);
    let file = dir.join("storm.jsonl");
    common::write_jsonl(&file, &spans, None);
    let (ok, stdout, stderr) =
        common::stormglass(&["analyze", "--format", "json", file.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let text = std::fs::read_to_string(repo_root().join("docs/figures.md")).unwrap();
    for (header, list, names) in FIGURE_TABLES {
        let reported: BTreeSet<String> = report[list][0]
            .as_object()
            .unwrap_or_else(|| panic!("no {list} in the report"))
            .keys()
            .filter(|k| !names.contains(&k.as_str()))
            .cloned()
            .collect();
        let table = text
            .lines()
            .skip_while(|l| !l.starts_with(header))
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        let documented: BTreeSet<String> = table
            .flat_map(|line| {
                let first = line.split('|').nth(1).unwrap_or_default();
                first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        let undocumented: Vec<&String> = reported.difference(&documented).collect();
        assert!(
            undocumented.is_empty(),
            "{list}: reported, not documented: {undocumented:?}"
        );
        let gone: Vec<&String> = documented.difference(&reported).collect();
        assert!(
            gone.is_empty(),
            "{list}: documented, not reported: {gone:?}"
        );
    }
}

/// The stages in the order the data flows; `model`, `runtime` and `demo` are beside them.
const STAGES: [&str; 5] = ["ingest", "archive", "assembly", "analytics", "export"];

/// `stormglass query` names every report table it can read, in its help and in
/// docs/commands.md: the report's queries and the storm potential's table.
#[test]
fn query_reference_names_every_report_table() {
    let (ok, help, stderr) = common::stormglass(&["query", "--help"]);
    assert!(ok, "{stderr}");
    let words: BTreeSet<&str> = (help.split_whitespace())
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric() && c != '_'))
        .collect();
    let commands = std::fs::read_to_string(repo_root().join("docs/commands.md")).unwrap();
    let row = commands
        .lines()
        .find(|l| l.starts_with("| `stormglass query"))
        .expect("docs/commands.md has a row for stormglass query");
    let tables = (stormglass_analytics::queries::REPORT.iter())
        .map(|q| q.name)
        .chain(["storm_potential"]);
    for table in tables {
        assert!(
            words.contains(table),
            "`stormglass query --help` does not name {table}: {help}"
        );
        assert!(
            row.contains(&format!("`{table}`")),
            "docs/commands.md's stormglass query row does not name {table}"
        );
    }
}

/// The `stormglass-*` crates a manifest's `[dependencies]` names (`queries` is the package
/// of the SQL files, in `queries/`).
fn stormglass_dependencies(krate: &str) -> Vec<String> {
    let folder = match krate {
        "queries" => "queries".to_owned(),
        _ => format!("crates/{krate}"),
    };
    let manifest = std::fs::read_to_string(repo_root().join(folder).join("Cargo.toml")).unwrap();
    let mut section = "";
    let mut names = Vec::new();
    for line in manifest.lines() {
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]"
            && let Some(name) = line.strip_prefix("stormglass-")
        {
            names.push(name.split(['.', ' ', '=']).next().unwrap().to_owned());
        }
    }
    names
}

/// Each stage depends on `model`, `runtime`, the SQL files' package and earlier stages
/// only; no stage depends on the receivers; `model`, `runtime` and `queries` depend on no
/// stage.
#[test]
fn crates_depend_in_the_order_data_flows() {
    for (i, stage) in STAGES.iter().enumerate() {
        for dependency in stormglass_dependencies(stage) {
            let earlier = STAGES[..i].contains(&dependency.as_str());
            assert!(
                ["model", "runtime", "queries"].contains(&dependency.as_str()) || earlier,
                "{stage} depends on {dependency}"
            );
            assert!(dependency != "ingest", "{stage} depends on the receivers");
        }
    }
    for base in ["model", "runtime", "queries"] {
        let deps = stormglass_dependencies(base);
        assert!(
            deps.iter().all(|d| d == "model"),
            "{base} depends on {deps:?}"
        );
    }
}

/// The alerts docs/alerts.md marks "minimum traffic" are exactly those whose rule carries
/// the `alerts.min_events_per_minute` guard, and docs/configuration.md names no list of
/// its own: the rule is stated once, beside the table the code is held to.
#[test]
fn minimum_traffic_marks_are_the_guarded_rules() {
    use stormglass_analytics::alerts::DEFINITIONS;
    let text = std::fs::read_to_string(repo_root().join("docs/alerts.md")).unwrap();
    let marked: BTreeSet<(String, bool)> = text
        .lines()
        .skip_while(|l| !l.ends_with("| minimum traffic |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let guarded = cells[5].starts_with("yes");
            (cells[1].trim_matches('`').to_owned(), guarded)
        })
        .collect();
    // A threshold no other setting has, so its appearance in a rule is the guard's.
    let thresholds = stormglass_analytics::AlertThresholds {
        min_events_per_minute: 7.25,
        ..Default::default()
    };
    let guarded: BTreeSet<(String, bool)> = DEFINITIONS
        .iter()
        .map(|d| {
            let rule = stormglass_export::promql::alert_expr(d, &thresholds);
            (d.name.to_owned(), rule.contains(" * 60 >= 7.25"))
        })
        .collect();
    assert_eq!(marked, guarded, "docs/alerts.md's minimum traffic column");
    let config = std::fs::read_to_string(repo_root().join("docs/configuration.md")).unwrap();
    let line = config
        .lines()
        .find(|l| l.starts_with("| `alerts.min_events_per_minute`"))
        .unwrap();
    assert!(line.contains("(alerts.md)"), "{line}");
}

/// docs/configuration.md shows the example file whole (its keys and comments, below the
/// file's own header), so the page cannot fall behind the file its test loads.
#[test]
fn configuration_page_shows_the_example_file() {
    let page = std::fs::read_to_string(repo_root().join("docs/configuration.md")).unwrap();
    let example =
        std::fs::read_to_string(repo_root().join("crates/cli/stormglass.example.yaml")).unwrap();
    let shown = page
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(block, _)| block)
        .unwrap();
    let body = example
        .lines()
        .skip_while(|l| l.starts_with('#') || l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        shown,
        body.trim_end(),
        "docs/configuration.md's example block"
    );
}
