//! What-if: each layer's expected amplification if every request to some services failed
//! with a given probability, from the retry policies a window's report observed.
//!
//! The model, exactly as docs/figures.md states it:
//! * a failed service's requests fail with probability `q = P`; another service's fail when
//!   one of its calls to a failing service fails on every attempt. Each of its requests
//!   makes `f_e` calls of edge `e` on average (the edge's logical calls over the service's
//!   requests; 1 for a caller without requests in the window), `k_e` of them always and one
//!   more on a share `r_e` of the requests (`f_e = k_e + r_e`):
//!   `q(s) = 1 - prod over its edges e (1 - p_e)^k_e (1 - r_e p_e)`, `p_e = q(callee)^m_e`
//!   the probability that a call fails, edges to services that do not fail adding nothing
//!   (at width a service calls many edges, each on a few of its requests);
//! * an edge whose callee fails with probability `q` sends `(1 - q^m) / (1 - q)` attempts per
//!   call on average (`m` when `q = 1`), `m` being the edge's attempts per call at most
//!   (its largest attempt number + 1);
//! * a layer's amplification is the product of the attempts per call along the path from an
//!   entry; where several paths reach it, their mean weighted by the calls each brings with
//!   no retry anywhere (an edge's logical calls over its caller's observed amplification;
//!   entry requests count with amplification 1);
//! * `requests_per_second` = the layer's no-retry attempts in the window per second x its
//!   amplification.
//!
//! A cycle in the call graph is cut where it closes, as the storm potential's walk does.
//!
//! Under a policy (`--policy`, [`Policy`]), an edge's `m` is the policy's attempts, and a
//! retry budget caps its retries per call as a budget does once the callee fails enough to
//! reach it, allowing `r` = its ratio + its floor over the calls per second the edge carries
//! under the failure (its no-retry calls per second x its caller's amplification): the expected retries per call `R = (1 - q^m) / (1 - q) - 1` become
//! `min(R, r)`, and a call fails when its first attempt fails and its retries (the share
//! `min(1, r / R)` the budget lets through) all fail too:
//! `q (1 - min(1, r / R) (1 - q^(m-1)))`. A budget that holds concurrent retries (an entry
//! with `min_retry_concurrency`: Envoy's and Istio's) allows, in a steady state where
//! retries last as long as first tries, `r = max(ratio / (1 - ratio), min / F)`: its
//! cluster's retries in flight are at most `ratio` of all its requests in flight (retries
//! included), or `min`, over the `F` first tries in flight to the cluster (the caller's
//! calls to the callee, every operation: each edge's calls per second x one try's timeout,
//! the entry's, else the edge's observed, else 1 s). Edges the policy does not name keep
//! what was observed. Each layer's `success_probability` is `1 - q` of its requests.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::policy::{Policy, PolicyEdge, RateBudget, Throttling};
use crate::report::{EdgeFigures, Listing, Report, Selection};

/// One layer's expected load if the failures happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerWhatIf {
    pub service: String,
    pub amplification: f64,
    /// The probability that a request to the layer succeeds (retries below included).
    pub success_probability: f64,
    /// Null when the window has no length (no spans).
    pub requests_per_second: Option<f64>,
}

/// One edge of the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EdgeWhatIf {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    /// The most attempts per call observed (largest attempt number + 1), or the policy's.
    pub max_attempts: u32,
    /// The policy's retry budget ratio, where it names a budget.
    pub retry_budget_ratio: Option<f64>,
    /// The retries per call the budget allows under the failure: its ratio plus its floor
    /// over the calls per second the edge then carries, or for a budget on retries in
    /// flight what its share or minimum allows (the share alone without a window length);
    /// null without a budget, or where the edge carries no calls.
    pub retry_budget_per_call: Option<f64>,
    /// The probability that a request to the callee fails.
    pub callee_failure_probability: f64,
    /// Expected attempts per call.
    pub attempts_per_call: f64,
}

/// The what-if of a report: every layer and edge, by name (or those [`WhatIf::listed`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WhatIf {
    pub layers: Vec<LayerWhatIf>,
    pub edges: Vec<EdgeWhatIf>,
    /// How many layers and edges there are and how many are listed.
    pub listing: Listing,
}

/// Which layers and edges [`WhatIf::listed`] keeps, and the order it lists them in.
pub const WHATIF_ORDER: &str = "the worst kept: layers by amplification, then failure \
    probability, then requests per second; edges by attempts per call, then the callee's \
    failure probability; listed by name";

