//! Replay: the observed logical calls again, under a retry policy ([`Policy`]): per edge the
//! retries the policy would have dropped, the successes that cost, and the load it saves.
//! The rules, as docs/advice.md states them:
//!
//! * an edge the policy names makes at most its `max_attempts`: a call that made more
//!   keeps that many, and one that succeeded only on a later attempt fails instead;
//! * its retries (after the cap) are then held to the budget as it runs, call by call in
//!   the order they started (Linkerd's and Finagle's budget): each call deposits
//!   `retry_budget_ratio`, each retry withdraws one, both forgotten after 10 s, and a
//!   retry goes while the deposits plus `retry_budget_min_per_second` x 10 s cover it. A
//!   call whose retry is dropped ends with the attempt before it: one a retry saved loses
//!   its success;
//! * an edge whose budget holds concurrent retries, as Envoy's and Istio's `retry_budget`
//!   does (`min_retry_concurrency` set, or `replay --budget-as envoy`), is replayed attempt
//!   by attempt in time, per caller and callee (Envoy's cluster): a retry goes when the
//!   attempt before it ends (or when it started, if sooner) while the retries held are
//!   fewer than `retry_budget_ratio` of the attempts in flight then (rounded down), or
//!   `min_retry_concurrency`, whichever is more; it holds its place until it ends itself.
//!   A call whose retry is refused ends with the attempt before it;
//! * an edge whose policy throttles as gRPC does (`retry_throttling`) is replayed attempt
//!   by attempt in the order the calls started: each failed attempt takes a token, each
//!   success gives back `token_ratio`, and a retry goes only while the tokens are above
//!   half of `max_tokens` (and the attempts allow); a retry the calls did not make is taken
//!   to fail, as the attempt before it did;
//! * an edge the policy does not name is replayed as observed;
//! * a call made for an attempt the policy drops upstream is not made (nor what it called
//!   in turn): an attempt past its edge's cap or refused by its budget is dropped
//!   outright, one a bucket throttles in the share its edge's bucket drops
//!   (`calls_replayed`, `attempts_not_called`); a call dropped so deposits nothing in its
//!   edge's budget. A storm capped at one layer saves the layers below it.
//!
//! Counts are sums of the calls' adjusted counts (sampling), as every figure's.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use datafusion::prelude::SessionContext;

use stormglass_runtime::retry_budget::RetryBudget;

use crate::engine::AnalysisError;
use crate::policy::{Policy, PolicyEdge};
use crate::queries;
use crate::report::{Listing, Selection};
use crate::table::{rows, run};

mod passes;
use passes::{concurrent, throttled};

/// One observed logical call, as `logical_calls` holds it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CallRow {
    pub caller: Option<String>,
    pub callee: Option<String>,
    pub operation: Option<String>,
    pub attempts: i64,
    pub final_outcome: Option<String>,
    pub weight: f64,
    pub start_ns: i64,
    pub end_ns: i64,
    /// The call's trace (hex) and its number there; with the upstream call and attempt
    /// number it was made for (none for a call no attempt made).
    #[serde(default)]
    pub trace_id: Option<String>,
    #[serde(default)]
    pub logical_call_id: i64,
    #[serde(default)]
    pub upstream_call_id: Option<i64>,
    #[serde(default)]
    pub upstream_attempt: Option<i64>,
}

/// One attempt, as `attempts` holds it: what a throttled edge is replayed from.
#[derive(Clone, Debug, Deserialize)]
pub struct AttemptRow {
    pub caller: Option<String>,
    pub callee: Option<String>,
    pub operation: Option<String>,
    pub trace_id: String,
    pub logical_call_id: i64,
    pub attempt: i64,
    pub outcome: Option<String>,
    pub start_ns: i64,
    pub end_ns: i64,
}

/// One edge replayed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EdgeReplay {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    /// The policy's attempts for the edge; null where the policy does not name it.
    pub max_attempts: Option<u32>,
    /// How the policy holds its retries back beyond the cap, as replayed: `rate`
    /// (Linkerd's budget), `concurrency` (Envoy's and Istio's), `token_bucket` (gRPC's
    /// throttling); null without.
    pub budget: Option<&'static str>,
    #[serde(flatten)]
    pub counts: ReplayCounts,
    pub success_rate: Option<f64>,
    pub success_rate_replayed: Option<f64>,
    /// Attempts saved, as a share of the attempts observed.
    pub load_saved: Option<f64>,
    /// Retries made and replayed (attempts past each call's first).
    pub retries: f64,
    pub retries_replayed: f64,
}

