//! Advice: each edge's timeout, attempts, backoff and retry budget sized from a window's
//! traffic, and each layer's amplification under them. The rules, as docs/advice.md
//! states them:
//!
//! * **timeout**: the P99.9 of the operation the timeout guards (`callee_p999_ms`) x
//!   `advice.timeout_factor`, in whole milliseconds; where no SERVER span measured it, the
//!   timeout observed. It must fit what the caller has: its own budget, as `check-budget`
//!   reads the budget table, is the shortest of its callers' timeouts (each caller's
//!   longest over its operations; none for an entry service). A timeout that does not fit
//!   is cut to it, with a `budget_too_small` finding naming the budget to raise.
//! * **attempts**: retries at one layer of any path, the deepest: an edge retries (3
//!   attempts) only when its callee calls no one (a retry there repeats one call, not a
//!   subtree of calls that may retry themselves), it is safe (no unsafe retries or timeout
//!   retries on writes seen, and every write it carries has an idempotency key: a write
//!   never retried so far is not safe to retry for that) and retries help (they succeeded at least half of the time,
//!   where any were made). Every other edge makes 1 attempt. Attempts are then lowered
//!   until the worst case (every attempt timing out, with the backoffs) fits the caller's
//!   budget; where retries that saved calls are lowered so, a `budget_too_small` finding
//!   names the budget that would keep them.
//! * **backoff**: exponential (x2) with full jitter, from the callee's median duration
//!   (at least `advice.min_backoff_ms`) up to the timeout.
//! * **retry budget**: a retrying edge's retries at most `retry_budget_ratio` of its calls:
//!   twice the share of successful calls that needed a retry in the window, between 5% and
//!   20% (Envoy's and Linkerd's default); `retry_budget_min_per_second`, the floor that lets
//!   a quiet edge retry at all, the ratio's allowance at the observed call rate (at least 1).
//!   An edge that does not retry has a budget of 0.
//! * **amplification under the advice**: with one retrying layer per path and its retries
//!   capped by the budget, a layer receives at most 1 + the most retries per call a
//!   retrying edge into it is allowed: its ratio plus its floor over its calls per second
//!   with no retry above it (Linkerd adds the floor to the ratio), at most its retries.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use serde::Serialize;

use crate::engine::Params;
use crate::policy::RateBudget;
use crate::report::{EdgeFigures, Listing, Report};

/// Attempts an edge that retries is advised.
pub const MAX_ATTEMPTS: u32 = 3;
/// The retry budget ratio's bounds.
pub const MIN_BUDGET_RATIO: f64 = 0.05;
pub const MAX_BUDGET_RATIO: f64 = 0.2;

/// What the advice assumes (`advice.*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdviceParams {
    pub timeout_factor: f64,
    pub min_backoff_ms: f64,
    /// No timeout is advised below this: the P99.9 of calls taking a few milliseconds is
    /// one window's sample, and the caller's own scheduling delays and pauses exceed it.
    pub min_timeout_ms: f64,
}

impl From<&Params> for AdviceParams {
    fn from(p: &Params) -> Self {
        AdviceParams {
            timeout_factor: p.timeout_factor,
            min_backoff_ms: p.min_backoff_ms,
            min_timeout_ms: p.min_timeout_ms,
        }
    }
}

/// Exponential backoff with full jitter.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Backoff {
    pub initial_ms: f64,
    pub max_ms: f64,
    pub multiplier: f64,
    /// `full`: each wait is uniform between 0 and the exponential value.
    pub jitter: &'static str,
}

/// One edge's advised settings and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EdgeAdvice {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    /// Per attempt; null where neither a P99.9 nor a timeout was observed.
    pub timeout_ms: Option<f64>,
    /// Where the timeout comes from: `p999` (x the factor), `observed`, or `budget` (cut
    /// to the caller's budget).
    pub timeout_source: Option<&'static str>,
    pub max_attempts: u32,
    /// Why this edge retries or not.
    pub attempts_reason: String,
    pub backoff: Backoff,
    pub retry_budget_ratio: f64,
    pub retry_budget_min_per_second: f64,
    /// The findings on this edge the advice answers.
    pub reasons: Vec<String>,
}