impl WhatIf {
    /// The layers and edges `selection` selects, at most its limit of each: the worst
    /// ([`WHATIF_ORDER`]), each in its place; `listing` counts them.
    pub fn listed(mut self, selection: &Selection) -> WhatIf {
        let services = selection.services(&self.edges, |e| (&e.caller, &e.callee));
        let edges_selected = selection.keep_edges(
            &mut self.edges,
            |e| (&e.caller, &e.callee),
            |a, b| {
                (b.attempts_per_call.total_cmp(&a.attempts_per_call)).then(
                    b.callee_failure_probability
                        .total_cmp(&a.callee_failure_probability),
                )
            },
        );
        if let Some(services) = services {
            self.layers.retain(|l| services.contains(&l.service));
        }
        let layers_selected = self.layers.len();
        // Failure before traffic: where the policy leaves a layer's load as it was (one
        // attempt per call), the layers the failure reaches are the answer, not the busiest.
        crate::report::keep_worst(&mut self.layers, selection.limit, |a, b| {
            (b.amplification.total_cmp(&a.amplification))
                .then(a.success_probability.total_cmp(&b.success_probability))
                .then(
                    (b.requests_per_second.unwrap_or(0.0))
                        .total_cmp(&a.requests_per_second.unwrap_or(0.0)),
                )
        });
        self.listing = Listing::of(
            WHATIF_ORDER,
            (edges_selected, self.edges.len()),
            (layers_selected, self.layers.len()),
        );
        self
    }
}

/// Parse `SERVICE=P` (or `SERVICE:P`): a service and a probability in [0, 1].
pub fn parse_failure(text: &str) -> Result<(String, f64), String> {
    let (service, p) = text
        .rsplit_once(['=', ':'])
        .ok_or_else(|| format!("{text:?}: expected SERVICE=P, e.g. db=1 or db=0.5"))?;
    let p: f64 = p
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: {p:?} is not a probability"))?;
    if !(0.0..=1.0).contains(&p) || service.trim().is_empty() {
        return Err(format!(
            "{text:?}: expected a service and a probability from 0 to 1"
        ));
    }
    Ok((service.trim().to_owned(), p))
}

/// The first failed service the report has no layer for (a what-if about it says nothing).
pub fn unknown_service<'f>(report: &Report, failures: &'f [(String, f64)]) -> Option<&'f str> {
    failures
        .iter()
        .map(|(service, _)| service.as_str())
        .find(|s| !report.layers.iter().any(|l| l.service == *s))
}

/// Expected attempts per call of an edge with at most `m` attempts whose callee fails with
/// probability `q`.
pub fn attempts_per_call(q: f64, m: u32) -> f64 {
    if q >= 1.0 {
        f64::from(m)
    } else {
        (1.0 - q.powi(m as i32)) / (1.0 - q)
    }
}

/// Per edge its retry policy and its calls per request of its caller, and per service the
/// edges it calls (by index: one lookup per service, not a scan of every edge).
struct Model<'r> {
    retrying: Vec<Retrying>,
    per_request: Vec<f64>,
    calls: HashMap<&'r str, Vec<usize>>,
}

/// The share of a caller's requests that survive an edge whose calls fail with probability
/// `p`, `per_request` calls of it per request: `k` on every request and one more on a share
/// `r` of them.
fn survives(p: f64, per_request: f64) -> f64 {
    let k = per_request.trunc();
    (1.0 - p).powf(k) * (1.0 - (per_request - k) * p)
}

/// An edge's retry policy in the model: its attempts per call at most, the retry budget
/// ratio capping its retries, and gRPC's token bucket throttling them, if any.
#[derive(Clone, Copy)]
struct Retrying {
    max_attempts: u32,
    budget: Option<f64>,
    throttling: Option<Throttling>,
}

impl Retrying {
    fn of(e: &EdgeFigures, entry: Option<&PolicyEdge>) -> Retrying {
        match entry {
            Some(p) => Retrying {
                max_attempts: p.max_attempts.max(1),
                // Set by what_if from the policy's ratio and floor.
                budget: None,
                throttling: p.retry_throttling,
            },
            None => Retrying {
                max_attempts: u32::try_from(e.max_attempt.unwrap_or(0).max(0) + 1)
                    .unwrap_or(u32::MAX),
                budget: None,
                throttling: None,
            },
        }
    }

