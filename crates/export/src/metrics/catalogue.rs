//! The catalogue: every figure metric's name, help and labels (docs/metrics.md lists the
//! same), one enum per kind whose variants index the collector's state.

use std::sync::LazyLock;

use stormglass_analytics::figures::EDGE_COUNTS;

/// Every counter family: [`Counter`]'s, then one per entry of the figure catalogue's
/// [`EDGE_COUNTS`] (`stormglass_<counter>_total`, labelled by edge), at
/// [`edge_count_family`].
pub(super) static COUNTERS: LazyLock<Vec<Spec>> = LazyLock::new(|| {
    let edge_counts = EDGE_COUNTS.iter().map(|c| Spec {
        // Named once per process, for as long as it runs.
        name: Box::leak(format!("stormglass_{}_total", c.counter).into_boxed_str()),
        help: c.help,
        labels: EDGE,
    });
    OWN_COUNTERS.iter().cloned().chain(edge_counts).collect()
});

/// The family index of the `i`-th entry of [`EDGE_COUNTS`] in [`COUNTERS`].
pub(super) fn edge_count_family(i: usize) -> usize {
    Counter::ALL.len() + i
}

/// Labels whose values come from the spans (unbounded sets; folded on overflow).
pub(super) const IDENTITY: [&str; 6] = [
    "caller",
    "callee",
    "service",
    "operation",
    "cause",
    "status_code",
];

pub(super) const EDGE: &[&str] = &["caller", "callee", "operation"];
pub(super) const SERVICE: &[&str] = &["service"];

#[derive(Clone)]
pub(super) struct Spec {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    pub(super) labels: &'static [&'static str],
}

pub(super) const fn spec(
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
) -> Spec {
    Spec { name, help, labels }
}

/// Declares one kind of metric family from one list: an enum whose variants index that
/// kind's state (`as usize`), `ALL` in the list's order, `spec()` (name, help, labels: the
/// catalogue), and the static of every spec in that order.
macro_rules! families {
    ($(#[$doc:meta])* $kind:ident, $specs:ident { $($variant:ident => $spec:expr,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(super) enum $kind {
            $($variant,)*
        }

        impl $kind {
            pub(super) const ALL: &[$kind] = &[$($kind::$variant,)*];

            pub(super) const fn spec(self) -> Spec {
                match self {
                    $($kind::$variant => $spec,)*
                }
            }
        }

        pub(super) static $specs: LazyLock<Vec<Spec>> =
            LazyLock::new(|| $kind::ALL.iter().map(|k| k.spec()).collect());
    };
}

families! {
    /// The counter families of their own; the per-edge counts of the figure catalogue
    /// follow them in [`COUNTERS`].
    Counter, OWN_COUNTERS {
        LogicalCalls => spec(
            "stormglass_logical_calls_total",
            "Logical calls (a call and all its attempts) completed, by first and final outcome (ok/failed).",
            &[
                "caller",
                "callee",
                "operation",
                "first_outcome",
                "final_outcome",
            ],
        ),
        Attempts => spec(
            "stormglass_attempts_total",
            "Attempts, first or retry, by outcome class and cause (a retry's cause; none for first attempts).",
            &[
                "caller",
                "callee",
                "operation",
                "attempt",
                "outcome",
                "cause",
            ],
        ),
        EntryRequests => spec(
            "stormglass_entry_requests_total",
            "Requests entering the system (root SERVER/CONSUMER spans), by entry service and operation.",
            &["service", "operation"],
        ),
        EntryFailedRequests => spec(
            "stormglass_entry_failed_requests_total",
            "Requests entering the system whose entry span failed: divided by stormglass_entry_requests_total, the entry's error rate.",
            &["service", "operation"],
        ),
        LayerAttempts => spec(
            "stormglass_layer_attempts_total",
            "Attempts (and entry requests) received by a layer; divided by the baseline it is the amplification.",
            SERVICE,
        ),
        LayerBaseline => spec(
            "stormglass_layer_baseline_attempts_total",
            "Attempts a layer would have received with no retry anywhere upstream.",
            SERVICE,
        ),
        LayerResponses => spec(
            "stormglass_layer_responses_total",
            "Attempts a layer received (entry requests aside) by the response code kept raw (an HTTP status as its number, a gRPC status by its name, none without either) and the outcome class: the layer's error share with the codes behind it.",
            &["service", "status_code", "outcome"],
        ),
        OrphanPairs => spec(
            "stormglass_orphan_pairs_total",
            "Cancelled or timed-out attempts whose callee kept working, by the callee's outcome (ok/failed/pending).",
            &["caller", "callee", "operation", "server_outcome"],
        ),
        OrphanWork => spec(
            "stormglass_orphan_work_seconds_total",
            "Seconds callees kept working after their caller cancelled or timed out.",
            EDGE,
        ),
        DeadlineViolations => spec(
            "stormglass_deadline_violations_total",
            "Deadline budget violations: inversion, overcommit, not_propagated.",
            &["caller", "callee", "kind"],
        ),
        MultiLayer => spec(
            "stormglass_multi_layer_retry_traces_total",
            "Traces in which two or more distinct callers retried, by entry service.",
            SERVICE,
        ),
        BrokenTraces => spec(
            "stormglass_broken_traces_total",
            "Traces with a span whose parent never arrived (a subtree that looks like its own entry), by the service of that span.",
            SERVICE,
        ),
        OutOfBudgetRetries => spec(
            "stormglass_out_of_budget_retries_total",
            "Retries started with less of the caller's budget left than the callee's median duration on the edge (within 2%; those after the deadline among them): retries that cannot fit. Each interval's retries are set against the window's median when the interval is analysed.",
            EDGE,
        ),
    }
}

