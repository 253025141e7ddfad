//! The PromQL of the alerts and the recording rules they and the dashboards read: written
//! beside the metric catalogue whose names they use. Each alert of
//! [`stormglass_analytics::alerts::DEFINITIONS`] has its expression here, by name; the
//! built-in evaluator checks the same condition on a window's report.
//!
//! Where the engines read different data, by design:
//! * Ratio alerts read counters in Prometheus (rates over 5 minutes, summed over every
//!   stormglass instance) and the window's exact counts in the evaluator (one instance).
//! * `StormglassRetryContributionHigh` in Prometheus counts calls whose first attempt failed
//!   and whose last succeeded (the labels of `stormglass_logical_calls_total`); the report
//!   counts successful calls with more than one attempt. They differ only for calls that
//!   succeeded first and were still re-sent (hedging).
//! * Tail ratio and timeout-below-tail read the layer histogram in Prometheus (quantiles of
//!   the buckets summed over instances, within the buckets' 25%) and the mean budget
//!   (`stormglass_attempt_deadline_seconds_total / stormglass_budgeted_attempts_total`: the
//!   configured timeout when an edge has one); the evaluator reads the window's 2% quantiles
//!   and the median budget.
//! * Storm potential reads the gauge with `max by`: a walk along call chains cannot be
//!   summed, and each instance sees the same retry policies, so the largest is the figure.
//! * Values are in base units, as in Prometheus: the timeout alert's value is the share of
//!   the edge's answered calls the timeout kills (`timeout_kill_share`).

use stormglass_analytics::AlertThresholds;
use stormglass_analytics::alerts::{AlertDefinition, EntrySlo};

/// The labels of an edge's series.
const EDGE: &str = "caller, callee, operation";

/// An alert's PromQL condition, over the exported metrics and [`recording_rules`].
pub fn alert_expr(d: &AlertDefinition, t: &AlertThresholds) -> String {
    match ALERT_EXPRS.iter().find(|(name, _)| *name == d.name) {
        Some((_, expr)) => expr(t),
        None => unreachable!("every alert has an expression (held by a test): {}", d.name),
    }
}

type Expr = fn(&AlertThresholds) -> String;