    /// The attempts a call may make when the callee fails with probability `q`. A token
    /// bucket loses 1 per failed attempt and gains `token_ratio` per success: where that
    /// drifts down (q > ratio / (1 + ratio)), it drains to half of `max_tokens` and stays
    /// under it, and no retry goes; otherwise it stays full and lets every retry through.
    fn attempts_allowed(self, q: f64) -> u32 {
        match self.throttling {
            Some(t) if (1.0 - q) * t.token_ratio < q => 1,
            _ => self.max_attempts,
        }
    }

    /// Expected attempts per call when the callee fails with probability `q`.
    fn attempts_per_call(self, q: f64) -> f64 {
        let unbounded = attempts_per_call(q, self.attempts_allowed(q));
        match self.budget {
            Some(r) => 1.0 + (unbounded - 1.0).min(r),
            None => unbounded,
        }
    }

    /// The probability that a call fails when the callee fails with probability `q`.
    fn call_fails(self, q: f64) -> f64 {
        let allowed = self.attempts_allowed(q);
        let m = i32::try_from(allowed).unwrap_or(i32::MAX);
        let retries = attempts_per_call(q, allowed) - 1.0;
        let let_through = match self.budget {
            Some(r) if retries > 0.0 => (r / retries).min(1.0),
            _ => 1.0,
        };
        q * (1.0 - let_through * (1.0 - q.powi(m - 1)))
    }
}

/// The what-if of `report` if requests to each named service failed with its probability,
/// under `policy` where given (else the policies observed).
///
/// A budget's floor allows `floor / calls per second` retries per call on top of its ratio,
/// and the calls per second an edge carries depend on how much its caller is amplified,
/// which depends on how the edges below retry: the model is solved again with each edge's
/// rate from the last solution until no budget moves, at most [`MAX_ROUNDS`] times (one
/// retrying layer per path, as advised, settles in two or three).
pub fn what_if(report: &Report, failures: &[(String, f64)], policy: Option<&Policy>) -> WhatIf {
    let failing: HashMap<&str, f64> = failures.iter().map(|(s, p)| (s.as_str(), *p)).collect();
    let mut calls: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, e) in report.edges.iter().enumerate() {
        calls.entry(e.caller.as_str()).or_default().push(i);
    }
    // Each edge's policy entry, looked up once.
    let entries: Vec<Option<&PolicyEdge>> = (report.edges.iter())
        .map(|e| policy.and_then(|p| p.edge(&e.caller, &e.callee, &e.operation)))
        .collect();
    let budgets: Vec<Option<Budget>> = entries.iter().map(|e| budget_of(*e)).collect();
    let requests: HashMap<&str, u64> = (report.layers.iter())
        .map(|l| (l.service.as_str(), l.requests))
        .collect();
    let mut model = Model {
        per_request: (report.edges.iter())
            .map(|e| match requests.get(e.caller.as_str()) {
                Some(&n) if n > 0 => e.logical_calls as f64 / n as f64,
                _ => 1.0,
            })
            .collect(),
        retrying: report
            .edges
            .iter()
            .zip(&entries)
            .map(|(e, entry)| Retrying::of(e, *entry))
            .collect(),
        calls,
    };
    let observed: HashMap<&str, f64> = report
        .layers
        .iter()
        .map(|l| (l.service.as_str(), l.amplification.unwrap_or(1.0).max(1.0)))
        .collect();
    // Each edge's calls with no retry anywhere: its logical calls over its caller's
    // observed amplification.
    let no_retry_calls: Vec<f64> = report
        .edges
        .iter()
        .map(|e| e.logical_calls as f64 / observed.get(e.caller.as_str()).unwrap_or(&1.0))
        .collect();
    let seconds = report.window.seconds.filter(|s| *s > 0.0);
    let floored = seconds.is_some() && budgets.iter().flatten().any(|b| b.has_floor());
    let concurrent = (budgets.iter().flatten()).any(|b| matches!(b, Budget::Concurrency { .. }));
    // How long each edge's tries last, where a budget holds retries in flight.
    let tries: Vec<f64> = if concurrent {
        (report.edges.iter().zip(&entries))
            .map(|(e, entry)| try_seconds(e, *entry))
            .collect()
    } else {
        Vec::new()
    };
    let mut solution = Solution::default();
    for round in 0..MAX_ROUNDS {
        // The first round takes every caller at its no-retry rate, the largest allowance.
        let mut moved = round == 0;
        // Each edge's calls per second under the failure; per caller and callee (Envoy's
        // cluster), the first tries in flight, each lasting its edge's try.
        let rates: Vec<Option<f64>> = (report.edges.iter().enumerate())
            .map(|(i, e)| {
                let upstream = (solution.amplification.get(e.caller.as_str()))
                    .copied()
                    .unwrap_or(1.0);
                seconds.map(|s| no_retry_calls[i] * upstream / s)
            })
            .collect();
        let mut in_flight: HashMap<(&str, &str), f64> = HashMap::new();
        for ((e, rate), try_s) in report.edges.iter().zip(&rates).zip(&tries) {
            *in_flight.entry((&e.caller, &e.callee)).or_default() += rate.unwrap_or(0.0) * try_s;
        }
        for (i, (e, budget)) in report.edges.iter().zip(&budgets).enumerate() {
            let Some(budget) = budget else { continue };
            let cluster = in_flight.get(&(e.caller.as_str(), e.callee.as_str()));
            let per_call = budget.per_call(rates[i], seconds.and(cluster.copied()));
            let before = model.retrying[i].budget;
            moved |= before.is_none_or(|b| (b - per_call).abs() > 1e-12 * b.abs().max(1.0));
            model.retrying[i].budget = Some(per_call);
        }
        if !moved {
            break;
        }
        solution = solve(report, &model, &failing, &no_retry_calls);
        if !floored {
            break;
        }
    }
    let Solution {
        q,
        amplification,
        attempts_per_call,
    } = solution;
    let edges: Vec<EdgeWhatIf> = report
        .edges
        .iter()
        .zip(&model.retrying)
        .zip(&budgets)
        .zip(attempts_per_call)
        .map(|(((e, r), budget), attempts_per_call)| EdgeWhatIf {
            caller: e.caller.clone(),
            callee: e.callee.clone(),
            operation: e.operation.clone(),
            max_attempts: r.max_attempts,
            retry_budget_ratio: budget.map(Budget::ratio),
            retry_budget_per_call: r.budget.filter(|b| b.is_finite()),
            callee_failure_probability: failing
                .get(e.callee.as_str())
                .or_else(|| q.get(e.callee.as_str()))
                .copied()
                .unwrap_or(0.0),
            attempts_per_call,
        })
        .collect();
    let layers: Vec<LayerWhatIf> = report
        .layers
        .iter()
        .map(|l| {
            let a = amplification
                .get(l.service.as_str())
                .copied()
                .unwrap_or(1.0);
            LayerWhatIf {
                service: l.service.clone(),
                amplification: a,
                success_probability: 1.0
                    - failing
                        .get(l.service.as_str())
                        .or_else(|| q.get(l.service.as_str()))
                        .copied()
                        .unwrap_or(0.0),
                requests_per_second: seconds.map(|s| l.baseline_attempts as f64 / s * a),
            }
        })
        .collect();
    WhatIf {
        layers,
        edges,
        listing: Listing::default(),
    }
    .listed(&Selection::default())
}

