//! End-to-end: `stormglass advise` on span files: retries kept at the deepest layer only,
//! the budget table it writes passes `check-budget`, and the gRPC service config it writes
//! is accepted and obeyed by a real grpcio channel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Server, get, post_traces, python, repo_root, stormglass, stormglass_exit, temp_dir};
use serde_json::{Value, json};
use stormglass_testkit::fixtures::{Id, Spans, grpc_status, peer, retry, route, template};
use stormglass_testkit::otlp::kv;

/// One checkout through `gateway` (ending at `gateway_end` ms) to `order` (at `end`):
/// `order`'s SERVER span, for the calls it makes.
fn checkout(s: &mut Spans, trace: u32, gateway_end: f64, end: f64) -> Id {
    let g = s
        .server(trace, "gateway", "GET /checkout")
        .at(0.0, gateway_end)
        .with(vec![route("/checkout")])
        .add();
    let c = s
        .client(trace, "gateway", "POST")
        .under(g)
        .at(1.0, end + 1.0)
        .with(vec![peer("order"), template("/orders"), retry(0)])
        .add();
    s.server(trace, "order", "POST /orders")
        .under(c)
        .at(2.0, end)
        .with(vec![route("/orders")])
        .add()
}

/// A gateway calls `order` over HTTP, which reserves stock at `inventory` over gRPC
/// (`demo.Inventory/Reserve`); one call in four fails UNAVAILABLE first and succeeds on
/// the retry. Both layers retry today; `inventory` calls no one.
fn two_retrying_layers(calls: u32) -> Spans {
    let mut s = Spans::default();
    for trace in 1..=calls {
        let o = checkout(&mut s, trace, 400.0, 299.0);
        let grpc = |s: &mut Spans, attempt: i64, at: f64, status: i64| {
            let a = s
                .client(trace, "order", "Reserve")
                .under(o)
                .at(at, at + 40.0)
                .with(vec![
                    kv("rpc.service", "demo.Inventory"),
                    kv("rpc.method", "Reserve"),
                    retry(attempt),
                    grpc_status(status),
                ])
                .add();
            s.server(trace, "inventory", "Reserve")
                .under(a)
                .at(at + 1.0, at + 39.0)
                .with(vec![
                    kv("rpc.service", "demo.Inventory"),
                    kv("rpc.method", "Reserve"),
                    grpc_status(status),
                ])
                .add();
        };
        if trace % 4 == 0 {
            grpc(&mut s, 0, 3.0, 14);
            grpc(&mut s, 1, 60.0, 0);
        } else {
            grpc(&mut s, 0, 3.0, 0);
        }
    }
    s
}

fn write(dir: &Path, spans: &Spans) -> String {
    let file = dir.join("spans.jsonl");
    common::write_jsonl(&file, spans, None);
    file.to_string_lossy().into_owned()
}

