//! The budget table `stormglass check-budget` reads (each edge's timeout, attempts and
//! backoff, and which calls a service makes one after another): its rules on its own and
//! against observed traffic, and what the traffic shows of it, read from a query context
//! by the `queries/budget_*.sql` queries.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use datafusion::prelude::SessionContext;
use serde::Deserialize;
use serde_json::Value;

use crate::engine::{AnalysisError, register_table};
use crate::queries;
use crate::table::{Table, rows, run};

/// One declared edge.
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    pub caller: String,
    pub callee: String,
    pub timeout_ms: f64,
    pub attempts: u32,
    pub backoff_ms: f64,
}

impl Edge {
    /// The longest the edge can take: every attempt timing out, with the backoffs between
    /// them (the first before the first retry, doubling after).
    pub fn worst_ms(&self) -> f64 {
        crate::advice::worst_ms(self.attempts, self.timeout_ms, self.backoff_ms)
    }

    fn name(&self) -> String {
        format!("{} -> {}", self.caller, self.callee)
    }

    /// The worst case written out: `2 x 300 ms + 100 ms of backoff`.
    fn worst_terms(&self) -> String {
        let backoff = self.worst_ms() - f64::from(self.attempts) * self.timeout_ms;
        match (self.attempts, backoff > 0.0) {
            (1, _) => format!("{} ms", self.timeout_ms),
            (n, false) => format!("{n} x {} ms", self.timeout_ms),
            (n, true) => format!("{n} x {} ms + {backoff} ms of backoff", self.timeout_ms),
        }
    }
}

/// A budget file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Declared {
    pub edges: Vec<Edge>,
    /// Per service, the callees it calls one after another while serving one request.
    pub sequential: BTreeMap<String, Vec<String>>,
}

/// How bad a violation is: errors fail the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Warning,
    Error,
}

/// One thing wrong with the budgets, with its numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub level: Level,
    pub kind: &'static str,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            Level::Warning => "warning",
            Level::Error => "error",
        };
        write!(f, "{level} {}: {}", self.kind, self.message)
    }
}

/// The budget table of a parsed file, or every problem with its path.
pub fn parse(tree: &Value) -> Result<Declared, Vec<(String, String)>> {
    let mut errors = Vec::new();
    let mut declared = Declared::default();
    let Some(top) = tree.as_object() else {
        return Err(vec![(
            "(top)".into(),
            "expected a map with `edges` and `sequential`".into(),
        )]);
    };
    for key in top
        .keys()
        .filter(|k| !["edges", "sequential"].contains(&k.as_str()))
    {
        errors.push((
            key.clone(),
            "unknown key; expected edges, sequential".into(),
        ));
    }
    let mut seen = BTreeSet::new();
    match top.get("edges") {
        None => errors.push(("edges".into(), "missing: the declared edges".into())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let at = format!("edges[{i}]");
                let Some(edge) = parse_edge(item, &at, &mut errors) else {
                    continue;
                };
                if seen.insert((edge.caller.clone(), edge.callee.clone())) {
                    declared.edges.push(edge);
                } else {
                    errors.push((at, format!("{} is declared twice", edge.name())));
                }
            }
        }
        Some(_) => errors.push(("edges".into(), "expected a list of edges".into())),
    }
    match top.get("sequential") {
        None | Some(Value::Null) => {}
        Some(Value::Object(services)) => {
            for (service, callees) in services {
                let at = format!("sequential.{service}");
                let Some(list) = callees.as_array() else {
                    errors.push((at, "expected a list of callees".into()));
                    continue;
                };
                let mut names = Vec::new();
                for (i, callee) in list.iter().enumerate() {
                    match callee.as_str() {
                        Some(c) if seen.contains(&(service.clone(), c.to_owned())) => {
                            names.push(c.to_owned());
                        }
                        Some(c) => errors.push((
                            format!("{at}[{i}]"),
                            format!("no edge {service} -> {c} is declared"),
                        )),
                        None => errors.push((format!("{at}[{i}]"), "expected a service".into())),
                    }
                }
                declared.sequential.insert(service.clone(), names);
            }
        }
        Some(_) => errors.push((
            "sequential".into(),
            "expected a map of service: [callees]".into(),
        )),
    }
    if errors.is_empty() {
        Ok(declared)
    } else {
        Err(errors)
    }
}

