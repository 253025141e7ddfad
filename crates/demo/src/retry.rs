//! Clients the way real ones retry: a loop with a policy per edge (max attempts, exponential
//! backoff with optional jitter, a per-attempt timeout that is fixed or derived from the
//! remaining deadline), one CLIENT span per attempt carrying `retry`, `cause` and `deadline`
//! (plus `http.request.resend_count` for HTTP, or, for gRPC, attempt spans with
//! `previous-rpc-attempts` under one call span), and server spans that record the budget
//! they received and whether they honoured it.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use crate::telemetry;

/// Header carrying the caller's budget in milliseconds (gRPC uses `grpc-timeout`).
pub const DEADLINE_HEADER: &str = "x-deadline-ms";
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// What an attempt ended with, as the caller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Deadline,
    Unavailable,
    ServerError,
}

impl Outcome {
    /// The outcome class of docs/instrumenting.md.
    pub fn class(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Deadline => "deadline",
            Outcome::Unavailable => "unavailable",
            Outcome::ServerError => "server_error",
        }
    }

    pub fn http_status(self) -> u16 {
        match self {
            Outcome::Ok => 200,
            Outcome::Deadline => 504,
            Outcome::Unavailable => 503,
            Outcome::ServerError => 500,
        }
    }

    pub fn from_http_status(status: u16) -> Outcome {
        match status {
            200..=299 => Outcome::Ok,
            503 | 502 => Outcome::Unavailable,
            504 | 408 => Outcome::Deadline,
            _ => Outcome::ServerError,
        }
    }

    pub fn grpc_code(self) -> tonic::Code {
        match self {
            Outcome::Ok => tonic::Code::Ok,
            Outcome::Deadline => tonic::Code::DeadlineExceeded,
            Outcome::Unavailable => tonic::Code::Unavailable,
            Outcome::ServerError => tonic::Code::Internal,
        }
    }

    pub fn from_grpc_code(code: tonic::Code) -> Outcome {
        match code {
            tonic::Code::Ok => Outcome::Ok,
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => Outcome::Deadline,
            tonic::Code::Unavailable => Outcome::Unavailable,
            _ => Outcome::ServerError,
        }
    }
}

/// How a client calls one callee.
#[derive(Clone, Debug)]
pub struct Policy {
    pub max_attempts: u32,
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// Cap each attempt's timeout by what is left of the caller's own deadline.
    pub derive_from_deadline: bool,
    /// Backoff before retry n is `backoff * 2^(n-1)`, jittered to 50-100% when `jitter`.
    pub backoff: Duration,
    pub jitter: bool,
    /// Outcomes worth another attempt.
    pub retry_on: &'static [Outcome],
    /// Send an idempotency key (the same on every attempt of a call).
    pub idempotency_key: bool,
    /// Tell the callee the budget (`grpc-timeout` / `x-deadline-ms`).
    pub propagate_deadline: bool,
    /// Retry below the tracing layer, as client libraries and proxies do: one CLIENT span
    /// for the whole call, every attempt sent with its context and no span or number of
    /// its own, so only the callee's SERVER spans show the attempts.
    pub below_tracing: bool,
    /// A retry budget shared by every call of the edge, where the plan sets one.
    pub budget: Option<Arc<RetryBudget>>,
}

/// A retry budget shared by an edge's calls, as `stormglass replay` runs it (see
/// [`stormglass_runtime::retry_budget`]), on the clock of the demo's run.
#[derive(Debug)]
pub struct RetryBudget {
    started: Instant,
    budget: Mutex<stormglass_runtime::retry_budget::RetryBudget>,
}

impl RetryBudget {
    pub fn new(ratio: f64, min_per_second: f64) -> RetryBudget {
        RetryBudget {
            started: Instant::now(),
            budget: Mutex::new(stormglass_runtime::retry_budget::RetryBudget::new(
                ratio,
                min_per_second,
            )),
        }
    }

    /// Now, and the budget: a panic while holding it leaves counts that are still counts.
    fn at(
        &self,
    ) -> (
        i64,
        std::sync::MutexGuard<'_, stormglass_runtime::retry_budget::RetryBudget>,
    ) {
        let now = i64::try_from(self.started.elapsed().as_nanos()).unwrap_or(i64::MAX);
        let budget = self
            .budget
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (now, budget)
    }

