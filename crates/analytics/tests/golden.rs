//! Golden results of every query on the fixtures: each table every query produces is
//! rendered (rows sorted, so plan order cannot matter) and compared with
//! tests/golden/<fixture>/<table>.txt.
//!
//! After an intended change, regenerate with
//! `STORMGLASS_BLESS=1 cargo nextest run -p stormglass-analytics --test golden`
//! and review the diff like code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

use std::path::PathBuf;

use fixtures::Spans;
use stormglass_analytics::{
    Engine,
    lineage::{ATTEMPT_LINEAGE, LINEAGE},
    queries,
};
use stormglass_model::{Conventions, encode_request};

async fn check(name: &str, build: fn(&mut Spans, u32)) {
    let mut spans = Spans::default();
    build(&mut spans, 1);
    let (batch, _) = encode_request(&Conventions::default(), &spans.request());
    let ctx = Engine::default().query_context(batch).await.unwrap();

    let mut tables: Vec<String> = vec![LINEAGE.to_owned(), ATTEMPT_LINEAGE.to_owned()];
    tables.extend(queries::DERIVED.iter().map(|q| q.name.to_owned()));
    tables.extend(
        queries::PARTIALS
            .iter()
            .map(|q| queries::merged_name(q.name)),
    );
    tables.extend(queries::REPORT.iter().map(|q| q.name.to_owned()));

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let bless = std::env::var_os("STORMGLASS_BLESS").is_some();
    let mut mismatches = Vec::new();
    for table in tables {
        let batches = ctx
            .table(table.as_str())
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        let rendered = sorted(&text);
        let path = dir.join(format!("{table}.txt"));
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &rendered).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("missing {}; run with STORMGLASS_BLESS=1", path.display()));
        if expected != rendered {
            mismatches.push(format!(
                "{}:\n--- expected\n{expected}\n--- actual\n{rendered}",
                path.display()
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "golden mismatches:\n{}",
        mismatches.join("\n")
    );
}

/// A pretty-printed table with its data rows sorted (header and borders kept in place).
fn sorted(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() < 4 {
        return format!("{text}\n");
    }
    let (head, rest) = lines.split_at(3);
    let (body, foot) = rest.split_at(rest.len() - 1);
    let mut body = body.to_vec();
    body.sort_unstable();
    let mut out: Vec<&str> = head.to_vec();
    out.extend(body);
    out.extend(foot);
    out.join("\n") + "\n"
}

/// Golden tables of the 3x3x3 retry storm.
#[tokio::test]
async fn golden_storm() {
    check("storm", fixtures::storm).await;
}

/// Golden tables of the deadline-budget mistakes.
#[tokio::test]
async fn golden_budgets() {
    check("budgets", fixtures::budgets).await;
}

/// Golden tables of the unsafe POST retries and the committed orphan.
#[tokio::test]
async fn golden_unsafe_post() {
    check("unsafe_post", fixtures::unsafe_post).await;
}

/// Golden tables of the pending orphans.
#[tokio::test]
async fn golden_pending_orphans() {
    check("pending_orphans", fixtures::pending_orphans).await;
}

/// Golden tables of both retry shapes.
#[tokio::test]
async fn golden_both_shapes() {
    check("both_shapes", fixtures::both_shapes).await;
}

/// Golden tables of the healthy chain.
#[tokio::test]
async fn golden_healthy() {
    check("healthy", fixtures::healthy).await;
}

/// Golden tables of the retries nobody numbered.
#[tokio::test]
async fn golden_hidden() {
    check("hidden", fixtures::hidden).await;
}
