//! Replay: the observed logical calls again, under a retry policy ([`Policy`]): per edge the
//! retries the policy would have dropped, the successes that cost, and the load it saves.
//! The rules, as docs/advice.md states them:
//!
//! * an edge the policy names makes at most its `max_attempts`: a call that made more
//!   keeps that many, and one that succeeded only on a later attempt fails instead;
//! * its retries (after the cap) are then held to the budget over the calls' span of time:
//!   at most `retry_budget_ratio` x its calls, or `retry_budget_min_per_second` x the
//!   seconds, whichever allows more. Retries past it are dropped as a budget drops them,
//!   spread over the window: the calls saved by a retry lose their success in the same
//!   share;
//! * an edge whose policy throttles as gRPC does (`retry_throttling`) is replayed attempt
//!   by attempt in the order the calls started: each failed attempt takes a token, each
//!   success gives back `token_ratio`, and a retry goes only while the tokens are above
//!   half of `max_tokens` (and the attempts allow); a retry the calls did not make is taken
//!   to fail, as the attempt before it did;
//! * an edge the policy does not name is replayed as observed.
//!
//! Counts are sums of the calls' adjusted counts (sampling), as every figure's.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use datafusion::prelude::SessionContext;

use crate::advice::Policy;
use crate::engine::AnalysisError;
use crate::queries;
use crate::table::{rows, run};

/// One observed logical call, as `logical_calls` holds it.
#[derive(Clone, Debug, Deserialize)]
pub struct CallRow {
    pub caller: Option<String>,
    pub callee: Option<String>,
    pub operation: Option<String>,
    pub attempts: i64,
    pub final_outcome: Option<String>,
    pub weight: f64,
    pub start_ns: i64,
    pub end_ns: i64,
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
}

/// One edge replayed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EdgeReplay {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    /// The policy's attempts for the edge; null where the policy does not name it.
    pub max_attempts: Option<u32>,
    pub calls: f64,
    pub attempts: f64,
    pub attempts_replayed: f64,
    /// Retries the policy drops: past its attempts, then past its budget.
    pub retries_dropped: f64,
    pub retries_dropped_by_budget: f64,
    /// Calls that succeeded as observed and would fail under the policy.
    pub successes_lost: f64,
    pub success_rate: Option<f64>,
    pub success_rate_replayed: Option<f64>,
    /// Attempts saved, as a share of the attempts observed.
    pub load_saved: Option<f64>,
    /// Retries made and replayed (attempts past each call's first).
    pub retries: f64,
    pub retries_replayed: f64,
}

/// The replay of a set of calls.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Replay {
    /// The calls' span of time, the budget's window.
    pub seconds: f64,
    pub edges: Vec<EdgeReplay>,
}

#[derive(Default)]
struct Sums {
    calls: f64,
    attempts: f64,
    capped: f64,
    successes: f64,
    /// Successes on an attempt past the cap.
    lost_to_cap: f64,
    /// Successes within the cap that needed a retry.
    saved_by_retry: f64,
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
    type Key<'a> = (&'a str, &'a str, &'a str);
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

/// The traffic of `ctx` (an [`crate::engine::Engine::query_context`]) as [`replay`] reads
/// it under `policy`: every logical call, and attempt by attempt only when a token bucket
/// throttles some edge.
pub async fn traffic(
    ctx: &SessionContext,
    policy: &Policy,
) -> Result<(Vec<CallRow>, Vec<AttemptRow>), AnalysisError> {
    let calls = rows(&run(ctx, &queries::REPLAY_CALLS).await?);
    let throttles = policy.edges.iter().any(|e| e.retry_throttling.is_some());
    let attempts = if throttles {
        rows(&run(ctx, &queries::REPLAY_ATTEMPTS).await?)
    } else {
        Vec::new()
    };
    Ok((calls, attempts))
}

