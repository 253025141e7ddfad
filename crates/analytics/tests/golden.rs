//! Golden results of every query on the fixtures, in tests/golden/<fixture>/:
//!
//! * the public report's tables (`edges`, `layers`, ...) as `<table>.txt`, record by
//!   record, one `column=value` line per field prefixed by the record's key (floats to six
//!   significant digits; `null` where there is no value), the records sorted so plan order
//!   cannot matter: a changed figure shows in a diff as one line naming its record and
//!   column;
//! * the derived and partial tables (`attempts`, `p_edges`, ...) as `<table>.slt`,
//!   queries and their expected rows in the style of DataFusion's sqllogictest: each
//!   `query` block selects the columns it is about (a row's key columns, then a few
//!   figures), its rows sorted, values space-separated (`NULL` where there is none, floats
//!   to six significant digits). The queries are the file's: a new column is added to the
//!   blocks, in the fixtures, where it means something, and no other file moves.
//!
//! No golden line is over 400 characters. After an intended change, regenerate with
//! `STORMGLASS_BLESS=1 cargo nextest run --workspace -E 'binary(golden)'` and review the
//! diff like code: blessing keeps each `.slt` file's queries and comments and rewrites
//! their rows; a `.slt` file that does not exist yet is written with every column of its
//! table, in blocks of a few.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stormglass_testkit::fixtures;

use std::path::PathBuf;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Schema};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::prelude::SessionContext;
use fixtures::Spans;
use stormglass_analytics::{
    Engine,
    lineage::{ATTEMPT_LINEAGE, LINEAGE},
    queries,
};
use stormglass_model::{Conventions, encode_request};

/// The longest line a golden file may hold.
const MAX_LINE: usize = 400;

/// Value columns per generated `query` block, after the row's key columns.
const BLOCK_COLUMNS: usize = 5;

async fn check(name: &str, build: fn(&mut Spans, u32)) {
    let mut spans = Spans::default();
    build(&mut spans, 1);
    // A fixed secret: the idempotency key hashes read the same on every run.
    let conventions = Conventions::default().with_key_secret([0x5a; 16]);
    let (batch, _) = encode_request(&conventions, &spans.request());
    let ctx = Engine::default().query_context(batch).await.unwrap();

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let bless = std::env::var_os("STORMGLASS_BLESS").is_some();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut mismatches = Vec::new();
    let mut compare = |path: PathBuf, rendered: String| {
        if let Some(line) = rendered.lines().find(|l| l.chars().count() > MAX_LINE) {
            mismatches.push(format!(
                "{}: a line over {MAX_LINE} characters (split its query): {line}",
                path.display()
            ));
        }
        if bless {
            std::fs::write(&path, &rendered).unwrap();
            return;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("missing {}; run with STORMGLASS_BLESS=1", path.display()));
        if expected != rendered {
            mismatches.push(format!(
                "{}:\n--- expected\n{expected}\n--- actual\n{rendered}",
                path.display()
            ));
        }
    };

    for table in queries::REPORT.iter().map(|q| q.name) {
        let batches = ctx.table(table).await.unwrap().collect().await.unwrap();
        compare(dir.join(format!("{table}.txt")), records(&batches));
    }
    let mut tables: Vec<String> = vec![LINEAGE.to_owned(), ATTEMPT_LINEAGE.to_owned()];
    tables.extend(queries::DERIVED.iter().map(|q| q.name.to_owned()));
    tables.extend(
        queries::PARTIALS
            .iter()
            .map(|q| queries::merged_name(q.name)),
    );
    for table in tables {
        let path = dir.join(format!("{table}.slt"));
        let blocks = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text),
            Err(_) if bless => {
                let schema = ctx.table(table.as_str()).await.unwrap().schema().clone();
                every_column(name, &table, schema.as_arrow())
            }
            Err(_) => panic!("missing {}; run with STORMGLASS_BLESS=1", path.display()),
        };
        compare(path, run(&ctx, &blocks).await);
    }
    assert!(
        mismatches.is_empty(),
        "golden mismatches:\n{}",
        mismatches.join("\n")
    );
}

/// One `query` block of a `.slt` golden: the comment lines before it and its SQL.
struct Block {
    comments: Vec<String>,
    sql: String,
}

/// The blocks of a `.slt` golden, their expected rows dropped (they are rendered again).
fn parse(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut comments = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.starts_with('#') {
            comments.push(line.to_owned());
        } else if line.starts_with("query ") {
            let sql: Vec<&str> = lines.by_ref().take_while(|l| *l != "----").collect();
            lines.by_ref().take_while(|l| !l.is_empty()).for_each(drop);
            blocks.push(Block {
                comments: std::mem::take(&mut comments),
                sql: sql.join("\n"),
            });
        }
    }
    blocks
}

