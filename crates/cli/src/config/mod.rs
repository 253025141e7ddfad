//! Configuration: embedded defaults, overridden by a YAML or TOML file, then by
//! `STORMGLASS_*` environment variables, then by command-line flags.
//!
//! All three sources are merged as one value tree before anything is typed, so a key means
//! the same thing everywhere (`assembly.idle` in the file, `STORMGLASS_ASSEMBLY__IDLE` in the
//! environment). Each top-level section is then deserialised on its own and validated, and
//! every problem is reported at once, each with its key path.

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};
use stormglass_analytics::{AlertThresholds, AnalyticsConfig, Params, ReportConfig};
use stormglass_archive::ArchiveConfig;
use stormglass_assembly::AssemblyConfig;
use stormglass_export::NotifyConfig;
use stormglass_runtime::{AuthConfig, TlsConfig};

use stormglass_runtime::config_tree::{Format, parse, scalar, section, set};

/// Prefix of environment overrides; `__` separates key path segments.
pub const ENV_PREFIX: &str = "STORMGLASS_";

/// `STORMGLASS_*` variables that are switches of the tools, not configuration keys:
/// re-blessing golden files in tests, faults injected by the live-path tests, and the
/// analysis's per-query timings and plans on stderr
/// ([`stormglass_analytics::table::SWITCHES`]).
const NOT_CONFIG: [&str; 2] = ["STORMGLASS_BLESS", "STORMGLASS_TEST_FAULTS"];

/// The whole configuration of `stormglass serve`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    pub listen: ListenConfig,
    pub limits: LimitsConfig,
    pub assembly: AssemblyConfig,
    pub analytics: AnalyticsConfig,
    pub advice: AdviceConfig,
    pub orphans: OrphansConfig,
    pub deadlines: DeadlinesConfig,
    pub clocks: ClocksConfig,
    pub retries: RetriesConfig,
    pub idempotency: IdempotencyConfig,
    pub sampling: SamplingConfig,
    pub shutdown: ShutdownConfig,
    pub archive: ArchiveConfig,
    pub tls: TlsConfig,
    pub auth: AuthConfig,
    pub links: LinksConfig,
    pub report: ReportConfig,
    pub alerts: AlertThresholds,
    /// The receiver keys of the `alerts` section (`alerts.alertmanagers`, ...).
    pub notify: NotifyConfig,
}

impl Config {
    /// How spans are read: the attribute aliases, and the sampling ratios.
    pub fn conventions(&self) -> stormglass_model::Conventions {
        stormglass_model::Conventions::default().with_sampling_ratios(
            self.sampling
                .ratios
                .iter()
                .map(|(service, ratio)| (service.as_str(), *ratio)),
        )
    }

    /// `https` when the API is served over TLS, else `http`.
    pub fn api_scheme(&self) -> &'static str {
        if self.tls.cert_file.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The thresholds the analysis SQL reads.
    pub fn params(&self) -> Params {
        Params {
            deadline_tolerance_ms: self.deadlines.tolerance_ms,
            orphan_grace_ms: self.orphans.grace_ms,
            min_backoff_ms: self.advice.min_backoff_ms,
            timeout_factor: self.advice.timeout_factor,
            min_timeout_ms: self.advice.min_timeout_ms,
            clock_tolerance_ms: self.clocks.tolerance_ms,
            clock_skew_threshold_ms: self.clocks.skew_threshold_ms,
            retries: stormglass_analytics::lineage::RetryRules {
                infer_loops: self.retries.infer_loops,
                overlap_tolerance_ms: self.retries.overlap_tolerance_ms,
                overlapping: self.retries.overlapping_resends,
            },
            backoff_min_calls: self.retries.backoff_min_calls as f64,
            synchronised_min_calls: self.retries.synchronised_min_calls as f64,
            slo_latency_ms: self.alerts.entry_slo.latency_ms,
            unknown_after_ms: self.idempotency.unknown_after.as_secs_f64() * 1e3,
        }
    }
}

/// `links.*`: where stormglass links to other tools.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinksConfig {
    /// A trace's page in a trace store (Tempo, Jaeger, ...), with `{trace_id}` in place of
    /// the id (32 hex digits): `http://tempo:3200/trace/{trace_id}`.
    pub trace_url: Option<String>,
}