/// One layer's amplification, observed and under the advice (at most).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerAdvice {
    pub service: String,
    pub amplification: Option<f64>,
    pub amplification_advised: f64,
}

/// A budget the advice cannot fit in, and what to raise.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdviceFinding {
    pub kind: &'static str,
    pub caller: String,
    pub callee: String,
    pub operation: String,
    pub message: String,
}

/// The advice for a window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Advice {
    pub edges: Vec<EdgeAdvice>,
    pub layers: Vec<LayerAdvice>,
    pub findings: Vec<AdviceFinding>,
    /// Per calling service, the callees its requests call one after another, whose
    /// timeouts, attempts and backoffs were fitted into its budget together.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sequential: BTreeMap<String, Vec<String>>,
    /// What a selection ([`Advice::listed`]) lists; absent from the whole advice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listing: Option<Listing>,
}

impl Advice {
    /// The advice for the edges and layers `selected` lists (a selection of the report it
    /// was made from, [`Report::select`]), with its listing; findings of the listed edges.
    pub fn listed(&self, selected: &Report) -> Advice {
        let edges: HashSet<(&str, &str, &str)> = selected
            .edges
            .iter()
            .map(|e| (e.caller.as_str(), e.callee.as_str(), e.operation.as_str()))
            .collect();
        let layers: HashSet<&str> = selected.layers.iter().map(|l| l.service.as_str()).collect();
        let listed = |c: &str, d: &str, o: &str| edges.contains(&(c, d, o));
        Advice {
            edges: self
                .edges
                .iter()
                .filter(|e| listed(&e.caller, &e.callee, &e.operation))
                .cloned()
                .collect(),
            layers: self
                .layers
                .iter()
                .filter(|l| layers.contains(l.service.as_str()))
                .cloned()
                .collect(),
            findings: self
                .findings
                .iter()
                .filter(|f| listed(&f.caller, &f.callee, &f.operation))
                .cloned()
                .collect(),
            sequential: self
                .sequential
                .iter()
                .filter(|(service, _)| layers.contains(service.as_str()))
                .map(|(s, callees)| (s.clone(), callees.clone()))
                .collect(),
            listing: selected.listing.clone(),
        }
    }
}

/// The longest an edge can take: every attempt timing out, with the backoffs between them
/// (the first before the first retry, doubling after). `check-budget` reads a budget
/// table's edges by the same rule.
pub fn worst_ms(attempts: u32, timeout_ms: f64, backoff_ms: f64) -> f64 {
    let retries = attempts.saturating_sub(1);
    f64::from(attempts) * timeout_ms + backoff_ms * (2f64.powi(retries as i32) - 1.0)
}

/// A `budget_too_small` finding on `e`.
fn budget_too_small(e: &EdgeFigures, message: String) -> AdviceFinding {
    AdviceFinding {
        kind: "budget_too_small",
        caller: e.caller.clone(),
        callee: e.callee.clone(),
        operation: e.operation.clone(),
        message,
    }
}