fn parse_edge(item: &Value, at: &str, errors: &mut Vec<(String, String)>) -> Option<Edge> {
    let Some(map) = item.as_object() else {
        errors.push((
            at.into(),
            "expected {caller, callee, timeout[, attempts, backoff]}".into(),
        ));
        return None;
    };
    let before = errors.len();
    for key in map
        .keys()
        .filter(|k| !["caller", "callee", "timeout", "attempts", "backoff"].contains(&k.as_str()))
    {
        errors.push((
            format!("{at}.{key}"),
            "unknown key; expected caller, callee, timeout, attempts, backoff".into(),
        ));
    }
    let mut name = |key: &str| match map.get(key).and_then(Value::as_str) {
        Some(s) if !s.trim().is_empty() => s.trim().to_owned(),
        _ => {
            errors.push((format!("{at}.{key}"), "expected a service name".into()));
            String::new()
        }
    };
    let (caller, callee) = (name("caller"), name("callee"));
    let mut duration = |key: &str, required: bool| match map.get(key) {
        None if !required => Some(0.0),
        None => {
            errors.push((format!("{at}.{key}"), "missing; e.g. 300ms".into()));
            None
        }
        Some(Value::String(s)) => match humantime::parse_duration(s.trim()) {
            Ok(d) if !d.is_zero() || !required => Some(d.as_secs_f64() * 1e3),
            Ok(_) => {
                errors.push((format!("{at}.{key}"), "must be more than 0".into()));
                None
            }
            Err(e) => {
                errors.push((format!("{at}.{key}"), format!("{e} (found {s:?})")));
                None
            }
        },
        Some(other) => {
            errors.push((
                format!("{at}.{key}"),
                format!("expected a duration such as 300ms, found {other}"),
            ));
            None
        }
    };
    let timeout_ms = duration("timeout", true);
    let backoff_ms = duration("backoff", false);
    let attempts = match map.get("attempts") {
        None => Some(1),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n >= 1 => Some(n),
            _ => {
                errors.push((
                    format!("{at}.attempts"),
                    format!("expected a whole number of attempts from 1, found {v}"),
                ));
                None
            }
        },
    };
    if errors.len() > before {
        return None;
    }
    Some(Edge {
        caller,
        callee,
        timeout_ms: timeout_ms?,
        attempts: attempts?,
        backoff_ms: backoff_ms?,
    })
}

/// Each service's budget: the smallest timeout of the edges into it (none for an entry).
fn budgets(declared: &Declared) -> BTreeMap<&str, f64> {
    let mut out: BTreeMap<&str, f64> = BTreeMap::new();
    for e in &declared.edges {
        out.entry(&e.callee)
            .and_modify(|b| *b = b.min(e.timeout_ms))
            .or_insert(e.timeout_ms);
    }
    out
}

/// The declared edges by (caller, callee), the first entry of a pair: one lookup per
/// edge, not a scan of the table.
fn by_pair(declared: &Declared) -> BTreeMap<(&str, &str), &Edge> {
    let mut out = BTreeMap::new();
    for e in &declared.edges {
        out.entry((e.caller.as_str(), e.callee.as_str()))
            .or_insert(e);
    }
    out
}

/// The violations the table has on its own: an edge whose worst case exceeds its caller's
/// budget (inversion), a sequential list whose worst cases add up past it (overcommit).
pub fn check(declared: &Declared) -> Vec<Violation> {
    let budgets = budgets(declared);
    let edges = by_pair(declared);
    let mut found = Vec::new();
    for e in &declared.edges {
        if let Some(b) = budgets
            .get(e.caller.as_str())
            .filter(|b| e.worst_ms() > **b)
        {
            found.push(Violation {
                level: Level::Error,
                kind: "inversion",
                message: format!(
                    "{} can take {} ms ({}), more than {}'s budget of {b} ms",
                    e.name(),
                    e.worst_ms(),
                    e.worst_terms(),
                    e.caller
                ),
            });
        }
    }
    for (service, callees) in &declared.sequential {
        let Some(&b) = budgets.get(service.as_str()) else {
            continue;
        };
        let worst: Vec<f64> = callees
            .iter()
            .filter_map(|c| edges.get(&(service.as_str(), c.as_str())))
            .map(|e| e.worst_ms())
            .collect();
        let total: f64 = worst.iter().sum();
        if total > b {
            let terms: Vec<String> = worst.iter().map(|w| w.to_string()).collect();
            found.push(Violation {
                level: Level::Error,
                kind: "overcommit",
                message: format!(
                    "{service} calls {} one after another: {} = {total} ms, more than its budget of {b} ms",
                    callees.join(", "),
                    terms.join(" + "),
                ),
            });
        }
    }
    found
}

