//! The advice ([`stormglass_analytics::advice`]) written where the knobs live: the budget
//! table `stormglass check-budget` reads, gRPC service configs (`methodConfig` with
//! `timeout` and `retryPolicy`, `retryThrottling`) for a client's channel to each callee,
//! Envoy routes and clusters (`retry_policy`, `retry_budget`), Istio VirtualServices and
//! DestinationRules, Gateway API HTTPRoutes (with the experimental
//! `XBackendTrafficPolicy.retryConstraint`) and Linkerd's annotations.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};
use stormglass_analytics::advice::{Advice, EdgeAdvice, worst_ms};
use stormglass_analytics::policy::min_retry_concurrency;

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
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        sequential: &'a BTreeMap<String, Vec<String>>,
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
    let file = FileOut {
        edges,
        sequential: &advice.sequential,
    };
    text + &serde_saphyr::to_string(&file).unwrap_or_default()
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

/// An operation as a route matches it: a gRPC method's path, an HTTP route without
/// parameters as its path; `None` for the rest (a templated route, a database's
/// statement: the callee's catch-all).
fn route_path(operation: &str) -> Option<String> {
    if let Some((service, method)) = grpc_name(operation) {
        return Some(format!("/{service}/{method}"));
    }
    let path = operation.rsplit(' ').next().unwrap_or(operation);
    (path.starts_with('/') && !path.contains(['{', ':', '*'])).then(|| path.to_owned())
}

/// The HTTP method an operation names (`POST /orders`), where it is one the route APIs
/// can match on: `GET /orders` and `POST /orders` share a path, and a route by path alone
/// would give the write the read's retries.
fn route_method(operation: &str) -> Option<&str> {
    const METHODS: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    let (method, _) = operation.split_once(' ')?;
    METHODS.contains(&method).then_some(method)
}

/// One route of a callee, as Envoy, Istio and Gateway API write it.
struct Route<'a> {
    name: String,
    /// The exact path it matches, with the method where the operation names one; `None`:
    /// the catch-all.
    path: Option<String>,
    method: Option<&'a str>,
    advice: Cow<'a, EdgeAdvice>,
    /// The operation whose traffic it carries, where it is one (the tag on its spans).
    operation: Option<&'a str>,
}

/// A callee's operations as routes: one per operation with a path of its own, then one
/// catch-all for those without (last: routes are tried in order, and a catch-all before
/// another route would take its traffic). A catch-all serving several operations takes
/// their [`shared`] advice.
fn routes<'a>(ops: &[&'a EdgeAdvice]) -> Vec<Route<'a>> {
    let mut out = Vec::new();
    let mut rest: Vec<&'a EdgeAdvice> = Vec::new();
    for &e in ops {
        match route_path(&e.operation) {
            Some(path) => out.push(Route {
                name: e.operation.clone(),
                path: Some(path),
                method: route_method(&e.operation),
                advice: Cow::Borrowed(e),
                operation: Some(&e.operation),
            }),
            None => rest.push(e),
        }
    }
    let name = match rest.as_slice() {
        [] => return out,
        [one] => one.operation.clone(),
        [first, more @ ..] => format!("{} (+{} more)", first.operation, more.len()),
    };
    if let Some(advice) = shared(&rest) {
        out.push(Route {
            name,
            path: None,
            method: None,
            operation: (rest.len() == 1).then(|| rest[0].operation.as_str()),
            advice,
        });
    }
    out
}

/// One setting for several operations (a catch-all route, a Service's annotations): the
/// fewest attempts and the longest timeout among them, so no operation's healthy calls
/// are cut by a timeout sized for a faster one.
fn shared<'a>(ops: &[&'a EdgeAdvice]) -> Option<Cow<'a, EdgeAdvice>> {
    let fewest = *ops.iter().min_by_key(|e| e.max_attempts)?;
    let longest = ops.iter().filter_map(|e| e.timeout_ms).reduce(f64::max);
    if fewest.timeout_ms == longest {
        return Some(Cow::Borrowed(fewest));
    }
    let mut merged = fewest.clone();
    merged.timeout_ms = longest;
    Some(Cow::Owned(merged))
}