/// Rounds of [`what_if`] at most; each is linear in edges and layers.
const MAX_ROUNDS: usize = 64;

/// An edge's retry budget in the model: the policy's, negative halves read as 0.
fn budget_of(entry: Option<&PolicyEdge>) -> Option<Budget> {
    let entry = entry?;
    let b = entry.rate_budget()?;
    let ratio = b.ratio.max(0.0);
    Some(match entry.min_retry_concurrency {
        Some(min) => Budget::Concurrency {
            ratio,
            min: f64::from(min),
        },
        None => Budget::Rate(RateBudget {
            ratio,
            floor: b.floor.max(0.0),
        }),
    })
}

/// How long one try of `e` lasts in the model: the policy's per-try timeout, else the
/// timeout observed, else 1 s (the rule `advise` turns a floor into retries in flight by).
fn try_seconds(e: &EdgeFigures, entry: Option<&PolicyEdge>) -> f64 {
    (entry.and_then(|p| p.timeout_ms).or(e.timeout_ms))
        .filter(|ms| *ms > 0.0)
        .map_or(1.0, |ms| ms / 1e3)
}

/// A retry budget as the model runs it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Budget {
    /// Linkerd's (and Gateway API's): a share of the calls, a floor per second on top.
    Rate(RateBudget),
    /// Envoy's and Istio's: retries in flight to the cluster (the caller's calls to the
    /// callee, every operation) at most `ratio` of its requests in flight, or `min`.
    Concurrency { ratio: f64, min: f64 },
}