families! {
    /// The histogram families.
    Histogram, HISTOGRAMS {
        LayerDuration => spec(
            "stormglass_layer_duration_seconds",
            "Layer latency: SERVER span durations per service (client-observed for uninstrumented callees).",
            SERVICE,
        ),
        EntryDuration => spec(
            "stormglass_entry_duration_seconds",
            "Durations of the requests entering the system (root SERVER/CONSUMER spans), per entry service and operation.",
            &["service", "operation"],
        ),
        RemainingBudget => spec(
            "stormglass_remaining_budget_seconds",
            "The caller's remaining budget when an attempt starts: the deadline of its nearest budgeted ancestor minus the time already spent (0 when spent).",
            EDGE,
        ),
    }
}

families! {
    /// The gauge families.
    Gauge, GAUGES {
        EffectiveSuccess => spec(
            "stormglass_effective_success_ratio",
            "Window: logical calls whose first attempt succeeded / logical calls.",
            EDGE,
        ),
        RawSuccess => spec(
            "stormglass_raw_success_ratio",
            "Window: logical calls whose final attempt succeeded / logical calls.",
            EDGE,
        ),
        RetryContribution => spec(
            "stormglass_retry_contribution_ratio",
            "Window: successful logical calls that needed a retry / successful logical calls.",
            EDGE,
        ),
        RetrySuccess => spec(
            "stormglass_retry_success_ratio",
            "Window: successful retry attempts / retry attempts.",
            EDGE,
        ),
        RetryRatio => spec(
            "stormglass_retry_ratio",
            "Window: retry attempts / first attempts.",
            EDGE,
        ),
        SynchronisedRetries => spec(
            "stormglass_synchronised_retries_ratio",
            "Window: retries sent in a 100 ms slot in which retries of many calls reached the callee (retries.synchronised_min_calls, and 3x its mean per slot) / retries.",
            EDGE,
        ),
        Amplification => spec(
            "stormglass_amplification_ratio",
            "Window: attempts received by the layer / attempts it would receive with no retry upstream.",
            SERVICE,
        ),
        StormPotential => spec(
            "stormglass_storm_potential_ratio",
            "Window: product of (max attempt number + 1) along the deepest call chain below the entry operation.",
            &["service", "operation"],
        ),
        LayerP99 => spec(
            "stormglass_layer_latency_p99_seconds",
            "Window: P99 layer latency (log-bucketed, within 2%).",
            SERVICE,
        ),
        LayerP999 => spec(
            "stormglass_layer_latency_p999_seconds",
            "Window: P99.9 layer latency (log-bucketed, within 2%).",
            SERVICE,
        ),
        TailRatio => spec(
            "stormglass_layer_tail_ratio",
            "Window: P99.9 / P99 layer latency.",
            SERVICE,
        ),
        Timeout => spec(
            "stormglass_timeout_seconds",
            "Window: median deadline the caller gives the callee's operation.",
            EDGE,
        ),
        RecommendedTimeout => spec(
            "stormglass_recommended_timeout_seconds",
            "Window: the P99.9 of the operation the timeout guards x advice.timeout_factor.",
            EDGE,
        ),
        CalleeP999 => spec(
            "stormglass_callee_latency_p999_seconds",
            "Window: the P99.9 latency of the operation the edge's timeout guards (the callee's SERVER spans under the edge; what stormglass_timeout_seconds is compared with).",
            EDGE,
        ),
        ClockSkew => spec(
            "stormglass_clock_skew_seconds",
            "Window: how far the callee's clock reads ahead of the caller's, estimated from their answered calls (corrected before orphan and deadline checks).",
            &["caller", "callee"],
        ),
        Coverage => spec(
            "stormglass_instrumentation_coverage_ratio",
            "Window: share of the edge's attempts whose spans carry what a figure needs, by field (attempt_number, cause, deadline, idempotency, server_spans; and how attempts were found: from_server_spans, inferred).",
            &["caller", "callee", "operation", "field"],
        ),
    }
}