/// What a replay sums, per edge and over all of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplayCounts {
    pub calls: f64,
    pub attempts: f64,
    /// Calls still made: those made for an attempt dropped upstream are not.
    pub calls_replayed: f64,
    pub attempts_replayed: f64,
    /// Retries the policy drops here, of the calls still made: past its attempts, then
    /// past its budget.
    pub retries_dropped: f64,
    /// Attempts not made because the upstream attempt they were made for is dropped.
    pub attempts_not_called: f64,
    pub retries_dropped_by_budget: f64,
    /// Calls that succeeded as observed and would fail under the policy.
    pub successes_lost: f64,
    /// Calls that succeeded as observed, kept their answering attempt, and would fail
    /// because a call that attempt made fails under the policy (a service fails the
    /// request it serves when its call fails, as `whatif` takes it).
    pub successes_lost_below: f64,
}

impl std::ops::AddAssign<&ReplayCounts> for ReplayCounts {
    fn add_assign(&mut self, o: &ReplayCounts) {
        self.calls += o.calls;
        self.attempts += o.attempts;
        self.calls_replayed += o.calls_replayed;
        self.attempts_replayed += o.attempts_replayed;
        self.retries_dropped += o.retries_dropped;
        self.attempts_not_called += o.attempts_not_called;
        self.retries_dropped_by_budget += o.retries_dropped_by_budget;
        self.successes_lost += o.successes_lost;
        self.successes_lost_below += o.successes_lost_below;
    }
}

/// The replay of a set of calls.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Replay {
    /// The calls' span of time, the budget's window.
    pub seconds: f64,
    /// Every edge, by name (or those [`Replay::listed`]).
    pub edges: Vec<EdgeReplay>,
    /// The sums over every edge replayed, listed or not.
    pub totals: ReplayTotals,
    /// How many edges there are and how many are listed.
    pub listing: Listing,
}

/// The sums of a replay's edges.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplayTotals {
    #[serde(flatten)]
    pub counts: ReplayCounts,
    /// Attempts saved, as a share of the attempts observed.
    pub load_saved: Option<f64>,
}

/// Which edges [`Replay::listed`] keeps, and the order it lists them in.
pub const REPLAY_ORDER: &str =
    "the worst kept: edges by successes lost, then attempts saved; listed by name";

impl Replay {
    /// The edges `selection` selects, at most its limit: the worst
    /// ([`REPLAY_ORDER`]), each in its place; the totals stay those of every edge.
    pub fn listed(mut self, selection: &Selection) -> Replay {
        let saved = |e: &EdgeReplay| e.counts.attempts - e.counts.attempts_replayed;
        let selected = selection.keep_edges(
            &mut self.edges,
            |e| (&e.caller, &e.callee),
            |a, b| {
                (b.counts.successes_lost.total_cmp(&a.counts.successes_lost))
                    .then(saved(b).total_cmp(&saved(a)))
            },
        );
        self.listing = Listing::of(REPLAY_ORDER, (selected, self.edges.len()), (0, 0));
        self
    }
}

fn totals(edges: &[EdgeReplay]) -> ReplayTotals {
    let mut counts = ReplayCounts::default();
    for e in edges {
        counts += &e.counts;
    }
    ReplayTotals {
        load_saved: ratio(counts.attempts - counts.attempts_replayed, counts.attempts),
        counts,
    }
}

#[derive(Default)]
struct Sums {
    /// The policy's attempts for the edge (`i64::MAX` where it does not name it).
    cap: i64,
    calls: f64,
    attempts: f64,
    capped: f64,
    successes: f64,
}

fn name(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("unknown")
}

fn ratio(n: f64, d: f64) -> Option<f64> {
    (d > 0.0).then(|| n / d)
}

/// The traffic of `ctx` (an [`crate::engine::Engine::query_context`]) as [`replay`] reads
/// it under `policy`: every logical call, and attempt by attempt only when a token bucket
/// throttles some edge or a budget holds concurrent retries.
pub async fn traffic(
    ctx: &SessionContext,
    policy: &Policy,
) -> Result<(Vec<CallRow>, Vec<AttemptRow>), AnalysisError> {
    let calls = rows(&run(ctx, &queries::REPLAY_CALLS).await?);
    let by_attempt = policy
        .edges
        .iter()
        .any(|e| e.retry_throttling.is_some() || e.min_retry_concurrency.is_some());
    let attempts = if by_attempt {
        rows(&run(ctx, &queries::REPLAY_ATTEMPTS).await?)
    } else {
        Vec::new()
    };
    Ok((calls, attempts))
}