    fn call(&self) {
        let (now, mut budget) = self.at();
        budget.call(now, 1.0);
    }

    /// Take one retry from the budget; false when it is spent.
    fn retry(&self) -> bool {
        let (now, mut budget) = self.at();
        budget.retry(now, 1.0)
    }
}

impl Policy {
    /// One attempt, `timeout` each, deadline derived and propagated, no retries.
    pub fn once(timeout_ms: u64) -> Policy {
        Policy {
            max_attempts: 1,
            timeout: Duration::from_millis(timeout_ms),
            derive_from_deadline: true,
            backoff: Duration::from_millis(10),
            jitter: true,
            retry_on: &[Outcome::Unavailable],
            idempotency_key: true,
            propagate_deadline: true,
            below_tracing: false,
            budget: None,
        }
    }

    pub fn attempts(mut self, n: u32, retry_on: &'static [Outcome]) -> Policy {
        self.max_attempts = n;
        self.retry_on = retry_on;
        self
    }

    pub fn fixed_timeout(mut self) -> Policy {
        self.derive_from_deadline = false;
        self
    }

    pub fn without_key(mut self) -> Policy {
        self.idempotency_key = false;
        self
    }

    pub fn below_tracing(mut self) -> Policy {
        self.below_tracing = true;
        self
    }

    fn backoff_before(&self, n: u32) -> Duration {
        let base = self.backoff * 2u32.saturating_pow(n.saturating_sub(1));
        if self.jitter {
            base.mul_f64(rand::random_range(0.5..=1.0))
        } else {
            base
        }
    }
}

/// The two numbered retry shapes of docs/instrumenting.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Each attempt a sibling CLIENT span (`retry`, `http.request.resend_count`).
    Sibling,
    /// One CLIENT call span with an attempt span per try (`previous-rpc-attempts`).
    CallSpan,
}

/// One attempt, as the transport sees it.
pub struct Attempt {
    pub number: u32,
    pub timeout: Duration,
    /// Trace context, deadline and idempotency headers to send.
    pub headers: http::HeaderMap,
}

/// What a call is: span name, callee, attributes common to its attempts.
pub struct Call<'a> {
    pub tracer: &'a SdkTracer,
    pub parent: &'a Context,
    pub name: &'static str,
    pub callee: &'static str,
    pub shape: Shape,
    pub attributes: Vec<KeyValue>,
}