impl Budget {
    fn ratio(self) -> f64 {
        match self {
            Budget::Rate(b) => b.ratio,
            Budget::Concurrency { ratio, .. } => ratio,
        }
    }

    /// Whether what it allows per call depends on the calls per second.
    fn has_floor(self) -> bool {
        match self {
            Budget::Rate(b) => b.floor > 0.0,
            Budget::Concurrency { min, .. } => min > 0.0,
        }
    }

    /// The retries per call it allows at `calls_per_second` on the edge, with
    /// `first_tries_in_flight` at its cluster (see the module's model); what the share
    /// allows where either is unknown.
    fn per_call(self, calls_per_second: Option<f64>, first_tries_in_flight: Option<f64>) -> f64 {
        match self {
            Budget::Rate(b) => b.per_call(calls_per_second),
            Budget::Concurrency { ratio, min } => {
                let share = if ratio < 1.0 {
                    ratio / (1.0 - ratio)
                } else {
                    f64::INFINITY
                };
                match first_tries_in_flight {
                    Some(f) if f > 0.0 => share.max(min / f),
                    Some(_) => f64::INFINITY,
                    None => share,
                }
            }
        }
    }
}

/// The model solved for one set of retry allowances.
#[derive(Default)]
struct Solution<'r> {
    /// Each service's failure probability (the failed ones aside).
    q: HashMap<&'r str, f64>,
    amplification: HashMap<&'r str, f64>,
    /// Per edge, in the report's order.
    attempts_per_call: Vec<f64>,
}

fn solve<'r>(
    report: &'r Report,
    model: &Model<'r>,
    failing: &HashMap<&str, f64>,
    no_retry_calls: &[f64],
) -> Solution<'r> {
    let mut q: HashMap<&str, f64> = HashMap::new();
    for layer in &report.layers {
        failure_probability(
            report,
            model,
            failing,
            &layer.service,
            &mut q,
            &mut Vec::new(),
        );
    }
    let attempts_per_call: Vec<f64> = report
        .edges
        .iter()
        .zip(&model.retrying)
        .map(|(e, r)| {
            let q = failure_probability(report, model, failing, &e.callee, &mut q, &mut Vec::new());
            r.attempts_per_call(q)
        })
        .collect();
    let mut entries: BTreeMap<&str, f64> = BTreeMap::new();
    for e in &report.entries {
        *entries.entry(e.service.as_str()).or_default() += e.requests as f64;
    }
    // Incoming (caller, no-retry calls, attempts per call) per callee.
    let mut incoming: HashMap<&str, Vec<(&str, f64, f64)>> = HashMap::new();
    for ((figures, calls), per_call) in report
        .edges
        .iter()
        .zip(no_retry_calls)
        .zip(&attempts_per_call)
    {
        incoming.entry(figures.callee.as_str()).or_default().push((
            figures.caller.as_str(),
            *calls,
            *per_call,
        ));
    }
    let mut amplification: HashMap<&str, f64> = HashMap::new();
    for l in &report.layers {
        amplify(
            &l.service,
            &entries,
            &incoming,
            &mut amplification,
            &mut Vec::new(),
        );
    }
    Solution {
        q,
        amplification,
        attempts_per_call,
    }
}

/// `q(service)`, memoised; a service met again on the path (a cycle) adds nothing.
fn failure_probability<'r>(
    report: &'r Report,
    model: &Model<'r>,
    failing: &HashMap<&str, f64>,
    service: &'r str,
    memo: &mut HashMap<&'r str, f64>,
    path: &mut Vec<&'r str>,
) -> f64 {
    if let Some(p) = failing.get(service) {
        return *p;
    }
    if let Some(q) = memo.get(service) {
        return *q;
    }
    if path.contains(&service) {
        return 0.0;
    }
    path.push(service);
    let mut succeeds = 1.0;
    for &i in model.calls.get(service).into_iter().flatten() {
        let e = &report.edges[i];
        let q = failure_probability(report, model, failing, &e.callee, memo, path);
        succeeds *= survives(model.retrying[i].call_fails(q), model.per_request[i]);
    }
    path.pop();
    let q = 1.0 - succeeds;
    memo.insert(service, q);
    q
}