/// What a retry may be attempted on: `UNAVAILABLE` for gRPC, for HTTP a refused or reset
/// connection and 503, the failures a retry can change.
fn retry_on(operation: &str) -> &'static str {
    if grpc_name(operation).is_some() {
        "unavailable"
    } else {
        "connect-failure,refused-stream,reset,retriable-status-codes"
    }
}

/// The whole call's deadline: every advised attempt timing out, with the backoffs.
fn deadline_ms(e: &EdgeAdvice, timeout: f64) -> f64 {
    worst_ms(e.max_attempts, timeout, e.backoff.initial_ms)
}

/// Concurrent retries the budget's floor allows (`replay --budget-as envoy` holds them
/// to the same number).
fn min_concurrency(e: &EdgeAdvice) -> u32 {
    min_retry_concurrency(e.retry_budget_min_per_second, e.timeout_ms)
}

/// Per (caller, callee): the caller's Envoy routes to the callee, its [`routes`]
/// (`route.timeout`, the call's deadline; `retry_policy` with `num_retries`,
/// `per_try_timeout` and exponential `retry_back_off`), and the callee's cluster with its
/// `retry_budget` (`budget_percent`, `min_retry_concurrency`), in Envoy's v3 JSON names.
pub fn envoy(advice: &Advice) -> Value {
    let mut out = Vec::new();
    for ((caller, callee), ops) in by_pair(advice) {
        let mut entries = Vec::new();
        // The largest retry budget of the retrying routes: (ratio, floor).
        let mut budget: Option<(f64, u32)> = None;
        let timed: Vec<&EdgeAdvice> = ops.into_iter().filter(|e| e.timeout_ms.is_some()).collect();
        for r in routes(&timed) {
            let e: &EdgeAdvice = &r.advice;
            let timeout = e.timeout_ms.unwrap_or_default();
            let mut matcher = match &r.path {
                Some(path) => json!({"path": path}),
                None => json!({"prefix": "/"}),
            };
            if let Some(method) = r.method {
                matcher["headers"] =
                    json!([{"name": ":method", "string_match": {"exact": method}}]);
            }
            let mut route =
                json!({"cluster": callee, "timeout": duration(deadline_ms(e, timeout))});
            if e.max_attempts > 1 {
                let mut policy = json!({
                    "retry_on": retry_on(&e.operation),
                    "num_retries": e.max_attempts - 1,
                    "per_try_timeout": duration(timeout),
                    "retry_back_off": {
                        "base_interval": duration(e.backoff.initial_ms),
                        "max_interval": duration(e.backoff.max_ms),
                    },
                });
                if grpc_name(&e.operation).is_none() {
                    policy["retriable_status_codes"] = json!([503]);
                }
                route["retry_policy"] = policy;
                budget = Some(match budget {
                    Some((ratio, floor)) if ratio >= e.retry_budget_ratio => (ratio, floor),
                    _ => (e.retry_budget_ratio, min_concurrency(e)),
                });
            }
            let mut entry = json!({"name": r.name, "match": matcher, "route": route});
            // Envoy's upstream spans are named after the cluster; a route's custom tags
            // land on them, so the next traffic's edges keep the operation it guards (a
            // catch-all of several operations tags none: it would merge them).
            if let Some(operation) = r.operation {
                entry["tracing"] = json!({"custom_tags": [
                    {"tag": "http.route", "literal": {"value": operation}}
                ]});
            }
            entries.push(entry);
        }
        if entries.is_empty() {
            continue;
        }
        let mut cluster = json!({"name": callee});
        if let Some((ratio, floor)) = budget {
            cluster["circuit_breakers"] = json!({"thresholds": [{"retry_budget": {
                "budget_percent": {"value": ratio * 100.0},
                "min_retry_concurrency": floor,
            }}]});
        }
        out.push(
            json!({"caller": caller, "callee": callee, "routes": entries, "cluster": cluster}),
        );
    }
    Value::Array(out)
}

/// Kubernetes objects, one per callee: `metadata.name` is the callee's service name.
fn object(api_version: &str, kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec})
}

/// The advised edges by callee: the mesh's routes and policies belong to the callee's
/// service, whichever caller sends ([`per_operation`]).
fn by_callee(advice: &Advice) -> BTreeMap<&str, Vec<&EdgeAdvice>> {
    let mut callees: BTreeMap<&str, Vec<&EdgeAdvice>> = BTreeMap::new();
    for e in advice.edges.iter().filter(|e| e.timeout_ms.is_some()) {
        callees.entry(&e.callee).or_default().push(e);
    }
    callees
}