/// Run `attempt` under `policy` until it succeeds, is not retryable, or the attempts or the
/// caller's `deadline` run out; every attempt is a span. Returns the final outcome and the
/// number of attempts.
pub async fn call<F, Fut>(
    call: Call<'_>,
    policy: &Policy,
    deadline: Option<Instant>,
    mut attempt: F,
) -> (Outcome, u32)
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let tracer = call.tracer;
    let mut common = call.attributes.clone();
    common.push(KeyValue::new("peer.service", call.callee));
    let hidden = policy.below_tracing;
    let call_cx = match call.shape {
        Shape::Sibling if !hidden => call.parent.clone(),
        _ => {
            let mut attributes = common.clone();
            if hidden {
                attributes.push(KeyValue::new("deadline", policy.timeout.as_millis() as i64));
            }
            let span = tracer
                .span_builder(call.name)
                .with_kind(SpanKind::Client)
                .with_attributes(attributes)
                .start_with_context(tracer, call.parent);
            call.parent.with_span(span)
        }
    };
    let key = policy
        .idempotency_key
        .then(|| format!("{:032x}", rand::random::<u128>()));
    let mut outcome = Outcome::Deadline;
    let mut previous: Option<Outcome> = None;
    let mut attempts = 0;
    if let Some(budget) = &policy.budget {
        budget.call();
    }
    for n in 0..policy.max_attempts {
        if n > 0 {
            if policy.budget.as_ref().is_some_and(|b| !b.retry()) {
                break;
            }
            tokio::time::sleep(policy.backoff_before(n)).await;
        }
        let mut timeout = policy.timeout;
        if policy.derive_from_deadline
            && let Some(deadline) = deadline
        {
            timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
        }
        if timeout < Duration::from_millis(1) {
            outcome = Outcome::Deadline;
            break;
        }
        let timeout_ms = timeout.as_millis() as i64;
        let mut attributes = common.clone();
        attributes.push(KeyValue::new("retry", i64::from(n)));
        attributes.push(KeyValue::new("deadline", timeout_ms));
        match call.shape {
            Shape::Sibling if n > 0 => {
                attributes.push(KeyValue::new("http.request.resend_count", i64::from(n)));
            }
            Shape::CallSpan => {
                attributes.push(KeyValue::new("previous-rpc-attempts", i64::from(n)));
            }
            Shape::Sibling => {}
        }
        if let Some(previous) = previous {
            attributes.push(KeyValue::new("cause", previous.class()));
        }
        if let Some(key) = &key {
            attributes.push(KeyValue::new("idempotency_key", key.clone()));
        }
        let name = match call.shape {
            Shape::Sibling => call.name.to_owned(),
            Shape::CallSpan => format!("Attempt.{}", call.name),
        };
        // Below the tracing layer an attempt is sent in the call span's context, unseen.
        let cx = if hidden {
            call_cx.clone()
        } else {
            let span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Client)
                .with_attributes(attributes)
                .start_with_context(tracer, &call_cx);
            call_cx.with_span(span)
        };
        let mut guard = Unfinished((!hidden).then(|| cx.clone()));
        let mut headers = http::HeaderMap::new();
        telemetry::inject(&cx, &mut headers);
        if policy.propagate_deadline {
            headers.insert(DEADLINE_HEADER, http::HeaderValue::from(timeout_ms));
        }
        if let Some(key) = &key
            && let Ok(value) = http::HeaderValue::from_str(key)
        {
            headers.insert(IDEMPOTENCY_HEADER, value);
        }
        attempts += 1;
        outcome = tokio::time::timeout(
            timeout,
            attempt(Attempt {
                number: n,
                timeout,
                headers,
            }),
        )
        .await
        .unwrap_or(Outcome::Deadline);
        guard.0 = None;
        if !hidden {
            end(&cx, outcome, call.shape);
        }
        if outcome == Outcome::Ok || !policy.retry_on.contains(&outcome) {
            break;
        }
        previous = Some(outcome);
    }
    if call.shape == Shape::CallSpan || hidden {
        end(&call_cx, outcome, call.shape);
    }
    (outcome, attempts)
}

/// Ends an attempt span as cancelled if the caller stopped waiting mid-attempt (the future
/// running the call was dropped); emptied once the attempt ends normally.
struct Unfinished(Option<Context>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(cx) = self.0.take() {
            let span = cx.span();
            span.set_attribute(KeyValue::new("error.type", "cancelled"));
            span.set_status(Status::error("cancelled"));
            span.end();
        }
    }
}

fn end(cx: &Context, outcome: Outcome, shape: Shape) {
    let span = cx.span();
    match shape {
        Shape::Sibling => span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(outcome.http_status()),
        )),
        Shape::CallSpan => span.set_attribute(KeyValue::new(
            "rpc.grpc.status_code",
            outcome.grpc_code() as i64,
        )),
    }
    if outcome != Outcome::Ok {
        if outcome == Outcome::Deadline {
            span.set_attribute(KeyValue::new("error.type", "timeout"));
        }
        span.set_status(Status::error(outcome.class()));
    }
    span.end();
}

/// A request as a server received it: trace context and budget.
pub struct Incoming {
    pub cx: Context,
    /// When the caller stops waiting, if it said.
    pub deadline: Option<Instant>,
    pub budget_ms: Option<i64>,
}

