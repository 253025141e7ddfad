//! The advice ([`stormglass_analytics::advice`]) written where the knobs live: the budget
//! table `stormglass check-budget` reads, and gRPC service configs (`methodConfig` with
//! `timeout` and `retryPolicy`, `retryThrottling`) for a client's channel to each callee.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};
use stormglass_analytics::advice::{Advice, EdgeAdvice, worst_ms};

/// Seconds as protobuf's Duration JSON writes them (`0.450s`).
fn duration(ms: f64) -> String {
    format!("{:.3}s", ms / 1e3)
}

/// The edges of `advice` by (caller, callee): a budget table and a channel's service
/// config each describe one client of one callee.
fn by_pair(advice: &Advice) -> BTreeMap<(&str, &str), Vec<&EdgeAdvice>> {
    let mut pairs: BTreeMap<(&str, &str), Vec<&EdgeAdvice>> = BTreeMap::new();
    for e in &advice.edges {
        pairs.entry((&e.caller, &e.callee)).or_default().push(e);
    }
    pairs
}

/// The budget table of `stormglass check-budget` (YAML): per (caller, callee), the longest
/// advised timeout of its operations, their most attempts and the backoff before the first
/// retry. Edges without a timeout (nothing measured them) are left out, and said so.
pub fn budget_file(advice: &Advice) -> String {
    #[derive(Serialize)]
    struct EdgeOut<'a> {
        caller: &'a str,
        callee: &'a str,
        timeout: String,
        attempts: u32,
        backoff: String,
    }
    #[derive(Serialize)]
    struct FileOut<'a> {
        edges: Vec<EdgeOut<'a>>,
    }
    let mut edges = Vec::new();
    let mut unmeasured = Vec::new();
    for ((caller, callee), ops) in by_pair(advice) {
        let timeout = ops
            .iter()
            .filter_map(|e| e.timeout_ms)
            .fold(None, |m, t| Some(m.map_or(t, |m: f64| m.max(t))));
        let Some(timeout) = timeout else {
            unmeasured.push(format!("{caller} -> {callee}"));
            continue;
        };
        let attempts = ops.iter().map(|e| e.max_attempts).max().unwrap_or(1);
        let backoff = ops.iter().map(|e| e.backoff.initial_ms).fold(0.0, f64::max);
        edges.push(EdgeOut {
            caller,
            callee,
            timeout: format!("{timeout}ms"),
            attempts,
            backoff: format!("{backoff}ms"),
        });
    }
    let mut text = String::from(
        "# Written by `stormglass advise --format budget`: each edge's advised timeout (per\n\
         # attempt), attempts and first backoff. Check it with `stormglass check-budget FILE`.\n",
    );
    if !unmeasured.is_empty() {
        text.push_str(&format!(
            "# Left out, no duration measured: {}\n",
            unmeasured.join(", ")
        ));
    }
    text + &serde_saphyr::to_string(&FileOut { edges }).unwrap_or_default()
}

/// A gRPC operation's `service` and `method` (`pkg.Service/Method`, with or without a
/// leading slash); other operations (HTTP routes) have none.
fn grpc_name(operation: &str) -> Option<(&str, &str)> {
    let (service, method) = operation.trim_start_matches('/').split_once('/')?;
    (service.contains('.') && !method.is_empty() && !method.contains('/'))
        .then_some((service, method))
}

/// One service config per (caller, callee) with gRPC operations, as the caller's channel
/// to the callee takes it (`grpc.service_config`): a `methodConfig` per operation with its
/// deadline (gRPC has no per-attempt timeout: the worst case of the advised attempts) and,
/// where it retries, a `retryPolicy` (exponential backoff from the advice,
/// retrying `UNAVAILABLE` only: the status a retry can change); and `retryThrottling`
/// sized from the retry budget (a token per failure, `tokenRatio` per success: retries stop
/// while fewer than half of `maxTokens` remain).
pub fn grpc_service_configs(advice: &Advice) -> Value {
    let mut out = serde_json::Map::new();
    for ((caller, callee), ops) in by_pair(advice) {
        let mut methods = Vec::new();
        let mut ratio: f64 = 0.0;
        let mut floor: f64 = 0.0;
        for e in &ops {
            let Some((service, method)) = grpc_name(&e.operation) else {
                continue;
            };
            let mut config = json!({"name": [{"service": service, "method": method}]});
            // gRPC's timeout is the whole call's deadline, retries included: the worst case
            // of the advised attempts.
            if let Some(t) = e.timeout_ms {
                let worst = worst_ms(e.max_attempts, t, e.backoff.initial_ms);
                config["timeout"] = json!(duration(worst));
            }
            if e.max_attempts > 1 {
                config["retryPolicy"] = json!({
                    "maxAttempts": e.max_attempts,
                    "initialBackoff": duration(e.backoff.initial_ms),
                    "maxBackoff": duration(e.backoff.max_ms),
                    "backoffMultiplier": e.backoff.multiplier,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                });
                ratio = ratio.max(e.retry_budget_ratio);
                floor = floor.max(e.retry_budget_min_per_second);
            }
            methods.push(config);
        }
        if methods.is_empty() {
            continue;
        }
        let mut config = json!({"methodConfig": methods});
        if ratio > 0.0 {
            // Tokens for ten seconds of the floor's retries, a whole number within gRPC's
            // 1..=1000 (grpcio refuses a config whose maxTokens has a fraction, even .0).
            let max_tokens = (floor * 10.0).clamp(1.0, 1000.0).round() as u32;
            config["retryThrottling"] = json!({"maxTokens": max_tokens, "tokenRatio": ratio});
        }
        out.insert(format!("{caller} -> {callee}"), config);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gRPC names come from `pkg.Service/Method` operations only.
    #[test]
    fn grpc_names() {
        assert_eq!(
            grpc_name("/inventory.Stock/Reserve"),
            Some(("inventory.Stock", "Reserve"))
        );
        assert_eq!(grpc_name("GET /items"), None);
        assert_eq!(grpc_name("/items/{id}"), None);
        assert_eq!(duration(450.0), "0.450s");
    }
}
