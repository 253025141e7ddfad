//! Attribute conventions: which span attributes feed which normalised column.
//!
//! docs/instrumenting.md ("What stormglass reads from your spans") lists, for each concept, the attribute names read in order
//! (first present wins). [`Conventions`] turns those lists into one lookup table so the
//! encoder classifies every attribute with a single hash probe, keeping for each concept
//! the alias of highest precedence it has seen. The lists are data, so a deployment can
//! extend them without code changes.
//!
//! Value coercion is lenient in the ways exporters differ (integers sent as strings, HTTP
//! header attributes sent as one-element string arrays) and strict about meaning: a value
//! that cannot be read as its concept is counted as malformed and kept in the `attributes`
//! map instead of being dropped.

use std::collections::HashMap;

use crate::hash::KeyedHash;

use crate::wire::{AnyValue, Value, text};

/// A concept of the input contract. Each maps to one or more normalised columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Concept {
    Attempt,
    /// An attempt counted from 1, as proxies number them (Envoy's `x-envoy-attempt-count`).
    AttemptCount,
    Cause,
    Deadline,
    AbsoluteDeadline,
    IdempotencyKey,
    /// The callee answered from its idempotency store (a replay of a request it had done).
    IdempotencyHit,
    Idempotent,
    HttpMethod,
    DbOperation,
    CalleeHint,
    RpcMethod,
    RpcService,
    Route,
    CtxCancelled,
    State,
    GrpcStatus,
    HttpStatus,
    ErrorType,
    ErrCode,
    /// The full URL a client requested: with [`Concept::UrlPath`] and [`Concept::UrlQuery`],
    /// what tells an application loop's retry of one request from a loop over several.
    Url,
    UrlPath,
    UrlQuery,
    /// An HTTP answer's `Retry-After` (seconds or an HTTP date).
    RetryAfter,
    /// A gRPC answer's `grpc-retry-pushback-ms`: milliseconds, negative or not an integer
    /// for "do not retry".
    GrpcPushback,
    /// Envoy's `response_flags` (`UT`, `DC`, `UO`, ...): how the proxy ended the request.
    ProxyFlags,
    /// HAProxy's termination state (`sH--`, `CD--`, ...), where a span carries it.
    TerminationState,
    /// OpenTracing's `component`: Envoy writes `proxy` on its own spans.
    Component,
    /// Envoy's `retry.count` on an upstream span: the retries before this attempt (read on
    /// spans whose `component` is `proxy` only: elsewhere it often counts a call's retries).
    ProxyRetryCount,
}

impl Concept {
    /// Number of concepts, for per-concept arrays.
    pub const COUNT: usize = 29;

    /// Every concept, in discriminant order (so `Concept::ALL[c as usize] == c`).
    pub const ALL: [Concept; Concept::COUNT] = [
        Concept::Attempt,
        Concept::AttemptCount,
        Concept::Cause,
        Concept::Deadline,
        Concept::AbsoluteDeadline,
        Concept::IdempotencyKey,
        Concept::IdempotencyHit,
        Concept::Idempotent,
        Concept::HttpMethod,
        Concept::DbOperation,
        Concept::CalleeHint,
        Concept::RpcMethod,
        Concept::RpcService,
        Concept::Route,
        Concept::CtxCancelled,
        Concept::State,
        Concept::GrpcStatus,
        Concept::HttpStatus,
        Concept::ErrorType,
        Concept::ErrCode,
        Concept::Url,
        Concept::UrlPath,
        Concept::UrlQuery,
        Concept::RetryAfter,
        Concept::GrpcPushback,
        Concept::ProxyFlags,
        Concept::TerminationState,
        Concept::Component,
        Concept::ProxyRetryCount,
    ];

