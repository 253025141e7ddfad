//! Outcome classes of docs/instrumenting.md ("What stormglass reads from your spans": outcome classes).
//!
//! A span's signals are read in a fixed precedence, most specific first: how a proxy says it
//! ended the request (Envoy's `response_flags`, HAProxy's termination state), a non-zero
//! gRPC status code, an HTTP status >= 400, `error.type`, `ctx_cancelled=true`, a non-zero
//! `err_code`, then the OTLP span status. The first signal that names a failure decides the
//! class; a span with none of them is `ok`.

/// Outcome class of one span. `Ok` is success, every other class is a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    Deadline,
    Cancelled,
    Unavailable,
    Throttled,
    ServerError,
    ClientError,
}

impl Outcome {
    /// Every class, in the order docs/instrumenting.md lists them.
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Deadline,
        Outcome::Cancelled,
        Outcome::Unavailable,
        Outcome::Throttled,
        Outcome::ServerError,
        Outcome::ClientError,
    ];

    /// The class name used in the `outcome` column, metric labels and the JSON report.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Deadline => "deadline",
            Outcome::Cancelled => "cancelled",
            Outcome::Unavailable => "unavailable",
            Outcome::Throttled => "throttled",
            Outcome::ServerError => "server_error",
            Outcome::ClientError => "client_error",
        }
    }

    /// The class named `name` (the inverse of [`Outcome::as_str`]).
    pub fn from_class(name: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// A failure callers retry: every failure but `client_error`, which the same request
    /// would meet again.
    pub fn is_retried(self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::ClientError)
    }

    /// Class of a gRPC status code; `None` for 0 (OK) and codes outside the gRPC range.
    pub fn from_grpc_code(code: i64) -> Option<Outcome> {
        Some(match code {
            0 => return None,
            1 => Outcome::Cancelled,
            4 => Outcome::Deadline,
            14 => Outcome::Unavailable,
            8 => Outcome::Throttled,
            2 | 13 | 15 => Outcome::ServerError,
            3 | 5 | 6 | 7 | 9 | 10 | 11 | 12 | 16 => Outcome::ClientError,
            _ => return None,
        })
    }

    /// Class of a gRPC status code given by name (`rpc.response.status_code` style,
    /// e.g. `DEADLINE_EXCEEDED`).
    pub fn from_grpc_name(name: &str) -> Option<Outcome> {
        Outcome::from_grpc_code(grpc_code_named(name)?)
    }

    /// Class of an HTTP status code; `None` below 400.
    pub fn from_http_status(status: i64) -> Option<Outcome> {
        Some(match status {
            504 | 408 => Outcome::Deadline,
            499 => Outcome::Cancelled,
            502 | 503 => Outcome::Unavailable,
            429 => Outcome::Throttled,
            500..=599 => Outcome::ServerError,
            400..=499 => Outcome::ClientError,
            _ => return None,
        })
    }

    /// Class of Envoy's `response_flags` (short codes joined by commas, `-` for none): a
    /// timeout (`UT` the request's or a per-try timeout, `SI` stream idle, `DT` max
    /// duration), the caller going away (`DC`), the upstream failing (`UF`, `UH`, `UC`,
    /// `UR`, `LR`, `NC`), load shed (`UO` circuit breaking, `RL` rate limited), or refused as
    /// asked (`NR` no route, `UAEX` unauthorised); `None` when no flag names a failure
    /// (`URX`, retries exhausted, leaves the class to the status).
    pub fn from_envoy_flags(flags: &str) -> Option<Outcome> {
        flags
            .split(',')
            .filter_map(|flag| {
                Some(match flag.trim() {
                    "UT" | "SI" | "DT" => Outcome::Deadline,
                    "DC" => Outcome::Cancelled,
                    "UF" | "UH" | "UC" | "UR" | "LR" | "NC" => Outcome::Unavailable,
                    "UO" | "RL" => Outcome::Throttled,
                    "NR" | "UAEX" => Outcome::ClientError,
                    _ => return None,
                })
            })
            // A timeout explains the resets it causes: the first in this order wins.
            .min_by_key(|class| Outcome::ALL.iter().position(|c| c == class))
    }

    /// Class of HAProxy's termination state (`%tsc`: the first letter says who ended the
    /// session, the second at which stage): `s` a server-side timeout (`sH`: no answer in
    /// `timeout server`); `c` a client-side timeout and `C`/`K` the client aborting or the
    /// session killed; `S` the server aborting or refusing, `D` it being down, `R` a
    /// resource running out; `P` the proxy refusing the request, `I` an internal error;
    /// `None` for `-` (a normal end) and the rest (the status decides).
    pub fn from_termination_state(state: &str) -> Option<Outcome> {
        Some(match state.trim().chars().next()? {
            's' => Outcome::Deadline,
            'c' | 'C' | 'K' => Outcome::Cancelled,
            'S' | 'D' | 'R' => Outcome::Unavailable,
            'P' => Outcome::ClientError,
            'I' => Outcome::ServerError,
            _ => return None,
        })
    }

    /// Class of an `error.type` value. Semantic conventions set `error.type` only on failed
    /// operations, so an unrecognised value is a failure of unknown cause: `server_error`.
    pub fn from_error_type(error_type: &str) -> Outcome {
        Outcome::from_keyword(error_type).unwrap_or(Outcome::ServerError)
    }

    /// The class a free-text reason names (`"timeout"`, `"connection refused"`, `"503"`,
    /// a class name itself), or `None` when it names none.
    pub fn from_keyword(text: &str) -> Option<Outcome> {
        let e = text.trim().to_ascii_lowercase();
        let has = |needle: &str| e.contains(needle);
        if let Some(class) = Outcome::ALL.into_iter().find(|c| c.as_str() == e) {
            Some(class)
        } else if has("timeout") || has("timed out") || has("deadline") {
            Some(Outcome::Deadline)
        } else if has("cancel") {
            // cancelled, canceled, ctx_cancelled, context canceled
            Some(Outcome::Cancelled)
        } else if has("refused") || has("reset") || has("unavailable") || has("unreachable") {
            Some(Outcome::Unavailable)
        } else if has("throttl") || has("rate_limit") || has("too_many_requests") {
            Some(Outcome::Throttled)
        } else if let Ok(status) = e.parse::<u16>() {
            // HTTP instrumentations put the status code as text into error.type.
            Outcome::from_http_status(i64::from(status))
        } else {
            None
        }
    }

    /// The `retry_cause` column's form of a cause attribute: the outcome class it names
    /// (so `timeout`, `DEADLINE_EXCEEDED` and `deadline` all read `deadline`), else the text
    /// lower-cased.
    pub fn normalise_cause(cause: &str) -> String {
        match Outcome::from_keyword(cause) {
            Some(class) => class.as_str().to_owned(),
            None => cause.trim().to_ascii_lowercase(),
        }
    }
}