/// Blocks selecting every column of `table`: its key columns, then a few others each.
fn every_column(fixture: &str, table: &str, schema: &Schema) -> Vec<Block> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let keys = schema
        .fields()
        .iter()
        .take(3)
        .take_while(|f| is_key(f.data_type()))
        .count();
    let (key, values) = names.split_at(keys);
    let groups: Vec<&[&str]> = if values.is_empty() {
        vec![&[]]
    } else {
        values.chunks(BLOCK_COLUMNS).collect()
    };
    groups
        .into_iter()
        .enumerate()
        .map(|(i, group)| Block {
            comments: if i == 0 {
                vec![format!(
                    "# {table} on the {fixture} fixture: each query selects the columns it is about."
                )]
            } else {
                Vec::new()
            },
            sql: format!("SELECT {} FROM {table}", [key, group].concat().join(", ")),
        })
        .collect()
}

/// Run each block and render it: its comments, `query <types> rowsort`, its SQL, `----`
/// and its rows, sorted.
async fn run(ctx: &SessionContext, blocks: &[Block]) -> String {
    let mut out = String::new();
    for (i, block) in blocks.iter().enumerate() {
        let frame = ctx
            .sql(&block.sql)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", block.sql));
        let types: String = (frame.schema().fields().iter())
            .map(|f| kind(f.data_type()))
            .collect();
        let batches = frame.collect().await.unwrap();
        let mut rows: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                cells(b, "NULL", "(empty)")
                    .into_iter()
                    .map(|row| row.join(" "))
            })
            .collect();
        rows.sort_unstable();
        if i > 0 {
            out.push('\n');
        }
        for comment in &block.comments {
            out.push_str(comment);
            out.push('\n');
        }
        out.push_str(&format!("query {types} rowsort\n{}\n----\n", block.sql));
        for row in rows {
            out.push_str(&row);
            out.push('\n');
        }
    }
    out
}

/// sqllogictest's letter for a column's type.
fn kind(t: &DataType) -> char {
    match t {
        DataType::Boolean => 'B',
        DataType::Float16 | DataType::Float32 | DataType::Float64 => 'R',
        t if t.is_integer() => 'I',
        DataType::Timestamp(..) => 'P',
        t if is_key(t) || matches!(t, DataType::LargeUtf8) => 'T',
        _ => '?',
    }
}

/// The columns that name a row (its leading ones of these types, at most three).
fn is_key(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8
            | DataType::Utf8View
            | DataType::Dictionary(..)
            | DataType::FixedSizeBinary(_)
            | DataType::Binary
    )
}

/// Each row's values as the goldens print them: floats to six significant digits, `null`
/// where there is no value, `empty` for an empty string.
fn cells(batch: &RecordBatch, null: &str, empty: &str) -> Vec<Vec<String>> {
    let options = FormatOptions::default().with_null(null);
    let formatters: Vec<ArrayFormatter> = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
        .collect();
    (0..batch.num_rows())
        .map(|row| {
            batch
                .columns()
                .iter()
                .zip(&formatters)
                .map(|(column, formatter)| match column.data_type() {
                    DataType::Float64 if column.is_valid(row) => {
                        significant(column.as_primitive::<Float64Type>().value(row))
                    }
                    _ => match formatter.value(row).to_string() {
                        value if value.is_empty() => empty.to_owned(),
                        value => value,
                    },
                })
                .collect()
        })
        .collect()
}

/// The batches' rows, sorted (by their whole rendering, so plan order cannot matter), each
/// a block of one line per field named by the record's key (its leading string and id
/// columns, at most three): `caller=a  callee=b  operation=op | retry_ratio=0.5`. A figure
/// that moves is one line of the diff, saying whose. An empty table is one line saying so.
fn records(batches: &[RecordBatch]) -> String {
    let mut rows: Vec<Vec<(String, bool)>> = Vec::new();
    for batch in batches {
        let schema = batch.schema();
        for values in cells(batch, "null", "") {
            let named = schema.fields().iter().zip(values);
            rows.push(
                named
                    .map(|(field, value)| {
                        (
                            format!("{}={value}", field.name()),
                            is_key(field.data_type()),
                        )
                    })
                    .collect(),
            );
        }
    }
    if rows.is_empty() {
        return "(no rows)\n".to_owned();
    }
    let whole = |row: &[(String, bool)]| {
        row.iter()
            .map(|(cell, _)| cell.as_str())
            .collect::<Vec<_>>()
            .join("  ")
    };
    rows.sort_unstable_by_key(|row| whole(row));
    let mut out = String::new();
    for row in &rows {
        let keys = row.iter().take(3).take_while(|(_, key)| *key).count();
        let key = row[..keys]
            .iter()
            .map(|(cell, _)| cell.as_str())
            .collect::<Vec<_>>()
            .join("  ");
        for (cell, _) in &row[keys..] {
            if key.is_empty() {
                out.push_str(&format!("{cell}\n"));
            } else {
                out.push_str(&format!("{key} | {cell}\n"));
            }
        }
        if keys == row.len() {
            out.push_str(&format!("{key}\n"));
        }
        out.push('\n');
    }
    out
}

