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
    assert_eq!(crate::policy::min_retry_concurrency(10.0, Some(200.0)), 2);
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