/// What the policy does to an edge: its attempt cap, its retry budget, and for an edge a
/// token bucket throttles, the share of retries the bucket keeps and the successes it
/// loses per call (spread evenly).
#[derive(Clone, Copy)]
struct Plan {
    cap: i64,
    budget: Option<Budget>,
    throttled: Option<(f64, f64)>,
}

/// A retry budget as the policy sets it.
#[derive(Clone, Copy)]
enum Budget {
    /// Linkerd's: `retry_budget_ratio` of the calls, `retry_budget_min_per_second`.
    Rate { ratio: f64, floor: f64 },
    /// Envoy's: `retry_budget_ratio` of the attempts in flight, `min_retry_concurrency`.
    Concurrency { ratio: f64, min: f64 },
}

impl Budget {
    fn of(p: &PolicyEdge) -> Option<Budget> {
        match p.min_retry_concurrency {
            Some(min) => Some(Budget::Concurrency {
                ratio: p.retry_budget_ratio.unwrap_or(0.0),
                min: f64::from(min),
            }),
            None => p.rate_budget().map(|b| Budget::Rate {
                ratio: b.ratio,
                floor: b.floor,
            }),
        }
    }
}

impl Plan {
    /// How much of attempt number `k` (0 the first) of a call that sent `sent` attempts
    /// the policy still sends.
    fn attempt_kept(&self, k: i64, sent: f64) -> f64 {
        match (k, self.throttled) {
            (k, _) if k >= self.cap => 0.0,
            (0, _) => 1.0,
            (_, Some((kept, _))) => kept,
            (k, None) => f64::from(u8::from((k as f64) < sent)),
        }
    }
}