    /// Name used in self-metrics (`field` label) and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Concept::Attempt => "attempt",
            Concept::AttemptCount => "attempt_count",
            Concept::Cause => "cause",
            Concept::Deadline => "deadline",
            Concept::AbsoluteDeadline => "absolute_deadline",
            Concept::IdempotencyKey => "idempotency_key",
            Concept::IdempotencyHit => "idempotency_hit",
            Concept::Idempotent => "idempotent",
            Concept::HttpMethod => "http_method",
            Concept::DbOperation => "db_operation",
            Concept::CalleeHint => "callee",
            Concept::RpcMethod => "rpc_method",
            Concept::RpcService => "rpc_service",
            Concept::Route => "route",
            Concept::CtxCancelled => "ctx_cancelled",
            Concept::State => "state",
            Concept::GrpcStatus => "grpc_status",
            Concept::HttpStatus => "http_status",
            Concept::ErrorType => "error_type",
            Concept::ErrCode => "err_code",
            Concept::Url => "url",
            Concept::UrlPath => "url_path",
            Concept::UrlQuery => "url_query",
            Concept::RetryAfter => "retry_after",
            Concept::GrpcPushback => "grpc_pushback",
            Concept::ProxyFlags => "proxy_flags",
            Concept::TerminationState => "termination_state",
            Concept::Component => "component",
            Concept::ProxyRetryCount => "proxy_retry_count",
        }
    }

    /// Concepts whose value lives entirely in a normalised column; their attributes are not
    /// repeated in the `attributes` map (unless malformed).
    pub fn is_consumed(self) -> bool {
        matches!(
            self,
            Concept::Attempt
                | Concept::AttemptCount
                | Concept::Cause
                | Concept::Deadline
                | Concept::AbsoluteDeadline
                | Concept::IdempotencyKey
                | Concept::IdempotencyHit
                | Concept::Idempotent
                | Concept::CtxCancelled
                | Concept::State
                | Concept::ProxyRetryCount
        )
    }
}

/// The default alias lists of docs/instrumenting.md, in precedence order (first wins).
///
/// Two deliberate additions, both older semantic-convention names that SDKs still emit:
/// `http.method` after `http.request.method`, and `http.status_code` after
/// `http.response.status_code`. `rpc.response.status_code` carries gRPC status names.
pub const DEFAULT_ALIASES: &[(Concept, &[&str])] = &[
    (
        Concept::Attempt,
        &[
            "retry",
            "retry.attempt",
            "http.request.resend_count",
            "rpc.grpc.previous_rpc_attempts",
            "previous-rpc-attempts",
            // gRPC's own metadata on a retried or hedged attempt, as instrumentations that
            // capture request metadata record it (a string array).
            "rpc.grpc.request.metadata.grpc-previous-rpc-attempts",
        ],
    ),
    (
        Concept::AttemptCount,
        &["http.request.header.x-envoy-attempt-count"],
    ),
    (Concept::Cause, &["cause", "retry.cause"]),
    (
        Concept::Deadline,
        &[
            "deadline",
            "deadline_ms",
            "timeout_ms",
            "rpc.request.deadline",
            "rpc.grpc.request.metadata.grpc-timeout",
            "http.request.header.grpc-timeout",
            "http.request.header.x-envoy-expected-rq-timeout-ms",
        ],
    ),
    (
        Concept::AbsoluteDeadline,
        &["deadline.unix_ms", "http.request.header.x-request-timeout"],
    ),
    (
        Concept::IdempotencyKey,
        &[
            "idempotency_key",
            "idempotency.key",
            "http.request.header.idempotency-key",
            "rpc.grpc.request.metadata.idempotency-key",
        ],
    ),
    (Concept::IdempotencyHit, &["idempotency.hit"]),
    (Concept::Idempotent, &["idempotent"]),
    (Concept::HttpMethod, &["http.request.method", "http.method"]),
    (Concept::DbOperation, &["db.operation.name", "db.operation"]),
    (
        Concept::CalleeHint,
        &[
            "peer.service",
            "server.address",
            "rpc.service",
            "db.system.name",
            "db.system",
            // Envoy's upstream spans: the cluster the proxy sent to.
            "upstream_cluster.name",
            "upstream_cluster",
        ],
    ),
    (Concept::RpcMethod, &["rpc.method"]),
    (Concept::RpcService, &["rpc.service"]),
    (
        Concept::Route,
        &["http.route", "url.template", "db.operation.name"],
    ),
    (Concept::CtxCancelled, &["ctx_cancelled", "cancelled"]),
    (Concept::State, &["state", "idempotency.state"]),
    (
        Concept::GrpcStatus,
        // Envoy's spans say `grpc.status_code`.
        &[
            "rpc.grpc.status_code",
            "rpc.response.status_code",
            "grpc.status_code",
        ],
    ),
    (
        Concept::HttpStatus,
        &["http.response.status_code", "http.status_code"],
    ),
    (Concept::ErrorType, &["error.type"]),
    (Concept::ErrCode, &["err_code"]),
    (Concept::Url, &["url.full", "http.url"]),
    (Concept::UrlPath, &["url.path"]),
    (Concept::UrlQuery, &["url.query"]),
    (Concept::RetryAfter, &["http.response.header.retry-after"]),
    (
        Concept::GrpcPushback,
        &[
            "rpc.grpc.response.metadata.grpc-retry-pushback-ms",
            "rpc.grpc.response.metadata.grpc_retry_pushback_ms",
        ],
    ),
    (
        Concept::ProxyFlags,
        &["response_flags", "envoy.response_flags"],
    ),
    (
        Concept::TerminationState,
        &["haproxy.termination_state", "termination_state"],
    ),
    (Concept::Component, &["component"]),
    (Concept::ProxyRetryCount, &["retry.count"]),
];