/// Each alert's expression, in docs/alerts.md order.
static ALERT_EXPRS: &[(&str, Expr)] = &[
    ("StormglassRetryAmplificationHigh", |t| {
        guarded(
            format!(
                "stormglass:layer_amplification:ratio_rate5m > {}",
                t.amplification
            ),
            "sum by (service) (rate(stormglass_layer_baseline_attempts_total[5m]))",
            t,
        )
    }),
    ("StormglassRetryStormPotential", |t| {
        format!(
            "max by (service, operation) (stormglass_storm_potential_ratio) >= {}",
            t.storm_potential
        )
    }),
    ("StormglassRetryContributionHigh", |t| {
        guarded(
            format!(
                "stormglass:edge_retry_contribution:ratio_rate5m > {}",
                t.retry_contribution
            ),
            "stormglass:edge_final_ok_calls:rate5m",
            t,
        )
    }),
    ("StormglassRetryBudgetExceeded", |t| {
        guarded(
            format!("stormglass:edge_retry:ratio_rate5m > {}", t.retry_ratio),
            "stormglass:edge_first_attempts:rate5m",
            t,
        )
    }),
    ("StormglassRetriesFailing", |t| {
        guarded(
            format!(
                "stormglass:edge_retry_success:ratio_rate5m < {}",
                t.retry_success_rate
            ),
            "stormglass:edge_retry_attempts:rate5m",
            t,
        )
    }),
    ("StormglassRetriedCallsFailing", |t| {
        guarded(
            format!(
                "stormglass:edge_retried_failed:ratio_rate5m > {}",
                t.retried_failed_share
            ),
            "stormglass:edge_retried_calls:rate5m",
            t,
        )
    }),
    ("StormglassRetryConcentration", |t| {
        format!(
            "stormglass:caller_callee_retries:per_minute_rate5m > {}",
            t.retries_per_minute
        )
    }),
    ("StormglassTailRatioHigh", |t| {
        guarded(
            format!("stormglass:layer_tail:ratio_rate5m > {}", t.tail_ratio),
            "sum by (service) (rate(stormglass_layer_attempts_total[5m]))",
            t,
        )
    }),
    ("StormglassTimeoutRateHigh", |t| {
        guarded(
            format!(
                "stormglass:layer_timeout_rate:ratio_rate5m > {}",
                t.timeout_rate
            ),
            "sum by (service) (rate(stormglass_layer_attempts_total[5m]))",
            t,
        )
    }),
    ("StormglassLayerErrorRateHigh", |t| {
        let share = "stormglass:layer_error:ratio_rate5m";
        guarded(
            format!(
                "({share} > {} or ({share} and {share} - ({share} offset 1w) > {}))",
                t.layer_error_rate, t.layer_error_jump
            ),
            "sum by (service) (rate(stormglass_layer_attempts_total[5m]))",
            t,
        )
    }),
    ("StormglassLatencyDrift", |t| {
        let ratio = "stormglass:layer_latency_p999:seconds_rate5m / \
                (max by (service) (stormglass_layer_latency_p999_baseline_seconds) \
                or stormglass:layer_latency_p999:seconds_rate5m offset 1w)";
        guarded(
            format!(
                "({ratio} > {} or {ratio} < {})",
                1.0 + t.latency_drift,
                1.0 - t.latency_drift
            ),
            "sum by (service) (rate(stormglass_layer_attempts_total[5m]))",
            t,
        )
    }),
    ("StormglassTimeoutBelowTail", |t| {
        guarded(
            "stormglass:edge_timeout_kill:ratio_rate5m > 0.001".to_owned(),
            &format!("sum by ({EDGE}) (rate(stormglass_attempts_total[5m]))"),
            t,
        )
    }),
    ("StormglassDeadlineInversion", |t| {
        guarded(
            "sum by (caller, callee) (increase(stormglass_deadline_violations_total\
                 {kind=~\"inversion|overcommit\"}[5m])) > 0"
                .to_owned(),
            "sum by (caller, callee) (rate(stormglass_attempts_total[5m]))",
            t,
        )
    }),
    ("StormglassUnsafeRetries", |t| {
        any_on_busy_edges("stormglass_unsafe_retries_total", t)
    }),
    ("StormglassOverlappingWriteRetries", |t| {
        any_on_busy_edges("stormglass_overlapping_write_retries_total", t)
    }),
    ("StormglassRerunWrites", |t| {
        any_on_busy_edges("stormglass_rerun_writes_total", t)
    }),
    ("StormglassRetryAfterIgnored", |t| {
        any_on_busy_edges("stormglass_retry_after_violations_total", t)
    }),
    ("StormglassEntryErrorBudgetBurn", |t| {
        let burn = |w: &str| {
            format!(
                "(sum by (service, operation) (rate(stormglass_entry_failed_requests_total[{w}])) \
                     / (sum by (service, operation) (rate(stormglass_entry_requests_total[{w}])) > 0) \
                     / {})",
                t.entry_slo.error_rate
            )
        };
        entry_burn(&burn, t)
    }),
    ("StormglassEntryLatencyBudgetBurn", |t| {
        let le = entry_le(&t.entry_slo);
        let share = t.entry_slo.latency_share;
        let burn = |w: &str| {
            format!(
                "((1 - sum by (service, operation) \
                     (rate(stormglass_entry_duration_seconds_bucket{{le=\"{le}\"}}[{w}])) \
                     / (sum by (service, operation) \
                     (rate(stormglass_entry_duration_seconds_count[{w}])) > 0)) / (1 - {share}))"
            )
        };
        entry_burn(&burn, t)
    }),
    ("StormglassCallsWithoutDeadline", |t| {
        guarded(
            format!(
                "stormglass:edge_attempts_without_deadline:ratio_rate5m > {}",
                t.without_deadline_share
            ),
            &format!("sum by ({EDGE}) (rate(stormglass_served_attempts_total[5m]))"),
            t,
        )
    }),
    ("StormglassWritesWithoutKey", |t| {
        guarded(
            format!(
                "stormglass:edge_writes_without_key:ratio_rate5m > {}",
                t.writes_without_key_share
            ),
            &format!("sum by ({EDGE}) (rate(stormglass_attempts_total[5m]))"),
            t,
        )
    }),
    ("StormglassNonRetryableRetries", |t| {
        guarded(
            format!("sum by ({EDGE}) (increase(stormglass_non_retryable_retries_total[5m])) > 0"),
            "stormglass:edge_retry_attempts:rate5m",
            t,
        )
    }),
    ("StormglassRetriesOutOfBudget", |t| {
        guarded(
            format!(
                "stormglass:edge_out_of_budget_retries:ratio_rate5m > {}",
                t.out_of_budget_retry_share
            ),
            "stormglass:edge_retry_attempts:rate5m",
            t,
        )
    }),
    ("StormglassOrphanWork", |t| {
        guarded(
            format!(
                "stormglass:edge_orphan_work_seconds:per_minute_rate5m > {}",
                t.orphan_work_seconds_per_minute
            ),
            &format!("sum by ({EDGE}) (rate(stormglass_attempts_total[5m]))"),
            t,
        )
    }),
];