/// `advice.*`: what the recommendations assume.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdviceConfig {
    /// recommended timeout = callee P99.9 x this.
    pub timeout_factor: f64,
    /// Retries started sooner than this after the previous attempt are immediate retries.
    pub min_backoff_ms: f64,
    /// No timeout is advised below this.
    pub min_timeout_ms: f64,
}

// The analysis thresholds' defaults are `Params::default()`'s: one source, so the binary
// and the analysis tests (which use `Params::default()`) cannot drift apart.

impl Default for AdviceConfig {
    fn default() -> Self {
        let defaults = Params::default();
        AdviceConfig {
            timeout_factor: defaults.timeout_factor,
            min_backoff_ms: defaults.min_backoff_ms,
            min_timeout_ms: defaults.min_timeout_ms,
        }
    }
}

/// `idempotency.*`: how writes' results are read.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// A given-up keyed write whose result stays unknown longer than this (no later span
    /// with its key answered) counts in `unknown_results_over_limit`.
    #[serde(with = "stormglass_runtime::duration")]
    pub unknown_after: std::time::Duration,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            unknown_after: std::time::Duration::from_secs_f64(
                Params::default().unknown_after_ms / 1e3,
            ),
        }
    }
}

/// `orphans.*`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrphansConfig {
    /// A callee ending more than this after its cancelled caller is orphan work.
    pub grace_ms: f64,
}

impl Default for OrphansConfig {
    fn default() -> Self {
        OrphansConfig {
            grace_ms: Params::default().orphan_grace_ms,
        }
    }
}

/// `deadlines.*`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeadlinesConfig {
    /// Budgets may exceed what the parent has left by this much before it is an inversion.
    pub tolerance_ms: f64,
}

impl Default for DeadlinesConfig {
    fn default() -> Self {
        DeadlinesConfig {
            tolerance_ms: Params::default().deadline_tolerance_ms,
        }
    }
}

/// `clocks.*`: clock skew between the hosts of a caller and its callee.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClocksConfig {
    /// Clocks agreeing within this (ms) are not corrected: timestamp resolution and jitter.
    pub tolerance_ms: f64,
    /// A skew larger than this (ms) is reported as a `clock_skew` finding.
    pub skew_threshold_ms: f64,
}

impl Default for ClocksConfig {
    fn default() -> Self {
        let defaults = Params::default();
        ClocksConfig {
            tolerance_ms: defaults.clock_tolerance_ms,
            skew_threshold_ms: defaults.clock_skew_threshold_ms,
        }
    }
}

/// `retries.*`: how attempts that carry no number are found.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetriesConfig {
    /// Unnumbered sibling CLIENT spans to one callee and operation, each started after the
    /// one before failed retryably (and to the same URL where both carry one), are attempts
    /// of one call: an application's retry loop.
    pub infer_loops: bool,
    /// A re-sent request (several SERVER spans under one CLIENT span) starting at most this
    /// long (ms) before the one before it ended follows it: a retry, not a hedge.
    pub overlap_tolerance_ms: f64,
    /// A re-sent request started while an earlier one still ran: `auto` (a hedge in calls
    /// where an earlier attempt answered while a later one ran, else a retry after a per-try
    /// timeout), `hedge` or `per_try_timeout` for every call.
    pub overlapping_resends: stormglass_analytics::lineage::Overlapping,
    /// An edge's `backoff` is classified from this many retried calls on (null below).
    pub backoff_min_calls: u64,
    /// A 100 ms slot in which at least this many calls retried to one callee (and 3 times
    /// its mean per slot) holds synchronised retries.
    pub synchronised_min_calls: u64,
}

impl Default for RetriesConfig {
    fn default() -> Self {
        let rules = Params::default().retries;
        RetriesConfig {
            infer_loops: rules.infer_loops,
            overlap_tolerance_ms: rules.overlap_tolerance_ms,
            overlapping_resends: rules.overlapping,
            backoff_min_calls: Params::default().backoff_min_calls as u64,
            synchronised_min_calls: Params::default().synchronised_min_calls as u64,
        }
    }
}

/// `shutdown.*`: a graceful stop (SIGTERM, SIGINT).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// Bound on releasing and analysing every open trace; what is left unanalysed after it
    /// is logged with its span count.
    #[serde(with = "stormglass_runtime::duration")]
    pub timeout: std::time::Duration,
    /// How long `/metrics` and the API keep answering after the last analysis, so the last
    /// scrape sees the final counters (set it to a scrape interval).
    #[serde(with = "stormglass_runtime::duration")]
    pub drain: std::time::Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            timeout: std::time::Duration::from_secs(30),
            drain: std::time::Duration::from_secs(15),
        }
    }
}