/// What the traffic showed of one (caller, callee): the most attempts per call, the
/// callee's P99.9, and the share of the callee's SERVER spans under this edge longer than
/// the declared timeout.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub caller: String,
    pub callee: String,
    pub max_attempts: u32,
    pub timeout_ms: Option<f64>,
    pub recommended_timeout_ms: Option<f64>,
    pub callee_p999_ms: Option<f64>,
    /// (served attempts, those longer than the declared timeout), for declared edges.
    pub served: Option<(f64, f64)>,
    /// The shortest median backoff of the pair's operations (ms), where its retries waited.
    pub backoff_median_ms: Option<f64>,
}

/// The violations of a table against traffic: a timeout below the callee's P99.9 (error,
/// with the share of calls it kills) or below P99.9 x `timeout_factor` (warning), more
/// attempts than declared (policy drift, error), retries waiting less than the declared
/// backoff (a median under half of it: warning), an edge in traffic not declared (warning).
pub fn against(declared: &Declared, observed: &[Observed], timeout_factor: f64) -> Vec<Violation> {
    let by_pair = by_pair(declared);
    let mut found = Vec::new();
    for o in observed {
        let name = format!("{} -> {}", o.caller, o.callee);
        let Some(e) = by_pair.get(&(o.caller.as_str(), o.callee.as_str())) else {
            found.push(Violation {
                level: Level::Warning,
                kind: "undeclared_edge",
                message: format!("{name} is in the traffic but not declared"),
            });
            continue;
        };
        if let Some(p999) = o.callee_p999_ms {
            let kills = o
                .served
                .filter(|(n, _)| *n > 0.0)
                .map(|(n, longer)| format!(" and kills {:.1}% of its calls", longer / n * 100.0))
                .unwrap_or_default();
            if e.timeout_ms < p999 {
                found.push(Violation {
                    level: Level::Error,
                    kind: "timeout_below_tail",
                    message: format!(
                        "{name}: the declared {} ms is below {}'s observed P99.9 of {p999:.0} ms{kills}",
                        e.timeout_ms, o.callee
                    ),
                });
            } else if e.timeout_ms < p999 * timeout_factor {
                found.push(Violation {
                    level: Level::Warning,
                    kind: "timeout_without_margin",
                    message: format!(
                        "{name}: the declared {} ms is below {}'s P99.9 of {p999:.0} ms x {timeout_factor} = {:.0} ms",
                        e.timeout_ms,
                        o.callee,
                        p999 * timeout_factor
                    ),
                });
            }
        }
        if o.max_attempts > e.attempts {
            found.push(Violation {
                level: Level::Error,
                kind: "policy_drift",
                message: format!(
                    "{name} made up to {} attempts per call; {} declared",
                    o.max_attempts, e.attempts
                ),
            });
        }
        if let Some(median) = o.backoff_median_ms
            && e.backoff_ms > 0.0
            && median < e.backoff_ms / 2.0
        {
            found.push(Violation {
                level: Level::Warning,
                kind: "backoff_below_declared",
                message: format!(
                    "{name}: retries waited a median {median:.0} ms; {} ms of backoff declared",
                    e.backoff_ms
                ),
            });
        }
    }
    found
}

/// One row of `p_sequences` (`partial_sequences.sql`): requests of `caller` that called the
/// callees of `sequence` one after another.
#[derive(Debug, Deserialize)]
pub struct SequenceRow {
    pub caller: String,
    pub sequence: Vec<String>,
    pub n: f64,
}