/// Replay `calls` under `policy`; `attempts` (in any order) for the edges it throttles as
/// gRPC does.
pub fn replay(calls: &[CallRow], attempts: &[AttemptRow], policy: &Policy) -> Replay {
    let throttled = throttled(attempts, policy);
    let start = calls.iter().map(|c| c.start_ns).min().unwrap_or(0);
    let end = calls.iter().map(|c| c.end_ns).max().unwrap_or(0);
    let seconds = (end - start).max(0) as f64 / 1e9;
    let cap_of = |key: Key| {
        policy
            .edge(key.0, key.1, key.2)
            .map_or(i64::MAX, |p| i64::from(p.max_attempts))
    };
    // Pass one: each edge as observed, and what the policy does to it. The policy is
    // looked up once per edge, not per call.
    let mut sums: HashMap<Key, Sums> = HashMap::new();
    for c in calls {
        let key = key_of(c);
        let attempts = c.attempts.max(1);
        let ok = c.final_outcome.as_deref() == Some("ok");
        let s = sums.entry(key).or_insert_with(|| Sums {
            cap: cap_of(key),
            ..Sums::default()
        });
        let cap = s.cap;
        s.calls += c.weight;
        s.attempts += attempts as f64 * c.weight;
        s.capped += attempts.min(cap) as f64 * c.weight;
        if ok {
            s.successes += c.weight;
        }
    }
    let plans: HashMap<Key, Plan> = sums
        .iter()
        .map(|(&key, s)| {
            let budget = policy.edge(key.0, key.1, key.2).and_then(Budget::of);
            let owned = (key.0.to_owned(), key.1.to_owned(), key.2.to_owned());
            let throttled = throttled.get(&owned).map(|(sent, late)| {
                let kept = ratio(sent - s.calls, s.capped - s.calls).unwrap_or(1.0);
                (kept, late / s.calls)
            });
            let plan = Plan {
                cap: s.cap,
                budget,
                throttled,
            };
            (key, plan)
        })
        .collect();
    // Pass two: the calls in the order they started, each after the call it was made for:
    // how much of it is still made, and how many of its attempts are sent.
    let index: HashMap<(&str, i64), usize> = calls
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some(((c.trace_id.as_deref()?, c.logical_call_id), i)))
        .collect();
    let concurrent = concurrent(calls, attempts, &index, &plans);
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by_key(|&i| (calls[i].start_ns, i));
    let mut pass = PassTwo {
        calls,
        index,
        plans: &plans,
        budgets: HashMap::new(),
        concurrent,
        decided: vec![None; calls.len()],
    };
    for i in order {
        pass.decide(i);
    }
    // A success on an attempt no longer sent is lost.
    let own: Vec<f64> = calls
        .iter()
        .zip(&pass.decided)
        .map(|(c, decided)| {
            let sent = decided.map_or(0.0, |d| d.sent);
            let ok = c.final_outcome.as_deref() == Some("ok");
            match plans[&key_of(c)].throttled {
                Some((_, per_call)) => per_call,
                None => f64::from(u8::from(ok && c.attempts.max(1) as f64 > sent)),
            }
        })
        .collect();
    let below = lost_below(calls, &pass.index, &own);
    let mut cascaded: HashMap<Key, Cascade> = HashMap::new();
    for (i, (c, decided)) in calls.iter().zip(&pass.decided).enumerate() {
        let key = key_of(c);
        let plan = plans[&key];
        let Some(Decided { made, sent }) = *decided else {
            unreachable!("pass two decides every call");
        };
        let attempts = c.attempts.max(1) as f64;
        let capped = c.attempts.max(1).min(plan.cap) as f64;
        let ok = c.final_outcome.as_deref() == Some("ok");
        let lost = own[i];
        let e = cascaded.entry(key).or_default();
        let w = c.weight;
        e.calls += w * made;
        e.not_called += w * attempts * (1.0 - made);
        e.dropped += w * made * (attempts - sent);
        e.by_budget += w * made * (capped - sent);
        e.successes += w * made * f64::from(u8::from(ok));
        e.lost += w * made * lost;
        e.lost_below += w * made * (1.0 - lost).max(0.0) * below[i];
    }
    let mut edges: Vec<EdgeReplay> = sums
        .into_iter()
        .map(|(key @ (caller, callee, operation), s)| {
            let p = policy.edge(caller, callee, operation);
            let c = &cascaded[&key];
            let replayed = s.attempts - c.dropped - c.not_called;
            EdgeReplay {
                caller: caller.to_owned(),
                callee: callee.to_owned(),
                operation: operation.to_owned(),
                max_attempts: p.map(|p| p.max_attempts),
                budget: p.and_then(|p| match (p.retry_throttling, Budget::of(p)) {
                    (Some(_), _) => Some("token_bucket"),
                    (None, Some(Budget::Rate { .. })) => Some("rate"),
                    (None, Some(Budget::Concurrency { .. })) => Some("concurrency"),
                    (None, None) => None,
                }),
                counts: ReplayCounts {
                    calls: s.calls,
                    attempts: s.attempts,
                    calls_replayed: c.calls,
                    attempts_replayed: replayed,
                    retries_dropped: c.dropped,
                    attempts_not_called: c.not_called,
                    retries_dropped_by_budget: c.by_budget,
                    successes_lost: c.lost,
                    successes_lost_below: c.lost_below,
                },
                success_rate: ratio(s.successes, s.calls),
                success_rate_replayed: ratio(c.successes - c.lost - c.lost_below, c.calls),
                load_saved: ratio(s.attempts - replayed, s.attempts),
                retries: s.attempts - s.calls,
                retries_replayed: replayed - c.calls,
            }
        })
        .collect();
    edges.sort_by(|a, b| {
        (&a.caller, &a.callee, &a.operation).cmp(&(&b.caller, &b.callee, &b.operation))
    });
    Replay {
        seconds,
        totals: totals(&edges),
        edges,
        listing: Listing::default(),
    }
    .listed(&Selection::default())
}

type Key<'a> = (&'a str, &'a str, &'a str);