/// The gRPC status codes' names, by code.
pub const GRPC_STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The gRPC status code named `name` (any case), e.g. 4 for `DEADLINE_EXCEEDED`.
pub fn grpc_code_named(name: &str) -> Option<i64> {
    let code = GRPC_STATUS_NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name.trim()))?;
    i64::try_from(code).ok()
}

/// gRPC's ALREADY_EXISTS.
const GRPC_ALREADY_EXISTS: i64 = 6;

/// An answer saying the request repeats one already done: HTTP 409 Conflict, gRPC
/// ALREADY_EXISTS, or an `error.type` naming a duplicate ("DuplicateKeyError",
/// "UniqueViolation", "already exists").
pub fn is_duplicate(http: Option<i64>, grpc: Option<i64>, error_type: Option<&str>) -> bool {
    let named = |text: &str| {
        let e = text.to_ascii_lowercase();
        [
            "duplicate",
            "unique",
            "already exist",
            "alreadyexist",
            "already_exist",
        ]
        .iter()
        .any(|needle| e.contains(needle))
    };
    http == Some(409) || grpc == Some(GRPC_ALREADY_EXISTS) || error_type.is_some_and(named)
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome signals found on one span, gathered by the encoder in one pass over the
/// attributes and resolved by [`OutcomeSignals::classify`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutcomeSignals {
    /// What a proxy's own flags say (Envoy's `response_flags`, HAProxy's termination state).
    pub proxy: Option<Outcome>,
    pub grpc: Option<Outcome>,
    pub http: Option<Outcome>,
    pub error_type: Option<Outcome>,
    pub ctx_cancelled: bool,
    pub err_code_nonzero: bool,
    pub status_error: bool,
}