/// Per calling service, the sequence of callees most of its requests called one after
/// another (the first in order of equals), from a window's rows of `p_sequences` (one per
/// interval or chunk that saw it).
pub fn sequential(rows: Vec<SequenceRow>) -> BTreeMap<String, Vec<String>> {
    let mut made: BTreeMap<(String, Vec<String>), f64> = BTreeMap::new();
    for row in rows {
        *made.entry((row.caller, row.sequence)).or_default() += row.n;
    }
    let mut most: BTreeMap<String, (f64, Vec<String>)> = BTreeMap::new();
    for ((caller, sequence), n) in made {
        let best = most.entry(caller).or_insert((0.0, Vec::new()));
        if n > best.0 {
            *best = (n, sequence);
        }
    }
    most.into_iter()
        .map(|(caller, (_, sequence))| (caller, sequence))
        .collect()
}

/// What the traffic of `ctx` (an [`crate::engine::Engine::query_context`]) shows of each of
/// its (caller, callee) pairs, with, for the declared ones, the served attempts longer than
/// the declared timeout.
pub async fn observed(
    ctx: &SessionContext,
    declared: &Declared,
) -> Result<Vec<Observed>, AnalysisError> {
    #[derive(Deserialize)]
    struct EdgeRow {
        caller: String,
        callee: String,
        max_attempt: Option<i64>,
        timeout_ms: Option<f64>,
        recommended_timeout_ms: Option<f64>,
        callee_p999_ms: Option<f64>,
        backoff_median_ms: Option<f64>,
    }
    #[derive(Deserialize)]
    struct Served {
        caller: String,
        callee: String,
        n: Option<f64>,
        longer: Option<f64>,
    }
    let edges: Vec<EdgeRow> = rows(&run(ctx, &queries::BUDGET_EDGES).await?);
    register_table(ctx, "declared", declared_table(declared))?;
    let served: BTreeMap<(String, String), (f64, f64)> =
        rows::<Served>(&run(ctx, &queries::BUDGET_SERVED).await?)
            .into_iter()
            .filter_map(|s| Some(((s.caller, s.callee), (s.n?, s.longer.unwrap_or(0.0)))))
            .collect();
    Ok(edges
        .into_iter()
        .map(|r| Observed {
            served: served.get(&(r.caller.clone(), r.callee.clone())).copied(),
            caller: r.caller,
            callee: r.callee,
            max_attempts: u32::try_from(r.max_attempt.unwrap_or(0).max(0) + 1).unwrap_or(u32::MAX),
            timeout_ms: r.timeout_ms,
            recommended_timeout_ms: r.recommended_timeout_ms,
            callee_p999_ms: r.callee_p999_ms,
            backoff_median_ms: r.backoff_median_ms,
        })
        .collect())
}

/// The `declared` table `budget_served` joins: one row per declared pair.
fn declared_table(declared: &Declared) -> Table {
    use arrow::array::{Float64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    let pairs = by_pair(declared);
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("caller", DataType::Utf8, false),
        Field::new("callee", DataType::Utf8, false),
        Field::new("timeout_ms", DataType::Float64, false),
    ]));
    let columns: Vec<arrow::array::ArrayRef> = vec![
        std::sync::Arc::new(StringArray::from_iter_values(pairs.keys().map(|k| k.0))),
        std::sync::Arc::new(StringArray::from_iter_values(pairs.keys().map(|k| k.1))),
        std::sync::Arc::new(Float64Array::from_iter_values(
            pairs.values().map(|e| e.timeout_ms),
        )),
    ];
    match RecordBatch::try_new(schema.clone(), columns) {
        Ok(batch) => Table {
            schema,
            batches: vec![batch],
        },
        Err(e) => unreachable!("three columns of one length match their schema: {e}"),
    }
}

