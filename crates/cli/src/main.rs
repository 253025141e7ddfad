//! `stormglass`: the collector and its tools in one binary. This file owns argument
//! handling; each command lives in its own module.

mod api;
mod budget;
mod config;
mod demo;
mod gate;
mod load;
mod offline;
mod runbooks;
mod serve;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Every accepted span costs a few dozen short-lived allocations (prost's decoded strings
/// and vectors) and the analysis many more: mimalloc's thread-local free lists make them
/// cheap where glibc's malloc dominated the profile.
///
/// Built with `no_thp`: with transparent huge pages, every first touch of memory the
/// allocator had returned to the kernel faults in (and zeroes, and may compact) a whole
/// 2 MiB page, which dominated `stormglass analyze` and cost the live path too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay`: its place in v3's `mi_option_e` (`mimalloc.h`), for
/// which `libmimalloc-sys` names no constant. A test checks it is the purge delay.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with the allocator, unused, before it goes back to the
/// kernel: 10 s (jemalloc's default decay), not mimalloc's 1 s.
///
/// mimalloc purges everything free when the delay since the last free runs out. The
/// analysis allocates and frees a chunk's tables several times a second, so at 1 s it
/// faulted back in, zeroed, the memory it had just freed, a sizeable share of its CPU.
/// Memory freed after a storm still goes back, 10 s later. `MIMALLOC_PURGE_DELAY=<ms>` in
/// the environment overrides it, as for any mimalloc option.
const PURGE_DELAY_MS: i32 = 10_000;

/// Hand the allocator's free memory back to the kernel now, whatever the purge delay: the
/// memory budget calls it when the resident size crowds out the data after a burst.
pub(crate) fn release_free_memory() {
    // SAFETY: `mi_collect` is mimalloc's public, thread-safe call to purge free memory; it
    // touches only the allocator's own structures.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

/// Set the allocator's purge delay ([`PURGE_DELAY_MS`]) unless the environment chose one.
fn keep_freed_memory_longer() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores one integer in mimalloc's option table. It is called
    // first thing in `main`, before any other thread exists (mimalloc documents it as not
    // thread safe).
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS.into());
    }
}