impl OutcomeSignals {
    /// Resolve the signals in precedence order (see the module docs).
    pub fn classify(&self) -> Outcome {
        self.proxy
            .or(self.grpc)
            .or(self.http)
            .or(self.error_type)
            .or(self.ctx_cancelled.then_some(Outcome::Cancelled))
            .or(self.err_code_nonzero.then_some(Outcome::ClientError))
            .or(self.status_error.then_some(Outcome::ServerError))
            .unwrap_or(Outcome::Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every class's name reads back as that class; failures but client errors are retried.
    #[test]
    fn classes_by_name_and_retried() {
        for outcome in Outcome::ALL {
            assert_eq!(Outcome::from_class(outcome.as_str()), Some(outcome));
        }
        assert_eq!(Outcome::from_class("teapot"), None);
        let retried: Vec<&str> = Outcome::ALL
            .into_iter()
            .filter(|o| o.is_retried())
            .map(Outcome::as_str)
            .collect();
        assert_eq!(
            retried,
            [
                "deadline",
                "cancelled",
                "unavailable",
                "throttled",
                "server_error"
            ]
        );
    }

    /// Every row of docs/instrumenting.md's gRPC column maps to its class.
    #[test]
    fn grpc_codes_follow_metrics_md() {
        assert_eq!(Outcome::from_grpc_code(0), None);
        assert_eq!(Outcome::from_grpc_code(4), Some(Outcome::Deadline));
        assert_eq!(Outcome::from_grpc_code(1), Some(Outcome::Cancelled));
        assert_eq!(Outcome::from_grpc_code(14), Some(Outcome::Unavailable));
        assert_eq!(Outcome::from_grpc_code(8), Some(Outcome::Throttled));
        for c in [2, 13, 15] {
            assert_eq!(Outcome::from_grpc_code(c), Some(Outcome::ServerError));
        }
        for c in [3, 5, 6, 7, 9, 10, 11, 12, 16] {
            assert_eq!(Outcome::from_grpc_code(c), Some(Outcome::ClientError));
        }
        assert_eq!(
            Outcome::from_grpc_name("deadline_exceeded"),
            Some(Outcome::Deadline)
        );
        assert_eq!(Outcome::from_grpc_name("OK"), None);
    }

    /// Every row of docs/instrumenting.md's HTTP column maps to its class; 2xx/3xx are no signal.
    #[test]
    fn http_statuses_follow_metrics_md() {
        assert_eq!(Outcome::from_http_status(200), None);
        assert_eq!(Outcome::from_http_status(304), None);
        assert_eq!(Outcome::from_http_status(504), Some(Outcome::Deadline));
        assert_eq!(Outcome::from_http_status(408), Some(Outcome::Deadline));
        assert_eq!(Outcome::from_http_status(499), Some(Outcome::Cancelled));
        assert_eq!(Outcome::from_http_status(502), Some(Outcome::Unavailable));
        assert_eq!(Outcome::from_http_status(503), Some(Outcome::Unavailable));
        assert_eq!(Outcome::from_http_status(429), Some(Outcome::Throttled));
        assert_eq!(Outcome::from_http_status(500), Some(Outcome::ServerError));
        assert_eq!(Outcome::from_http_status(404), Some(Outcome::ClientError));
    }

    /// `error.type` text maps by keyword; unknown failures are server errors.
    #[test]
    fn error_type_keywords() {
        assert_eq!(Outcome::from_error_type("timeout"), Outcome::Deadline);
        assert_eq!(
            Outcome::from_error_type("DeadlineExceeded"),
            Outcome::Deadline
        );
        assert_eq!(Outcome::from_error_type("canceled"), Outcome::Cancelled);
        assert_eq!(
            Outcome::from_error_type("ctx_cancelled"),
            Outcome::Cancelled
        );
        assert_eq!(
            Outcome::from_error_type("connection refused"),
            Outcome::Unavailable
        );
        assert_eq!(Outcome::from_error_type("503"), Outcome::Unavailable);
        assert_eq!(Outcome::from_error_type("404"), Outcome::ClientError);
        assert_eq!(
            Outcome::from_error_type("java.lang.NullPointerException"),
            Outcome::ServerError
        );
        assert_eq!(Outcome::normalise_cause("DEADLINE_EXCEEDED"), "deadline");
        assert_eq!(Outcome::normalise_cause("timeout"), "deadline");
        assert_eq!(Outcome::normalise_cause("Unavailable"), "unavailable");
        assert_eq!(Outcome::normalise_cause("Leader-Moved"), "leader-moved");
    }

    /// Precedence: codes beat error.type, which beats cancel flags, business codes and status.
    #[test]
    fn precedence() {
        let mut s = OutcomeSignals {
            status_error: true,
            ..Default::default()
        };
        assert_eq!(s.classify(), Outcome::ServerError);
        s.err_code_nonzero = true;
        assert_eq!(s.classify(), Outcome::ClientError);
        s.ctx_cancelled = true;
        assert_eq!(s.classify(), Outcome::Cancelled);
        s.error_type = Some(Outcome::Unavailable);
        assert_eq!(s.classify(), Outcome::Unavailable);
        s.http = Some(Outcome::Throttled);
        assert_eq!(s.classify(), Outcome::Throttled);
        s.grpc = Some(Outcome::Deadline);
        assert_eq!(s.classify(), Outcome::Deadline);
        assert_eq!(OutcomeSignals::default().classify(), Outcome::Ok);
    }
}