/// Prometheus recording rules the alert expressions and dashboards read: each figure of
/// docs/alerts.md that is a ratio of counters, over the last 5 minutes (the default window),
/// summed over instances. Empty denominators give no series (`> 0` filters), never NaN; an
/// absent numerator series counts as 0 (`or ... * 0`).
pub fn recording_rules() -> Vec<(&'static str, String)> {
    let calls = |selector: &str| {
        format!("sum by ({EDGE}) (rate(stormglass_logical_calls_total{selector}[5m]))")
    };
    let attempts =
        |selector: &str| format!("sum by ({EDGE}) (rate(stormglass_attempts_total{selector}[5m]))");
    let ratio = |numerator: String, denominator: &str| {
        format!("({numerator} or {denominator} * 0) / ({denominator} > 0)")
    };
    vec![
        (
            "stormglass:layer_amplification:ratio_rate5m",
            "sum by (service) (rate(stormglass_layer_attempts_total[5m])) / \
             (sum by (service) (rate(stormglass_layer_baseline_attempts_total[5m])) > 0)"
                .to_owned(),
        ),
        ("stormglass:edge_logical_calls:rate5m", calls("")),
        (
            "stormglass:edge_final_ok_calls:rate5m",
            calls("{final_outcome=\"ok\"}"),
        ),
        (
            "stormglass:edge_first_attempts:rate5m",
            attempts("{attempt=\"first\"}"),
        ),
        (
            "stormglass:edge_retry_attempts:rate5m",
            attempts("{attempt=\"retry\"}"),
        ),
        (
            "stormglass:edge_effective_success:ratio_rate5m",
            ratio(
                calls("{first_outcome=\"ok\"}"),
                "stormglass:edge_logical_calls:rate5m",
            ),
        ),
        (
            "stormglass:edge_raw_success:ratio_rate5m",
            ratio(
                calls("{final_outcome=\"ok\"}"),
                "stormglass:edge_logical_calls:rate5m",
            ),
        ),
        (
            "stormglass:edge_retry_contribution:ratio_rate5m",
            ratio(
                calls("{first_outcome=\"failed\",final_outcome=\"ok\"}"),
                "stormglass:edge_final_ok_calls:rate5m",
            ),
        ),
        (
            "stormglass:edge_retry_success:ratio_rate5m",
            ratio(
                attempts("{attempt=\"retry\",outcome=\"ok\"}"),
                "stormglass:edge_retry_attempts:rate5m",
            ),
        ),
        (
            "stormglass:edge_retry:ratio_rate5m",
            ratio(
                "stormglass:edge_retry_attempts:rate5m".to_owned(),
                "stormglass:edge_first_attempts:rate5m",
            ),
        ),
        (
            "stormglass:caller_callee_retries:per_minute_rate5m",
            "sum by (caller, callee) (rate(stormglass_attempts_total{attempt=\"retry\"}[5m])) * 60"
                .to_owned(),
        ),
        (
            "stormglass:edge_orphan_work_seconds:per_minute_rate5m",
            format!("sum by ({EDGE}) (rate(stormglass_orphan_work_seconds_total[5m])) * 60"),
        ),
        (
            "stormglass:layer_latency_p99:seconds_rate5m",
            "histogram_quantile(0.99, sum by (service, le) \
             (rate(stormglass_layer_duration_seconds_bucket[5m])))"
                .to_owned(),
        ),
        (
            "stormglass:layer_latency_p999:seconds_rate5m",
            "histogram_quantile(0.999, sum by (service, le) \
             (rate(stormglass_layer_duration_seconds_bucket[5m])))"
                .to_owned(),
        ),
        (
            "stormglass:layer_error:ratio_rate5m",
            ratio(
                "sum by (service) (rate(stormglass_layer_responses_total{outcome!=\"ok\"}[5m]))"
                    .to_owned(),
                "sum by (service) (rate(stormglass_layer_responses_total[5m]))",
            ),
        ),
        (
            "stormglass:entry_error:ratio_rate5m",
            ratio(
                "sum by (service, operation) \
                 (rate(stormglass_entry_failed_requests_total[5m]))"
                    .to_owned(),
                "sum by (service, operation) (rate(stormglass_entry_requests_total[5m]))",
            ),
        ),
        (
            "stormglass:entry_latency_p99:seconds_rate5m",
            "histogram_quantile(0.99, sum by (service, operation, le) \
             (rate(stormglass_entry_duration_seconds_bucket[5m])))"
                .to_owned(),
        ),
        (
            "stormglass:entry_latency_p999:seconds_rate5m",
            "histogram_quantile(0.999, sum by (service, operation, le) \
             (rate(stormglass_entry_duration_seconds_bucket[5m])))"
                .to_owned(),
        ),
        (
            "stormglass:layer_tail:ratio_rate5m",
            "stormglass:layer_latency_p999:seconds_rate5m / \
             (stormglass:layer_latency_p99:seconds_rate5m > 0)"
                .to_owned(),
        ),
        (
            "stormglass:edge_timeout:mean_seconds_rate5m",
            format!(
                "sum by ({EDGE}) (rate(stormglass_attempt_deadline_seconds_total[5m])) / \
                 (sum by ({EDGE}) (rate(stormglass_budgeted_attempts_total[5m])) > 0)"
            ),
        ),
        (
            "stormglass:edge_backoff:mean_seconds_rate5m",
            format!(
                "sum by ({EDGE}) (rate(stormglass_retry_backoff_seconds_total[5m])) / \
                 (sum by ({EDGE}) (rate(stormglass_backed_off_retries_total[5m])) > 0)"
            ),
        ),
        (
            "stormglass:callee_latency_p999:seconds_rate5m",
            "max by (callee) (label_replace(stormglass:layer_latency_p999:seconds_rate5m, \
             \"callee\", \"$1\", \"service\", \"(.*)\"))"
                .to_owned(),
        ),
        (
            "stormglass:edge_timeout_rate:ratio_rate5m",
            format!(
                "sum by ({EDGE}) (rate(stormglass_attempts_total{{outcome=\"deadline\"}}[5m])) / \
                 (sum by ({EDGE}) (rate(stormglass_attempts_total[5m])) > 0)"
            ),
        ),
        (
            "stormglass:layer_timeout_rate:ratio_rate5m",
            "sum by (service) (label_replace(rate(stormglass_attempts_total{outcome=\"deadline\"}[5m]), \
             \"service\", \"$1\", \"callee\", \"(.*)\")) / \
             (sum by (service) (label_replace(rate(stormglass_attempts_total[5m]), \
             \"service\", \"$1\", \"callee\", \"(.*)\")) > 0)"
                .to_owned(),
        ),
        (
            "stormglass:edge_retries_to_other_instance:ratio_rate5m",
            format!(
                "sum by ({EDGE}) (rate(stormglass_other_instance_retries_total[5m])) / \
                 (sum by ({EDGE}) (rate(stormglass_instance_retries_total[5m])) > 0)"
            ),
        ),
        (
            "stormglass:edge_timed_out_server_ok:ratio_rate5m",
            ratio(
                format!(
                    "sum by ({EDGE}) (rate(stormglass_timed_out_server_ok_attempts_total[5m]))"
                ),
                &format!(
                    "sum by ({EDGE}) (rate(stormglass_timed_out_served_attempts_total[5m]))"
                ),
            ),
        ),
        (
            "stormglass:edge_attempts_without_deadline:ratio_rate5m",
            ratio(
                format!("sum by ({EDGE}) (rate(stormglass_unbudgeted_served_attempts_total[5m]))"),
                &format!("sum by ({EDGE}) (rate(stormglass_served_attempts_total[5m]))"),
            ),
        ),
        (
            "stormglass:edge_writes_without_key:ratio_rate5m",
            format!(
                "(sum by ({EDGE}) (rate(stormglass_key_writes_total[5m])) - \
                 (sum by ({EDGE}) (rate(stormglass_keyed_writes_total[5m])) \
                 or sum by ({EDGE}) (rate(stormglass_key_writes_total[5m])) * 0)) / \
                 (sum by ({EDGE}) (rate(stormglass_key_writes_total[5m])) > 0)"
            ),
        ),
        (
            "stormglass:edge_out_of_budget_retries:ratio_rate5m",
            ratio(
                format!("sum by ({EDGE}) (rate(stormglass_out_of_budget_retries_total[5m]))"),
                "stormglass:edge_retry_attempts:rate5m",
            ),
        ),
        (
            "stormglass:edge_retried_calls:rate5m",
            format!("sum by ({EDGE}) (rate(stormglass_retried_calls_total[5m]))"),
        ),
        (
            "stormglass:edge_retried_failed:ratio_rate5m",
            ratio(
                format!("sum by ({EDGE}) (rate(stormglass_retried_failed_calls_total[5m]))"),
                "stormglass:edge_retried_calls:rate5m",
            ),
        ),
        (
            "stormglass:edge_timeout_kill:ratio_rate5m",
            format!(
                "sum by ({EDGE}) (rate(stormglass_timeout_killed_attempts_total[5m])) / \
                 (sum by ({EDGE}) (rate(stormglass_served_budgeted_attempts_total[5m])) > 0)"
            ),
        ),
    ]
}