/// A float to six significant digits, without trailing zeros: the accuracy no figure
/// exceeds (quantiles are within 2%, ratios and sums exact), so a golden line moves only
/// when a figure does.
fn significant(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = 6 - 1 - v.abs().log10().floor() as i32;
    let rounded = if digits >= 0 {
        format!("{:.*}", digits as usize, v)
    } else {
        let scale = 10f64.powi(-digits);
        format!("{}", (v / scale).round() * scale)
    };
    if rounded.contains('.') {
        rounded
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    } else {
        rounded
    }
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

/// The goldens hold every fixture of the testkit's roster (but `slow_tail`, 1,000 traces),
/// and nothing else: one roster for the goldens and the live/offline comparisons.
#[test]
fn goldens_hold_every_fixture() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut held: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    held.sort();
    let mut roster: Vec<String> = fixtures::ALL
        .iter()
        .map(|(name, ..)| (*name).to_owned())
        .filter(|name| name != "slow_tail")
        .collect();
    roster.sort();
    assert_eq!(held, roster);
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

/// Golden tables of a proxy's re-sends: after a 503, after a per-try timeout, and every
/// try too slow.
#[tokio::test]
async fn golden_proxy_resends() {
    check("proxy_resends", fixtures::proxy_resends).await;
}

/// Golden tables of a hedging client: the hedge answering, and the first attempt.
#[tokio::test]
async fn golden_hedges() {
    check("hedges", fixtures::hedges).await;
}

/// Golden tables of a timeout that kills a quarter of its calls and one without margin.
#[tokio::test]
async fn golden_timeouts() {
    check("timeouts", fixtures::timeouts).await;
}

/// Golden tables of retries after client errors (404, INVALID_ARGUMENT, err_code) and one
/// after a 429.
#[tokio::test]
async fn golden_client_errors() {
    check("client_errors", fixtures::client_errors).await;
}

/// Golden tables of retries that cannot fit the budget left: one with too little left, one
/// after the deadline, one re-send without numbers, and one that fits.
#[tokio::test]
async fn golden_out_of_budget() {
    check("out_of_budget", fixtures::out_of_budget).await;
}

/// Golden tables of idempotency keys: kept, changed on a retry, dropped, replayed.
#[tokio::test]
async fn golden_idempotency_keys() {
    check("idempotency_keys", fixtures::idempotency_keys).await;
}

/// Golden tables of timeouts judged against the operation they guard: by the edge's SERVER
/// spans, the callee operation's durations and the callee layer's.
#[tokio::test]
async fn golden_operations() {
    check("operations", fixtures::operations).await;
}

/// Golden tables of the writes re-run below a safe retry.
#[tokio::test]
async fn golden_rerun_writes() {
    check("rerun_writes", fixtures::rerun_writes).await;
}

/// Golden tables of the retried writes a unique index caught.
#[tokio::test]
async fn golden_duplicates() {
    check("duplicates", fixtures::duplicates).await;
}

/// Golden tables of the retries against Retry-After and gRPC pushback.
#[tokio::test]
async fn golden_pacing() {
    check("pacing", fixtures::pacing).await;
}

/// Golden tables of how retries wait.
#[tokio::test]
async fn golden_backoff() {
    check("backoff", fixtures::backoff).await;
}

/// Golden tables of how long given-up writes' results stay unknown.
#[tokio::test]
async fn golden_unknown_results() {
    check("unknown_results", fixtures::unknown_results).await;
}

#[tokio::test]
async fn golden_envoy() {
    check("envoy", fixtures::envoy).await;
}

#[tokio::test]
async fn golden_synchronised() {
    check("synchronised", fixtures::synchronised).await;
}
