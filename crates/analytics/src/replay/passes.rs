//! The passes that replay attempt by attempt in time, as the client or proxy runs them:
//! gRPC's token bucket and Envoy's concurrency budget.

use std::collections::HashMap;

use super::{AttemptRow, Budget, CallRow, Key, Plan, key_of, name};
use crate::policy::Policy;

/// Per throttled edge, its attempts replayed through the token bucket, and the successes
/// it loses (calls whose success came on a retry the bucket holds back).
pub(super) fn throttled(
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
pub(super) fn concurrent(
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