/// Fit the calls `service` makes one after another (`sequence`, its callees in order) into
/// its budget `have`: their worst cases (each callee's longest advised edge) summed must fit
/// it, as `check-budget` checks a budget table's `sequential` calls. Retries go first, the
/// edge with the longest worst case first; what still does not fit gets a
/// `budget_too_small` finding naming the budget to raise.
fn fit_sequence(
    service: &str,
    sequence: &[String],
    have: f64,
    drafts: &mut [(&EdgeFigures, EdgeAdvice)],
    findings: &mut Vec<AdviceFinding>,
) {
    let worst = |a: &EdgeAdvice| {
        a.timeout_ms
            .map_or(0.0, |t| worst_ms(a.max_attempts, t, a.backoff.initial_ms))
    };
    let callees: HashSet<&str> = sequence.iter().map(String::as_str).collect();
    let in_sequence = |a: &EdgeAdvice| callees.contains(a.callee.as_str());
    let mut cut = vec![false; drafts.len()];
    loop {
        // Each callee's worst case: its longest advised edge, one pass over the drafts.
        let mut by_callee: HashMap<&str, f64> = HashMap::new();
        for (_, a) in drafts.iter().filter(|(_, a)| in_sequence(a)) {
            let w = by_callee.entry(a.callee.as_str()).or_insert(0.0);
            *w = w.max(worst(a));
        }
        let steps: Vec<f64> = (sequence.iter())
            .map(|c| by_callee.get(c.as_str()).copied().unwrap_or(0.0))
            .collect();
        let sum: f64 = steps.iter().sum();
        if sum <= have {
            break;
        }
        let longest = (drafts.iter().enumerate())
            .filter(|(_, (_, a))| in_sequence(a) && a.max_attempts > 1 && a.timeout_ms.is_some())
            .max_by(|(_, (_, a)), (_, (_, b))| worst(a).total_cmp(&worst(b)))
            .map(|(i, _)| i);
        if let Some(i) = longest {
            drafts[i].1.max_attempts -= 1;
            cut[i] = true;
            continue;
        }
        let Some((first, _)) = drafts.iter().find(|(_, a)| a.callee == sequence[0]) else {
            break;
        };
        let terms: Vec<String> = steps.iter().map(|w| format!("{}", w.ceil())).collect();
        findings.push(budget_too_small(
            first,
            format!(
                "{service} calls {} one after another: their timeouts take {} = {} ms at \
                 worst, more than the {have} ms {service} has (the shortest timeout its callers \
                 are advised): raise the timeouts of the calls to {service} to at least {} ms, \
                 or make these calls in parallel",
                sequence.join(", "),
                terms.join(" + "),
                sum.ceil(),
                sum.ceil()
            ),
        ));
        break;
    }
    for ((_, a), cut) in drafts.iter_mut().zip(cut) {
        if cut {
            a.attempts_reason = format!(
                "{}; {} attempt(s) so that {service}'s calls to {} one after another fit its \
                 {have} ms",
                a.attempts_reason,
                a.max_attempts,
                sequence.join(", ")
            );
        }
    }
}

/// Services in the order budgets flow: callers before their callees (Kahn's order from the
/// services nobody calls); services on a cycle follow, in name order.
fn top_down(edges: &[EdgeFigures]) -> Vec<&str> {
    let mut callees: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut callers: BTreeMap<&str, usize> = BTreeMap::new();
    for e in edges {
        callers.entry(&e.caller).or_default();
        if e.caller != e.callee && callees.entry(&e.caller).or_default().insert(&e.callee) {
            *callers.entry(&e.callee).or_default() += 1;
        }
    }
    let mut ready: VecDeque<&str> = callers
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(s, _)| *s)
        .collect();
    let mut order = Vec::new();
    let mut placed = BTreeSet::new();
    while let Some(s) = ready.pop_front() {
        order.push(s);
        placed.insert(s);
        for c in callees.get(s).into_iter().flatten() {
            if let Some(n) = callers.get_mut(c) {
                *n -= 1;
                if *n == 0 {
                    ready.push_back(c);
                }
            }
        }
    }
    order.extend(callers.keys().filter(|s| !placed.contains(*s)));
    order
}

fn ceil_ms(ms: f64) -> f64 {
    ms.ceil().max(1.0)
}