/// Tells SREs whether their timeouts and retries help or hurt.
#[derive(Parser)]
#[command(name = "stormglass", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the collector: OTLP in, metrics out. With no config: OTLP on 127.0.0.1:4317
    /// (gRPC) and 127.0.0.1:4318 (HTTP), API and /metrics on 127.0.0.1:9464.
    Serve(ServeArgs),
    /// Analyse span files offline and print the report: OTLP/JSON (one request per line, as
    /// the OpenTelemetry Collector file exporter writes, or one document), binary OTLP
    /// protobuf, or Parquet with the span schema.
    Analyze {
        #[command(flatten)]
        input: SpanFiles,
        #[command(flatten)]
        listing: Listing,
        /// A deploy gate: after printing the report, exit 1 when a finding or an alert
        /// condition (without its `for:`) holds at or above LEVEL (info, warning, critical),
        /// or when one of the named findings or alerts does (`unsafe_retry,
        /// StormglassRetryAmplificationHigh`), naming each on stderr.
        #[arg(long, value_name = "LEVEL|KIND[,KIND...]")]
        fail_on: Option<gate::FailOn>,
    },
    /// Advice from the traffic: each edge's timeout (the guarded operation's P99.9 x
    /// advice.timeout_factor, fitted into the caller's budget), attempts (retries at the
    /// deepest layer of each path only, at most 3), backoff and retry budget, and each
    /// layer's amplification under them; as text, JSON, the budget table check-budget reads,
    /// gRPC service configs, Envoy routes and clusters, Istio, Gateway API or Linkerd
    /// objects (docs/advice.md).
    Advise {
        /// Span files or archive directories, as `analyze` reads them.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        format: offline::AdviceFormat,
        /// Configuration file (advice.timeout_factor, advice.min_backoff_ms,
        /// advice.min_timeout_ms).
        #[arg(long)]
        config: Option<PathBuf>,
        /// What the text lists (JSON, the policy other commands read, and the emitted
        /// configurations cover every edge the filters select, whatever the limit: cut
        /// short, they would leave edges without their settings).
        #[command(flatten)]
        listing: Listing,
    },
    /// Replay the observed calls under a retry policy (the JSON of `advise --format json`):
    /// per edge the retries it would have dropped (past its attempts, then past its
    /// budget), the successes that would have cost and the load it saves (docs/advice.md).
    Replay {
        /// The policy: per edge max_attempts, retry_budget_ratio, retry_budget_min_per_second.
        #[arg(long, required = true)]
        policy: PathBuf,
        /// How the policy's retry budgets run: as Linkerd's (and Gateway API's), a share of
        /// the calls over 10 s; or as Envoy's (and Istio's), a share of the requests in
        /// flight, at least min_retry_concurrency (from the floor where the policy names
        /// none, as `advise --format envoy` emits it).
        #[arg(long, value_enum, default_value_t = offline::BudgetAs::Linkerd)]
        budget_as: offline::BudgetAs,
        #[command(flatten)]
        input: SpanFiles,
        /// Which edges to list (the totals cover every edge): by default those where the
        /// policy costs the most successes, then saves the most attempts.
        #[command(flatten)]
        listing: Listing,
    },
    /// What if a service failed: each layer's expected amplification and request rate if
    /// every request to SERVICE failed with probability P, from the retry policies observed
    /// in the span files (each edge's most attempts per call).
    Whatif {
        /// SERVICE=P: requests to SERVICE fail with probability P (0 to 1); repeatable.
        #[arg(long = "fail", required = true, value_parser = stormglass_analytics::whatif::parse_failure)]
        fail: Vec<(String, f64)>,
        /// Predict under this retry policy instead of the observed one: the JSON of
        /// `stormglass advise --format json` (per edge max_attempts and retry budget).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// How the policy's retry budgets run, as `replay --budget-as` (Envoy's: retries in
        /// flight, modelled in a steady state).
        #[arg(long, value_enum, default_value_t = offline::BudgetAs::Linkerd)]
        budget_as: offline::BudgetAs,
        #[command(flatten)]
        input: SpanFiles,
        /// Which layers and edges to list: by default the most amplified layers and the
        /// edges with the most attempts per call.
        #[command(flatten)]
        listing: Listing,
    },
    /// Check a declared budget table (each edge's timeout, attempts, backoff; which calls a
    /// service makes one after another): worst cases past the caller's budget (inversion)
    /// and sequential calls past it (overcommit); with --against, also timeouts below the
    /// callee's P99.9, attempts above the declared ones and undeclared edges in the traffic.
    /// Exit 1 on any error-level violation.
    CheckBudget {
        /// The budget file: YAML, or TOML by its .toml name.
        #[arg(required_unless_present = "emit")]
        file: Option<PathBuf>,
        /// Span files (or archive directories) whose traffic the budgets are checked against.
        #[arg(long, num_args = 1.., conflicts_with = "emit")]
        against: Vec<PathBuf>,
        /// Instead of checking, print a budget file written from these span files' traffic:
        /// a baseline to commit.
        #[arg(long, num_args = 1.., conflicts_with = "file")]
        emit: Vec<PathBuf>,
        /// Configuration file (advice.timeout_factor and the conventions).
        #[arg(long)]
        config: Option<PathBuf>,
        /// How many violations to print, errors first (the summary counts them all).
        #[arg(long, default_value_t = stormglass_analytics::report::DEFAULT_LIMIT)]
        limit: usize,
        /// Print every violation.
        #[arg(long)]
        all: bool,
    },
    /// Run SQL over span files: tables spans, lineage, lineage_attempts, edge_names,
    /// attempts, logical_calls, entries, orphans, findings, the partials p_*, and the report
    /// tables layers, layer_operations, clock_skew, retry_budgets, edges, edge_causes,
    /// entry_operations, trace_counts, finding_counts, coverage, remaining_budgets,
    /// storm_potential.
    Query {
        /// The SQL to run.
        sql: String,
        /// Span files, as for analyze.
        #[arg(long = "from", required = true, num_args = 1..)]
        from: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: offline::Format,
        /// Configuration file for thresholds.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Start the collector and an instrumented service chain (gateway -> order -> inventory
    /// over gRPC and payment over HTTP -> a database) that replays one failure mode through
    /// the OpenTelemetry SDK, printing the headline figures every 5 s. The collector listens
    /// where `serve` does; the demo analyses every 2 s (assembly.idle 2s,
    /// analytics.interval 2s). With --otlp-grpc and --otlp-http, only the chain runs, its
    /// spans exported to a collector already running.
    Demo {
        /// The failure mode: healthy, storm, hidden, gc-pause, tail, budget, unsafe or orphans.
        #[arg(long, default_value = "storm", value_parser = scenario)]
        scenario: stormglass_demo::Scenario,
        /// How long to send requests (e.g. 60s, 5m).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        duration: std::time::Duration,
        /// Entry requests per second.
        #[arg(long, default_value_t = 20.0)]
        rate: f64,
        /// Configuration file (the same file `serve` reads).
        #[arg(long, conflicts_with = "otlp_grpc")]
        config: Option<PathBuf>,
        /// Export the chain's spans to a collector already running (`stormglass serve`, an
        /// OpenTelemetry Collector) at this OTLP/gRPC address instead of starting one.
        #[arg(long, value_name = "HOST:PORT", requires = "otlp_http")]
        otlp_grpc: Option<String>,
        /// Its OTLP/HTTP address (some of the chain's services export over HTTP).
        #[arg(long, value_name = "HOST:PORT", requires = "otlp_grpc")]
        otlp_http: Option<String>,
        /// The chain's clients obey this retry policy (the JSON of `advise --format json`:
        /// per edge max_attempts, timeout_ms and retry budget) instead of the scenario's.
        #[arg(long)]
        policy: Option<PathBuf>,
    },
    /// Send synthetic SDK-shaped traces to an OTLP receiver (stormglass or any collector)
    /// and report accepted/refused spans, spans/s and, with --pid, the server's CPU-seconds
    /// and memory. --decode-only measures the prost decode floor instead; --write-parquet
    /// writes the same traces to a Parquet file for `analyze` and `query`.
    Load(LoadArgs),
    /// Print the Prometheus recording and alerting rules generated from the alert
    /// definitions, with the thresholds and runbook base of the configuration. The shipped
    /// dashboards/prometheus/stormglass-rules.yml is this output for the defaults.
    Rules {
        /// Configuration file for thresholds (the same file `serve` reads).
        #[arg(long)]
        config: Option<PathBuf>,
        /// `file`: a Prometheus rule file; `prometheusrule`: the same groups as a Kubernetes
        /// PrometheusRule for the Prometheus Operator.
        #[arg(long, value_enum, default_value = "file")]
        format: RulesFormatArg,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RulesFormatArg {
    File,
    #[value(name = "prometheusrule")]
    PrometheusRule,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Configuration file (.yaml, .yml or .toml); STORMGLASS_* variables override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// OTLP/gRPC listen address (listen.grpc).
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<String>,
    /// OTLP/HTTP listen address (listen.http).
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
    /// API and /metrics listen address (listen.api).
    #[arg(long, value_name = "ADDR")]
    api_listen: Option<String>,
}

#[derive(clap::Args)]
struct LoadArgs {
    /// Receiver address (host:port).
    #[arg(long, default_value = "127.0.0.1:4317")]
    endpoint: String,
    /// OTLP transport: grpc, or http (protobuf to /v1/traces).
    #[arg(long, value_enum, default_value = "grpc")]
    protocol: LoadProtocol,
    /// Export requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long to send (e.g. 20s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: std::time::Duration,
    /// Spans per export request (whole traces, so slightly more).
    #[arg(long, default_value_t = 600)]
    spans_per_request: usize,
    /// Send at most this many spans per second, paced per request (background traffic
    /// at a chosen share of a receiver's capacity); unset, as fast as it answers.
    #[arg(long, value_name = "SPANS_PER_SECOND")]
    rate: Option<f64>,
    /// Distinct pre-encoded requests to cycle through.
    #[arg(long, default_value_t = 16)]
    payloads: usize,
    /// Services on the longest path of a trace.
    #[arg(long, default_value_t = 4)]
    depth: u32,
    /// Services each non-leaf service calls.
    #[arg(long, default_value_t = 1)]
    fanout: u32,
    /// Share of calls whose first attempt fails and is retried.
    #[arg(long, default_value_t = 0.1)]
    retry_rate: f64,
    /// Services per layer: above 1, each trace draws its services from this many per
    /// layer, spreading the same spans over many caller/callee pairs (a wide fleet).
    #[arg(long, default_value_t = 1)]
    width: u32,
    /// Seed of the synthetic traces.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Server process to report CPU-seconds and memory of.
    #[arg(long)]
    pid: Option<u32>,
    /// Wait this long after the last answer before reading the server's CPU, so work done
    /// after answering (assembly, analysis) is counted.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    settle: std::time::Duration,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Measure prost decoding (and decoding + Arrow encoding) of the payloads on one
    /// thread for --duration; sends nothing.
    #[arg(long, conflicts_with = "write_parquet")]
    decode_only: bool,
    /// Write --spans spans of the same traces to this Parquet file; sends nothing.
    #[arg(long, value_name = "FILE")]
    write_parquet: Option<PathBuf>,
    /// Spans to write with --write-parquet.
    #[arg(long, default_value_t = 10_000_000)]
    spans: u64,
}

/// A check found what it looks for (`analyze --fail-on`, `check-budget`): `stormglass`
/// exits 1, apart from errors (2). The text says what failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CheckFailed(pub String);

/// What `analyze`, `advise`, `whatif` and `replay` list: the worst edges and layers, or
/// everything, around a service.
#[derive(clap::Args)]
struct Listing {
    /// List everything: every edge and layer (by default the worst 200: `--limit`),
    /// and every orphan pair in the table, not only the 20 with the most work after
    /// cancel.
    #[arg(long)]
    all: bool,
    /// How many edges and layers to list: the worst (the most failed plus retried
    /// attempts; layers by requests above their baseline), listed by name; the report's
    /// `listing` says how many there are.
    #[arg(long, default_value_t = stormglass_analytics::report::DEFAULT_LIMIT)]
    limit: usize,
    /// Only the calls in and out of this service, and its layer.
    #[arg(long)]
    service: Option<String>,
    /// Only the calls this service makes.
    #[arg(long)]
    caller: Option<String>,
    /// Only the calls to this service.
    #[arg(long)]
    callee: Option<String>,
}

impl Listing {
    fn selection(self) -> stormglass_analytics::report::Selection {
        stormglass_analytics::report::Selection {
            limit: (!self.all).then_some(self.limit.max(1)),
            service: self.service,
            caller: self.caller,
            callee: self.callee,
        }
    }
}

/// The span files `analyze` and `whatif` read, and how they print.
#[derive(clap::Args)]
struct SpanFiles {
    /// Span files (.json/.jsonl/.ndjson, .parquet, anything else is OTLP protobuf); a
    /// directory stands for the archive files in it.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[arg(long, value_enum, default_value = "table")]
    format: offline::Format,
    /// Configuration file for thresholds (the same file `serve` reads).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LoadProtocol {
    Grpc,
    Http,
}

fn main() -> ExitCode {
    keep_freed_memory_longer();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Analyze {
            input,
            listing,
            fail_on,
        } => offline(input.config, |config| async move {
            let all = listing.all;
            let selection = listing.selection();
            offline::analyze(
                &config,
                &input.files,
                input.format,
                &selection,
                all,
                fail_on.as_ref(),
            )
            .await
        }),
        Command::Advise {
            files,
            format,
            config,
            listing,
        } => offline(config, |config| async move {
            offline::advise(&config, &files, format, listing.selection()).await
        }),
        Command::Replay {
            policy,
            budget_as,
            input,
            listing,
        } => offline(input.config, |config| async move {
            let selection = listing.selection();
            let files = &input.files;
            offline::replay(
                &config,
                files,
                (&policy, budget_as),
                input.format,
                &selection,
            )
            .await
        }),
        Command::Whatif {
            fail,
            policy,
            budget_as,
            input,
            listing,
        } => offline(input.config, |config| async move {
            offline::whatif(
                &config,
                &input.files,
                &fail,
                policy.as_deref().map(|p| (p, budget_as)),
                input.format,
                &listing.selection(),
            )
            .await
        }),
        Command::CheckBudget {
            file,
            against,
            emit,
            config,
            limit,
            all,
        } => offline(config, |config| async move {
            let limit = (!all).then_some(limit.max(1));
            match file {
                Some(file) => offline::check_budget(&config, &file, &against, limit).await,
                None => offline::emit_budget(&config, &emit).await,
            }
        }),
        Command::Query {
            sql,
            from,
            format,
            config,
        } => offline(config, |config| async move {
            offline::query(&config, &sql, &from, format).await
        }),
        Command::Rules { config, format } => rules(config, format),
        Command::Load(args) => load(args),
        Command::Demo {
            scenario,
            duration,
            rate,
            config,
            otlp_grpc,
            otlp_http,
            policy,
        } => demo(
            config,
            scenario,
            policy.as_deref(),
            duration,
            rate,
            otlp_grpc.zip(otlp_http),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The gate's own answer, apart from errors: exit 1 as `diff` and `grep` do.
        Err(e) if e.is::<CheckFailed>() => {
            eprintln!("stormglass: {e:#}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("stormglass: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let flags: config::Overrides = [
        ("listen.grpc", args.grpc_listen),
        ("listen.http", args.http_listen),
        ("listen.api", args.api_listen),
    ]
    .into_iter()
    .filter_map(|(key, value)| value.map(|v| (key, v)))
    .collect();
    let config = config::load(args.config.as_deref(), std::env::vars(), &flags)?;
    let runtime = serve::runtime(config.limits.receiver_nice)?;
    let served = runtime.block_on(serve::run(config));
    // A thread still waited for past shutdown.timeout (the last analysis) must not hold
    // the exit: dropping the runtime would wait for it without bound.
    runtime.shutdown_background();
    served
}

fn scenario(name: &str) -> Result<stormglass_demo::Scenario, String> {
    stormglass_demo::Scenario::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = stormglass_demo::Scenario::ALL
            .iter()
            .map(|s| s.name())
            .collect();
        format!("unknown scenario; expected one of {}", names.join(", "))
    })
}

fn demo(
    config: Option<PathBuf>,
    scenario: stormglass_demo::Scenario,
    policy: Option<&std::path::Path>,
    duration: std::time::Duration,
    rate: f64,
    elsewhere: Option<(String, String)>,
) -> anyhow::Result<()> {
    if !(rate.is_finite() && rate > 0.0) {
        anyhow::bail!("--rate must be a positive number of requests per second");
    }
    let plan = demo::plan(scenario, policy)?;
    if let Some((grpc, http)) = elsewhere {
        return tokio::runtime::Runtime::new()?
            .block_on(demo::send(scenario, plan, duration, rate, &grpc, &http));
    }
    let quick: config::Overrides = vec![
        ("assembly.idle", "2s".to_owned()),
        ("analytics.interval", "2s".to_owned()),
    ];
    let config = config::load(config.as_deref(), std::env::vars(), &quick)?;
    serve::runtime(config.limits.receiver_nice)?
        .block_on(demo::run(config, scenario, plan, duration, rate))
}

fn load(args: LoadArgs) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.retry_rate) {
        anyhow::bail!("--retry-rate must be between 0 and 1");
    }
    if args.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        anyhow::bail!("--rate must be a positive number of spans per second");
    }
    let shape = stormglass_model::synth::Shape {
        depth: args.depth,
        fanout: args.fanout,
        retry_rate: args.retry_rate,
        width: args.width,
        seed: args.seed,
    };
    if let Some(path) = &args.write_parquet {
        return load::write_parquet(path, shape, args.spans);
    }
    if args.decode_only {
        return load::decode_floor(
            shape,
            args.spans_per_request,
            args.payloads,
            args.duration,
            args.json,
        );
    }
    let config = stormglass_demo::load::LoadConfig {
        protocol: match args.protocol {
            LoadProtocol::Grpc => stormglass_demo::load::Protocol::Grpc,
            LoadProtocol::Http => stormglass_demo::load::Protocol::Http,
        },
        endpoint: args.endpoint,
        concurrency: args.concurrency,
        duration: args.duration,
        rate: args.rate,
        server_pid: args.pid,
        settle: args.settle,
    };
    tokio::runtime::Runtime::new()?.block_on(load::send(
        config,
        shape,
        args.spans_per_request,
        args.payloads,
        args.json,
    ))
}