/// The same guard in PromQL: `condition` holds and `events` (a per-second rate with the
/// condition's labels) reaches the minimum per minute.
fn guarded(condition: String, events: &str, t: &AlertThresholds) -> String {
    format!(
        "{condition} and {events} * 60 >= {}",
        t.min_events_per_minute
    )
}

/// The rule of a count alert on an edge: any increase of `counter` in 5 minutes, on an edge
/// with the minimum traffic of attempts.
fn any_on_busy_edges(counter: &str, t: &AlertThresholds) -> String {
    guarded(
        format!("sum by ({EDGE}) (increase({counter}[5m])) > 0"),
        &format!("sum by ({EDGE}) (rate(stormglass_attempts_total[5m]))"),
        t,
    )
}

/// A burn-rate alert in PromQL: `burn(window)` over 1h and 5m above the fast rate, or over
/// 6h and 30m above the slow one, on entries with the minimum traffic.
fn entry_burn(burn: &dyn Fn(&str) -> String, t: &AlertThresholds) -> String {
    guarded(
        format!(
            "(({} > {fast} and {} > {fast}) or ({} > {slow} and {} > {slow}))",
            burn("1h"),
            burn("5m"),
            burn("6h"),
            burn("30m"),
            fast = EntrySlo::FAST_BURN,
            slow = EntrySlo::SLOW_BURN,
        ),
        "sum by (service, operation) (rate(stormglass_entry_requests_total[5m]))",
        t,
    )
}

/// The `le` bound an entry's latency objective is read at: the largest bucket bound at or
/// below `latency_ms` (a request between it and the target counts as slow, so a breach is
/// never hidden), as the exporter writes it.
fn entry_le(slo: &EntrySlo) -> String {
    let seconds = slo.latency_ms / 1e3;
    let bounds = stormglass_analytics::histogram::le_bounds();
    let bound = bounds
        .iter()
        .rev()
        .find(|b| **b <= seconds)
        .or(bounds.first())
        .copied()
        .unwrap_or(0.001);
    bound.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormglass_analytics::alerts::DEFINITIONS;

    /// Every alert has one expression and every expression names an alert, in order.
    #[test]
    fn one_expression_per_alert() {
        let alerts: Vec<_> = DEFINITIONS.iter().map(|d| d.name).collect();
        let exprs: Vec<_> = ALERT_EXPRS.iter().map(|(name, _)| *name).collect();
        assert_eq!(exprs, alerts);
    }
}
