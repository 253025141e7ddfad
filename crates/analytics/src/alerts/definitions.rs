//! Every alert: its PromQL rule and the same condition over a report.

use super::*;

/// Every alert of docs/alerts.md, in its order.
pub static DEFINITIONS: &[AlertDefinition] = &[
    AlertDefinition {
        name: "StormglassRetryAmplificationHigh",
        severity: "critical",
        hold: Duration::from_secs(120),
        summary: "{service} receives {value}x the attempts it would without retries",
        description: "Retries above {service} multiply its load: it received {value} times the \
            attempts it would have received with no retry anywhere upstream (threshold \
            {threshold}). When it slows down, the retries become a storm.",
        threshold: |t| t.amplification,
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| l.amplification,
                |l| l.baseline_attempts as f64,
                |v| v > t.amplification,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetryStormPotential",
        severity: "warning",
        hold: Duration::from_secs(15 * 60),
        summary: "A full outage below {service} {operation} would multiply load by {value}",
        description: "The retry policies along the deepest call chain below entry operation \
            {operation} of {service} multiply to {value} (threshold {threshold}): if the \
            bottom fails, it receives that many attempts per request. Retry at one layer only.",
        threshold: |t| t.storm_potential,
        condition: |r, t| {
            r.entries
                .iter()
                .filter(|e| e.storm_potential >= t.storm_potential)
                .map(|e| {
                    (
                        labels(&[("service", &e.service), ("operation", &e.operation)]),
                        e.storm_potential,
                    )
                })
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassRetryContributionHigh",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: {value} of successes needed a retry",
        description: "A share of {value} of the successful calls from {caller} to {callee} \
            ({operation}) succeeded only after a retry (threshold {threshold}; healthy is 5-15%). \
            The raw success rate hides how often the first try fails.",
        threshold: |t| t.retry_contribution,
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.retry_contribution,
                |e| e.raw_success_rate.unwrap_or(0.0) * e.logical_calls as f64,
                |v| v > t.retry_contribution,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetryBudgetExceeded",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: {value} retries per first attempt",
        description: "{caller} sends {value} retries per first attempt to {callee} \
            ({operation}), over the retry budget of {threshold}. Retries beyond a budget add \
            load when the callee can least take it.",
        threshold: |t| t.retry_ratio,
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.retry_ratio,
                |e| e.attempts.saturating_sub(e.retry_attempts) as f64,
                |v| v > t.retry_ratio,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetriesFailing",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: only {value} of retries succeed",
        description: "Only {value} of the retry attempts from {caller} to {callee} \
            ({operation}) succeed (threshold {threshold}). Retries that fail add load, not \
            availability.",
        threshold: |t| t.retry_success_rate,
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.retry_success_rate,
                |e| e.retry_attempts as f64,
                |v| v < t.retry_success_rate,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetriedCallsFailing",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: {percent} of retried calls still fail",
        description: "{percent} of the calls {caller} retried to {callee} ({operation}) \
            failed on their last attempt too (threshold {threshold}): the retries do not save \
            the calls, they only add load to a callee that is failing.",
        threshold: |t| t.retried_failed_share,
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.retried_failed_share,
                |e| e.retried_calls as f64,
                |v| v > t.retried_failed_share,
            )
        },
    },
    AlertDefinition {
        name: "StormglassRetryConcentration",
        severity: "critical",
        hold: Duration::from_secs(60),
        summary: "{caller} retries {callee} {value} times per minute",
        description: "{caller} sends {value} retries per minute to {callee} (threshold \
            {threshold}): one caller is hammering one callee.",
        threshold: |t| t.retries_per_minute,
        condition: |r, t| {
            let Some(minutes) = window_minutes(r) else {
                return Vec::new();
            };
            // Only the edges that retried, and labels only for the pairs that breach: at
            // width, labelling every pair was most of the alerts' time.
            let mut by_pair: Fast<(&str, &str), u64> = Fast::default();
            for e in r.edges.iter().filter(|e| e.retry_attempts > 0) {
                *by_pair.entry((&e.caller, &e.callee)).or_default() += e.retry_attempts;
            }
            let mut pairs: Vec<_> = by_pair
                .into_iter()
                .map(|(pair, retries)| (pair, retries as f64 / minutes))
                .filter(|(_, per_minute)| *per_minute > t.retries_per_minute)
                .collect();
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            pairs
                .into_iter()
                .map(|((caller, callee), per_minute)| {
                    (
                        labels(&[("caller", caller), ("callee", callee)]),
                        per_minute,
                    )
                })
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassTailRatioHigh",
        severity: "warning",
        hold: Duration::from_secs(10 * 60),
        summary: "{service}: P99.9 is {value}x P99",
        description: "The P99.9 latency of {service} is {value} times its P99 (threshold \
            {threshold}): the tail is deteriorating, and timeouts set at P99 cut it off.",
        threshold: |t| t.tail_ratio,
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| l.tail_ratio,
                |l| l.requests as f64,
                |v| v > t.tail_ratio,
            )
        },
    },
    AlertDefinition {
        name: "StormglassTimeoutRateHigh",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{service}: {percent} of its attempts time out",
        description: "{percent} of the attempts {service} receives end in a deadline \
            (threshold {threshold}): callers give up on it, and every timeout they retry is \
            load it serves again.",
        threshold: |t| t.timeout_rate,
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| l.timeout_rate,
                |l| l.requests as f64,
                |v| v > t.timeout_rate,
            )
        },
    },
    AlertDefinition {
        name: "StormglassLayerErrorRateHigh",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{service}: {percent} of its attempts fail",
        description: "{percent} of the attempts {service} receives fail (above \
            alerts.layer_error_rate {threshold}, or alerts.layer_error_jump above the same \
            share a week earlier): stormglass_layer_responses_total says with which status \
            codes, and its callers' retries multiply the load it fails under.",
        threshold: |t| t.layer_error_rate,
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| l.error_rate,
                |l| l.requests as f64,
                |v| v > t.layer_error_rate,
            )
        },
    },
    AlertDefinition {
        name: "StormglassLatencyDrift",
        severity: "warning",
        hold: Duration::from_secs(30 * 60),
        summary: "{service}: P99.9 is {value}x its baseline",
        description: "The P99.9 latency of {service} is {value} times its baseline (the \
            load-test report in alerts.baseline, else the same time a week earlier), more \
            than {threshold} away: the timeouts and deadline budgets derived from the \
            baseline no longer fit. Recompute them from the current P99.9.",
        threshold: |t| t.latency_drift,
        condition: |r, t| {
            busy_layers(
                r,
                t,
                |l| Some(l.p999_ms? / t.baseline_p999_ms.get(&l.service)?),
                |l| l.requests as f64,
                |v| (v - 1.0).abs() > t.latency_drift,
            )
        },
    },
    AlertDefinition {
        name: "StormglassTimeoutBelowTail",
        severity: "warning",
        hold: Duration::from_secs(15 * 60),
        summary: "{caller} -> {callee} {operation}: the timeout kills {percent} of healthy calls",
        description: "{caller} gives {callee} ({operation}) a timeout below {callee}'s P99.9 \
            latency: it cuts off {percent} of {callee}'s calls, slow but healthy, which are then \
            retried, adding load exactly when the callee is slow. Set it to P99.9 x 1.5, the \
            edge's recommended timeout (`stormglass advise` sizes it).",
        threshold: |_| 0.0,
        // Judged against the operation the timeout guards, from the edge's own counters
        // (summed over instances): a timeout below the P99.9 of the callee's SERVER spans
        // under the edge kills more than 0.1% of them. The value is that share.
        condition: |r, t| {
            r.edges
                .iter()
                .filter(|e| e.timeout_below_tail == Some(true) && busy(r, e.attempts as f64, t))
                .filter_map(|e| Some((edge_labels(e), e.timeout_kill_share?)))
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassDeadlineInversion",
        severity: "warning",
        // Not docs/alerts.md's 5m: a single inversion keeps `increase[5m] > 0` (and the 5-minute
        // window's findings) for just 5 minutes, so a 5m hold never fired for it. 1m fires
        // for any inversion, in Prometheus and in the built-in evaluator.
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee}: {value} deadline inversions or overcommits",
        description: "{caller} gives {callee} more time than it has left itself ({value} \
            inversions or overcommitted budgets): the callee keeps working after the caller \
            has given up.",
        threshold: |_| 0.0,
        condition: |r, t| {
            let mut budget: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            for f in &r.findings {
                if f.kind == "deadline_inversion" || f.kind == "overcommit" {
                    *budget.entry((&f.caller, &f.callee)).or_default() += f.count;
                }
            }
            // The attempts of the pairs with findings only.
            let mut attempts: BTreeMap<(&str, &str), u64> =
                budget.keys().map(|pair| (*pair, 0)).collect();
            for e in &r.edges {
                if let Some(n) = attempts.get_mut(&(e.caller.as_str(), e.callee.as_str())) {
                    *n += e.attempts;
                }
            }
            budget
                .into_iter()
                .filter(|(pair, _)| busy(r, attempts.get(pair).copied().unwrap_or(0) as f64, t))
                .map(|((caller, callee), count)| {
                    (
                        labels(&[("caller", caller), ("callee", callee)]),
                        count as f64,
                    )
                })
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassUnsafeRetries",
        severity: "critical",
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee} {operation}: {value} unsafe retries",
        description: "{caller} retried the non-idempotent {operation} on {callee} without an \
            idempotency key {value} times: each may have applied the write twice.",
        threshold: |_| 0.0,
        condition: |r, t| counted_on_busy_edges(r, t, |e| e.unsafe_retries),
    },
    AlertDefinition {
        name: "StormglassOverlappingWriteRetries",
        severity: "critical",
        // 1m, as for unsafe retries: a count in a 5-minute range holds only 5 minutes.
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee} {operation}: {value} retries reached a callee still \
            running the write",
        description: "{caller} retried the non-idempotent {operation} on {callee} without a \
            stable idempotency key while {callee} still ran the attempt before, {value} \
            times: the write may run twice at once.",
        threshold: |_| 0.0,
        condition: |r, t| counted_on_busy_edges(r, t, |e| e.overlapping_write_retries),
    },
    AlertDefinition {
        name: "StormglassRerunWrites",
        severity: "critical",
        // 1m, as for unsafe retries: a count in a 5-minute range holds only 5 minutes.
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee} {operation}: {value} writes re-run under an upstream \
            retry",
        description: "{caller} made the non-idempotent {operation} on {callee} again, {value} \
            times, while serving a retry of a call made to it, without the idempotency key of \
            the write it made for the attempt before: the retry above may be safe, the write \
            below ran twice.",
        threshold: |_| 0.0,
        condition: |r, t| counted_on_busy_edges(r, t, |e| e.rerun_writes),
    },
    AlertDefinition {
        name: "StormglassRetryAfterIgnored",
        severity: "warning",
        // 1m, as for unsafe retries: a count in a 5-minute range holds only 5 minutes.
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee} {operation}: {value} retries ignored the callee's \
            Retry-After or pushback",
        description: "{caller} retried {operation} on {callee} {value} times before the \
            wait the previous answer asked for (HTTP Retry-After, gRPC \
            grpc-retry-pushback-ms) had elapsed, or after a pushback that said not to retry: \
            the callee shed load and got it back at once.",
        threshold: |_| 0.0,
        condition: |r, t| counted_on_busy_edges(r, t, |e| e.retry_after_violations),
    },
    AlertDefinition {
        name: "StormglassEntryErrorBudgetBurn",
        severity: "critical",
        hold: Duration::from_secs(2 * 60),
        summary: "{service} {operation}: failures burn the error budget {value}x",
        description: "{service} {operation} fails its users {value} times as fast as its \
            entry SLO allows (alerts.entry_slo.error_rate): at this rate the month's error \
            budget is gone in days. Retries below it are not saving the calls.",
        threshold: |_| EntrySlo::FAST_BURN,
        condition: |r, t| {
            busy_entries(r, t, |e| {
                e.error_rate
                    .map(|rate| rate / t.entry_slo.error_rate)
                    .filter(|burn| *burn > EntrySlo::FAST_BURN)
            })
        },
    },
    AlertDefinition {
        name: "StormglassEntryLatencyBudgetBurn",
        severity: "critical",
        hold: Duration::from_secs(2 * 60),
        summary: "{service} {operation}: slow requests burn the latency budget {value}x",
        description: "{service} {operation} answers too slowly {value} times as often as its \
            entry SLO allows (alerts.entry_slo: latency_share of the requests within \
            latency_ms): at this rate the month's budget is gone in days. Look below it for \
            retries and timeouts that add to the tail.",
        threshold: |_| EntrySlo::FAST_BURN,
        condition: |r, t| {
            let budget = 1.0 - t.entry_slo.latency_share;
            busy_entries(r, t, |e| {
                e.latency_slo_share
                    .map(|share| (1.0 - share) / budget)
                    .filter(|burn| *burn > EntrySlo::FAST_BURN)
            })
        },
    },
    AlertDefinition {
        name: "StormglassCallsWithoutDeadline",
        severity: "warning",
        hold: Duration::from_secs(15 * 60),
        summary: "{caller} -> {callee} {operation}: {percent} of its calls carry no deadline",
        description: "{percent} of the attempts {caller} sends to {operation} on {callee} \
            carry no deadline on either side (threshold {threshold}): they can wait forever, \
            hold their resources while {callee} is slow, and no budget can be checked.",
        threshold: |t| t.without_deadline_share,
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| e.attempts_without_deadline,
                |e| e.attempts as f64,
                |v| v > t.without_deadline_share,
            )
        },
    },
    AlertDefinition {
        name: "StormglassWritesWithoutKey",
        severity: "warning",
        hold: Duration::from_secs(15 * 60),
        summary: "{caller} -> {callee} {operation}: {percent} of its writes carry no \
            idempotency key",
        description: "{percent} of the writes {caller} sends to {operation} on {callee} carry \
            no idempotency key (threshold {threshold}): a retry of one anywhere on its path \
            cannot be told from a new write, so it may apply twice.",
        threshold: |t| t.writes_without_key_share,
        condition: |r, t| {
            let keyless =
                |c: &crate::report::EdgeCoverage| c.shares.idempotency_key.map(|keyed| 1.0 - keyed);
            r.coverage
                .edges
                .iter()
                .filter(|c| busy(r, c.shares.attempts as f64, t))
                .filter_map(|c| Some((c, keyless(c)?)))
                .filter(|(_, share)| *share > t.writes_without_key_share)
                .map(|(c, share)| {
                    (
                        labels(&[
                            ("caller", &c.caller),
                            ("callee", &c.callee),
                            ("operation", &c.operation),
                        ]),
                        share,
                    )
                })
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassNonRetryableRetries",
        severity: "warning",
        // 1m, as for inversions: a count in a 5-minute range holds only 5 minutes.
        hold: Duration::from_secs(60),
        summary: "{caller} -> {callee} {operation}: {value} retries of client errors",
        description: "{caller} retried {operation} on {callee} {value} times after a client \
            error (a 4xx but 408 and 429, INVALID_ARGUMENT, NOT_FOUND, ... a non-zero \
            err_code): the same request meets the same error, so each retry is load that \
            cannot succeed.",
        threshold: |_| 0.0,
        condition: |r, t| {
            r.edges
                .iter()
                .filter(|e| e.non_retryable_retries > 0 && busy(r, e.retry_attempts as f64, t))
                .map(|e| (edge_labels(e), e.non_retryable_retries as f64))
                .collect()
        },
    },
    AlertDefinition {
        name: "StormglassRetriesOutOfBudget",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{caller} -> {callee} {operation}: {percent} of retries cannot fit the budget left",
        description: "{percent} of {caller}'s retries of {operation} on {callee} started with \
            less of the caller's budget left than {callee}'s median duration on this call \
            (threshold {threshold}), some after the deadline had passed: they fail or are \
            abandoned, adding load for nothing. Check the remaining budget before retrying.",
        threshold: |t| t.out_of_budget_retry_share,
        condition: |r, t| {
            busy_edges(
                r,
                t,
                |e| {
                    let retries = e.retry_attempts as f64;
                    (retries > 0.0).then(|| e.out_of_budget_retries as f64 / retries)
                },
                |e| e.retry_attempts as f64,
                |v| v > t.out_of_budget_retry_share,
            )
        },
    },
    AlertDefinition {
        name: "StormglassOrphanWork",
        severity: "warning",
        hold: Duration::from_secs(5 * 60),
        summary: "{callee} works {value} s per minute for callers of {operation} that gave up",
        description: "{callee} keeps working on {operation} after {caller} cancelled or timed \
            out: {value} seconds of orphan work per minute (threshold {threshold}). Propagate \
            cancellation and deadlines.",
        threshold: |t| t.orphan_work_seconds_per_minute,
        condition: |r, t| {
            let Some(minutes) = window_minutes(r) else {
                return Vec::new();
            };
            busy_edges(
                r,
                t,
                |e| Some(e.orphan_work_seconds / minutes),
                |e| e.attempts as f64,
                |v| v > t.orphan_work_seconds_per_minute,
            )
        },
    },
];

/// The same condition over a report: the edges where `count` is above 0 and the attempts
/// reach the minimum traffic.
fn counted_on_busy_edges(
    r: &Report,
    t: &AlertThresholds,
    count: fn(&crate::report::EdgeFigures) -> u64,
) -> Vec<Breach> {
    r.edges
        .iter()
        .filter(|e| count(e) > 0 && busy(r, e.attempts as f64, t))
        .map(|e| (edge_labels(e), count(e) as f64))
        .collect()
}

/// The same over a report (one window: the fast rate): the entries whose `burn` is some,
/// among those with the minimum traffic.
fn busy_entries(
    r: &Report,
    t: &AlertThresholds,
    burn: impl Fn(&crate::report::EntryFigures) -> Option<f64>,
) -> Vec<Breach> {
    r.entries
        .iter()
        .filter(|e| busy(r, e.requests as f64, t))
        .filter_map(|e| {
            let labels = labels(&[("service", &e.service), ("operation", &e.operation)]);
            Some((labels, burn(e)?))
        })
        .collect()
}
