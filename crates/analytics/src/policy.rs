//! A retry policy to predict or replay: per edge its attempts, per-try timeout, retry budget
//! (a rate, as Linkerd runs it, or on retries in flight, as Envoy does) or token bucket, as
//! `stormglass advise --format json` writes it and `whatif`, `replay` and the demo read it.

use std::collections::HashMap;

use serde::Deserialize;

/// A retry policy to predict or replay: per edge its attempts and retry budget, read from
/// the JSON `stormglass advise --format json` writes (other fields are ignored, so an
/// edited or hand-written file needs only these).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Policy {
    pub edges: Vec<PolicyEdge>,
    /// Each (caller, callee, operation)'s first entry in `edges`: one lookup per call
    /// replayed, not a scan of the policy.
    #[serde(skip)]
    index: HashMap<(String, String, String), usize>,
}

/// One edge of a [`Policy`].
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct PolicyEdge {
    pub caller: String,
    pub callee: String,
    /// The operation; `*` (or absent) for every operation of the caller and callee.
    #[serde(default = "any_operation")]
    pub operation: String,
    pub max_attempts: u32,
    /// Per attempt; absent, as observed (`stormglass demo --policy` sets it).
    #[serde(default)]
    pub timeout_ms: Option<f64>,
    /// Retries at most this share of the calls; absent, no budget.
    #[serde(default)]
    pub retry_budget_ratio: Option<f64>,
    /// Retries allowed per second whatever the ratio.
    #[serde(default)]
    pub retry_budget_min_per_second: Option<f64>,
    /// Where set, the budget holds concurrent retries as Envoy's and Istio's `retry_budget`
    /// does (`retry_budget_ratio` of the requests in flight, at least this many), not a
    /// share of the calls over time.
    #[serde(default)]
    pub min_retry_concurrency: Option<u32>,
    /// gRPC's `retryThrottling`, where the client throttles with a token bucket instead.
    #[serde(default)]
    pub retry_throttling: Option<Throttling>,
}

impl PolicyEdge {
    /// Its retry budget read as a rate, where it sets either half (the other read as 0):
    /// `retry_budget_ratio` of the calls and `retry_budget_min_per_second` on top.
    pub fn rate_budget(&self) -> Option<RateBudget> {
        match (self.retry_budget_ratio, self.retry_budget_min_per_second) {
            (None, None) => None,
            (ratio, floor) => Some(RateBudget {
                ratio: ratio.unwrap_or(0.0),
                floor: floor.unwrap_or(0.0),
            }),
        }
    }
}

/// A retry budget as a rate, as Linkerd's `retryBudget` runs it: `ratio` of the calls, and
/// `floor` retries a second on top of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateBudget {
    pub ratio: f64,
    pub floor: f64,
}

impl RateBudget {
    /// The retries per call it allows at `calls_per_second`: the ratio + the floor over the
    /// rate; the ratio alone where the rate is unknown, every retry where there are no
    /// calls.
    pub fn per_call(self, calls_per_second: Option<f64>) -> f64 {
        match calls_per_second {
            Some(_) if self.floor == 0.0 => self.ratio,
            Some(rate) if rate > 0.0 => self.ratio + self.floor / rate,
            Some(_) => f64::INFINITY,
            None => self.ratio,
        }
    }
}

/// gRPC's retry throttling: tokens start at `max_tokens`; a failed attempt takes one, a
/// success gives back `token_ratio` (up to `max_tokens`); no retry is sent while the tokens
/// are at or below half of `max_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct Throttling {
    pub max_tokens: f64,
    pub token_ratio: f64,
}

fn any_operation() -> String {
    "*".to_owned()
}

impl Policy {
    /// Read a policy file (JSON), saying what is wrong and where.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let mut policy: Policy = serde_json::from_str(text).map_err(|e| {
            format!("not a policy (the JSON of `stormglass advise --format json`): {e}")
        })?;
        for (i, e) in policy.edges.iter().enumerate() {
            let key = (e.caller.clone(), e.callee.clone(), e.operation.clone());
            policy.index.entry(key).or_insert(i);
        }
        if let Some(e) = policy.edges.iter().find(|e| e.max_attempts == 0) {
            return Err(format!(
                "{} -> {} {}: max_attempts must be at least 1",
                e.caller, e.callee, e.operation
            ));
        }
        Ok(policy)
    }

    /// The policy as Envoy and Istio would run it: each retry budget holds concurrent
    /// retries, at least [`min_retry_concurrency`] of them where the edge names no
    /// `min_retry_concurrency` (as `advise --format envoy` and `istio` emit it).
    pub fn with_concurrency_budgets(mut self) -> Policy {
        for e in &mut self.edges {
            if e.retry_budget_ratio.is_some() || e.retry_budget_min_per_second.is_some() {
                e.min_retry_concurrency.get_or_insert_with(|| {
                    min_retry_concurrency(
                        e.retry_budget_min_per_second.unwrap_or(0.0),
                        e.timeout_ms,
                    )
                });
            }
        }
        self
    }

    /// The policy of an edge: its operation's entry, else the caller and callee's `*`.
    pub fn edge(&self, caller: &str, callee: &str, operation: &str) -> Option<&PolicyEdge> {
        let of = |op: &str| {
            let key = (caller.to_owned(), callee.to_owned(), op.to_owned());
            self.index.get(&key).map(|&i| &self.edges[i])
        };
        of(operation).or_else(|| of("*"))
    }
}

/// Concurrent retries a budget's floor allows: its rate over a try's timeout (Little's
/// law; 1 s where none is known), at least 1, as Envoy's and Istio's
/// `min_retry_concurrency` counts them.
pub fn min_retry_concurrency(min_per_second: f64, timeout_ms: Option<f64>) -> u32 {
    let seconds = timeout_ms.unwrap_or(1000.0) / 1e3;
    ((min_per_second * seconds).ceil() as u32).max(1)
}