fn rules(config: Option<PathBuf>, format: RulesFormatArg) -> anyhow::Result<()> {
    use stormglass_export::rules::RulesFormat;
    let format = match format {
        RulesFormatArg::File => RulesFormat::File,
        RulesFormatArg::PrometheusRule => RulesFormat::PrometheusRule,
    };
    let config = config::load(config.as_deref(), std::env::vars(), &Vec::new())?;
    let runbook_base = match config.notify.runbook_base.as_str() {
        "" => stormglass_export::rules::default_runbook_base(config.api_scheme()),
        base => base.to_owned(),
    };
    print!(
        "{}",
        stormglass_export::rules::render_as(format, &config.alerts, &runbook_base)
    );
    Ok(())
}

fn offline<F, Fut>(config: Option<PathBuf>, run: F) -> anyhow::Result<()>
where
    F: FnOnce(config::Config) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let config = config::load(config.as_deref(), std::env::vars(), &Vec::new())?;
    tokio::runtime::Runtime::new()?.block_on(run(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option `main` sets is mimalloc's purge delay (1 s by default in mimalloc v3), and
    /// `keep_freed_memory_longer` sets it to 10 s: an upgrade that moves the option fails here.
    #[test]
    fn the_option_set_is_the_purge_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: `mi_option_get` reads one integer of mimalloc's option table.
        #[allow(unsafe_code)]
        let get = || unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        assert_eq!(
            get(),
            1000,
            "option {PURGE_DELAY} is not mimalloc's purge delay"
        );
        keep_freed_memory_longer();
        assert_eq!(get(), i64::from(PURGE_DELAY_MS));
    }

    /// `demo --help` names every scenario the demo accepts.
    #[test]
    fn demo_help_names_every_scenario() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let help = cli
            .find_subcommand("demo")
            .and_then(|demo| demo.get_arguments().find(|a| a.get_id() == "scenario"))
            .and_then(|arg| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        for scenario in stormglass_demo::Scenario::ALL {
            assert!(
                help.contains(scenario.name()),
                "`demo --help` does not name {}: {help}",
                scenario.name()
            );
        }
    }
}