/// One attribute name's roles: (concept, precedence) pairs; lower precedence wins.
type Roles = Vec<(Concept, u8)>;

/// The alias table the encoder consults for every attribute, and the sampling ratios of
/// services whose SDKs sample without writing OpenTelemetry's threshold.
#[derive(Clone, Debug)]
pub struct Conventions {
    /// Looked up for every attribute of every span: the keyed hash, not SipHash (~2% of
    /// the server's CPU under load, `perf record`), keyed by the name's bytes so the
    /// received key is looked up as it arrived, without a second UTF-8 check.
    by_name: HashMap<Box<[u8]>, Roles, KeyedHash>,
    /// Per service: 1 / its sampling ratio.
    sampling_weights: HashMap<String, f64>,
    /// The key of [`Conventions::idempotency_key_hash`]: random unless set
    /// ([`Conventions::with_key_secret`]).
    key_secret: Secret,
}

/// A hash key, never shown (`Debug` reads `Secret(..)`).
#[derive(Clone)]
struct Secret([u8; 16]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Default for Conventions {
    fn default() -> Self {
        Conventions::new(DEFAULT_ALIASES.iter().map(|(c, names)| (*c, names.iter())))
    }
}

/// The spellings an attribute name is read in: a captured HTTP header's name also with its
/// dashes as underscores, as OpenTelemetry Python writes them (and the semantic conventions
/// did before 1.21): `http.request.header.x_envoy_expected_rq_timeout_ms`.
fn spellings(name: &str) -> Vec<String> {
    let mut spellings = vec![name.to_owned()];
    for prefix in ["http.request.header.", "http.response.header."] {
        if let Some(header) = name.strip_prefix(prefix)
            && header.contains('-')
        {
            spellings.push(format!("{prefix}{}", header.replace('-', "_")));
        }
    }
    spellings
}

impl Conventions {
    /// Build from per-concept alias lists in precedence order.
    pub fn new<I, N, S>(lists: I) -> Self
    where
        I: IntoIterator<Item = (Concept, N)>,
        N: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut by_name: HashMap<Box<[u8]>, Roles, KeyedHash> = HashMap::default();
        for (concept, names) in lists {
            for (rank, name) in names.into_iter().enumerate() {
                let rank = u8::try_from(rank).unwrap_or(u8::MAX);
                for spelling in spellings(name.as_ref()) {
                    let roles = by_name.entry(spelling.as_bytes().into()).or_default();
                    if !roles.contains(&(concept, rank)) {
                        roles.push((concept, rank));
                    }
                }
            }
        }
        Conventions {
            by_name,
            sampling_weights: HashMap::new(),
            key_secret: Secret(rand::random()),
        }
    }

    /// Hash idempotency keys with `secret`: spans encoded by two processes with the same
    /// secret (a restart restoring its archive) compare their keys.
    pub fn with_key_secret(mut self, secret: [u8; 16]) -> Self {
        self.key_secret = Secret(secret);
        self
    }

    /// What stormglass keeps of an idempotency key's value: a keyed hash (SipHash-2-4 under
    /// a secret key), equal for equal keys and, without the secret, no way back to the
    /// value, not even by trying likely ones.
    pub fn idempotency_key_hash(&self, key: &[u8]) -> i64 {
        use std::hash::Hasher;
        let mut hasher = siphasher::sip::SipHasher24::new_with_key(&self.key_secret.0);
        hasher.write(key);
        hasher.finish() as i64
    }

    /// Spans of these services, when their tracestate carries no threshold, each stand for
    /// 1 / ratio spans (ratios in (0, 1]; others are ignored).
    pub fn with_sampling_ratios<'a>(
        mut self,
        ratios: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> Self {
        self.sampling_weights = ratios
            .into_iter()
            .filter(|(_, r)| *r > 0.0 && *r <= 1.0)
            .map(|(service, r)| (service.to_owned(), 1.0 / r))
            .collect();
        self
    }

    /// The configured weight of `service`'s spans, if any.
    pub fn sampling_weight(&self, service: &str) -> Option<f64> {
        self.sampling_weights.get(service).copied()
    }

    /// The roles an attribute name (as text or as received bytes) plays; empty for
    /// attributes outside the contract.
    pub fn roles(&self, name: impl AsRef<[u8]>) -> &[(Concept, u8)] {
        self.by_name
            .get(name.as_ref())
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

/// Unwrap a one-element array, as HTTP header attributes arrive (`["300m"]`).
pub fn scalar(value: &AnyValue) -> Option<&Value> {
    match value.value.as_ref()? {
        Value::ArrayValue(array) => array.values.first()?.value.as_ref(),
        other => Some(other),
    }
}

/// An integer, from an int, an integral double, or a string holding one.
pub fn as_i64(value: &AnyValue) -> Option<i64> {
    match scalar(value)? {
        Value::IntValue(i) => Some(*i),
        Value::DoubleValue(d) if d.fract() == 0.0 && d.is_finite() => Some(*d as i64),
        // "3" and "3.0" (SDKs that stringify every attribute, or record numbers as doubles).
        Value::StringValue(s) => {
            let s = text(s).trim();
            s.parse().ok().or_else(|| {
                let d: f64 = s.parse().ok()?;
                (d.fract() == 0.0 && d.is_finite() && d.abs() < 9.0e15).then_some(d as i64)
            })
        }
        _ => None,
    }
}

/// A boolean, from a bool, `"true"`/`"false"` in any case, or 0/1.
pub fn as_bool(value: &AnyValue) -> Option<bool> {
    match scalar(value)? {
        Value::BoolValue(b) => Some(*b),
        Value::StringValue(s) => match text(s).trim().to_ascii_lowercase().as_str() {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        },
        Value::IntValue(0) => Some(false),
        Value::IntValue(1) => Some(true),
        _ => None,
    }
}

/// A string value (strings only: a number is not a name).
pub fn as_str(value: &AnyValue) -> Option<&str> {
    match scalar(value)? {
        Value::StringValue(s) => Some(text(s)),
        _ => None,
    }
}

/// An HTTP `Retry-After` in milliseconds: delay-seconds (`120`), or an HTTP date taken from
/// `end_ns` (when the answer came; 0 for a date already past).
pub fn retry_after_ms(value: &AnyValue, end_ns: i64) -> Option<f64> {
    if let Some(seconds) = as_i64(value) {
        return (seconds >= 0).then_some(seconds as f64 * 1000.0);
    }
    let Value::StringValue(s) = scalar(value)? else {
        return None;
    };
    let at = httpdate::parse_http_date(text(s).trim()).ok()?;
    let at_ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as f64;
    Some((at_ms - end_ns as f64 / 1e6).max(0.0))
}

/// gRPC's `grpc-retry-pushback-ms`: milliseconds to wait; a negative value or one that is
/// not an integer says not to retry (gRPC A6), read as -1.
pub fn pushback_ms(value: &AnyValue) -> f64 {
    match as_i64(value) {
        Some(ms) if ms >= 0 => ms as f64,
        _ => -1.0,
    }
}

/// A relative time budget in milliseconds: numbers are milliseconds; strings may be plain
/// numbers, carry a unit (`300ms`, `1.5s`, `2min`), or use gRPC's timeout format
/// (`300m`, `2S`, `100000u`: an integer of at most 8 digits and one of `HMSmun`).
pub fn as_budget_ms(value: &AnyValue) -> Option<f64> {
    let ms = match scalar(value)? {
        Value::IntValue(i) => *i as f64,
        Value::DoubleValue(d) => *d,
        Value::StringValue(s) => parse_duration_ms(text(s))?,
        _ => return None,
    };
    (ms.is_finite() && ms >= 0.0).then_some(ms)
}

/// Parse a duration string into milliseconds (see [`as_budget_ms`]).
pub fn parse_duration_ms(text: &str) -> Option<f64> {
    let s = text.trim();
    if let Some(ms) = parse_grpc_timeout_ms(s) {
        return Some(ms);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match unit.trim() {
        "" | "ms" => 1.0,
        "ns" => 1e-6,
        "us" | "µs" => 1e-3,
        "s" | "sec" => 1e3,
        "min" => 60e3,
        "h" => 3_600e3,
        _ => return None,
    };
    Some(number * factor)
}

/// gRPC's `grpc-timeout` header format: 1 to 8 ASCII digits then one unit letter.
fn parse_grpc_timeout_ms(s: &str) -> Option<f64> {
    // The unit must be one ASCII letter; checking it first keeps the split on a char boundary.
    if !s.as_bytes().last()?.is_ascii() {
        return None;
    }
    let (digits, unit) = s.split_at(s.len() - 1);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: f64 = digits.parse().ok()?;
    let factor = match unit {
        "H" => 3_600e3,
        "M" => 60e3,
        "S" => 1e3,
        "m" => 1.0,
        "u" => 1e-3,
        "n" => 1e-6,
        _ => return None,
    };
    Some(n * factor)
}

/// Render any attribute value as text for the `attributes` map: strings as-is, scalars in
/// their usual form, bytes as lower-case hex, arrays and key-value lists as JSON.
pub fn render(value: &AnyValue) -> Option<String> {
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(text(s).to_owned()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        Value::BytesValue(b) => Some(hex(b)),
        _ => Some(to_json(value).to_string()),
    }
}

fn to_json(value: &AnyValue) -> serde_json::Value {
    use serde_json::Value as J;
    match value.value.as_ref() {
        None => J::Null,
        Some(Value::StringValue(s)) => J::String(text(s).to_owned()),
        Some(Value::BoolValue(b)) => J::Bool(*b),
        Some(Value::IntValue(i)) => J::from(*i),
        Some(Value::DoubleValue(d)) => J::from(*d),
        Some(Value::BytesValue(b)) => J::String(hex(b)),
        Some(Value::ArrayValue(a)) => J::Array(a.values.iter().map(to_json).collect()),
        Some(Value::KvlistValue(kv)) => J::Object(
            kv.values
                .iter()
                .map(|kv| {
                    let v = kv.value.as_ref().map_or(J::Null, to_json);
                    (text(&kv.key).to_owned(), v)
                })
                .collect(),
        ),
    }
}

/// Lower-case hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ArrayValue;

    fn s(v: &str) -> AnyValue {
        AnyValue {
            value: Some(Value::StringValue(bytes::Bytes::copy_from_slice(
                v.as_bytes(),
            ))),
        }
    }
    fn i(v: i64) -> AnyValue {
        AnyValue {
            value: Some(Value::IntValue(v)),
        }
    }

    /// Every unit form of docs/instrumenting.md's deadline row parses to milliseconds.
    #[test]
    fn budgets_in_every_listed_form() {
        assert_eq!(as_budget_ms(&i(300)), Some(300.0));
        assert_eq!(as_budget_ms(&s("300")), Some(300.0));
        assert_eq!(as_budget_ms(&s("300ms")), Some(300.0));
        assert_eq!(as_budget_ms(&s("1.5s")), Some(1500.0));
        assert_eq!(as_budget_ms(&s("300m")), Some(300.0)); // gRPC: m = milliseconds
        assert_eq!(as_budget_ms(&s("2S")), Some(2000.0));
        assert_eq!(as_budget_ms(&s("100000u")), Some(100.0));
        assert_eq!(as_budget_ms(&s("1M")), Some(60_000.0));
        assert_eq!(as_budget_ms(&s("2min")), Some(120_000.0));
        let header = AnyValue {
            value: Some(Value::ArrayValue(ArrayValue {
                values: vec![s("250m")],
            })),
        };
        assert_eq!(as_budget_ms(&header), Some(250.0));
        assert_eq!(as_budget_ms(&s("soon")), None);
        assert_eq!(as_budget_ms(&i(-5)), None);
        assert_eq!(as_budget_ms(&s("123456789m")), None); // 9 digits: not gRPC, bad unit
        assert_eq!(as_budget_ms(&s("12꠹")), None); // non-ASCII unit must not panic
    }

    /// Integers and booleans are accepted in the forms exporters actually send.
    #[test]
    fn lenient_scalars() {
        assert_eq!(as_i64(&s(" 2 ")), Some(2));
        assert_eq!(as_i64(&s("two")), None);
        assert_eq!(as_bool(&s("TRUE")), Some(true));
        assert_eq!(as_bool(&i(0)), Some(false));
        assert_eq!(as_str(&i(1)), None);
    }

    /// Earlier aliases get lower ranks; one name may play several roles.
    #[test]
    fn alias_precedence_and_shared_names() {
        let c = Conventions::default();
        assert_eq!(c.roles("retry"), &[(Concept::Attempt, 0)]);
        assert_eq!(c.roles("previous-rpc-attempts"), &[(Concept::Attempt, 4)]);
        let rpc_service = c.roles("rpc.service");
        assert!(rpc_service.contains(&(Concept::CalleeHint, 2)));
        assert!(rpc_service.contains(&(Concept::RpcService, 0)));
        assert_eq!(c.roles("http.url"), &[(Concept::Url, 1)]);
        assert!(c.roles("http.user_agent").is_empty());
    }

    /// Arrays and maps render as JSON, bytes as hex.
    #[test]
    fn rendering() {
        let arr = AnyValue {
            value: Some(Value::ArrayValue(ArrayValue {
                values: vec![s("a"), i(1)],
            })),
        };
        assert_eq!(render(&arr).as_deref(), Some(r#"["a",1]"#));
        let bytes = AnyValue {
            value: Some(Value::BytesValue(vec![0xab, 0x01].into())),
        };
        assert_eq!(render(&bytes).as_deref(), Some("ab01"));
    }
}