/// `sampling.*`: for SDKs that sample by ratio without writing OpenTelemetry's threshold
/// into the tracestate (`ot=th:`, which is read first when present).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Per service: the share of its traces kept, in (0, 1]; each kept span counts as
    /// 1 / ratio.
    pub ratios: std::collections::BTreeMap<String, f64>,
}

/// `listen.*`: where the receivers and the API listen. Port 0 picks a free port.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub api: SocketAddr,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            grpc: SocketAddr::from(([127, 0, 0, 1], 4317)),
            http: SocketAddr::from(([127, 0, 0, 1], 4318)),
            api: SocketAddr::from(([127, 0, 0, 1], 9464)),
        }
    }
}

/// `limits.*`: the memory budget and per-request bounds.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// The process's memory bound: spans held (open, waiting for analysis, being analysed),
    /// requests being decoded and the window's partials get what the process's own
    /// footprint leaves of it. Bytes, a human size (`512MiB`, `2GiB`), or `auto`: 80% of the
    /// cgroup's memory limit (the container's), else 1 GiB.
    pub memory: MemoryLimit,
    /// Requests read, decoded and stored at once, over both transports.
    pub max_concurrent_requests: usize,
    /// Largest OTLP request, in bytes, measured after decompression.
    pub max_request_bytes: usize,
    /// Longest a request's body may take to arrive once its headers did; a slower client
    /// gets 408 / DEADLINE_EXCEEDED and frees its request slot.
    #[serde(with = "stormglass_runtime::duration")]
    pub request_timeout: std::time::Duration,
    /// Series per exported figure metric; beyond it new series fold into
    /// `operation="__overflow__"`.
    pub max_series_per_metric: usize,
    /// How much lower the receivers' CPU priority is than the assembly's and the analysis's:
    /// added to the process's nice value on the receivers' threads (0 to 19; 0: the same).
    pub receiver_nice: u8,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            memory: MemoryLimit::Auto,
            max_concurrent_requests: 64,
            max_request_bytes: 64 << 20,
            request_timeout: stormglass_ingest::admission::DEFAULT_BODY_TIMEOUT,
            max_series_per_metric: 2000,
            receiver_nice: 10,
        }
    }
}

/// `limits.memory`: a size, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MemoryLimit {
    /// [`MemoryLimit::AUTO_SHARE`] of the cgroup's memory limit, else [`MemoryLimit::FALLBACK`].
    #[default]
    Auto,
    Bytes(bytesize::ByteSize),
}

impl MemoryLimit {
    /// The share of a cgroup's memory limit `auto` takes: the process stays within ~15%
    /// above `limits.memory`, so 80% keeps it clear of the out-of-memory killer.
    pub const AUTO_SHARE: f64 = 0.8;
    /// `auto` outside a memory-limited cgroup.
    pub const FALLBACK: u64 = 1 << 30;

    /// The bound in bytes, given the cgroup's memory limit (if any), and how it was chosen
    /// (for the log).
    pub fn resolve(self, cgroup: Option<u64>) -> (usize, String) {
        let (bytes, how) = match (self, cgroup) {
            (MemoryLimit::Bytes(b), _) => (b.as_u64(), "limits.memory".to_owned()),
            (MemoryLimit::Auto, Some(cgroup)) => (
                (cgroup as f64 * Self::AUTO_SHARE) as u64,
                format!(
                    "limits.memory auto: 80% of the cgroup's memory limit ({})",
                    bytesize::ByteSize(cgroup).display().iec()
                ),
            ),
            (MemoryLimit::Auto, None) => (
                Self::FALLBACK,
                "limits.memory auto: no cgroup memory limit, 1 GiB".to_owned(),
            ),
        };
        (usize::try_from(bytes).unwrap_or(usize::MAX), how)
    }
}

impl<'de> Deserialize<'de> for MemoryLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        let invalid = |what: &str| {
            serde::de::Error::custom(format!(
                "expected a size (bytes, `512MiB`, `2GiB`) or `auto`, found {what}"
            ))
        };
        match Raw::deserialize(d).map_err(|_| invalid("another type"))? {
            Raw::Bytes(b) => Ok(MemoryLimit::Bytes(bytesize::ByteSize(b))),
            Raw::Text(t) if t.trim().eq_ignore_ascii_case("auto") => Ok(MemoryLimit::Auto),
            Raw::Text(t) => t
                .trim()
                .parse::<bytesize::ByteSize>()
                .map(MemoryLimit::Bytes)
                .map_err(|_| invalid(&format!("`{t}`"))),
        }
    }
}

