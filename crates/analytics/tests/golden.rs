//! Golden results of every query on the fixtures: each table every query produces is
//! rendered record by record, one `column=value` line per field prefixed by the record's
//! key (floats to six significant digits; `null` where there is no value), the records
//! sorted so plan order cannot matter, and compared with tests/golden/<fixture>/<table>.txt.
//! A changed figure shows in a diff as one line naming its record and column.
//!
//! After an intended change, regenerate with
//! `STORMGLASS_BLESS=1 cargo nextest run --workspace -E 'binary(golden)'`
//! and review the diff like code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stormglass_testkit::fixtures;

use std::path::PathBuf;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
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
    // A fixed secret: the idempotency key hashes read the same on every run.
    let conventions = Conventions::default().with_key_secret([0x5a; 16]);
    let (batch, _) = encode_request(&conventions, &spans.request());
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
        let rendered = records(&batches);
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

/// The batches' rows, sorted (by their whole rendering, so plan order cannot matter), each
/// a block of one line per field named by the record's key (its leading string and id
/// columns, at most three): `caller=a  callee=b  operation=op | retry_ratio=0.5`. A figure
/// that moves is one line of the diff, saying whose. An empty table is one line saying so.
fn records(batches: &[RecordBatch]) -> String {
    let mut rows: Vec<Vec<(String, bool)>> = Vec::new();
    for batch in batches {
        let schema = batch.schema();
        let options = FormatOptions::default().with_null("null");
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for row in 0..batch.num_rows() {
            let cells = schema
                .fields()
                .iter()
                .zip(batch.columns())
                .zip(&formatters)
                .map(|((field, column), formatter)| {
                    let value = match column.data_type() {
                        DataType::Float64 if column.is_valid(row) => {
                            significant(column.as_primitive::<Float64Type>().value(row))
                        }
                        _ => formatter.value(row).to_string(),
                    };
                    let key = matches!(
                        column.data_type(),
                        DataType::Utf8
                            | DataType::Utf8View
                            | DataType::Dictionary(..)
                            | DataType::FixedSizeBinary(_)
                            | DataType::Binary
                    );
                    (format!("{}={value}", field.name()), key)
                })
                .collect();
            rows.push(cells);
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