/// Per operation of a callee, the advice its route serves every caller with: the
/// callers' [`shared`] advice (the fewest attempts any was advised, the longest timeout: a
/// timeout sized for one caller's faster calls would cut another's, and a caller whose
/// budget needs less keeps its own deadline).
fn per_operation<'a>(ops: &[&'a EdgeAdvice]) -> Vec<Cow<'a, EdgeAdvice>> {
    let mut by_op: BTreeMap<&str, Vec<&'a EdgeAdvice>> = BTreeMap::new();
    for &e in ops {
        by_op.entry(&e.operation).or_default().push(e);
    }
    by_op
        .into_values()
        .filter_map(|callers| shared(&callers))
        .collect()
}

/// Istio: per callee a VirtualService, its [`routes`] as `http` rules (`timeout`,
/// `retries` with `attempts` (the retries), `perTryTimeout` and `retryOn`) and, where it
/// retries, a DestinationRule with `trafficPolicy.retryBudget` (`percent`,
/// `minRetryConcurrency`).
pub fn istio(advice: &Advice) -> Vec<Value> {
    let mut out = Vec::new();
    for (callee, ops) in by_callee(advice) {
        let mut http = Vec::new();
        // The last retrying route's retry budget: (ratio, floor).
        let mut budget: Option<(f64, u32)> = None;
        let merged = per_operation(&ops);
        for r in routes(&merged.iter().map(AsRef::as_ref).collect::<Vec<_>>()) {
            let e: &EdgeAdvice = &r.advice;
            let timeout = e.timeout_ms.unwrap_or_default();
            let mut rule = json!({
                "name": r.name,
                "route": [{"destination": {"host": callee}}],
                "timeout": duration(deadline_ms(e, timeout)),
            });
            if let Some(path) = &r.path {
                let mut matcher = json!({"uri": {"exact": path}});
                if let Some(method) = r.method {
                    matcher["method"] = json!({"exact": method});
                }
                rule["match"] = json!([matcher]);
            }
            rule["retries"] = if e.max_attempts > 1 {
                budget = Some((e.retry_budget_ratio, min_concurrency(e)));
                json!({
                    "attempts": e.max_attempts - 1,
                    "perTryTimeout": duration(timeout),
                    "retryOn": retry_on(&e.operation).replace("retriable-status-codes", "503"),
                })
            } else {
                json!({"attempts": 0})
            };
            http.push(rule);
        }
        out.push(object(
            "networking.istio.io/v1",
            "VirtualService",
            callee,
            json!({"hosts": [callee], "http": http}),
        ));
        if let Some((ratio, floor)) = budget {
            out.push(object(
                "networking.istio.io/v1",
                "DestinationRule",
                callee,
                json!({"host": callee, "trafficPolicy": {"retryBudget": {
                    "percent": ratio * 100.0,
                    "minRetryConcurrency": floor,
                }}}),
            ));
        }
    }
    out
}

/// Gateway API durations: whole milliseconds (`285ms`).
fn gateway_duration(ms: f64) -> String {
    format!("{}ms", ms.ceil() as u64)
}