impl Incoming {
    /// Read trace context and budget from headers (`x-deadline-ms` or `grpc-timeout`).
    pub fn from_headers(headers: &http::HeaderMap) -> Incoming {
        let cx = telemetry::extract(headers);
        let budget_ms = headers
            .get(DEADLINE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .or_else(|| {
                headers
                    .get("grpc-timeout")
                    .and_then(|v| v.to_str().ok())
                    .and_then(grpc_timeout_ms)
            });
        Incoming {
            cx,
            deadline: budget_ms.map(|ms| Instant::now() + Duration::from_millis(ms.max(0) as u64)),
            budget_ms,
        }
    }
}

/// gRPC's `grpc-timeout` (`300m`, `2S`, `100000u`, ...) in milliseconds.
fn grpc_timeout_ms(value: &str) -> Option<i64> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: i64 = digits.parse().ok()?;
    Some(match unit {
        "H" => n * 3_600_000,
        "M" => n * 60_000,
        "S" => n * 1000,
        "m" => n,
        "u" => n / 1000,
        "n" => n / 1_000_000,
        _ => return None,
    })
}

/// A SERVER span that records its outcome; dropped unfinished (the handler was cancelled),
/// it ends as cancelled with `ctx_cancelled=true`.
pub struct ServerSpan {
    cx: Context,
    grpc: bool,
    finished: bool,
}

impl ServerSpan {
    pub fn start(
        tracer: &SdkTracer,
        name: &'static str,
        incoming: &Incoming,
        record_budget: bool,
        grpc: bool,
        attributes: Vec<KeyValue>,
    ) -> ServerSpan {
        let mut attributes = attributes;
        if record_budget && let Some(ms) = incoming.budget_ms {
            attributes.push(KeyValue::new("deadline", ms));
        }
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(tracer, &incoming.cx);
        ServerSpan {
            cx: incoming.cx.with_span(span),
            grpc,
            finished: false,
        }
    }

    /// The context children start under.
    pub fn context(&self) -> &Context {
        &self.cx
    }

    pub fn finish(mut self, outcome: Outcome, cancelled: bool) {
        let span = self.cx.span();
        span.set_attribute(if self.grpc {
            KeyValue::new("rpc.grpc.status_code", outcome.grpc_code() as i64)
        } else {
            KeyValue::new(
                "http.response.status_code",
                i64::from(outcome.http_status()),
            )
        });
        if cancelled {
            span.set_attribute(KeyValue::new("ctx_cancelled", true));
        }
        if outcome != Outcome::Ok {
            span.set_status(Status::error(outcome.class()));
        }
        span.end();
        self.finished = true;
    }
}

impl Drop for ServerSpan {
    fn drop(&mut self) {
        if !self.finished {
            let span = self.cx.span();
            span.set_attribute(KeyValue::new("ctx_cancelled", true));
            span.set_status(Status::error("cancelled"));
            span.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// grpc-timeout in every unit gRPC defines.
    /// The budget as Linkerd's: ten calls at 10% cover one retry, not two; a floor of 1/s
    /// is a reserve of ten retries over the window, on top of the deposits.
    #[test]
    fn budget_deposits_and_reserve() {
        let b = RetryBudget::new(0.1, 0.0);
        for _ in 0..9 {
            b.call();
        }
        assert!(!b.retry(), "0.9 of a retry deposited");
        b.call();
        assert!(b.retry());
        assert!(!b.retry());
        let b = RetryBudget::new(0.1, 1.0);
        b.call();
        assert_eq!((0..20).filter(|_| b.retry()).count(), 10);
    }

    #[test]
    fn grpc_timeouts() {
        assert_eq!(grpc_timeout_ms("300m"), Some(300));
        assert_eq!(grpc_timeout_ms("2S"), Some(2000));
        assert_eq!(grpc_timeout_ms("100000u"), Some(100));
        assert_eq!(grpc_timeout_ms("x"), None);
    }

    /// Backoff doubles per retry and jitter stays within 50-100%.
    #[test]
    fn backoff_doubles() {
        let mut p = Policy::once(100).attempts(4, &[Outcome::Unavailable]);
        p.jitter = false;
        assert_eq!(p.backoff_before(1), Duration::from_millis(10));
        assert_eq!(p.backoff_before(3), Duration::from_millis(40));
        p.jitter = true;
        let b = p.backoff_before(2);
        assert!(b >= Duration::from_millis(10) && b <= Duration::from_millis(20));
    }
}