/// The advice keeps retries at `inventory` (it calls no one), takes them from
/// `gateway -> order`, sizes each timeout from the guarded operation's P99.9 and fits it
/// into what the caller has; the budget table passes `check-budget`; the text names why.
#[test]
fn advice_keeps_retries_at_the_deepest_layer() {
    let scratch = temp_dir("advise");
    let dir = scratch.path();
    let file = write(dir, &two_retrying_layers(40));
    let (ok, stdout, stderr) = stormglass(&["advise", "--format", "json", &file]);
    assert!(ok, "{stderr}");
    let advice: Value = serde_json::from_str(&stdout).unwrap();
    let order = advised_edge(&advice, "order");
    let inventory = advised_edge(&advice, "inventory");
    assert_eq!(order["max_attempts"], 1, "{order:#}");
    assert_eq!(order["retry_budget_ratio"], 0.0, "{order:#}");
    assert_eq!(inventory["operation"], "demo.Inventory/Reserve");
    assert_eq!(inventory["max_attempts"], 3, "{inventory:#}");
    // 38 ms of P99.9 x 1.5, and the callee's median before the first retry.
    assert_eq!(inventory["timeout_ms"], 57.0, "{inventory:#}");
    assert_eq!(inventory["timeout_source"], "p999");
    assert_eq!(inventory["backoff"]["initial_ms"], 38.0, "{inventory:#}");
    assert_eq!(inventory["backoff"]["jitter"], "full");
    // A quarter of the successful calls needed a retry: twice that, capped at 20%.
    assert_eq!(inventory["retry_budget_ratio"], 0.2, "{inventory:#}");
    assert!(inventory["retry_budget_min_per_second"].as_f64().unwrap() >= 1.0);
    let layer = |s: &str| advised_layer(&advice, s);
    // The ratio's 20% and the floor's as many again at the window's call rate.
    assert_eq!(layer("inventory")["amplification_advised"], 1.4);
    assert_eq!(layer("order")["amplification_advised"], 1.0);
    assert!(
        advice["findings"].as_array().unwrap().is_empty(),
        "{advice:#}"
    );

    let (ok, text, stderr) = stormglass(&["advise", &file]);
    assert!(ok, "{stderr}");
    assert!(text.contains("inventory calls no one"), "{text}");
    assert!(text.contains("Layers"), "{text}");

    let (ok, table, stderr) = stormglass(&["advise", "--format", "budget", &file]);
    assert!(ok, "{stderr}");
    let budget = dir.join("budget.yaml");
    std::fs::write(&budget, &table).unwrap();
    let (code, out, err) = stormglass_exit(&["check-budget", budget.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{table}\n{out}{err}");
}

/// `order` reserves stock at `inventory` (40 ms) and then, with `charge`, charges at
/// `payment` (150 ms), one after the other, for every request.
fn reserve_then_charge(charge: bool) -> Spans {
    let mut s = Spans::default();
    for trace in 1..=40 {
        let o = checkout(&mut s, trace, 210.0, 202.0);
        let calls = [
            ("inventory", "demo.Inventory", "Reserve", 5.0, 45.0),
            ("payment", "demo.Payment", "Charge", 50.0, 200.0),
        ];
        for (callee, service, method, from, to) in &calls[..if charge { 2 } else { 1 }] {
            let rpc = vec![kv("rpc.service", service), kv("rpc.method", method)];
            let a = s
                .client(trace, "order", method)
                .under(o)
                .at(*from, *to)
                .with(rpc.clone())
                .add();
            s.server(trace, callee, method)
                .under(a)
                .at(from + 1.0, to - 1.0)
                .with(rpc)
                .add();
        }
    }
    s
}

/// `advise --format json` over `spans`, written to `dir`.
fn advise_json(dir: &Path, spans: &Spans) -> Value {
    let file = write(dir, spans);
    let (ok, stdout, stderr) = stormglass(&["advise", "--format", "json", &file]);
    assert!(ok, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// The advice's layer `service`.
fn advised_layer(advice: &Value, service: &str) -> Value {
    (advice["layers"].as_array().unwrap().iter())
        .find(|l| l["service"] == service)
        .unwrap_or_else(|| panic!("no layer {service}: {advice:#}"))
        .clone()
}

/// The advised edge into `callee`.
fn advised_edge(advice: &Value, callee: &str) -> Value {
    (advice["edges"].as_array().unwrap().iter())
        .find(|e| e["callee"] == callee)
        .unwrap_or_else(|| panic!("no edge to {callee}: {advice:#}"))
        .clone()
}

/// Alone, `inventory` may try 3 times within what `order` has (its timeout, 300 ms); made
/// one after the other with `payment`, the two calls' worst cases must fit it together, so
/// `inventory` tries once; the budget table names the sequence and passes `check-budget`.
#[test]
fn sequential_calls_fit_the_callers_budget_together() {
    let scratch = temp_dir("advise-sequential");
    let dir = scratch.path();
    let alone = advise_json(dir, &reserve_then_charge(false));
    assert_eq!(
        advised_edge(&alone, "inventory")["max_attempts"],
        3,
        "{alone:#}"
    );
    assert!(alone.get("sequential").is_none(), "{alone:#}");

    let spans = reserve_then_charge(true);
    let advice = advise_json(dir, &spans);
    assert_eq!(
        advice["sequential"],
        json!({"order": ["inventory", "payment"]}),
        "{advice:#}"
    );
    let inventory = advised_edge(&advice, "inventory");
    assert_eq!(inventory["max_attempts"], 1, "{inventory:#}");
    assert!(
        (inventory["attempts_reason"].as_str().unwrap())
            .contains("order's calls to inventory, payment one after another fit"),
        "{inventory:#}"
    );
    assert!(
        advice["findings"].as_array().unwrap().is_empty(),
        "{advice:#}"
    );

    let file = write(dir, &spans);
    let (ok, text, stderr) = stormglass(&["advise", &file]);
    assert!(ok, "{stderr}");
    assert!(text.contains("\norder: inventory, payment\n"), "{text}");
    let (ok, table, stderr) = stormglass(&["advise", "--format", "budget", &file]);
    assert!(ok, "{stderr}");
    assert!(
        table.contains("sequential:\n  order:\n  - inventory\n  - payment\n"),
        "{table}"
    );
    let budget = dir.join("budget.yaml");
    std::fs::write(&budget, &table).unwrap();
    let (code, out, err) = stormglass_exit(&["check-budget", budget.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{table}\n{out}{err}");
}

/// The gRPC service config `advise --format grpc` writes for `order`'s channel to
/// `inventory` is accepted by a real grpcio channel, which makes exactly the advised
/// attempts against a server that always answers UNAVAILABLE.
#[test]
fn grpc_service_config_is_obeyed_by_grpcio() {
    let scratch = temp_dir("advise-grpc");
    let dir = scratch.path();
    let file = write(dir, &two_retrying_layers(40));
    let (ok, stdout, stderr) = stormglass(&["advise", "--format", "grpc", &file]);
    assert!(ok, "{stderr}");
    let configs: Value = serde_json::from_str(&stdout).unwrap();
    let config = &configs["order -> inventory"];
    let method = &config["methodConfig"][0];
    assert_eq!(
        method["name"][0]["service"], "demo.Inventory",
        "{configs:#}"
    );
    assert_eq!(method["retryPolicy"]["maxAttempts"], 3, "{configs:#}");
    assert!(config["retryThrottling"]["tokenRatio"].as_f64().unwrap() > 0.0);
    let script =
        std::fs::read_to_string(repo_root().join("tests/python/grpc_service_config.py")).unwrap();
    let run = |config: &Value| -> Value {
        let out = python(&script, &[&config.to_string(), "demo.Inventory", "Reserve"]);
        serde_json::from_slice(&out).unwrap()
    };
    // Accepted whole: a config grpcio refuses fails every call with INVALID_ARGUMENT.
    let whole = run(config);
    assert_ne!(whole["status"], "INVALID_ARGUMENT", "{config}: {whole}");
    // Obeyed: grpcio Python applies a service config's timeout about a second early
    // (grpc/grpc#34547), so the retries are counted without it.
    let mut retries_only = config.clone();
    retries_only["methodConfig"][0]
        .as_object_mut()
        .unwrap()
        .remove("timeout");
    let seen = run(&retries_only);
    assert_eq!(seen["status"], "UNAVAILABLE", "{seen}");
    assert_eq!(
        seen["attempts"], 3,
        "grpcio's attempts under {retries_only}: {seen}"
    );
}

/// Live, `/api/v1/advice` gives the same advice for the window as `advise` for the files,
/// listed as `/api/v1/report` lists (`?callee=` around one callee, `listing` with totals).
#[test]
fn live_advice_is_the_files_advice() {
    let spans = two_retrying_layers(40);
    let scratch = temp_dir("advise-live");
    let dir = scratch.path();
    let file = write(dir, &spans);
    let (ok, stdout, stderr) = stormglass(&["advise", "--format", "json", &file]);
    assert!(ok, "{stderr}");
    let offline: Value = serde_json::from_str(&stdout).unwrap();
    let server = Server::start(&[
        ("STORMGLASS_ASSEMBLY__IDLE", "300ms"),
        ("STORMGLASS_ANALYTICS__INTERVAL", "1s"),
    ]);
    post_traces(&server, &spans);
    let url = format!("http://{}/api/v1/advice?all=true", server.api);
    // The same but for the retry budget's floor, the ratio's allowance at the window's call
    // rate (live, the window is `analytics.window` long; offline, as long as the spans), and
    // the amplification it allows.
    let settings = |advice: &Value| -> Vec<Value> {
        let mut edges = advice["edges"].as_array().cloned().unwrap_or_default();
        for e in &mut edges {
            e.as_object_mut()
                .unwrap()
                .remove("retry_budget_min_per_second");
        }
        let mut layers = advice["layers"].as_array().cloned().unwrap_or_default();
        for l in &mut layers {
            l.as_object_mut().unwrap().remove("amplification_advised");
        }
        edges.extend(layers);
        edges
    };
    server.wait_until("the window's advice", |_| {
        let (status, body) = get(&url);
        status == 200
            && serde_json::from_str::<Value>(&body)
                .is_ok_and(|a| settings(&a) == settings(&offline))
    });
    let (status, body) = get(&format!(
        "http://{}/api/v1/advice?callee=inventory",
        server.api
    ));
    assert_eq!(status, 200, "{body}");
    let around: Value = serde_json::from_str(&body).unwrap();
    let edges = around["edges"].as_array().unwrap();
    assert_eq!(edges.len(), 1, "{around:#}");
    assert_eq!(edges[0]["max_attempts"], 3);
    assert_eq!(around["listing"]["edges"], 1, "{around:#}");
    let (status, _) = get(&format!("http://{}/api/v1/advice?limit=0", server.api));
    assert_eq!(status, 400);
}

/// `advise --format FORMAT` over `file`, as YAML documents parsed into JSON values.
fn advise_yaml(file: &str, format: &str) -> Vec<Value> {
    let (ok, stdout, stderr) = stormglass(&["advise", "--format", format, file]);
    assert!(ok, "{stderr}");
    stdout
        .split("\n---\n")
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

/// The Envoy routes and cluster `advise --format envoy` writes parse strictly in Envoy's
/// own v3 API (envoy-data-plane, generated from Envoy's protos: an unknown field fails),
/// with the advised retry policy, retry budget and the operation tagged on the route's
/// spans, and Envoy itself accepts them
/// (`envoy --mode validate` over a bootstrap holding them all); the same check refuses a
/// route with a field Envoy does not know.
#[test]
fn envoy_config_parses_in_envoys_api() {
    let scratch = temp_dir("advise-envoy");
    let dir = scratch.path();
    let file = write(dir, &two_retrying_layers(40));
    let config = advise_yaml(&file, "envoy").remove(0);
    let script = std::fs::read_to_string(repo_root().join("tests/python/envoy_config.py")).unwrap();
    let checked: Value = serde_json::from_slice(&python(&script, &[&config.to_string()])).unwrap();
    assert_eq!(checked["api_error"], Value::Null, "{checked}");
    assert_eq!(checked["valid"], true, "{}", checked["envoy"]);
    let mut broken = config.clone();
    broken[0]["routes"][0]["route"]["retry_policy_typo"] = Value::from(1);
    let refused: Value = serde_json::from_slice(&python(&script, &[&broken.to_string()])).unwrap();
    assert_eq!(refused["valid"], false, "{refused}");
    assert!(
        refused["envoy"]
            .as_str()
            .unwrap()
            .contains("retry_policy_typo"),
        "{refused}"
    );
    let parsed = &checked["entries"];
    let to_inventory = parsed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["callee"] == "inventory")
        .unwrap_or_else(|| panic!("no entry for inventory: {parsed:#}"));
    let route = &to_inventory["routes"][0]["route"];
    assert_eq!(route["retryPolicy"]["numRetries"], 2, "{parsed:#}");
    assert_eq!(route["retryPolicy"]["perTryTimeout"], "0.057s");
    assert_eq!(route["retryPolicy"]["retryOn"], "unavailable");
    // The route names the operation on Envoy's spans, which carry the cluster's name.
    let tags = &to_inventory["routes"][0]["tracing"]["customTags"];
    assert_eq!(tags[0]["tag"], "http.route", "{parsed:#}");
    assert_eq!(tags[0]["literal"]["value"], "demo.Inventory/Reserve");
    let budget = &to_inventory["cluster"]["circuitBreakers"]["thresholds"][0]["retryBudget"];
    assert_eq!(budget["budgetPercent"]["value"], 20.0, "{parsed:#}");
}

/// The Istio and Gateway API objects follow the upstream CRD schemas (as npm's
/// @kubernetes-models packages them); Linkerd's annotations are the documented keys.
#[test]
fn mesh_objects_follow_the_upstream_schemas() {
    let js = repo_root().join("tests/js");
    assert!(
        js.join("node_modules/@kubernetes-models/istio").is_dir(),
        "run `npm ci` in tests/js (tests/run.sh does) for the mesh schema test"
    );
    let scratch = temp_dir("advise-mesh");
    let dir = scratch.path();
    let file = write(dir, &two_retrying_layers(40));
    for (format, kinds) in [
        ("istio", vec!["VirtualService", "DestinationRule"]),
        ("gateway-api", vec!["HTTPRoute", "XBackendTrafficPolicy"]),
    ] {
        let objects = advise_yaml(&file, format);
        let of_inventory: Vec<&str> = objects
            .iter()
            .filter(|o| o["metadata"]["name"] == "inventory")
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(of_inventory, kinds, "{format}: {objects:#?}");
        follow_the_mesh_schemas(&objects);
    }
    let istio = advise_yaml(&file, "istio");
    let vs = istio
        .iter()
        .find(|o| o["kind"] == "VirtualService" && o["metadata"]["name"] == "inventory")
        .unwrap();
    assert_eq!(vs["spec"]["http"][0]["retries"]["attempts"], 2, "{vs:#}");
    assert_eq!(vs["spec"]["http"][0]["retries"]["perTryTimeout"], "0.057s");
    let linkerd = advise_yaml(&file, "linkerd");
    let inventory = linkerd
        .iter()
        .find(|o| o["metadata"]["name"] == "inventory")
        .unwrap();
    let annotations = &inventory["metadata"]["annotations"];
    assert_eq!(
        annotations["retry.linkerd.io/grpc"], "unavailable",
        "{inventory:#}"
    );
    assert_eq!(annotations["retry.linkerd.io/limit"], "2");
    assert_eq!(annotations["retry.linkerd.io/timeout"], "57ms");
    assert_eq!(annotations["timeout.linkerd.io/request"], "285ms");
}

/// Every object of `objects` passes the upstream CRD schemas (tests/js/validate_mesh.mjs).
fn follow_the_mesh_schemas(objects: &[Value]) {
    let js = repo_root().join("tests/js");
    let mut node = std::process::Command::new("node")
        .arg(js.join("validate_mesh.mjs"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node runs");
    use std::io::Write;
    node.stdin
        .take()
        .unwrap()
        .write_all(Value::Array(objects.to_vec()).to_string().as_bytes())
        .unwrap();
    let output = node.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert_eq!(text.matches(": valid").count(), objects.len(), "{text}");
}

/// `web` calls `items` on one path with two methods (`GET /items`, `POST /items`: spans
/// named so, without a route attribute, are two operations) and on two templated routes
/// (no path of their own), one call of each per request.
fn one_path_two_methods(calls: u32) -> Spans {
    let mut s = Spans::default();
    for trace in 1..=calls {
        let page = s
            .server(trace, "web", "GET /page")
            .at(0.0, 500.0)
            .with(vec![route("/page")])
            .add();
        let operations = [
            ("GET /items", None),
            ("POST /items", None),
            ("GET", Some("/items/{id}")),
            ("DELETE", Some("/items/{id}/tags")),
        ];
        for (i, (name, templated)) in operations.into_iter().enumerate() {
            let at = 1.0 + 100.0 * i as f64;
            let mut attributes = vec![peer("items"), retry(0)];
            let mut served = Vec::new();
            if let Some(t) = templated {
                attributes.push(template(t));
                served.push(route(t));
            }
            let call = (s.client(trace, "web", name).under(page))
                .at(at, at + 50.0 + 10.0 * i as f64)
                .with(attributes)
                .add();
            (s.server(trace, "items", name).under(call))
                .at(at + 1.0, at + 49.0 + 10.0 * i as f64)
                .with(served)
                .add();
        }
    }
    s
}

/// Routes of a callee whose operations share a path or have none: Envoy, Istio and
/// Gateway API match each method-named operation by its method as well (the write never
/// takes the read's route), and end with one catch-all for the operations without a path,
/// with the longer of their timeouts; Envoy's API and Envoy itself, and the upstream CRD
/// schemas, accept them.
#[test]
fn mesh_routes_match_methods_and_end_with_one_catch_all() {
    let scratch = temp_dir("advise-routes");
    let advised = advise_json(scratch.path(), &one_path_two_methods(30));
    let file = scratch
        .path()
        .join("spans.jsonl")
        .to_string_lossy()
        .into_owned();
    let timeout = |operation: &str| {
        (advised["edges"].as_array().unwrap().iter())
            .find(|e| e["operation"] == operation)
            .unwrap_or_else(|| panic!("no advice for {operation}: {advised:#}"))["timeout_ms"]
            .as_f64()
            .unwrap()
    };
    let catch_all_ms = timeout("/items/{id}").max(timeout("/items/{id}/tags"));
    assert!(
        timeout("/items/{id}/tags") > timeout("/items/{id}"),
        "{advised:#}"
    );

    let config = advise_yaml(&file, "envoy").remove(0);
    let routes = config[0]["routes"].as_array().unwrap();
    let names: Vec<&str> = routes.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["GET /items", "POST /items", "/items/{id} (+1 more)"]
    );
    let method = |r: &Value| r["match"]["headers"][0]["string_match"]["exact"].clone();
    assert_eq!(
        (method(&routes[0]), method(&routes[1])),
        (json!("GET"), json!("POST"))
    );
    assert_eq!(routes[2]["match"], json!({"prefix": "/"}));
    // The longer timeout per try, as the fewest attempts of the two take it.
    assert_eq!(
        routes[2]["route"]["retry_policy"]["per_try_timeout"],
        format!("{:.3}s", catch_all_ms / 1e3),
        "{config:#}"
    );
    let script = std::fs::read_to_string(repo_root().join("tests/python/envoy_config.py")).unwrap();
    let checked: Value = serde_json::from_slice(&python(&script, &[&config.to_string()])).unwrap();
    assert_eq!(checked["api_error"], Value::Null, "{checked}");
    assert_eq!(checked["valid"], true, "{}", checked["envoy"]);

    let istio = advise_yaml(&file, "istio");
    let http = istio[0]["spec"]["http"].as_array().unwrap();
    assert_eq!(http[1]["match"][0]["method"]["exact"], "POST", "{http:#?}");
    assert!(
        http[2].get("match").is_none(),
        "the catch-all is last: {http:#?}"
    );
    follow_the_mesh_schemas(&istio);
    let gateway = advise_yaml(&file, "gateway-api");
    let rules = gateway[0]["spec"]["rules"].as_array().unwrap();
    assert_eq!(rules[1]["matches"][0]["method"], "POST", "{rules:#?}");
    assert!(rules[2].get("matches").is_none(), "{rules:#?}");
    follow_the_mesh_schemas(&gateway);
}

/// `replay` of the observed calls under a policy that allows `inventory` one attempt drops
/// the 10 retries of the 40 calls and loses the 10 successes they made, at `inventory` and
/// above it at `order`; `whatif --policy` with the advised policy predicts `inventory` at
/// its retry budget when it fails, where the observed policy (2 attempts) predicts 2x: the
/// advised 20% of its 100 calls a second plus the floor's 20 retries a second, 1.4x, the
/// bound `advise` states for it; run as Envoy's budget, what 20% of the requests in flight
/// allows.
#[test]
fn replay_and_whatif_under_a_policy() {
    let scratch = temp_dir("advise-replay");
    let dir = scratch.path();
    let file = write(dir, &two_retrying_layers(40));
    let one_attempt = dir.join("one-attempt.json");
    std::fs::write(
        &one_attempt,
        r#"{"edges": [{"caller": "order", "callee": "inventory", "max_attempts": 1}]}"#,
    )
    .unwrap();
    let replayed = replay(&one_attempt, &file);
    let edge = replayed_edge(&replayed, "inventory");
    assert_eq!(edge["max_attempts"], 1, "{edge:#}");
    assert_eq!(
        (edge["calls"].as_f64(), edge["attempts"].as_f64()),
        (Some(40.0), Some(50.0))
    );
    assert_eq!(edge["retries_dropped"], 10.0, "{edge:#}");
    assert_eq!(edge["successes_lost"], 10.0, "{edge:#}");
    assert_eq!(edge["success_rate_replayed"], 0.75, "{edge:#}");
    assert_eq!(edge["load_saved"], 0.2, "{edge:#}");
    let gateway = replayed_edge(&replayed, "order");
    assert_eq!(gateway["max_attempts"], Value::Null, "as seen: {gateway:#}");
    assert_eq!(gateway["retries_dropped"], 0.0);
    // order fails the requests whose inventory call now fails: gateway loses them too.
    assert_eq!(gateway["successes_lost_below"], 10.0, "{gateway:#}");
    assert_eq!(gateway["success_rate_replayed"], 0.75, "{gateway:#}");

    let (ok, advice, stderr) = stormglass(&["advise", "--format", "json", &file]);
    assert!(ok, "{stderr}");
    let advised = dir.join("advised.json");
    std::fs::write(&advised, advice).unwrap();
    let amplification_as = |policy: Option<&str>, budget_as: &str| -> f64 {
        let mut args = vec!["whatif", "--fail", "inventory=1", "--format", "json"];
        if let Some(p) = policy {
            args.extend(["--policy", p, "--budget-as", budget_as]);
        }
        args.push(&file);
        let (ok, stdout, stderr) = stormglass(&args);
        assert!(ok, "{stderr}");
        let w: Value = serde_json::from_str(&stdout).unwrap();
        w["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["service"] == "inventory")
            .unwrap()["amplification"]
            .as_f64()
            .unwrap()
    };
    let amplification = |policy: Option<&str>| amplification_as(policy, "linkerd");
    assert!((amplification(None) - 2.0).abs() < 1e-9);
    let policy: Value = serde_json::from_str(&std::fs::read_to_string(&advised).unwrap()).unwrap();
    let edge = advised_edge(&policy, "inventory");
    assert_eq!(
        (
            &edge["retry_budget_ratio"],
            &edge["retry_budget_min_per_second"]
        ),
        (&json!(0.2), &json!(20.0)),
        "{edge:#}"
    );
    assert!((amplification(advised.to_str()) - 1.4).abs() < 1e-9);
    // The same budget as Envoy runs it (`min_retry_concurrency` from the floor over one
    // try's timeout, as `advise --format envoy` writes it): retries in flight at most 20%
    // of the requests in flight, 0.25 per first try, or that floor over the first tries in
    // flight, whichever allows more.
    let try_seconds = edge["timeout_ms"].as_f64().unwrap() / 1e3;
    let floor = (20.0 * try_seconds).ceil().max(1.0) / (100.0 * try_seconds);
    let retries = edge["max_attempts"].as_f64().unwrap() - 1.0;
    let expected = 1.0 + retries.min(floor.max(0.25));
    let envoy = amplification_as(advised.to_str(), "envoy");
    assert!((envoy - expected).abs() < 1e-9, "{envoy} vs {expected}");
    let layer = advised_layer(&policy, "inventory");
    assert!(
        (layer["amplification_advised"].as_f64().unwrap() - 1.4).abs() < 1e-9,
        "{layer:#}"
    );

    // Capped at the top of a 3 x 3 x 3 storm, the layers below are saved too: of the 9
    // calls svc makes to db (27 attempts), the 3 made for gateway's first attempt remain.
    let mut storm = Spans::default();
    stormglass_testkit::fixtures::storm(&mut storm, 1);
    let storm_file = dir.join("storm.jsonl");
    common::write_jsonl(&storm_file, &storm, None);
    let top = dir.join("top.json");
    std::fs::write(
        &top,
        r#"{"edges": [{"caller": "gateway", "callee": "api", "max_attempts": 1}]}"#,
    )
    .unwrap();
    let replayed = replay(&top, storm_file.to_str().unwrap());
    let edge = |callee: &str| replayed_edge(&replayed, callee);
    let db = edge("db");
    assert_eq!(
        (db["calls"].as_f64(), db["calls_replayed"].as_f64()),
        (Some(9.0), Some(3.0)),
        "{db:#}"
    );
    assert_eq!(
        (db["attempts"].as_f64(), db["attempts_replayed"].as_f64()),
        (Some(27.0), Some(9.0))
    );
    assert_eq!(db["attempts_not_called"], 18.0);
    let svc = edge("svc");
    assert_eq!(
        (svc["attempts"].as_f64(), svc["attempts_replayed"].as_f64()),
        (Some(9.0), Some(3.0)),
        "{svc:#}"
    );

    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"edges": [{"caller": "a"}]}"#).unwrap();
    let (code, _, stderr) = stormglass_exit(&["replay", "--policy", bad.to_str().unwrap(), &file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not a policy"), "{stderr}");
}

/// `stormglass replay --policy POLICY FILE` as JSON.
fn replay(policy: &Path, file: &str) -> Value {
    let policy = policy.to_str().unwrap();
    let (ok, stdout, stderr) =
        stormglass(&["replay", "--policy", policy, "--format", "json", file]);
    assert!(ok, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// The replayed edge into `callee`.
fn replayed_edge(replayed: &Value, callee: &str) -> Value {
    let edges = replayed["edges"].as_array().unwrap();
    edges
        .iter()
        .find(|e| e["callee"] == callee)
        .unwrap()
        .clone()
}

/// `stormglass demo` run as a user would, archiving its spans: the last summary's
/// amplification at `db` and the gateway's effective success (%).
fn demo(scenario: &str, archive: &Path, policy: Option<&Path>) -> (f64, f64) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_stormglass"));
    command
        .args(["demo", "--scenario", scenario, "--duration", "8s"])
        .env("STORMGLASS_LISTEN__GRPC", "127.0.0.1:0")
        .env("STORMGLASS_LISTEN__HTTP", "127.0.0.1:0")
        .env("STORMGLASS_LISTEN__API", "127.0.0.1:0")
        .env("STORMGLASS_ARCHIVE__DIR", archive)
        .env("STORMGLASS_ARCHIVE__FLUSH", "1s");
    if let Some(policy) = policy {
        command.arg("--policy").arg(policy);
    }
    let output = command.output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = |prefix: &str| {
        text.lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {text}"))
            .to_owned()
    };
    let amplification = last("amplification:");
    let db = amplification
        .split(", ")
        .find_map(|a| a.trim().strip_prefix("db "))
        .and_then(|a| a.trim_end_matches('x').parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no db in {amplification}"));
    let effective = last("gateway -> order: effective success ");
    let effective = effective
        .split('%')
        .next()
        .and_then(|p| p.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no effective success in {effective}"));
    (db, effective)
}

/// The advice proven on the demo chain, its clients obeying the advised file: the storm
/// that reads 27x at the database reads at most 1.5x, as `whatif --policy` predicts (within
/// 10%); the healthy scenario's effective success moves by under half a point.
#[test]
fn the_demo_obeys_the_advised_policy() {
    let scratch = temp_dir("advise-demo");
    let dir = scratch.path();
    let advise = |archive: &Path, name: &str, config: &[&str]| {
        let mut args = vec!["advise", "--format", "json", archive.to_str().unwrap()];
        args.extend(config);
        let (ok, json, stderr) = stormglass(&args);
        assert!(ok, "{stderr}");
        let path = dir.join(name);
        std::fs::write(&path, json).unwrap();
        path
    };
    let storm = dir.join("storm");
    let (before, _) = demo("storm", &storm, None);
    assert!(before > 20.0, "the storm reads {before}x at db");
    let policy = advise(&storm, "storm-policy.json", &[]);
    let (after, _) = demo("storm", &dir.join("storm-advised"), Some(&policy));
    assert!(
        after <= 1.5,
        "under the advice the storm reads {after}x at db"
    );
    let (ok, stdout, stderr) = stormglass(&[
        "whatif",
        "--fail",
        "db=1",
        "--policy",
        policy.to_str().unwrap(),
        "--format",
        "json",
        storm.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let predicted: Value = serde_json::from_str(&stdout).unwrap();
    let predicted = predicted["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["service"] == "db")
        .unwrap()["amplification"]
        .as_f64()
        .unwrap();
    assert!(
        (after - predicted).abs() <= 0.1 * predicted,
        "measured {after}x, predicted {predicted}x"
    );

    // The healthy chain answers in a few milliseconds: 1.5x the P99.9 of one minute is a
    // timeout the scheduling delays of a busy machine exceed in the next. The advice never
    // goes below advice.min_timeout_ms (50 ms) for that reason, and is sized here with room
    // besides (x3), as the docs tell anyone whose fast calls share a crowded host.
    let healthy = dir.join("healthy");
    let (_, effective) = demo("healthy", &healthy, None);
    let roomy = dir.join("roomy.yaml");
    std::fs::write(&roomy, "advice:\n  timeout_factor: 3\n").unwrap();
    let policy = advise(
        &healthy,
        "healthy-policy.json",
        &["--config", roomy.to_str().unwrap()],
    );
    // A stall of the whole machine longer than the timeouts (a build beside the suite)
    // fails calls of any run it meets: the advised run is tried again, a bounded number of
    // times, until one ran without one. Advice that costs healthy calls fails every run.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut advised = Vec::new();
    for run in 0..3 {
        let archive = dir.join(format!("healthy-advised-{run}"));
        let (_, success) = demo("healthy", &archive, Some(&policy));
        advised.push(success);
        if (success - effective).abs() < 0.5 || Instant::now() > deadline {
            break;
        }
    }
    assert!(
        advised.iter().any(|a| (a - effective).abs() < 0.5),
        "effective success {effective}% -> {advised:?}% under the advice"
    );
}