/// Gateway API: per callee an HTTPRoute attached to the mesh (`parentRefs` to the
/// callee's Service, GAMMA), a rule per route ([`routes`]) with `timeouts` (`request`:
/// the call's deadline, `backendRequest`: one try's) and, where it retries, `retry`
/// (`attempts`, `backoff`, 503); and the experimental `XBackendTrafficPolicy` with `retryConstraint`
/// (`budget.percent`, `minRetryRate`).
pub fn gateway_api(advice: &Advice) -> Vec<Value> {
    let mut out = Vec::new();
    for (callee, ops) in by_callee(advice) {
        let service_ref = json!({"group": "", "kind": "Service", "name": callee});
        let mut rules = Vec::new();
        // The last retrying rule's retry budget: (ratio, floor per second).
        let mut budget: Option<(f64, f64)> = None;
        let merged = per_operation(&ops);
        for r in routes(&merged.iter().map(AsRef::as_ref).collect::<Vec<_>>()) {
            let e: &EdgeAdvice = &r.advice;
            let timeout = e.timeout_ms.unwrap_or_default();
            let mut rule = json!({
                "backendRefs": [{"name": callee, "port": 80}],
                "timeouts": {
                    "request": gateway_duration(deadline_ms(e, timeout)),
                    "backendRequest": gateway_duration(timeout),
                },
            });
            if let Some(path) = &r.path {
                let mut matcher = json!({"path": {"type": "Exact", "value": path}});
                if let Some(method) = r.method {
                    matcher["method"] = json!(method);
                }
                rule["matches"] = json!([matcher]);
            }
            if e.max_attempts > 1 {
                budget = Some((e.retry_budget_ratio, e.retry_budget_min_per_second));
                rule["retry"] = json!({
                    "attempts": e.max_attempts - 1,
                    "backoff": gateway_duration(e.backoff.initial_ms),
                    "codes": [503],
                });
            }
            rules.push(rule);
        }
        out.push(object(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            callee,
            json!({"parentRefs": [service_ref.clone()], "rules": rules}),
        ));
        if let Some((ratio, floor)) = budget {
            out.push(object(
                "gateway.networking.x-k8s.io/v1alpha1",
                "XBackendTrafficPolicy",
                callee,
                json!({"targetRefs": [service_ref], "retryConstraint": {
                    "budget": {"percent": (ratio * 100.0).round() as u32, "interval": "10s"},
                    "minRetryRate": {"count": floor.ceil() as u32, "interval": "1s"},
                }}),
            ));
        }
    }
    out
}

