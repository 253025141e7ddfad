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

use crate::advice::{Policy, PolicyEdge};
use crate::engine::AnalysisError;
use crate::queries;
use crate::report::{Listing, Selection};
use crate::table::{rows, run};

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

/// The order [`Replay::listed`] keeps the worst in.
pub const REPLAY_ORDER: &str = "edges by successes lost, then attempts saved";

impl Replay {
    /// The edges `selection` selects, at most its limit, the worst first
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

/// Per throttled edge, its attempts replayed through the token bucket, and the successes
/// it loses (calls whose success came on a retry the bucket holds back).
fn throttled(
    attempts: &[AttemptRow],
    policy: &Policy,
) -> HashMap<(String, String, String), (f64, f64)> {
    // Calls in the order they started, each with its attempts' outcomes in order.
    let mut calls: HashMap<(Key, &str, i64), Vec<&AttemptRow>> = HashMap::new();
    for a in attempts {
        let key = (name(&a.caller), name(&a.callee), name(&a.operation));
        if policy
            .edge(key.0, key.1, key.2)
            .is_some_and(|p| p.retry_throttling.is_some())
        {
            calls
                .entry((key, a.trace_id.as_str(), a.logical_call_id))
                .or_default()
                .push(a);
        }
    }
    let mut ordered: Vec<(Key, Vec<&AttemptRow>)> = calls
        .into_iter()
        .map(|((key, _, _), mut a)| {
            a.sort_by_key(|a| (a.attempt, a.start_ns));
            (key, a)
        })
        .collect();
    ordered.sort_by_key(|(key, a)| (*key, a.first().map_or(0, |a| a.start_ns)));
    let mut out: HashMap<(String, String, String), (f64, f64)> = HashMap::new();
    let mut tokens: HashMap<Key, f64> = HashMap::new();
    for (key, observed) in ordered {
        let Some(p) = policy.edge(key.0, key.1, key.2) else {
            continue;
        };
        let Some(t) = p.retry_throttling else {
            continue;
        };
        let bucket = tokens.entry(key).or_insert(t.max_tokens);
        let mut sent = 0u32;
        let mut ok = false;
        while sent < p.max_attempts.max(1) {
            if sent > 0 && *bucket <= t.max_tokens / 2.0 {
                break;
            }
            // An attempt the calls did not make fails as the one before it did.
            let outcome = observed
                .get(sent as usize)
                .or(observed.last())
                .and_then(|a| a.outcome.as_deref());
            sent += 1;
            if outcome == Some("ok") {
                *bucket = (*bucket + t.token_ratio).min(t.max_tokens);
                ok = true;
                break;
            }
            *bucket -= 1.0;
        }
        // A success the bucket held back: the call succeeded, on a retry not sent now.
        let lost = !ok
            && observed
                .last()
                .is_some_and(|a| a.outcome.as_deref() == Some("ok"));
        let entry = out
            .entry((key.0.to_owned(), key.1.to_owned(), key.2.to_owned()))
            .or_default();
        entry.0 += f64::from(sent);
        entry.1 += f64::from(u8::from(lost));
    }
    out
}

/// Per call of an edge whose budget holds concurrent retries (Envoy's), the attempts it
/// still sends: every call to the same callee from the same caller, budgeted or not,
/// replayed attempt by attempt in time, each attempt in flight from its start to its end
/// and each retry held from when it was decided to its end. Calls are replayed as made
/// whatever happens upstream (as the token bucket's), sampled ones by their weight.
fn concurrent(
    calls: &[CallRow],
    attempts: &[AttemptRow],
    index: &HashMap<(&str, i64), usize>,
    plans: &HashMap<Key, Plan>,
) -> HashMap<usize, i64> {
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, HashSet};