/// Per call, the share of its observed success lost below it: the calls made for its
/// answering (last) attempt that fail under the policy, at their own edge or below, fail
/// that attempt (`own`: each call's share lost at its own edge). A call that failed as
/// observed loses nothing and passes nothing up. Children first, over an explicit stack;
/// a chain met again while being walked (which a trace cannot hold) is cut there.
fn lost_below(calls: &[CallRow], index: &HashMap<(&str, i64), usize>, own: &[f64]) -> Vec<f64> {
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); calls.len()];
    for (i, c) in calls.iter().enumerate() {
        let upstream = (c.trace_id.as_deref().zip(c.upstream_call_id))
            .and_then(|(trace, call)| index.get(&(trace, call)).copied());
        if let Some(u) = upstream.filter(|&u| u != i)
            && c.upstream_attempt == Some(calls[u].attempts.max(1) - 1)
        {
            children[u].push(i);
        }
    }
    let mut below = vec![0.0; calls.len()];
    let mut failed = vec![0.0; calls.len()];
    let (mut done, mut walking) = (vec![false; calls.len()], vec![false; calls.len()]);
    for root in 0..calls.len() {
        let mut stack = vec![(root, false)];
        while let Some((i, expanded)) = stack.pop() {
            if done[i] {
                continue;
            }
            if !expanded {
                walking[i] = true;
                stack.push((i, true));
                stack.extend(
                    children[i]
                        .iter()
                        .filter(|&&c| !walking[c])
                        .map(|&c| (c, false)),
                );
                continue;
            }
            done[i] = true;
            if calls[i].final_outcome.as_deref() != Some("ok") {
                continue;
            }
            let kept: f64 = children[i].iter().map(|&c| 1.0 - failed[c]).product();
            below[i] = 1.0 - kept;
            failed[i] = 1.0 - (1.0 - own[i]).max(0.0) * kept;
        }
    }
    below
}

fn key_of(c: &CallRow) -> Key<'_> {
    (name(&c.caller), name(&c.callee), name(&c.operation))
}

/// Pass two's sums of an edge, each call weighted by the share of it still made.
#[derive(Default)]
struct Cascade {
    calls: f64,
    not_called: f64,
    dropped: f64,
    by_budget: f64,
    successes: f64,
    lost: f64,
    lost_below: f64,
}

/// What pass two decided for a call: the share of it still made (the product, up its
/// chain of upstream attempts, of how much of each is still sent) and the attempts it
/// sends.
#[derive(Clone, Copy)]
struct Decided {
    made: f64,
    sent: f64,
}

struct PassTwo<'a> {
    calls: &'a [CallRow],
    index: HashMap<(&'a str, i64), usize>,
    plans: &'a HashMap<Key<'a>, Plan>,
    budgets: HashMap<Key<'a>, RetryBudget>,
    /// Per call of an edge whose budget holds concurrent retries, the attempts it sends.
    concurrent: HashMap<usize, i64>,
    decided: Vec<Option<Decided>>,
}

impl PassTwo<'_> {
    /// Decide call `i`, after the call it was made for (a call whose upstream started
    /// later, skewed, still waits for it; a chain met again while being walked, which a
    /// trace cannot hold, counts as made).
    fn decide(&mut self, i: usize) -> Decided {
        if let Some(d) = self.decided[i] {
            return d;
        }
        let c = &self.calls[i];
        let key = key_of(c);
        let plan = self.plans[&key];
        let capped = c.attempts.max(1).min(plan.cap);
        self.decided[i] = Some(Decided {
            made: 1.0,
            sent: capped as f64,
        });
        let upstream = c
            .trace_id
            .as_deref()
            .zip(c.upstream_call_id)
            .and_then(|(trace, call)| self.index.get(&(trace, call)).copied());
        let made = match (upstream, c.upstream_attempt) {
            (Some(u), Some(k)) => {
                let up = self.decide(u);
                let kept = self
                    .plans
                    .get(&key_of(&self.calls[u]))
                    .map_or(1.0, |p| p.attempt_kept(k, up.sent));
                up.made * kept
            }
            _ => 1.0,
        };
        let sent = match (plan.throttled, plan.budget) {
            (Some((kept, _)), _) => 1.0 + (capped - 1) as f64 * kept,
            (None, Some(Budget::Concurrency { .. })) => {
                self.concurrent.get(&i).map_or(capped, |&s| s.min(capped)) as f64
            }
            (None, Some(Budget::Rate { ratio, floor })) if made > 0.0 => {
                let budget =
                    (self.budgets.entry(key)).or_insert_with(|| RetryBudget::new(ratio, floor));
                let w = c.weight * made;
                budget.call(c.start_ns, w);
                let retries = (1..capped)
                    .take_while(|_| budget.retry(c.start_ns, w))
                    .count();
                (1 + retries) as f64
            }
            _ => capped as f64,
        };
        let d = Decided { made, sent };
        self.decided[i] = Some(d);
        d
    }
}

#[cfg(test)]
mod tests;