/// Linkerd: per callee the annotations of its Service (as Linkerd documents them for
/// retries and timeouts on a Service or route): `retry.linkerd.io/http` (or `/grpc`),
/// `retry.linkerd.io/limit` (retries), `retry.linkerd.io/timeout` (per try) and
/// `timeout.linkerd.io/request` (the call): a Service's annotations serve all its
/// operations and callers, so they take the [`shared`] advice of all.
/// Linkerd's annotations have no retry budget: its retries are bounded by `limit`.
pub fn linkerd(advice: &Advice) -> Vec<Value> {
    let mut out = Vec::new();
    for (callee, ops) in by_callee(advice) {
        let Some(shared) = shared(&ops) else {
            continue;
        };
        let e: &EdgeAdvice = &shared;
        let timeout = e.timeout_ms.unwrap_or_default();
        let mut annotations = serde_json::Map::new();
        annotations.insert(
            "timeout.linkerd.io/request".into(),
            json!(gateway_duration(deadline_ms(e, timeout))),
        );
        if e.max_attempts > 1 {
            let (key, on) = if grpc_name(&e.operation).is_some() {
                ("retry.linkerd.io/grpc", "unavailable")
            } else {
                ("retry.linkerd.io/http", "5xx")
            };
            annotations.insert(key.into(), json!(on));
            annotations.insert(
                "retry.linkerd.io/limit".into(),
                json!((e.max_attempts - 1).to_string()),
            );
            annotations.insert(
                "retry.linkerd.io/timeout".into(),
                json!(gateway_duration(timeout)),
            );
        }
        out.push(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": callee, "annotations": annotations}}));
    }
    out
}

/// Kubernetes objects as one YAML stream.
pub fn yaml_documents(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_saphyr::to_string(o).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n")
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
        assert_eq!(route_path("GET /orders").as_deref(), Some("/orders"));
        assert_eq!(route_path("/items/{id}"), None);
        assert_eq!(route_method("POST /orders"), Some("POST"));
        assert_eq!(route_method("SELECT stock"), None);
        assert_eq!(duration(450.0), "0.450s");
    }

    fn edge(operation: &str, attempts: u32, timeout_ms: f64) -> EdgeAdvice {
        EdgeAdvice {
            caller: "web".into(),
            callee: "items".into(),
            operation: operation.into(),
            timeout_ms: Some(timeout_ms),
            timeout_source: Some("p999"),
            max_attempts: attempts,
            attempts_reason: String::new(),
            backoff: stormglass_analytics::advice::Backoff {
                initial_ms: 10.0,
                max_ms: timeout_ms,
                multiplier: 2.0,
                jitter: "full",
            },
            retry_budget_ratio: if attempts > 1 { 0.2 } else { 0.0 },
            retry_budget_min_per_second: if attempts > 1 { 1.0 } else { 0.0 },
            reasons: Vec::new(),
        }
    }

    /// A callee read (GET) and written (POST) on one path, and two templated operations:
    /// each route matches its method, so the write never takes the read's retries, and
    /// the templated ones share one catch-all, last (a catch-all first would take every
    /// route's traffic), with the fewest attempts and the longest timeout of the two.
    #[test]
    fn routes_match_methods_and_end_with_one_catch_all() {
        let advice = Advice {
            edges: vec![
                edge("DELETE /items/{id}", 1, 400.0),
                edge("GET /items", 3, 100.0),
                edge("GET /items/{id}", 3, 50.0),
                edge("POST /items", 1, 200.0),
            ],
            ..Advice::default()
        };
        let envoy = envoy(&advice);
        let routes = envoy[0]["routes"].as_array().unwrap();
        let names: Vec<&str> = routes.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["GET /items", "POST /items", "DELETE /items/{id} (+1 more)"]
        );
        let method = |r: &Value| r["match"]["headers"][0]["string_match"]["exact"].clone();
        assert_eq!(method(&routes[0]), "GET");
        assert_eq!(method(&routes[1]), "POST");
        assert!(
            routes[1]["route"].get("retry_policy").is_none(),
            "{envoy:#}"
        );
        let catch_all = &routes[2];
        assert_eq!(catch_all["match"], json!({"prefix": "/"}));
        assert!(
            catch_all["route"].get("retry_policy").is_none(),
            "{envoy:#}"
        );
        assert_eq!(catch_all["route"]["timeout"], "0.400s");
        assert!(
            catch_all.get("tracing").is_none(),
            "merges two operations' spans"
        );
        assert_eq!(
            routes[0]["tracing"]["custom_tags"][0]["literal"]["value"],
            "GET /items"
        );

        let istio = istio(&advice);
        let http = istio[0]["spec"]["http"].as_array().unwrap();
        assert_eq!(http.len(), 3);
        assert_eq!(http[1]["match"][0]["method"]["exact"], "POST");
        assert_eq!(http[1]["retries"]["attempts"], 0);
        assert!(http[2].get("match").is_none(), "the catch-all is last");
        assert_eq!(http[2]["timeout"], "0.400s");

        let gateway = gateway_api(&advice);
        let rules = gateway[0]["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules[0]["matches"][0]["method"], "GET");
        assert_eq!(rules[2]["timeouts"]["request"], "400ms");
        assert!(rules[2].get("matches").is_none());
    }

    /// Two callers of one operation: its route serves both, with the fewer attempts and
    /// the longer timeout (the shorter would cut the slower caller's healthy calls).
    #[test]
    fn a_route_serves_every_caller_with_the_longer_timeout() {
        let mut batch = edge("GET /items", 3, 500.0);
        batch.caller = "batch".into();
        let advice = Advice {
            edges: vec![batch, edge("GET /items", 1, 100.0)],
            ..Advice::default()
        };
        let istio = istio(&advice);
        let http = &istio[0]["spec"]["http"][0];
        assert_eq!(http["retries"]["attempts"], 0, "{istio:#?}");
        assert_eq!(http["timeout"], "0.500s");
        let gateway = gateway_api(&advice);
        let rule = &gateway[0]["spec"]["rules"][0];
        assert_eq!(rule["timeouts"]["backendRequest"], "500ms", "{gateway:#?}");
    }

    /// A Service's Linkerd annotations serve a fast and a slow operation: the slow one's
    /// timeout, so its healthy calls are not cut at the fast one's.
    #[test]
    fn linkerd_annotations_keep_the_slowest_operation() {
        let advice = Advice {
            edges: vec![edge("GET /fast", 3, 71.0), edge("GET /slow", 3, 1950.0)],
            ..Advice::default()
        };
        let linkerd = linkerd(&advice);
        let annotations = &linkerd[0]["metadata"]["annotations"];
        assert_eq!(
            annotations["retry.linkerd.io/timeout"], "1950ms",
            "{linkerd:#?}"
        );
        assert_eq!(annotations["retry.linkerd.io/limit"], "2");
    }
}