/// Per service, the callees it most often calls one after another in the traffic of `ctx`
/// (see [`sequential`]).
pub async fn sequential_in(
    ctx: &SessionContext,
) -> Result<BTreeMap<String, Vec<String>>, AnalysisError> {
    Ok(sequential(rows(
        &crate::table::table(ctx, "p_sequences").await?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(yaml: &str) -> Result<Declared, Vec<(String, String)>> {
        parse(&serde_saphyr::from_str(yaml).unwrap())
    }

    const ISSUE: &str = "
edges:
  - {caller: gateway, callee: order, timeout: 800ms}
  - {caller: order, callee: inventory, timeout: 300ms}
  - {caller: order, callee: payment, timeout: 400ms}
  - {caller: order, callee: user, timeout: 100ms}
sequential:
  order: [inventory, payment, user]
";

    /// 300 + 400 + 100 in 800 passes; 500 + 400 in 800 is an overcommit.
    #[test]
    fn sequential_calls_must_fit_the_budget() {
        assert_eq!(check(&table(ISSUE).unwrap()), []);
        let over = table(
            &ISSUE
                .replace("timeout: 300ms", "timeout: 500ms")
                .replace("  - {caller: order, callee: user, timeout: 100ms}\n", "")
                .replace("[inventory, payment, user]", "[inventory, payment]"),
        )
        .unwrap();
        let found = check(&over);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].to_string(),
            "error overcommit: order calls inventory, payment one after another: 500 + 400 = 900 ms, more than its budget of 800 ms"
        );
    }

    /// Attempts and backoff make the worst case: 3 x 300 ms + 100 + 200 ms of backoff is
    /// 1200 ms, past order's 800 ms: an inversion.
    #[test]
    fn retries_and_backoff_count_in_the_worst_case() {
        let t = table(&ISSUE.replace(
            "{caller: order, callee: inventory, timeout: 300ms}",
            "{caller: order, callee: inventory, timeout: 300ms, attempts: 3, backoff: 100ms}",
        ))
        .unwrap();
        let inventory = &t.edges[1];
        assert_eq!(inventory.worst_ms(), 1200.0);
        let kinds: Vec<_> = check(&t).iter().map(|v| v.kind).collect();
        assert_eq!(kinds, ["inversion", "overcommit"]);
        assert!(
            check(&t)[0]
                .message
                .contains("3 x 300 ms + 300 ms of backoff")
        );
    }

    /// Every problem at once, each with its path.
    #[test]
    fn every_problem_with_its_path() {
        let errors = table(
            "
edges:
  - {caller: a, callee: b, timeout: soon}
  - {caller: a, timeout: 100ms, attempts: 0, retries: 2}
  - {caller: a, callee: b, timeout: 100ms}
  - {caller: a, callee: b, timeout: 100ms}
sequential:
  a: [b, c]
extra: 1
",
        )
        .unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "extra",
                "edges[0].timeout",
                "edges[1].retries",
                "edges[1].callee",
                "edges[1].attempts",
                "edges[3]",
                "sequential.a[1]"
            ],
            "{errors:?}"
        );
    }

    /// Traffic: a timeout under the callee's P99.9 is an error saying what it kills; one
    /// without margin a warning; more attempts than declared an error; an undeclared edge a
    /// warning; retries waiting a median 20 ms where 100 ms of backoff is declared a
    /// warning.
    #[test]
    fn against_traffic() {
        let t = table(&ISSUE.replace(
            "{caller: gateway, callee: order, timeout: 800ms}",
            "{caller: gateway, callee: order, timeout: 800ms, attempts: 2, backoff: 100ms}",
        ))
        .unwrap();
        let seen = |caller: &str, callee: &str, attempts: u32, p999: f64| Observed {
            caller: caller.into(),
            callee: callee.into(),
            max_attempts: attempts,
            timeout_ms: None,
            recommended_timeout_ms: None,
            callee_p999_ms: Some(p999),
            served: Some((20.0, 5.0)),
            backoff_median_ms: None,
        };
        let found = against(
            &t,
            &[
                seen("order", "user", 1, 180.0),
                seen("order", "payment", 1, 300.0),
                seen("order", "inventory", 3, 100.0),
                seen("order", "audit", 1, 10.0),
                Observed {
                    backoff_median_ms: Some(20.0),
                    ..seen("gateway", "order", 2, 100.0)
                },
            ],
            1.5,
        );
        let lines: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "error timeout_below_tail: order -> user: the declared 100 ms is below user's observed P99.9 of 180 ms and kills 25.0% of its calls",
                "warning timeout_without_margin: order -> payment: the declared 400 ms is below payment's P99.9 of 300 ms x 1.5 = 450 ms",
                "error policy_drift: order -> inventory made up to 3 attempts per call; 1 declared",
                "warning undeclared_edge: order -> audit is in the traffic but not declared",
                "warning backoff_below_declared: gateway -> order: retries waited a median 20 ms; 100 ms of backoff declared",
            ]
        );
    }
}