/// A layer's amplification, memoised: its entry requests at 1 and each incoming edge's
/// no-retry calls at the caller's amplification x the edge's attempts per call, weighted by
/// those calls. A caller met again on the path (a cycle) counts at 1.
fn amplify<'r>(
    service: &'r str,
    entries: &BTreeMap<&'r str, f64>,
    incoming: &HashMap<&'r str, Vec<(&'r str, f64, f64)>>,
    memo: &mut HashMap<&'r str, f64>,
    path: &mut Vec<&'r str>,
) -> f64 {
    if let Some(a) = memo.get(service) {
        return *a;
    }
    if path.contains(&service) {
        return 1.0;
    }
    path.push(service);
    let own = entries.get(service).copied().unwrap_or(0.0);
    let (mut weighted, mut weights) = (own, own);
    for &(caller, calls, per_call) in incoming.get(service).into_iter().flatten() {
        let upstream = amplify(caller, entries, incoming, memo, path);
        weighted += calls * upstream * per_call;
        weights += calls;
    }
    path.pop();
    let a = if weights > 0.0 {
        weighted / weights
    } else {
        1.0
    };
    memo.insert(service, a);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attempts per call of an edge: m when the callee always fails, 1 when it never
    /// does, the geometric sum between (3 attempts at q = 0.5: 1 + 0.5 + 0.25).
    #[test]
    fn attempts_per_call_is_the_geometric_sum() {
        assert_eq!(attempts_per_call(1.0, 3), 3.0);
        assert_eq!(attempts_per_call(0.0, 3), 1.0);
        assert_eq!(attempts_per_call(0.5, 3), 1.75);
    }

    /// Under a retry budget, retries per call stop at the ratio and the calls whose retries
    /// it holds back fail: 3 attempts with a 20% budget against a callee failing half of the
    /// time send 1.2 attempts per call (0.75 unbounded) and fail 0.5 x (1 - 0.2/0.75 x 0.75)
    /// = 0.4 of calls (0.125 unbounded).
    #[test]
    fn a_budget_caps_retries_as_it_behaves() {
        let budgeted = Retrying {
            max_attempts: 3,
            budget: Some(0.2),
            throttling: None,
        };
        assert!((budgeted.attempts_per_call(0.5) - 1.2).abs() < 1e-12);
        assert!((budgeted.call_fails(0.5) - 0.4).abs() < 1e-12);
        assert!((budgeted.attempts_per_call(1.0) - 1.2).abs() < 1e-12);
        assert_eq!(budgeted.call_fails(1.0), 1.0);
        let unbounded = Retrying {
            max_attempts: 3,
            budget: None,
            throttling: None,
        };
        assert!((unbounded.attempts_per_call(0.5) - 1.75).abs() < 1e-12);
        assert!((unbounded.call_fails(0.5) - 0.125).abs() < 1e-12);
    }

    /// gRPC's token bucket is a threshold, not a share: with 0.1 back per success it stops
    /// every retry once more than 1/11 of attempts fail, and lets all through below. The
    /// model agrees with the bucket replayed attempt by attempt (replay) over 2,000 calls
    /// of a callee failing at random, 3 attempts each as made without throttling: at 30%
    /// failing, the retries replayed are those the full bucket spent draining to half (a
    /// few per thousand calls); at 5%, every retry.
    #[test]
    fn a_token_bucket_stops_retries_past_its_line() {
        let throttled = Retrying {
            max_attempts: 3,
            budget: None,
            throttling: Some(Throttling {
                max_tokens: 10.0,
                token_ratio: 0.1,
            }),
        };
        assert_eq!(throttled.attempts_per_call(0.3), 1.0);
        assert!((throttled.call_fails(0.3) - 0.3).abs() < 1e-12);
        let q = 0.05;
        assert!((throttled.attempts_per_call(q) - (1.0 + q + q * q)).abs() < 1e-12);

        let policy = r#"{"edges": [{"caller": "a", "callee": "b", "max_attempts": 3,
            "retry_throttling": {"max_tokens": 10, "token_ratio": 0.1}}]}"#;
        let replayed = |q: f64| replayed_retries_per_call(q, 1_000_000, policy);
        let per_call = replayed(0.3);
        assert!(per_call < 0.01, "{per_call} retries per call replayed");
        let per_call = replayed(0.05);
        let expected = throttled.attempts_per_call(0.05) - 1.0;
        assert!(
            (per_call - expected).abs() < 0.2 * expected,
            "{per_call} vs {expected}"
        );
    }

    /// Retries per call `replay` lets through under `policy` (its edge `a -> b`) over 2,000
    /// calls `spacing_ns` apart to a callee failing at random with probability `q`, 3
    /// attempts each as made without a policy.
    fn replayed_retries_per_call(q: f64, spacing_ns: i64, policy: &str) -> f64 {
        replayed_tries(q, (2000, spacing_ns, 0), &["op"], policy)
    }

    /// As [`replayed_retries_per_call`] over `calls` calls, each try lasting `try_ns`, the
    /// next sent as the one before ends, the calls taking `operations` in turn: the
    /// retries per call over them all.
    fn replayed_tries(
        q: f64,
        (calls_made, spacing_ns, try_ns): (i64, i64, i64),
        operations: &[&str],
        policy: &str,
    ) -> f64 {
        let mut seed = 7_u64;
        let mut fails = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 11) as f64 / (1u64 << 53) as f64) < q
        };
        let mut attempts = Vec::new();
        let mut calls = Vec::new();
        for call in 0..calls_made {
            let operation = operations[call as usize % operations.len()];
            let mut made = 0;
            let mut ok = false;
            while made < 3 && !ok {
                ok = !fails();
                attempts.push(crate::replay::AttemptRow {
                    caller: Some("a".into()),
                    callee: Some("b".into()),
                    operation: Some(operation.into()),
                    trace_id: format!("{call:032x}"),
                    logical_call_id: 1,
                    attempt: made,
                    outcome: Some(if ok { "ok" } else { "unavailable" }.into()),
                    start_ns: call * spacing_ns + made * try_ns.max(1),
                    end_ns: call * spacing_ns + made * try_ns.max(1) + try_ns,
                });
                made += 1;
            }
            calls.push(crate::replay::CallRow {
                caller: Some("a".into()),
                callee: Some("b".into()),
                operation: Some(operation.into()),
                attempts: made,
                final_outcome: Some(if ok { "ok" } else { "unavailable" }.into()),
                weight: 1.0,
                start_ns: call * spacing_ns,
                end_ns: call * spacing_ns + (made * try_ns).max(10),
                trace_id: Some(format!("{call:032x}")),
                logical_call_id: 1,
                ..crate::replay::CallRow::default()
            });
        }
        let policy = Policy::parse(policy).unwrap();
        let r = crate::replay::replay(&calls, &attempts, &policy);
        let retries: f64 = r.edges.iter().map(|e| e.retries_replayed).sum();
        retries / r.edges.iter().map(|e| e.counts.calls).sum::<f64>()
    }

    /// A budget with a floor, in a steady state, allows what the model says: 10 calls a
    /// second that always fail, 3 attempts, 20% and 1 retry a second: 0.2 + 1/10 retries
    /// per call, as the budget replayed call by call over 200 s lets through (its first
    /// window's reserve aside).
    #[test]
    fn a_budget_floor_agrees_with_the_budget_replayed() {
        let budgeted = Retrying {
            max_attempts: 3,
            budget: Some(
                RateBudget {
                    ratio: 0.2,
                    floor: 1.0,
                }
                .per_call(Some(10.0)),
            ),
            throttling: None,
        };
        let expected = budgeted.attempts_per_call(1.0) - 1.0;
        assert!((expected - 0.3).abs() < 1e-12);
        let per_call = replayed_retries_per_call(
            1.0,
            100_000_000,
            r#"{"edges": [{"caller": "a", "callee": "b", "max_attempts": 3,
                "retry_budget_ratio": 0.2, "retry_budget_min_per_second": 1}]}"#,
        );
        assert!(
            (per_call - expected).abs() < 0.02 * expected,
            "{per_call} vs {expected}"
        );
    }

    /// A budget on retries in flight (Envoy's), in a steady state, allows what the model
    /// says: 1,000 calls a second that always fail, 100 ms tries, 3 attempts, 20% of the
    /// requests in flight: 100 first tries and 25 retries in flight, 0.25 retries per call,
    /// as the budget replayed try by try over 20 s lets through (and at 5,000 a second); at
    /// 10 calls a second its floor of 1 retry in flight allows 1 per call.
    #[test]
    fn a_concurrency_budget_agrees_with_the_budget_replayed() {
        let policy = r#"{"edges": [{"caller": "a", "callee": "b", "max_attempts": 3,
            "timeout_ms": 100, "retry_budget_ratio": 0.2, "min_retry_concurrency": 1}]}"#;
        let parsed = Policy::parse(policy).unwrap();
        let budget = budget_of(parsed.edge("a", "b", "op")).unwrap();
        // Envoy holds whole retries (at 100 first tries in flight, 24 retries, not 25): the
        // model is within one retry in flight of the replay.
        for (calls, spacing_ns, per_second, within) in [
            (20_000, 1_000_000, 1000.0, 1.0 / 24.0),
            (50_000, 200_000, 5000.0, 1.0 / 124.0),
            (200, 100_000_000, 10.0, 0.02),
        ] {
            let modelled = Retrying {
                max_attempts: 3,
                budget: Some(budget.per_call(Some(per_second), Some(per_second * 0.1))),
                throttling: None,
            };
            let expected = modelled.attempts_per_call(1.0) - 1.0;
            let replayed = replayed_tries(1.0, (calls, spacing_ns, 100_000_000), &["op"], policy);
            assert!(
                (replayed - expected).abs() <= within * expected + 1e-3,
                "{per_second}/s: {replayed} replayed vs {expected}"
            );
        }
        assert!((budget.per_call(Some(1000.0), Some(100.0)) - 0.25).abs() < 1e-12);
        assert!((budget.per_call(Some(10.0), Some(1.0)) - 1.0).abs() < 1e-12);
    }

    /// Envoy's budget is the cluster's: two operations of `a` on `b`, 5 calls a second each,
    /// share its one retry in flight. The what-if of such a window allows each 1 retry per
    /// call (the one retry in flight over the cluster's 1 first try in flight), as the
    /// replay lets through, not 2 (each operation's own half a first try in flight).
    #[test]
    fn a_concurrency_budget_is_shared_by_its_cluster() {
        let policy = r#"{"edges": [{"caller": "a", "callee": "b", "max_attempts": 3,
            "timeout_ms": 100, "retry_budget_ratio": 0.2, "min_retry_concurrency": 1}]}"#;
        let replayed = replayed_tries(1.0, (400, 100_000_000, 100_000_000), &["x", "y"], policy);
        let edge = |operation: &str| EdgeFigures {
            logical_calls: 200,
            attempts: 200,
            max_attempt: Some(0),
            ..EdgeFigures::named("a", "b", operation)
        };
        let report = Report {
            edges: vec![edge("x"), edge("y")],
            window: crate::report::Window {
                seconds: Some(40.0),
                ..Default::default()
            },
            ..Report::default()
        };
        let answer = what_if(
            &report,
            &[("b".into(), 1.0)],
            Some(&Policy::parse(policy).unwrap()),
        );
        for e in &answer.edges {
            assert_eq!(e.retry_budget_per_call, Some(1.0), "{e:?}");
            assert!((e.attempts_per_call - 2.0).abs() < 1e-12, "{e:?}");
        }
        assert!((replayed - 1.0).abs() < 0.02, "{replayed} replayed");
    }

    /// A limited listing keeps the layers the failure reaches before busier ones it leaves
    /// alone: at width, callers that do not retry keep amplification 1 but fail.
    #[test]
    fn the_listing_keeps_the_layers_a_failure_reaches() {
        let layer = |service: &str, amplification: f64, success: f64, rps: f64| LayerWhatIf {
            service: service.into(),
            amplification,
            success_probability: success,
            requests_per_second: Some(rps),
        };
        let answer = WhatIf {
            layers: vec![
                layer("busy", 1.0, 1.0, 90.0),
                layer("caller", 1.0, 0.5, 0.1),
                layer("quiet", 1.0, 1.0, 1.0),
                layer("storm", 2.0, 1.0, 0.1),
            ],
            ..WhatIf::default()
        }
        .listed(&Selection {
            limit: Some(2),
            ..Selection::default()
        });
        let listed: Vec<&str> = answer.layers.iter().map(|l| l.service.as_str()).collect();
        assert_eq!(listed, ["caller", "storm"]);
        assert_eq!(answer.listing.layers, 4);
    }

    /// `SERVICE=P` and `SERVICE:P` parse; anything else is an error saying what is expected.
    #[test]
    fn failures_parse() {
        assert_eq!(parse_failure("db=1"), Ok(("db".into(), 1.0)));
        assert_eq!(parse_failure("db:0.5"), Ok(("db".into(), 0.5)));
        assert!(parse_failure("db").unwrap_err().contains("SERVICE=P"));
        assert!(parse_failure("db=2").is_err());
        assert!(parse_failure("db=x").is_err());
        assert!(parse_failure("=0.5").is_err());
    }
}