/// The findings of an edge's figures the advice answers.
fn reasons(e: &EdgeFigures, retries_below: bool, callee_amplification: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    if e.timeout_below_tail == Some(true) {
        out.push(format!(
            "timeout_below_tail: the timeout ({:.1} ms) is below the operation's P99.9 \
             ({:.1} ms)",
            e.timeout_ms.unwrap_or_default(),
            e.callee_p999_ms.unwrap_or_default()
        ));
    }
    if e.timeout_without_margin == Some(true) {
        out.push(format!(
            "timeout_without_margin: the timeout ({:.1} ms) is above the P99.9 ({:.1} ms) \
             but below it x advice.timeout_factor",
            e.timeout_ms.unwrap_or_default(),
            e.callee_p999_ms.unwrap_or_default()
        ));
    }
    if e.timeout_too_long == Some(true) {
        out.push(format!(
            "timeout_too_long: the timeout ({:.1} ms) is over 10 times the recommended one",
            e.timeout_ms.unwrap_or_default()
        ));
    }
    if retries_below && e.max_attempt.is_some_and(|m| m > 0) {
        out.push(format!(
            "multi_layer_retry: {} retries here although {} calls further, so each retry repeats \
             calls that may retry themselves",
            e.caller, e.callee
        ));
    }
    if e.max_attempt
        .is_some_and(|m| m + 1 > i64::from(MAX_ATTEMPTS))
    {
        out.push(format!(
            "too_many_attempts: up to {} attempts per call",
            e.max_attempt.unwrap_or_default() + 1
        ));
    }
    if let Some(a) = callee_amplification.filter(|a| *a > 2.0) {
        out.push(format!(
            "retry_amplification: {} receives {a:.1}x its calls",
            e.callee
        ));
    }
    for (count, kind) in [
        (e.unsafe_retries, "unsafe_retry"),
        (e.timeout_retries_on_writes, "timeout_retry_on_write"),
        (e.immediate_retries, "immediate_retry"),
        (e.non_retryable_retries, "non_retryable_retry"),
        (e.out_of_budget_retries, "out_of_budget_retry"),
    ] {
        if count > 0 {
            out.push(format!("{kind}: {count} in the window"));
        }
    }
    out
}