    let clusters: HashSet<(&str, &str)> = plans
        .iter()
        .filter(|(_, p)| matches!(p.budget, Some(Budget::Concurrency { .. })))
        .map(|(k, _)| (k.0, k.1))
        .collect();
    if clusters.is_empty() {
        return HashMap::new();
    }
    // Each call of those clusters, looked up once: its cluster (by number), its budget
    // where it has one, the attempts its cap lets it try, its weight, and its attempts
    // (number, start, end) in order.
    struct Tracked {
        cluster: usize,
        budget: Option<(f64, f64)>,
        cap: i64,
        weight: f64,
        tries: Vec<(i64, i64, i64)>,
    }
    let mut cluster_of: HashMap<(&str, &str), usize> = HashMap::new();
    let mut tracked: Vec<Tracked> = Vec::new();
    let mut position: HashMap<usize, usize> = HashMap::new();
    for a in attempts {
        if !clusters.contains(&(name(&a.caller), name(&a.callee))) {
            continue;
        }
        let Some(&i) = index.get(&(a.trace_id.as_str(), a.logical_call_id)) else {
            continue;
        };
        let at = *position.entry(i).or_insert_with(|| {
            let c = &calls[i];
            let key = key_of(c);
            let next = cluster_of.len();
            let plan = plans[&key];
            tracked.push(Tracked {
                cluster: *cluster_of.entry((key.0, key.1)).or_insert(next),
                budget: match plan.budget {
                    Some(Budget::Concurrency { ratio, min }) => Some((ratio, min)),
                    _ => None,
                },
                cap: plan.cap,
                weight: c.weight,
                tries: Vec::new(),
            });
            tracked.len() - 1
        });
        (tracked[at].tries).push((a.attempt, a.start_ns, a.end_ns.max(a.start_ns)));
    }
    // Events in time; at one instant ends first (an attempt just answered is no longer in
    // flight, as Envoy releases a retry's place before deciding the next), then decisions,
    // then starts.
    const END: u8 = 0;
    const DECIDE: u8 = 1;
    const START: u8 = 2;
    let mut events = BinaryHeap::new();
    for (n, t) in tracked.iter_mut().enumerate() {
        t.tries.sort_unstable();
        events.push(Reverse((t.tries[0].1, DECIDE, n, 0usize)));
    }
    // Per cluster, the attempts in flight and the retries held (weighted).
    let mut in_flight = vec![(0.0_f64, 0.0_f64); cluster_of.len()];
    let mut sent: Vec<i64> = vec![0; tracked.len()];
    while let Some(Reverse((at, kind, n, k))) = events.pop() {
        let t = &tracked[n];
        let (active, held) = &mut in_flight[t.cluster];
        let w = t.weight;
        match kind {
            START => {
                *active += w;
                events.push(Reverse((t.tries[k].2.max(at), END, n, k)));
            }
            END => {
                *active -= w;
                if k > 0 {
                    *held -= w;
                }
            }
            _ => {
                // The slack absorbs the sums' rounding, as the rate budget's.
                let allowed = k == 0
                    || t.budget.is_none_or(|(ratio, min)| {
                        *held + w <= (ratio * *active + 1e-9).floor().max(min) + 1e-9
                    });
                if !allowed {
                    continue;
                }
                if k > 0 {
                    *held += w;
                }
                sent[n] = k as i64 + 1;
                events.push(Reverse((t.tries[k].1.max(at), START, n, k)));
                if ((k + 1) as i64) < t.cap.min(t.tries.len() as i64) {
                    let next = t.tries[k + 1].1.min(t.tries[k].2).max(at);
                    events.push(Reverse((next, DECIDE, n, k + 1)));
                }
            }
        }
    }
    position.into_iter().map(|(i, n)| (i, sent[n])).collect()
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
        let ratio = p.retry_budget_ratio;
        match (
            p.min_retry_concurrency,
            ratio,
            p.retry_budget_min_per_second,
        ) {
            (Some(min), ..) => Some(Budget::Concurrency {
                ratio: ratio.unwrap_or(0.0),
                min: f64::from(min),
            }),
            (None, None, None) => None,
            (None, ratio, floor) => Some(Budget::Rate {
                ratio: ratio.unwrap_or(0.0),
                floor: floor.unwrap_or(0.0),
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
mod tests {
    use super::*;

    fn attempt(call: i64, attempt: i64, ok: bool) -> AttemptRow {
        AttemptRow {
            caller: Some("shop".into()),
            callee: Some("stock".into()),
            operation: Some("demo.Stock/Get".into()),
            trace_id: format!("{call:032x}"),
            logical_call_id: 1,
            attempt,
            outcome: Some(if ok { "ok" } else { "unavailable" }.into()),
            start_ns: call * 1_000_000 + attempt,
            end_ns: call * 1_000_000 + attempt,
        }
    }

    /// gRPC's throttling replayed over calls made without it: 10 tokens, 0.5 back per
    /// success, no retry at or below 5. Every third call fails all its 3 attempts (8
    /// retries in 12 calls); throttled, the first two failing calls still make 3 attempts
    /// (10 -> 7, then 8 -> 5 after two successes), every later one 1 (the tokens hover at
    /// 5-6): 4 retries, as grpcio makes them.
    #[test]
    fn throttling_as_grpc_does() {
        let mut attempts = Vec::new();
        let mut calls = Vec::new();
        for i in 0..12 {
            let fails = i % 3 == 0;
            let tries = if fails { 3 } else { 1 };
            for a in 0..tries {
                attempts.push(attempt(i, a, !fails));
            }
            calls.push(CallRow {
                caller: Some("shop".into()),
                callee: Some("stock".into()),
                operation: Some("demo.Stock/Get".into()),
                attempts: tries,
                final_outcome: Some(if fails { "unavailable" } else { "ok" }.into()),
                weight: 1.0,
                start_ns: i * 1_000_000,
                end_ns: i * 1_000_000 + 10,
                ..CallRow::default()
            });
        }
        let policy = Policy::parse(
            r#"{"edges": [{"caller": "shop", "callee": "stock", "max_attempts": 3,
                "retry_throttling": {"max_tokens": 10, "token_ratio": 0.5}}]}"#,
        )
        .unwrap();
        let r = replay(&calls, &attempts, &policy);
        let e = &r.edges[0];
        assert_eq!((e.retries, e.retries_replayed), (8.0, 4.0), "{e:?}");
        assert_eq!(e.counts.successes_lost, 0.0);
        // Half the tokens: the bucket is at its threshold after the first failure.
        let tight = Policy::parse(
            r#"{"edges": [{"caller": "shop", "callee": "stock", "max_attempts": 3,
                "retry_throttling": {"max_tokens": 2, "token_ratio": 0.5}}]}"#,
        )
        .unwrap();
        let r = replay(&calls, &attempts, &tight);
        assert_eq!(r.edges[0].retries_replayed, 0.0, "{:?}", r.edges[0]);
    }

    /// Envoy's budget over ten calls started a millisecond apart, each first attempt
    /// taking 20 ms, the even ones failing and answered by a retry sent at once (20 ms
    /// more). At 20% with at least 1 concurrent retry, call 0's retry goes (9 attempts in
    /// flight: a limit of 1, none held) and holds its place to 40 ms, so the retries of
    /// calls 2, 4, 6 and 8 (22-28 ms) find the limit taken (at most 8 in flight: 1): they
    /// are refused and their successes lost. At least 3: calls 0, 2 and 4 retry. At 100%:
    /// all five (call 2 finds 8 in flight, one held). A rate budget (Linkerd's) against
    /// the same policy read as Envoy's.
    #[test]
    fn concurrency_budget_as_envoy_holds_it() {
        let mut calls = Vec::new();
        let mut attempts = Vec::new();
        for i in 0..10_i64 {
            let fails = i % 2 == 0;
            let ms = 1_000_000;
            let trace = format!("{i:032x}");
            let mut tried = |attempt: i64, start: i64, ok: bool| {
                attempts.push(AttemptRow {
                    caller: Some("shop".into()),
                    callee: Some("stock".into()),
                    operation: Some("GET /stock".into()),
                    trace_id: trace.clone(),
                    logical_call_id: 1,
                    attempt,
                    outcome: Some(if ok { "ok" } else { "unavailable" }.into()),
                    start_ns: start * ms,
                    end_ns: (start + 20) * ms,
                })
            };
            tried(0, i, !fails);
            if fails {
                tried(1, i + 20, true);
            }
            calls.push(CallRow {
                caller: Some("shop".into()),
                callee: Some("stock".into()),
                operation: Some("GET /stock".into()),
                attempts: if fails { 2 } else { 1 },
                final_outcome: Some("ok".into()),
                weight: 1.0,
                start_ns: i * ms,
                end_ns: (i + if fails { 40 } else { 20 }) * ms,
                trace_id: Some(trace),
                logical_call_id: 1,
                ..CallRow::default()
            });
        }
        let envoy = |ratio: f64, min: u32| {
            let p = Policy::parse(&format!(
                r#"{{"edges": [{{"caller": "shop", "callee": "stock", "max_attempts": 2,
                    "retry_budget_ratio": {ratio}, "min_retry_concurrency": {min}}}]}}"#
            ))
            .unwrap();
            let r = replay(&calls, &attempts, &p);
            let e = &r.edges[0];
            (e.retries_replayed, e.counts.successes_lost)
        };
        assert_eq!(envoy(0.2, 1), (1.0, 4.0));
        let p = Policy::parse(
            r#"{"edges": [{"caller": "shop", "callee": "stock", "max_attempts": 2,
                "retry_budget_ratio": 0.2, "min_retry_concurrency": 1}]}"#,
        )
        .unwrap();
        assert_eq!(
            replay(&calls, &attempts, &p).edges[0].budget,
            Some("concurrency")
        );
        assert_eq!(envoy(0.2, 3), (3.0, 2.0));
        assert_eq!(envoy(1.0, 1), (5.0, 0.0));
        // At 50% as a rate budget each call deposits half a retry: calls 2, 4, 6 and 8
        // retry. As Envoy's (a floor of 0/s: 1 concurrent), call 6 finds 6 in flight
        // (calls 7-9, three retries held): a limit of 3, taken.
        let rate = Policy::parse(
            r#"{"edges": [{"caller": "shop", "callee": "stock", "max_attempts": 2,
                "retry_budget_ratio": 0.5, "retry_budget_min_per_second": 0.0,
                "timeout_ms": 200.0}]}"#,
        )
        .unwrap();
        let r = replay(&calls, &attempts, &rate);
        assert_eq!(
            (r.edges[0].retries_replayed, r.edges[0].budget),
            (4.0, Some("rate"))
        );
        let as_envoy = rate.with_concurrency_budgets();
        assert_eq!(as_envoy.edges[0].min_retry_concurrency, Some(1));
        assert_eq!(
            replay(&calls, &attempts, &as_envoy).edges[0].retries_replayed,
            3.0
        );
        assert_eq!(crate::advice::min_retry_concurrency(10.0, Some(200.0)), 2);
    }

    fn call(attempts: i64, ok: bool, at_s: i64) -> CallRow {
        CallRow {
            caller: Some("order".into()),
            callee: Some("db".into()),
            operation: Some("SELECT".into()),
            attempts,
            final_outcome: Some(if ok { "ok" } else { "unavailable" }.into()),
            weight: 1.0,
            start_ns: at_s * 1_000_000_000,
            end_ns: at_s * 1_000_000_000 + 1,
            ..CallRow::default()
        }
    }

    /// Call `id` of trace `t` on `caller -> callee`, made for attempt `up` of call 1 (none
    /// for a call no attempt made).
    fn linked(
        caller: &str,
        callee: &str,
        id: i64,
        attempts: i64,
        ok: bool,
        up: Option<i64>,
    ) -> CallRow {
        CallRow {
            caller: Some(caller.into()),
            callee: Some(callee.into()),
            operation: Some("op".into()),
            attempts,
            final_outcome: Some(if ok { "ok" } else { "unavailable" }.into()),
            weight: 1.0,
            trace_id: Some("t".into()),
            logical_call_id: id,
            upstream_call_id: up.map(|_| 1),
            upstream_attempt: up,
            ..CallRow::default()
        }
    }

    /// A storm capped at the top saves the layers below: gateway -> api makes 3 attempts,
    /// each of which calls api -> db once (db fails twice, then answers). Capped at one
    /// attempt at gateway -> api, the db calls made for attempts 2 and 3 are not made:
    /// db's edge replays 1 call of 3, its load saved two thirds, no success of its own
    /// lost; with 2 attempts allowed, 2 of 3.
    #[test]
    fn dropped_attempts_take_their_calls_below_with_them() {
        let calls = vec![
            linked("gateway", "api", 1, 3, true, None),
            linked("api", "db", 2, 1, false, Some(0)),
            linked("api", "db", 3, 1, false, Some(1)),
            linked("api", "db", 4, 1, true, Some(2)),
        ];
        let capped = |n: u32| {
            let p = Policy::parse(&format!(
                r#"{{"edges": [{{"caller": "gateway", "callee": "api", "max_attempts": {n}}}]}}"#
            ))
            .unwrap();
            replay(&calls, &[], &p)
        };
        let r = capped(1);
        let (api, db) = (&r.edges[1], &r.edges[0]);
        assert_eq!((api.callee.as_str(), db.callee.as_str()), ("api", "db"));
        assert_eq!(
            (api.counts.attempts, api.counts.attempts_replayed),
            (3.0, 1.0)
        );
        assert_eq!(
            api.counts.successes_lost, 1.0,
            "its success came on the third"
        );
        assert_eq!(
            (db.counts.calls, db.counts.calls_replayed),
            (3.0, 1.0),
            "{db:?}"
        );
        assert_eq!(
            (db.counts.attempts_not_called, db.counts.retries_dropped),
            (2.0, 0.0)
        );
        assert_eq!(db.counts.attempts_replayed, 1.0);
        assert_eq!(db.counts.successes_lost, 0.0);
        assert!((db.load_saved.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(db.success_rate_replayed, Some(0.0), "the one made failed");
        let r = capped(2);
        assert_eq!(r.edges[0].counts.calls_replayed, 2.0);
        // Not named by the policy, nothing upstream dropped: replayed as observed.
        let r = replay(&calls, &[], &Policy::parse(r#"{"edges": []}"#).unwrap());
        assert_eq!(r.edges[0].counts.calls_replayed, 3.0);
        assert_eq!(r.edges[0].counts.attempts_not_called, 0.0);
    }

    /// A success lost below fails the calls above it: gateway -> api (answered on its
    /// only attempt) made api -> db, answered on db's second attempt. Capped at one
    /// attempt at api -> db, the db call fails, so api's attempt fails and gateway's call
    /// loses its success (below, not at its own edge). A db call made for an attempt
    /// before the answering one takes nothing up: that attempt had failed already.
    #[test]
    fn a_success_lost_below_is_lost_above() {
        let capped =
            Policy::parse(r#"{"edges": [{"caller": "api", "callee": "db", "max_attempts": 1}]}"#)
                .unwrap();
        let calls = vec![
            linked("gateway", "api", 1, 1, true, None),
            linked("api", "db", 2, 2, true, Some(0)),
        ];
        let r = replay(&calls, &[], &capped);
        // Edges by name: api -> db, then gateway -> api.
        let (db, api) = (&r.edges[0], &r.edges[1]);
        assert_eq!(
            (db.counts.successes_lost, db.counts.successes_lost_below),
            (1.0, 0.0)
        );
        assert_eq!(
            (api.counts.successes_lost, api.counts.successes_lost_below),
            (0.0, 1.0)
        );
        assert_eq!(api.success_rate_replayed, Some(0.0));
        assert_eq!(r.totals.counts.successes_lost_below, 1.0);
        // Made for gateway's first of two attempts: that attempt failed as observed.
        let calls = vec![
            linked("gateway", "api", 1, 2, true, None),
            linked("api", "db", 2, 2, true, Some(0)),
        ];
        let r = replay(&calls, &[], &capped);
        assert_eq!(r.edges[1].counts.successes_lost_below, 0.0);
        assert_eq!(r.edges[1].success_rate_replayed, Some(1.0));
    }

    fn policy(max_attempts: u32, ratio: Option<f64>) -> Policy {
        let ratio = ratio.map_or("null".to_owned(), |r| r.to_string());
        Policy::parse(&format!(
            r#"{{"edges": [{{"caller": "order", "callee": "db", "operation": "SELECT",
                "max_attempts": {max_attempts}, "retry_budget_ratio": {ratio}}}]}}"#
        ))
        .unwrap()
    }

    /// Ten calls a second apart (one budget window): six answered first, two on the second
    /// attempt, one on the fourth, one failing after four. Capped at 2 attempts: the two
    /// 4-attempt calls lose 2 retries each and the fourth-attempt success is lost. A 10%
    /// budget then deposits 0.1 a call: the first retry it covers is the tenth call's, so
    /// the three calls before it lose theirs, and the two a retry saved their success.
    #[test]
    fn caps_then_budget() {
        let mut calls: Vec<CallRow> = (0..6).map(|i| call(1, true, i)).collect();
        calls.push(call(2, true, 6));
        calls.push(call(2, true, 7));
        calls.push(call(4, true, 8));
        calls.push(call(4, false, 9));
        let r = replay(&calls, &[], &policy(2, None));
        let e = &r.edges[0];
        assert_eq!(
            (
                e.counts.calls,
                e.counts.attempts,
                e.counts.attempts_replayed
            ),
            (10.0, 18.0, 14.0)
        );
        assert_eq!(e.counts.retries_dropped, 4.0);
        assert_eq!(e.counts.successes_lost, 1.0);
        let r = replay(&calls, &[], &policy(2, Some(0.1)));
        let e = &r.edges[0];
        assert_eq!(e.counts.retries_dropped_by_budget, 3.0);
        assert_eq!(e.counts.attempts_replayed, 11.0);
        assert!((e.counts.successes_lost - 3.0).abs() < 1e-12);
        assert_eq!(e.success_rate, Some(0.9));
        assert!((e.success_rate_replayed.unwrap() - 0.6).abs() < 1e-12);
        assert_eq!((e.retries, e.retries_replayed), (8.0, 1.0));
        // Where the retries fall matters, not only how many: the same calls with the
        // 2-attempt ones first, and the window then forgotten (each call 20 s apart).
        let spread: Vec<CallRow> = (0..10)
            .map(|i| {
                let (attempts, ok) = [(2, true), (2, true), (1, true), (1, true), (1, true)][i % 5];
                call(attempts, ok, 20 * i as i64)
            })
            .collect();
        let r = replay(&spread, &[], &policy(2, Some(0.1)));
        assert_eq!(
            r.edges[0].counts.retries_dropped_by_budget, 4.0,
            "none covered"
        );
        let r = replay(&spread, &[], &policy(2, Some(1.0)));
        assert_eq!(r.edges[0].counts.retries_dropped_by_budget, 0.0);
        // An edge the policy does not name is replayed as observed.
        let r = replay(&calls, &[], &Policy::default());
        assert_eq!(r.edges[0].counts.retries_dropped, 0.0);
        assert_eq!(r.edges[0].max_attempts, None);
    }
}