/// The top-level sections, in the order the example file shows them.
pub const SECTIONS: [&str; 18] = [
    "listen",
    "limits",
    "assembly",
    "analytics",
    "advice",
    "orphans",
    "deadlines",
    "clocks",
    "retries",
    "idempotency",
    "sampling",
    "shutdown",
    "archive",
    "tls",
    "auth",
    "links",
    "report",
    "alerts",
];

/// Every problem found, each as (key path, message).
#[derive(Debug, PartialEq)]
pub struct ConfigErrors(pub Vec<(String, String)>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problems):", self.0.len())?;
        for (key, message) in &self.0 {
            writeln!(f, "  {key}: {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Command-line overrides, as key paths.
pub type Overrides = Vec<(&'static str, String)>;

/// Load the configuration from an optional file, the environment and flag overrides.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: &Overrides,
) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut tree = match file {
        Some(path) => read_file(path).unwrap_or_else(|e| {
            errors.push(("(file)".to_owned(), e));
            Value::Object(Map::new())
        }),
        None => Value::Object(Map::new()),
    };
    for (name, value) in env {
        if NOT_CONFIG.contains(&name.as_str())
            || stormglass_analytics::table::SWITCHES.contains(&name.as_str())
        {
            continue;
        }
        if let Some(path) = name.strip_prefix(ENV_PREFIX) {
            let keys: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
            set(&mut tree, &keys, scalar(&value));
        }
    }
    for (key, value) in flags {
        let keys: Vec<String> = key.split('.').map(str::to_owned).collect();
        set(&mut tree, &keys, Value::String(value.clone()));
    }
    let config = from_tree(tree, &mut errors);
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Type each section of the merged tree, collecting errors instead of stopping at the first.
fn from_tree(tree: Value, errors: &mut Vec<(String, String)>) -> Config {
    let Value::Object(mut sections) = tree else {
        errors.push((
            "(root)".to_owned(),
            "the configuration must be a mapping of sections".to_owned(),
        ));
        return Config::default();
    };
    let mut config = Config {
        listen: section(&mut sections, "listen", errors),
        limits: section(&mut sections, "limits", errors),
        assembly: section(&mut sections, "assembly", errors),
        analytics: section(&mut sections, "analytics", errors),
        advice: section(&mut sections, "advice", errors),
        orphans: section(&mut sections, "orphans", errors),
        deadlines: section(&mut sections, "deadlines", errors),
        clocks: section(&mut sections, "clocks", errors),
        retries: section(&mut sections, "retries", errors),
        idempotency: section(&mut sections, "idempotency", errors),
        sampling: section(&mut sections, "sampling", errors),
        shutdown: section(&mut sections, "shutdown", errors),
        archive: section(&mut sections, "archive", errors),
        tls: section(&mut sections, "tls", errors),
        auth: section(&mut sections, "auth", errors),
        links: section(&mut sections, "links", errors),
        report: section(&mut sections, "report", errors),
        notify: notify_keys(&mut sections, errors),
        alerts: section(&mut sections, "alerts", errors),
    };
    for unknown in sections.keys() {
        errors.push((
            unknown.clone(),
            format!("unknown section; expected one of {}", SECTIONS.join(", ")),
        ));
    }
    errors.extend(config.notify.validate("alerts"));
    errors.extend(config.alerts.validate("alerts"));
    if let Some(url) = &config.links.trace_url
        && !url.contains("{trace_id}")
    {
        errors.push((
            "links.trace_url".to_owned(),
            format!("{url:?} has no {{trace_id}} to replace with a trace id"),
        ));
    }
    if let Some(path) = &config.alerts.baseline {
        match stormglass_analytics::alerts::read_baseline(path) {
            Ok(p999) => config.alerts.baseline_p999_ms = p999,
            Err(e) => errors.push(("alerts.baseline".to_owned(), e)),
        }
    }
    if config.limits.max_series_per_metric == 0 {
        errors.push((
            "limits.max_series_per_metric".to_owned(),
            "must be greater than 0 (default 2000)".to_owned(),
        ));
    }
    if config.limits.max_request_bytes == 0 || config.limits.max_request_bytes >= 1 << 30 {
        errors.push((
            "limits.max_request_bytes".to_owned(),
            "must be greater than 0 and below 1 GiB (default 67108864, 64 MiB)".to_owned(),
        ));
    }
    if let MemoryLimit::Bytes(b) = config.limits.memory
        && b.as_u64() < 16 << 20
    {
        errors.push((
            "limits.memory".to_owned(),
            "must be at least 16MiB (default auto: 80% of the container's limit, else 1GiB)"
                .to_owned(),
        ));
    }
    if config.limits.request_timeout.is_zero() {
        errors.push((
            "limits.request_timeout".to_owned(),
            "must be greater than 0 (default 30s)".to_owned(),
        ));
    }
    if config.limits.receiver_nice > 19 {
        errors.push((
            "limits.receiver_nice".to_owned(),
            "must be between 0 and 19 (default 10)".to_owned(),
        ));
    }
    if config.limits.max_concurrent_requests == 0 {
        errors.push((
            "limits.max_concurrent_requests".to_owned(),
            "must be greater than 0 (default 64)".to_owned(),
        ));
    }
    errors.extend(config.assembly.validate("assembly"));
    errors.extend(config.analytics.validate("analytics"));
    errors.extend(config.report.validate("report"));
    errors.extend(config.archive.validate("archive"));
    errors.extend(config.tls.validate("tls"));
    let positive = [
        (
            "advice.timeout_factor",
            config.advice.timeout_factor,
            "e.g. 1.5",
        ),
        (
            "advice.min_backoff_ms",
            config.advice.min_backoff_ms,
            "e.g. 5",
        ),
        (
            "advice.min_timeout_ms",
            config.advice.min_timeout_ms,
            "e.g. 50",
        ),
        ("orphans.grace_ms", config.orphans.grace_ms, "e.g. 5"),
        (
            "deadlines.tolerance_ms",
            config.deadlines.tolerance_ms,
            "e.g. 1",
        ),
        ("clocks.tolerance_ms", config.clocks.tolerance_ms, "e.g. 1"),
        (
            "clocks.skew_threshold_ms",
            config.clocks.skew_threshold_ms,
            "e.g. 10",
        ),
    ];
    let slo = &config.alerts.entry_slo;
    for (key, share) in [
        ("alerts.entry_slo.latency_share", slo.latency_share),
        ("alerts.entry_slo.error_rate", slo.error_rate),
    ] {
        if !(share > 0.0 && share < 1.0) {
            errors.push((
                key.to_owned(),
                "must be a share in (0, 1), e.g. 0.95".to_owned(),
            ));
        }
    }
    if !(slo.latency_ms.is_finite() && slo.latency_ms > 0.0) {
        errors.push((
            "alerts.entry_slo.latency_ms".to_owned(),
            "must be a duration in ms > 0, e.g. 1200".to_owned(),
        ));
    }
    for (service, ratio) in &config.sampling.ratios {
        if !(*ratio > 0.0 && *ratio <= 1.0) {
            errors.push((
                format!("sampling.ratios.{service}"),
                "must be a ratio in (0, 1], e.g. 0.25 for 1 trace in 4".to_owned(),
            ));
        }
    }
    for (key, value, example) in positive {
        if !(value.is_finite() && value >= 0.0) {
            errors.push((key.to_owned(), format!("must be a number >= 0 ({example})")));
        }
    }
    config
}

/// The `alerts` section holds thresholds and receivers: move the receiver keys out and type
/// them on their own (errors still name `alerts.<key>`); the thresholds stay for `section`.
fn notify_keys(
    sections: &mut Map<String, Value>,
    errors: &mut Vec<(String, String)>,
) -> NotifyConfig {
    let Some(Value::Object(alerts)) = sections.get_mut("alerts") else {
        return NotifyConfig::default();
    };
    let mut receivers = Map::new();
    for key in NotifyConfig::KEYS {
        if let Some(value) = alerts.remove(key) {
            receivers.insert(key.to_owned(), value);
        }
    }
    let mut holder = Map::new();
    holder.insert("alerts".to_owned(), Value::Object(receivers));
    section(&mut holder, "alerts", errors)
}

fn read_file(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let format = match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "yaml" | "yml" => Format::Yaml,
        "toml" => Format::Toml,
        _ => {
            return Err(format!(
                "{}: unknown format; name the file .yaml, .yml or .toml",
                path.display()
            ));
        }
    };
    parse(&text, format).map_err(|e| format!("{} {e}", path.display()))
}