/// The advice for `report`'s window (its edges: use a whole report, not a selection).
pub fn advise(report: &Report, params: &AdviceParams) -> Advice {
    let calls_out: BTreeSet<&str> = report
        .edges
        .iter()
        .filter(|e| e.caller != e.callee)
        .map(|e| e.caller.as_str())
        .collect();
    let amplification: BTreeMap<&str, Option<f64>> = report
        .layers
        .iter()
        .map(|l| (l.service.as_str(), l.amplification))
        .collect();
    // Edges carrying writes without an idempotency key (by pair, not a scan per edge).
    let unkeyed_writes: HashSet<(&str, &str, &str)> = report
        .coverage
        .edges
        .iter()
        .filter(|c| c.shares.idempotency_key.is_some_and(|share| share < 1.0))
        .map(|c| (c.caller.as_str(), c.callee.as_str(), c.operation.as_str()))
        .collect();
    let window_seconds = report.window.seconds.filter(|s| *s > 0.0);
    let mut by_caller: BTreeMap<&str, Vec<&EdgeFigures>> = BTreeMap::new();
    for e in &report.edges {
        by_caller.entry(&e.caller).or_default().push(e);
    }
    // A service's budget as `check-budget` reads the budget table the advice writes: per
    // calling service its longest advised timeout (the table's entry for the pair), and
    // the shortest of those over its callers (static timeouts serve every caller's calls).
    let mut into: HashMap<String, BTreeMap<String, f64>> = HashMap::new();
    // Per callee, the most retries per call a retrying edge into it is allowed.
    let mut bound: HashMap<&str, f64> = HashMap::new();
    let mut advice = Advice {
        sequential: report.sequential_calls.clone(),
        ..Advice::default()
    };
    let mut drafts: Vec<(&EdgeFigures, EdgeAdvice)> = Vec::new();
    for service in top_down(&report.edges) {
        let budget =
            (into.get(service)).and_then(|callers| callers.values().copied().reduce(f64::min));
        for e in by_caller.get(service).into_iter().flatten() {
            let leaf = !calls_out.contains(e.callee.as_str());
            let (mut timeout, mut source) = match (e.callee_p999_ms, e.timeout_ms) {
                (Some(p999), _) => (
                    Some(ceil_ms(p999 * params.timeout_factor).max(params.min_timeout_ms)),
                    Some("p999"),
                ),
                (None, Some(t)) => (Some(t), Some("observed")),
                (None, None) => (None, None),
            };
            let unsafe_seen = e.unsafe_retries > 0 || e.timeout_retries_on_writes > 0;
            let unkeyed = unkeyed_writes.contains(&(
                e.caller.as_str(),
                e.callee.as_str(),
                e.operation.as_str(),
            ));
            let helps = e.retry_success_rate.is_none_or(|r| r >= 0.5);
            let (mut attempts, mut reason) = if !leaf {
                (
                    1,
                    format!(
                        "{} calls further: retries belong to the deepest layer of each path",
                        e.callee
                    ),
                )
            } else if unsafe_seen {
                (
                    1,
                    "unsafe retries seen: retry only once the writes carry an idempotency key"
                        .to_owned(),
                )
            } else if unkeyed {
                (
                    1,
                    "writes sent without an idempotency key: a retry could apply one twice"
                        .to_owned(),
                )
            } else if !helps {
                (
                    1,
                    format!(
                        "retries succeeded {:.0}% of the time: they add load, not availability",
                        e.retry_success_rate.unwrap_or_default() * 100.0
                    ),
                )
            } else {
                (
                    MAX_ATTEMPTS,
                    format!(
                        "{} calls no one: the deepest layer of its paths retries",
                        e.callee
                    ),
                )
            };
            let initial = ceil_ms(
                e.callee_median_ms
                    .unwrap_or(params.min_backoff_ms)
                    .max(params.min_backoff_ms),
            );
            if let (Some(t), Some(have)) = (timeout, budget) {
                if t > have {
                    advice.findings.push(budget_too_small(
                        e,
                        format!(
                            "{} has {have} ms (the shortest timeout its callers are advised) for \
                             {} {}, whose P99.9 x {} is {t} ms: raise the timeouts of the calls \
                             to {} to at least {t} ms, or make {} faster",
                            e.caller,
                            e.callee,
                            e.operation,
                            params.timeout_factor,
                            e.caller,
                            e.callee
                        ),
                    ));
                    timeout = Some(have);
                    source = Some("budget");
                }
                let t = timeout.unwrap_or(have);
                let wanted = attempts;
                while attempts > 1 && worst_ms(attempts, t, initial) > have {
                    attempts -= 1;
                }
                if attempts < wanted {
                    reason = format!(
                        "{reason}; {attempts} attempt(s) so that every attempt timing out fits \
                         {}'s {have} ms",
                        e.caller
                    );
                    // Retries that saved calls and no longer fit: say which budget to raise
                    // to keep them, as for a timeout that does not fit.
                    let saved = e.retry_contribution.unwrap_or(0.0);
                    if saved > 0.0 {
                        let need = worst_ms(wanted, t, initial).ceil();
                        advice.findings.push(budget_too_small(
                            e,
                            format!(
                                "{} has {have} ms for {} {}, too little to retry it: \
                                 {wanted} attempts of {t} ms with their backoff take {need} ms, \
                                 and its retries saved {:.1}% of its successful calls. Raise the \
                                 timeouts of the calls to {} to at least {need} ms, or expect \
                                 those calls to fail",
                                e.caller,
                                e.callee,
                                e.operation,
                                saved * 100.0,
                                e.caller
                            ),
                        ));
                    }
                }
            }
            if let Some(t) = timeout {
                let pair = (into.entry(e.callee.clone()).or_default())
                    .entry(e.caller.clone())
                    .or_insert(t);
                *pair = pair.max(t);
            }
            drafts.push((
                *e,
                EdgeAdvice {
                    caller: e.caller.clone(),
                    callee: e.callee.clone(),
                    operation: e.operation.clone(),
                    timeout_ms: timeout,
                    timeout_source: source,
                    max_attempts: attempts,
                    attempts_reason: reason,
                    backoff: Backoff {
                        initial_ms: initial,
                        max_ms: timeout.unwrap_or(initial).max(initial),
                        multiplier: 2.0,
                        jitter: "full",
                    },
                    retry_budget_ratio: 0.0,
                    retry_budget_min_per_second: 0.0,
                    reasons: reasons(
                        e,
                        !leaf,
                        amplification.get(e.callee.as_str()).copied().flatten(),
                    ),
                },
            ));
        }
        if let (Some(sequence), Some(have)) = (report.sequential_calls.get(service), budget) {
            fit_sequence(service, sequence, have, &mut drafts, &mut advice.findings);
        }
        for (e, mut a) in drafts.drain(..) {
            if a.max_attempts > 1 {
                let ratio = (2.0 * e.retry_contribution.unwrap_or(0.0))
                    .clamp(MIN_BUDGET_RATIO, MAX_BUDGET_RATIO);
                let ratio = (ratio * 100.0).round() / 100.0;
                let rate = window_seconds.map_or(0.0, |s| e.logical_calls as f64 / s);
                let floor = (ratio * rate).ceil().max(1.0);
                // Under the advice no layer above retries: the edge carries its calls
                // with no retry, and the floor's retries come on top of the ratio's
                // (Linkerd's budget).
                let upstream = amplification
                    .get(e.caller.as_str())
                    .copied()
                    .flatten()
                    .unwrap_or(1.0)
                    .max(1.0);
                let per_call = RateBudget { ratio, floor }.per_call(
                    window_seconds
                        .filter(|_| e.logical_calls > 0)
                        .map(|s| e.logical_calls as f64 / upstream / s),
                );
                let b = bound.entry(e.callee.as_str()).or_default();
                *b = b.max(per_call.min(f64::from(a.max_attempts - 1)));
                a.retry_budget_ratio = ratio;
                a.retry_budget_min_per_second = floor;
            }
            advice.edges.push(a);
        }
    }
    advice.edges.sort_by(|a, b| {
        (&a.caller, &a.callee, &a.operation).cmp(&(&b.caller, &b.callee, &b.operation))
    });
    let layers = report
        .layers
        .iter()
        .map(|l| LayerAdvice {
            service: l.service.clone(),
            amplification: l.amplification,
            amplification_advised: 1.0 + bound.get(l.service.as_str()).copied().unwrap_or(0.0),
        })
        .collect();
    advice.layers = layers;
    advice
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget's floor adds its retries per second to the ratio's, spread over the calls
    /// a second the edge carries: 20% and 20/s at 100 calls/s allow 0.4 retries per call,
    /// at 400 calls/s 0.25; without calls the floor covers every retry, without a window
    /// length the ratio stands alone.
    #[test]
    fn a_budget_floor_spreads_over_the_calls() {
        let b = RateBudget {
            ratio: 0.2,
            floor: 20.0,
        };
        assert!((b.per_call(Some(100.0)) - 0.4).abs() < 1e-12);
        assert!((b.per_call(Some(400.0)) - 0.25).abs() < 1e-12);
        assert_eq!(b.per_call(Some(0.0)), f64::INFINITY);
        assert_eq!(b.per_call(None), 0.2);
    }

    /// The worst case adds every attempt's timeout and the doubling backoffs between them.
    #[test]
    fn worst_case_of_attempts_and_backoff() {
        assert_eq!(worst_ms(1, 300.0, 50.0), 300.0);
        assert_eq!(worst_ms(3, 100.0, 10.0), 300.0 + 10.0 + 20.0);
    }

    /// The advice's settings with `timeout_factor`, backoffs of at least 5 ms and timeouts
    /// of at least 50 ms.
    fn params(timeout_factor: f64) -> AdviceParams {
        AdviceParams {
            timeout_factor,
            min_backoff_ms: 5.0,
            min_timeout_ms: 50.0,
        }
    }

    fn edge(caller: &str, callee: &str, p999: f64) -> EdgeFigures {
        EdgeFigures {
            logical_calls: 600,
            attempts: 600,
            callee_p999_ms: Some(p999),
            callee_median_ms: Some(p999 / 10.0),
            ..EdgeFigures::named(caller, callee, "op")
        }
    }

    /// A service called by two callers has the shorter of their timeouts, as `check-budget`
    /// reads the budget table: a static timeout serves the calls made for either.
    #[test]
    fn the_shortest_caller_timeout_is_the_budget() {
        let params = params(1.5);
        let report = Report {
            edges: vec![
                edge("gateway", "order", 400.0),
                edge("admin", "order", 40.0),
                edge("order", "inventory", 100.0),
            ],
            ..Report::default()
        };
        let advice = advise(&report, &params);
        let inventory = advice
            .edges
            .iter()
            .find(|e| e.callee == "inventory")
            .unwrap();
        assert_eq!(
            (inventory.timeout_ms, inventory.timeout_source),
            (Some(60.0), Some("budget")),
            "{inventory:?}"
        );
        assert_eq!(advice.findings.len(), 1, "{:?}", advice.findings);
        assert!(
            advice.findings[0]
                .message
                .starts_with("order has 60 ms (the shortest timeout its callers are advised)"),
            "{:?}",
            advice.findings
        );
    }

    /// Calls made one after another fit their caller's budget together, as the budget
    /// table 800 = 300 + 400 + 100 does: their retries go first, the longest worst case
    /// first; when their timeouts alone take more, a finding names the sum.
    #[test]
    fn sequential_calls_fitted_together() {
        let params = params(2.0);
        let mut report = Report {
            edges: vec![
                edge("gateway", "order", 400.0),
                edge("order", "inventory", 150.0),
                edge("order", "payment", 200.0),
                edge("order", "user", 50.0),
            ],
            ..Report::default()
        };
        let sequence = ["inventory", "payment", "user"].map(String::from).to_vec();
        report
            .sequential_calls
            .insert("order".to_owned(), sequence.clone());
        let advice = advise(&report, &params);
        let by = |a: &Advice, callee: &str| {
            let e = a.edges.iter().find(|e| e.callee == callee).unwrap();
            (e.timeout_ms, e.max_attempts)
        };
        // Alone, inventory could try twice (615 ms) and user 3 times (315 ms) in 800 ms;
        // after one another, only the timeouts fit: 300 + 400 + 100.
        assert_eq!(by(&advice, "inventory"), (Some(300.0), 1));
        assert_eq!(by(&advice, "payment"), (Some(400.0), 1));
        assert_eq!(by(&advice, "user"), (Some(100.0), 1));
        assert!(advice.findings.is_empty(), "{:?}", advice.findings);
        let user = advice.edges.iter().find(|e| e.callee == "user").unwrap();
        assert!(
            user.attempts_reason.ends_with(
                "order's calls to inventory, payment, user one after another fit its 800 ms"
            ),
            "{}",
            user.attempts_reason
        );
        assert_eq!(advice.sequential["order"], sequence);
        // Apart, the same edges keep their retries.
        report.sequential_calls.clear();
        let apart = advise(&report, &params);
        assert_eq!(by(&apart, "inventory"), (Some(300.0), 2));
        assert_eq!(by(&apart, "user"), (Some(100.0), 3));
        // A slower user service: 300 + 400 + 200 cannot fit 800 ms.
        report.sequential_calls.insert("order".to_owned(), sequence);
        report.edges[3].callee_p999_ms = Some(100.0);
        let advice = advise(&report, &params);
        assert_eq!(advice.findings.len(), 1, "{:?}", advice.findings);
        assert_eq!(advice.findings[0].kind, "budget_too_small");
        assert_eq!(advice.findings[0].callee, "inventory");
        let message = &advice.findings[0].message;
        assert!(
            message.contains("300 + 400 + 200 = 900 ms") && message.contains("at least 900 ms"),
            "{message}"
        );
    }

    /// Only the deepest edge of a path retries; each timeout is its P99.9 x the factor; a
    /// retrying edge's attempts shrink until they fit the caller's budget (retries that
    /// saved calls then with a finding naming the budget that keeps them), and a timeout
    /// that cannot fit is cut, with the finding naming the budget to raise.
    #[test]
    fn one_retrying_layer_fitted_into_the_budgets() {
        let params = params(1.5);
        let mut report = Report::default();
        report.window.seconds = Some(60.0);
        report.edges = vec![
            edge("gateway", "order", 400.0),
            edge("order", "inventory", 100.0),
            edge("inventory", "db", 90.0),
        ];
        let advice = advise(&report, &params);
        let by = |callee: &str| advice.edges.iter().find(|e| e.callee == callee).unwrap();
        assert_eq!(by("order").timeout_ms, Some(600.0));
        assert_eq!(by("order").max_attempts, 1);
        assert_eq!(by("inventory").max_attempts, 1);
        // db: 135 ms per attempt from 9 ms of backoff: 3 attempts take up to 432 ms and 2 up
        // to 279, past inventory's 150 ms (its callers' timeout); 1 fits.
        let db = by("db");
        assert_eq!((db.timeout_ms, db.max_attempts), (Some(135.0), 1), "{db:?}");
        assert!(advice.findings.is_empty(), "{:?}", advice.findings);
        // Had its retries saved calls, the finding names the budget that would keep them.
        report.edges[2].retry_contribution = Some(0.04);
        let advice = advise(&report, &params);
        assert_eq!(advice.findings.len(), 1, "{:?}", advice.findings);
        let message = &advice.findings[0].message;
        assert!(
            message.contains("too little to retry") && message.contains("at least 432 ms"),
            "{message}"
        );
        report.edges[2].retry_contribution = None;
        // A slower database cannot fit inventory's 150 ms at all: cut, with a finding.
        report.edges[2].callee_p999_ms = Some(200.0);
        let advice = advise(&report, &params);
        let db = advice.edges.iter().find(|e| e.callee == "db").unwrap();
        assert_eq!(
            (db.timeout_ms, db.timeout_source),
            (Some(150.0), Some("budget"))
        );
        assert_eq!(advice.findings.len(), 1);
        assert_eq!(advice.findings[0].kind, "budget_too_small");
        // Given room, the deepest edge retries 3 times with a budget from its retry share.
        report.edges[0].callee_p999_ms = Some(2000.0);
        report.edges[1].callee_p999_ms = Some(1000.0);
        report.edges[2].retry_contribution = Some(0.04);
        let advice = advise(&report, &params);
        let db = advice.edges.iter().find(|e| e.callee == "db").unwrap();
        assert_eq!(db.max_attempts, MAX_ATTEMPTS, "{db:?}");
        assert_eq!(db.retry_budget_ratio, 0.08);
        // 600 calls in 60 s: 10 a second, 0.8 retries a second: a floor of 1.
        assert_eq!(db.retry_budget_min_per_second, 1.0);
        let layer = |s: &str| advice.layers.iter().find(|l| l.service == s);
        assert!(layer("db").is_none(), "no layers in this report");
        // Writes without a key, never retried so far, are still not advised retries.
        report.coverage.edges.push(crate::report::EdgeCoverage {
            caller: "inventory".into(),
            callee: "db".into(),
            operation: "op".into(),
            shares: serde_json::from_value(serde_json::json!({
                "attempts": 600, "attempt_number": 1.0, "cause": null, "deadline": null,
                "idempotency": null, "idempotency_key": 0.5, "server_spans": 1.0,
            }))
            .unwrap_or_else(|e| unreachable!("coverage shares: {e}")),
        });
        let advice = advise(&report, &params);
        let db = advice.edges.iter().find(|e| e.callee == "db").unwrap();
        assert_eq!(db.max_attempts, 1, "{db:?}");
        assert!(db.attempts_reason.contains("idempotency key"), "{db:?}");
    }
}