/// Replay `calls` under `policy`; `attempts` (in any order) for the edges it throttles as
/// gRPC does.
pub fn replay(calls: &[CallRow], attempts: &[AttemptRow], policy: &Policy) -> Replay {
    let throttled = throttled(attempts, policy);
    let start = calls.iter().map(|c| c.start_ns).min().unwrap_or(0);
    let end = calls.iter().map(|c| c.end_ns).max().unwrap_or(0);
    let seconds = (end - start).max(0) as f64 / 1e9;
    let mut sums: HashMap<(&str, &str, &str), Sums> = HashMap::new();
    for c in calls {
        let key = (name(&c.caller), name(&c.callee), name(&c.operation));
        let cap = policy
            .edge(key.0, key.1, key.2)
            .map_or(i64::MAX, |p| i64::from(p.max_attempts));
        let attempts = c.attempts.max(1);
        let ok = c.final_outcome.as_deref() == Some("ok");
        let s = sums.entry(key).or_default();
        s.calls += c.weight;
        s.attempts += attempts as f64 * c.weight;
        s.capped += attempts.min(cap) as f64 * c.weight;
        if ok {
            s.successes += c.weight;
            if attempts > cap {
                s.lost_to_cap += c.weight;
            } else if attempts > 1 {
                s.saved_by_retry += c.weight;
            }
        }
    }
    let mut edges: Vec<EdgeReplay> = sums
        .into_iter()
        .map(|((caller, callee, operation), s)| {
            let p = policy.edge(caller, callee, operation);
            let retries = s.capped - s.calls;
            let allowance = match p.map(|p| (p.retry_budget_ratio, p.retry_budget_min_per_second)) {
                None | Some((None, None)) => f64::INFINITY,
                Some((ratio, floor)) => {
                    (ratio.unwrap_or(0.0) * s.calls).max(floor.unwrap_or(0.0) * seconds)
                }
            };
            let by_budget = (retries - allowance).max(0.0);
            let held_back = ratio(by_budget, retries).unwrap_or(0.0);
            let mut lost = s.lost_to_cap + s.saved_by_retry * held_back;
            let mut replayed = s.capped - by_budget;
            let mut dropped_by_budget = by_budget;
            let key = (caller.to_owned(), callee.to_owned(), operation.to_owned());
            if let Some((sent, late)) = throttled.get(&key) {
                replayed = *sent;
                lost = *late;
                dropped_by_budget = (s.capped - sent).max(0.0);
            }
            EdgeReplay {
                caller: caller.to_owned(),
                callee: callee.to_owned(),
                operation: operation.to_owned(),
                max_attempts: p.map(|p| p.max_attempts),
                calls: s.calls,
                attempts: s.attempts,
                attempts_replayed: replayed,
                retries_dropped: s.attempts - replayed,
                retries_dropped_by_budget: dropped_by_budget,
                successes_lost: lost,
                success_rate: ratio(s.successes, s.calls),
                success_rate_replayed: ratio(s.successes - lost, s.calls),
                load_saved: ratio(s.attempts - replayed, s.attempts),
                retries: s.attempts - s.calls,
                retries_replayed: replayed - s.calls,
            }
        })
        .collect();
    edges.sort_by(|a, b| {
        (&a.caller, &a.callee, &a.operation).cmp(&(&b.caller, &b.callee, &b.operation))
    });
    Replay { seconds, edges }
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
        assert_eq!(e.successes_lost, 0.0);
        // Half the tokens: the bucket is at its threshold after the first failure.
        let tight = Policy::parse(
            r#"{"edges": [{"caller": "shop", "callee": "stock", "max_attempts": 3,
                "retry_throttling": {"max_tokens": 2, "token_ratio": 0.5}}]}"#,
        )
        .unwrap();
        let r = replay(&calls, &attempts, &tight);
        assert_eq!(r.edges[0].retries_replayed, 0.0, "{:?}", r.edges[0]);
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
        }
    }

    fn policy(max_attempts: u32, ratio: Option<f64>) -> Policy {
        let ratio = ratio.map_or("null".to_owned(), |r| r.to_string());
        Policy::parse(&format!(
            r#"{{"edges": [{{"caller": "order", "callee": "db", "operation": "SELECT",
                "max_attempts": {max_attempts}, "retry_budget_ratio": {ratio}}}]}}"#
        ))
        .unwrap()
    }

    /// Ten calls: six answered first, two on the second attempt, one on the fourth, one
    /// failing after four. Capped at 2 attempts: the two 4-attempt calls lose 2 retries
    /// each and the fourth-attempt success is lost; a 10% budget then allows 1 of the 4
    /// retries left: 3 more go, and 3/4 of the two calls a retry saved lose their success.
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
            (e.calls, e.attempts, e.attempts_replayed),
            (10.0, 18.0, 14.0)
        );
        assert_eq!(e.retries_dropped, 4.0);
        assert_eq!(e.successes_lost, 1.0);
        let r = replay(&calls, &[], &policy(2, Some(0.1)));
        let e = &r.edges[0];
        assert_eq!(e.retries_dropped_by_budget, 3.0);
        assert_eq!(e.attempts_replayed, 11.0);
        assert!((e.successes_lost - (1.0 + 2.0 * 0.75)).abs() < 1e-12);
        assert_eq!(e.success_rate, Some(0.9));
        assert!((e.success_rate_replayed.unwrap() - 0.65).abs() < 1e-12);
        assert_eq!((e.retries, e.retries_replayed), (8.0, 1.0));
        // An edge the policy does not name is replayed as observed.
        let r = replay(&calls, &[], &Policy::default());
        assert_eq!(r.edges[0].retries_dropped, 0.0);
        assert_eq!(r.edges[0].max_attempts, None);
    }
}
