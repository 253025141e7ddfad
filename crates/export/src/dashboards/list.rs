//! The dashboards, panel by panel (see [`super`] for what every panel shares).

use serde_json::json;

use super::{Dashboard, Filter, node_graph, stat, table, timeseries};

/// Every dashboard, in `dashboards/grafana/`.
pub fn dashboards() -> Vec<Dashboard> {
    vec![
        Dashboard {
            uid: "stormglass-deadlines",
            title: "stormglass / Deadline budgets",
            description: "Budgets that do not add up and retries that are not safe: inversions, overcommit, missing propagation, unsafe retries.",
            filter: Filter::Edge("stormglass_deadline_violations_total"),
            panels: vec![
                timeseries(
                    "Deadline violations by kind (5m)",
                    "inversion: a child's budget exceeds what its parent has left. overcommit: sequential children's budgets sum past the parent's. not_propagated: the callee received no deadline. Inversions and overcommits: StormglassDeadlineInversion.",
                )
                    .unit("short")
                    .from_zero()
                    .query("sum by (kind) (increase(stormglass_deadline_violations_total{$series,$edge}[$__rate_interval]))", "{{kind}}"),
                table(
                    "Deadline violations per edge (5m)",
                    "Violations per caller → callee and kind over the last 5 minutes.",
                )
                    .unit("none")
                    .table_query("sum by (caller, callee, kind) (increase(stormglass_deadline_violations_total{$series,$edge}[$__rate_interval]))"),
                timeseries(
                    "Unsafe retries (5m)",
                    "Retries of non-idempotent operations without an idempotency key. Must be 0: StormglassUnsafeRetries.",
                )
                    .size(8, 8)
                    .unit("short")
                    .from_zero()
                    .red_from(1.0)
                    .query("sum by (caller, callee, operation) (increase(stormglass_unsafe_retries_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Writes run twice (5m)",
                    "Writes that may have applied twice although no retry of them was unsafe: re-run below an upstream retry without the first write's key (StormglassRerunWrites), and retried while the callee still ran the attempt before (StormglassOverlappingWriteRetries). Must be 0.",
                )
                    .size(8, 8)
                    .unit("short")
                    .from_zero()
                    .red_from(1.0)
                    .query("sum by (caller, callee, operation) (increase(stormglass_rerun_writes_total{$series,$edge}[$__rate_interval]))", "re-run: {{caller}} → {{callee}} {{operation}}")
                    .query("sum by (caller, callee, operation) (increase(stormglass_overlapping_write_retries_total{$series,$edge}[$__rate_interval]))", "overlapping: {{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Duplicates caught (5m)",
                    "Retried writes answered as a duplicate (HTTP 409, gRPC ALREADY_EXISTS, an error.type naming one): an earlier attempt had done the write and a unique index caught the repeat, while the caller read a failure. A unique index is not idempotency: send a key.",
                )
                    .size(8, 8)
                    .unit("short")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (increase(stormglass_duplicate_rejections_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Timeout retries on writes (5m)",
                    "Retries after a deadline on non-idempotent operations: double-write risk even with a key.",
                )
                    .size(8, 8)
                    .unit("short")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (increase(stormglass_timeout_retries_on_writes_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Retries before the asked wait (5m)",
                    "Retries started before the wait the previous answer asked for elapsed (HTTP Retry-After, gRPC grpc-retry-pushback-ms), or after a pushback that said not to retry: StormglassRetryAfterIgnored.",
                )
                    .size(8, 8)
                    .unit("short")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (increase(stormglass_retry_after_violations_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Immediate retries (5m)",
                    "Retries with less than advice.min_backoff_ms backoff: synchronized storms.",
                )
                    .size(8, 8)
                    .unit("short")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (increase(stormglass_immediate_retries_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}}"),
            ],
        },
        Dashboard {
            uid: "stormglass-edges",
            title: "stormglass / Edges",
            description: "One caller → callee edge at a time: attempts by outcome and cause, retry success, timeouts against the callee's P99.9, orphan work.",
            filter: Filter::Edge("stormglass_attempts_total"),
            panels: vec![
                timeseries(
                    "Attempts by outcome",
                    "Attempts per second, first attempts and retries, by outcome class.",
                )
                    .unit("reqps")
                    .query("sum by (attempt, outcome) (rate(stormglass_attempts_total{$series,$edge}[$__rate_interval]))", "{{attempt}} {{outcome}}"),
                timeseries(
                    "Retries by cause",
                    "Retry attempts per second by cause (the failure that triggered them).",
                )
                    .unit("reqps")
                    .query(r#"sum by (cause) (rate(stormglass_attempts_total{$series,$edge,attempt="retry"}[$__rate_interval]))"#, "{{cause}}"),
                timeseries(
                    "Effective vs raw success",
                    "Per edge: first-attempt success (effective) and final success (raw).",
                )
                    .unit("percentunit")
                    .share()
                    .query("stormglass:edge_effective_success:ratio_rate5m{$recorded,$edge}", "effective {{caller}} → {{callee}} {{operation}}")
                    .query("stormglass:edge_raw_success:ratio_rate5m{$recorded,$edge}", "raw {{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Retry success rate",
                    "Successful retries / retries. Below the dashed alert threshold (70% by default, from stormglass' configuration) retries add load, not availability: StormglassRetriesFailing.",
                )
                    .unit("percentunit")
                    .share()
                    .query("stormglass:edge_retry_success:ratio_rate5m{$recorded,$edge}", "{{caller}} → {{callee}} {{operation}}")
                    .alert_line(r#"max(stormglass_alert_threshold{$series,alert="StormglassRetriesFailing"})"#),
                timeseries(
                    "Retry ratio (retry budget)",
                    "Retries / first attempts. Above the dashed alert threshold (10% by default, from stormglass' configuration) the retry budget is exceeded: StormglassRetryBudgetExceeded.",
                )
                    .unit("percentunit")
                    .from_zero()
                    .query("stormglass:edge_retry:ratio_rate5m{$recorded,$edge}", "{{caller}} → {{callee}} {{operation}}")
                    .alert_line(r#"max(stormglass_alert_threshold{$series,alert="StormglassRetryBudgetExceeded"})"#),
                timeseries(
                    "Edge amplification",
                    "Attempts / logical calls on this hop.",
                )
                    .unit("suffix:x")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (rate(stormglass_attempts_total{$series,$edge}[$__rate_interval])) / sum by (caller, callee, operation) (rate(stormglass_logical_calls_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Timeout vs callee P99.9",
                    "The mean budget the caller gives (the configured timeout when the edge has one, every instance together), the P99.9 of the operation it guards (the callee's SERVER spans under these calls, the largest any instance computed from its window), and the largest recommended timeout (that P99.9 x advice.timeout_factor). A timeout below P99.9 cuts off healthy requests: StormglassTimeoutBelowTail.",
                )
                    .unit("s")
                    .from_zero()
                    .query("stormglass:edge_timeout:mean_seconds_rate5m{$recorded,$edge}", "timeout {{caller}} → {{callee}} {{operation}}")
                    .query("max by (cluster, job, caller, callee, operation) (stormglass_callee_latency_p999_seconds{$series,$edge})", "P99.9 of {{callee}} {{operation}} (its SERVER spans under these calls)")
                    .query("max by (cluster, job, caller, callee, operation) (stormglass_recommended_timeout_seconds{$series,$edge})", "recommended {{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Backoff",
                    "The mean wait between an attempt's end and its retry's start (hedges aside), every instance together. Near 0 retries come back at once (immediate retries); a wait that never grows or spreads synchronises the callers' retries. The report's backoff says which shape (none, constant, exponential, exponential_jitter).",
                )
                    .unit("s")
                    .from_zero()
                    .query("stormglass:edge_backoff:mean_seconds_rate5m{$recorded,$edge}", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Synchronised retries",
                    "The share of an edge's retries sent in a 100 ms slot in which retries of many calls reached its callee (retries.synchronised_min_calls, and 3 times its mean per slot), over each instance's window. Retries on one schedule re-ignite a storm at their period; jittered backoff spreads them.",
                )
                    .unit("percentunit")
                    .share()
                    .query("max by (caller, callee, operation) (stormglass_synchronised_retries_ratio{$series,$edge})", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Orphan work",
                    "Seconds per minute the callee kept working after the caller gave up (cancelled or timed out). Above the dashed alert threshold (1 s/min by default, from stormglass' configuration): StormglassOrphanWork.",
                )
                    .unit("suffix: s/min")
                    .from_zero()
                    .query("stormglass:edge_orphan_work_seconds:per_minute_rate5m{$recorded,$edge}", "{{caller}} → {{callee}} {{operation}}")
                    .alert_line(r#"max(stormglass_alert_threshold{$series,alert="StormglassOrphanWork"})"#),
                timeseries(
                    "Orphan pairs by server outcome",
                    "Abandoned attempts whose server went on: ok (the side effect happened anyway), failed, pending.",
                )
                    .unit("reqps")
                    .query("sum by (server_outcome) (rate(stormglass_orphan_pairs_total{$series,$edge}[$__rate_interval]))", "{{server_outcome}}"),
                timeseries(
                    "Attempts found without numbers",
                    r#"Attempts per second read from SERVER spans without a number (re-sends below the CLIENT span by a client library or proxy, calls from uninstrumented callers), inferred from sibling CLIENT spans (application retry loops), and hedged (started before an earlier attempt ended: counted as attempts, not retries). docs/instrumenting.md ("Retries nobody numbered") says how each is read and what makes it exact."#,
                )
                    .unit("reqps")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (rate(stormglass_hidden_attempts_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}} hidden")
                    .query("sum by (caller, callee, operation) (rate(stormglass_inferred_attempts_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}} inferred")
                    .query("sum by (caller, callee, operation) (rate(stormglass_hedged_attempts_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}} hedged"),
                timeseries(
                    "Retries to another instance",
                    "Retries that reached another instance of the callee than the attempt before / retries whose instances are both known (service.instance.id, else host.name). Near 0 while an instance is sick: the retries keep hitting it.",
                )
                    .unit("percentunit")
                    .share()
                    .query("sum by (caller, callee, operation) (rate(stormglass_other_instance_retries_total{$series,$edge}[$__rate_interval])) / (sum by (caller, callee, operation) (rate(stormglass_instance_retries_total{$series,$edge}[$__rate_interval])) > 0)", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Timeout rate",
                    "Attempts ending in deadline (the caller's timeout or the callee's deadline) / attempts: how often this edge's timeout fires. Read it beside Timeout vs callee P99.9: a timeout below the callee's tail fires on healthy calls.",
                )
                    .unit("percentunit")
                    .share()
                    .query(r#"sum by (caller, callee, operation) (rate(stormglass_attempts_total{$series,$edge,outcome="deadline"}[$__rate_interval])) / (sum by (caller, callee, operation) (rate(stormglass_attempts_total{$series,$edge}[$__rate_interval])) > 0)"#, "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Healthy calls cut off by the timeout",
                    "Of the attempts with a budget whose callee sent a SERVER span, the share whose SERVER span ran longer than the budget: calls, slow but answered, that the timeout killed and the caller retried (timeout_kill_share). Read it beside Timeout vs callee P99.9.",
                )
                    .unit("percentunit")
                    .share()
                    .query("sum by (caller, callee, operation) (rate(stormglass_timeout_killed_attempts_total{$series,$edge}[$__rate_interval])) / (sum by (caller, callee, operation) (rate(stormglass_served_budgeted_attempts_total{$series,$edge}[$__rate_interval])) > 0)", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Retried calls lost anyway",
                    "Logical calls that were retried and still failed on their last attempt / retried calls (retried_failed_share): the calls the retries did not save. StormglassRetriedCallsFailing fires above alerts.retried_failed_share (0.5). Retry success rate counts attempts; this counts calls.",
                )
                    .unit("percentunit")
                    .share()
                    .query("sum by (caller, callee, operation) (rate(stormglass_retried_failed_calls_total{$series,$edge}[$__rate_interval])) / (sum by (caller, callee, operation) (rate(stormglass_retried_calls_total{$series,$edge}[$__rate_interval])) > 0)", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Timeouts whose callee finished ok",
                    "Of the attempts ending in deadline whose callee sent a SERVER span, the share whose SERVER span ended ok, however long after the caller gave up (timed_out_server_ok_share): work the callee finished and the timeout threw away. High with a high timeout rate: the timeout is shorter than the callee needs, not the callee broken.",
                )
                    .unit("percentunit")
                    .share()
                    .query("sum by (caller, callee, operation) (rate(stormglass_timed_out_server_ok_attempts_total{$series,$edge}[$__rate_interval])) / (sum by (caller, callee, operation) (rate(stormglass_timed_out_served_attempts_total{$series,$edge}[$__rate_interval])) > 0)", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Calls without a deadline",
                    "Of the attempts whose callee sent a SERVER span, the share with no deadline on either side (attempts_without_deadline): calls that can wait forever and hold the caller's threads and connections when the callee stalls.",
                )
                    .unit("percentunit")
                    .share()
                    .query("sum by (caller, callee, operation) (rate(stormglass_unbudgeted_served_attempts_total{$series,$edge}[$__rate_interval])) / (sum by (caller, callee, operation) (rate(stormglass_served_attempts_total{$series,$edge}[$__rate_interval])) > 0)", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Retries of client errors",
                    "Retries per second whose previous attempt ended in a client error (4xx but 408 and 429, INVALID_ARGUMENT, NOT_FOUND, ... a non-zero err_code): the same request meets the same error, so they cannot succeed (StormglassNonRetryableRetries).",
                )
                    .unit("reqps")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (rate(stormglass_non_retryable_retries_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}}"),
                timeseries(
                    "Retries that cannot fit the budget left",
                    "Retries per second that started with less of the caller's budget left than the callee's median duration on the edge (A), and those started after the deadline had passed (B): they fail or are abandoned, adding load for nothing (StormglassRetriesOutOfBudget).",
                )
                    .unit("reqps")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (rate(stormglass_out_of_budget_retries_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}} out of budget")
                    .query("sum by (caller, callee, operation) (rate(stormglass_retries_after_deadline_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}} after the deadline"),
                timeseries(
                    "Idempotency keys: unstable retries and hits",
                    "Retries per second whose idempotency key is not their first attempt's (A: the callee cannot tell they repeat it; counted as unsafe retries, StormglassUnsafeRetries), and attempts the callee answered from its idempotency store (B: repeats the key made harmless).",
                )
                    .unit("reqps")
                    .from_zero()
                    .query("sum by (caller, callee, operation) (rate(stormglass_unstable_key_retries_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}} unstable key")
                    .query("sum by (caller, callee, operation) (rate(stormglass_idempotency_hits_total{$series,$edge}[$__rate_interval]))", "{{caller}} → {{callee}} {{operation}} hit"),
            ],
        },
        Dashboard {
            uid: "stormglass-layers",
            title: "stormglass / Layer tails",
            description: "Per service: P99, P99.9 and the tail ratio; timeouts belong at P99.9 x 1.5, never at P99.",
            filter: Filter::Service("stormglass_layer_attempts_total"),
            panels: vec![
                timeseries(
                    "P99 and P99.9 per instance (window)",
                    "Each instance's own window (analytics.window), within 2%: one series per instance, not summed. The panel beside it has the figures of all instances together.",
                )
                    .unit("s")
                    .from_zero()
                    .query(r#"stormglass_layer_latency_p99_seconds{$series,service=~"$service"}"#, "P99 {{service}} {{instance}}")
                    .query(r#"stormglass_layer_latency_p999_seconds{$series,service=~"$service"}"#, "P99.9 {{service}} {{instance}}"),
                timeseries(
                    "Tail ratio",
                    "P99.9 / P99 of the layer histogram summed over instances (each quantile within its buckets' 25%). Above the dashed alert threshold (2 by default, from stormglass' configuration) the tail is deteriorating: StormglassTailRatioHigh.",
                )
                    .unit("suffix:x")
                    .from_zero()
                    .query(r#"stormglass:layer_tail:ratio_rate5m{$recorded,service=~"$service"}"#, "{{service}}")
                    .alert_line(r#"max(stormglass_alert_threshold{$series,alert="StormglassTailRatioHigh"})"#),
                timeseries(
                    "P99 and P99.9 from the histogram (all instances)",
                    "histogram_quantile over stormglass_layer_duration_seconds summed across instances; buckets are 1.25x wide, so within ~25%.",
                )
                    .unit("s")
                    .from_zero()
                    .query(r#"stormglass:layer_latency_p99:seconds_rate5m{$recorded,service=~"$service"}"#, "P99 {{service}}")
                    .query(r#"stormglass:layer_latency_p999:seconds_rate5m{$recorded,service=~"$service"}"#, "P99.9 {{service}}"),
                timeseries(
                    "Attempts received vs baseline",
                    "Attempts a layer receives and what it would receive with no retry upstream; their ratio is the amplification.",
                )
                    .unit("reqps")
                    .from_zero()
                    .query(r#"sum by (service) (rate(stormglass_layer_attempts_total{$series,service=~"$service"}[$__rate_interval]))"#, "received {{service}}")
                    .query(r#"sum by (service) (rate(stormglass_layer_baseline_attempts_total{$series,service=~"$service"}[$__rate_interval]))"#, "baseline {{service}}"),
                timeseries(
                    "Timeout rate",
                    "Of the attempts a layer received from its callers (entry requests aside), those ending in deadline. A layer whose timeout rate climbs while its P99.9 holds is being timed out by callers with too tight a budget.",
                )
                    .unit("percentunit")
                    .share()
                    .query(r#"sum by (callee) (rate(stormglass_attempts_total{$series,callee=~"$service",outcome="deadline"}[$__rate_interval])) / (sum by (callee) (rate(stormglass_attempts_total{$series,callee=~"$service"}[$__rate_interval])) > 0)"#, "{{callee}}"),
                timeseries(
                    "Failures by status code",
                    "Of the attempts a layer received from its callers, the share that failed, per raw status code (503, UNAVAILABLE, 409; none where the caller gave up before an answer), stacked to the layer's error share (error_rate). Above the dashed alert threshold (5% by default, from stormglass' configuration): StormglassLayerErrorRateHigh.",
                )
                    .unit("percentunit")
                    .share()
                    .query(r#"sum by (service, status_code) (rate(stormglass_layer_responses_total{$series,service=~"$service",outcome!="ok"}[$__rate_interval])) / ignoring (status_code) group_left sum by (service) (rate(stormglass_layer_responses_total{$series,service=~"$service"}[$__rate_interval]))"#, "{{service}} {{status_code}}")
                    .alert_line(r#"max(stormglass_alert_threshold{$series,alert="StormglassLayerErrorRateHigh"})"#),
            ],
        },
        Dashboard {
            uid: "stormglass-overview",
            title: "stormglass / Overview",
            description: "Do retries and timeouts help or hurt? Effective vs raw success, retry contribution, amplification per layer, alerts firing.",
            filter: Filter::Service("stormglass_layer_attempts_total"),
            panels: vec![
                timeseries(
                    "Effective vs raw success (all edges)",
                    "Raw: logical calls whose final attempt succeeded. Effective: whose first attempt succeeded (what users feel without retries). The gap is what retries buy.",
                )
                    .unit("percentunit")
                    .share()
                    .query(r#"(sum(rate(stormglass_logical_calls_total{$series,first_outcome="ok"}[$__rate_interval])) or vector(0)) / (sum(rate(stormglass_logical_calls_total{$series}[$__rate_interval])) > 0)"#, "effective")
                    .query(r#"(sum(rate(stormglass_logical_calls_total{$series,final_outcome="ok"}[$__rate_interval])) or vector(0)) / (sum(rate(stormglass_logical_calls_total{$series}[$__rate_interval])) > 0)"#, "raw"),
                timeseries(
                    "Retry contribution per edge",
                    "Share of successful calls that needed a retry. Healthy 5-15%; above the dashed alert threshold (20% by default, from stormglass' configuration) StormglassRetryContributionHigh fires.",
                )
                    .unit("percentunit")
                    .from_zero()
                    .query("stormglass:edge_retry_contribution:ratio_rate5m{$recorded}", "{{caller}} → {{callee}} {{operation}}")
                    .alert_line(r#"max(stormglass_alert_threshold{$series,alert="StormglassRetryContributionHigh"})"#),
                timeseries(
                    "Amplification per layer",
                    "Attempts a layer receives / attempts it would receive with no retry upstream. Above the dashed alert threshold (2x by default, from stormglass' configuration) StormglassRetryAmplificationHigh fires.",
                )
                    .unit("suffix:x")
                    .from_zero()
                    .query(r#"stormglass:layer_amplification:ratio_rate5m{$recorded,service=~"$service"}"#, "{{service}}")
                    .alert_line(r#"max(stormglass_alert_threshold{$series,alert="StormglassRetryAmplificationHigh"})"#),
                table(
                    "Alerts firing",
                    "stormglass alerts firing in this Prometheus (from the shipped rules).",
                )
                    .unit("none")
                    .table_query(r#"sum by (alertname, severity) (ALERTS{$recorded,alertname=~"Stormglass.*", alertstate="firing"})"#),
                stat(
                    "Storm potential per entry operation",
                    "What a full outage at the bottom would do: product of (max attempt + 1) down the deepest chain. 8 or more: StormglassRetryStormPotential.",
                )
                    .size(8, 8)
                    .unit("suffix:x")
                    .red_from(8.0)
                    .query(r#"max by (service, operation) (stormglass_storm_potential_ratio{$series,service=~"$service"})"#, "{{service}} {{operation}}"),
                timeseries(
                    "Entry requests",
                    "Requests entering the system per second, by entry service and operation.",
                )
                    .size(8, 8)
                    .unit("reqps")
                    .query(r#"sum by (service, operation) (rate(stormglass_entry_requests_total{$series,service=~"$service"}[$__rate_interval]))"#, "{{service}} {{operation}}"),
                timeseries(
                    "Multi-layer retry traces",
                    "Traces per second in which two or more layers retried (only one layer should).",
                )
                    .size(8, 8)
                    .unit("reqps")
                    .query(r#"sum by (service) (rate(stormglass_multi_layer_retry_traces_total{$series,service=~"$service"}[$__rate_interval]))"#, "{{service}}"),
                timeseries(
                    "Self: spans accepted",
                    "Spans per second taken in per instance. Refused export requests (exporters retry, then drop) have their own alert, StormglassRefusingSpans.",
                )
                    .size(6, 8)
                    .unit("short")
                    .from_zero()
                    .query("sum by (instance) (rate(stormglass_receiver_accepted_spans_total{$series}[$__rate_interval]))", "{{instance}} accepted spans/s"),
                timeseries(
                    "Self: spans waiting for analysis",
                    "Released spans queued for analysis; a backlog that never empties means analysis is slower than ingest (StormglassAnalysisLagging).",
                )
                    .size(6, 8)
                    .unit("short")
                    .from_zero()
                    .query("stormglass_analysis_pending_spans{$series}", "{{instance}}"),
                timeseries(
                    "Self: analysis failures",
                    "Analysis failures per interval (StormglassAnalysisFailing; /healthz names the task). Internal task errors, failed notifications and overflow series have their own alerts.",
                )
                    .size(6, 8)
                    .unit("short")
                    .from_zero()
                    .query("sum by (instance) (increase(stormglass_analysis_failures_total{$series}[$__rate_interval]))", "{{instance}} analysis failures"),
                timeseries(
                    "Self: memory",
                    "The process's memory bound (limits.memory), its resident footprint, the data budget (the limit less the footprint beyond reserved data) and the bytes reserved for data; when reserved reaches the data budget less the analysis's quarter of the limit, receivers refuse with a retryable answer.",
                )
                    .size(6, 8)
                    .unit("bytes")
                    .from_zero()
                    .query("stormglass_memory_used_bytes{$series}", "{{instance}} used")
                    .query("stormglass_memory_limit_bytes{$series}", "{{instance}} limit")
                    .query("stormglass_memory_footprint_bytes{$series}", "{{instance}} resident")
                    .query("stormglass_memory_data_budget_bytes{$series}", "{{instance}} data budget"),
                table(
                    "Instrumentation coverage",
                    "Per edge, the share of attempts whose spans carry what each figure needs: attempt_number (the retry figures), cause (retries by cause), deadline (timeouts, inversions), idempotency (unsafe retries, among writes: a flag or a key), idempotency_key (unstable keys, among writes: a key), server_spans (layer latency, orphan work); and how the other attempts were found (from_server_spans: read from the callee's SERVER spans; inferred: from sibling CLIENT spans; low shares of these two are no fault). A low share explains an empty or low figure; docs/instrumenting.md says what to add. The lowest share any instance saw in its window.",
                )
                    .size(24, 8)
                    .unit("percentunit")
                    .share()
                    .table_query("min by (caller, callee, operation, field) (stormglass_instrumentation_coverage_ratio{$series})")
                    .with(json!({
                        "transformations": [
                            {
                                "id": "organize",
                                "options": {
                                    "excludeByName": {
                                        "Time": true
                                    },
                                    "renameByName": {
                                        "Value": "share"
                                    }
                                }
                            }
                        ],
                        "fieldConfig": {
                            "defaults": {
                                "color": {
                                    "mode": "thresholds"
                                },
                                "custom": {
                                    "cellOptions": {
                                        "type": "color-text"
                                    }
                                },
                                "thresholds": {
                                    "steps": [
                                        {
                                            "color": "red",
                                            "value": null
                                        },
                                        {
                                            "color": "orange",
                                            "value": 0.5
                                        },
                                        {
                                            "color": "green",
                                            "value": 0.95
                                        }
                                    ]
                                }
                            }
                        }
                    })),
                timeseries(
                    "Entry error rate",
                    "Requests entering the system whose entry span failed / requests, per entry operation (error_rate): what the callers outside see, retries and all.",
                )
                    .unit("percentunit")
                    .share()
                    .query(r#"sum by (service, operation) (rate(stormglass_entry_failed_requests_total{$series,service=~"$service"}[$__rate_interval])) / (sum by (service, operation) (rate(stormglass_entry_requests_total{$series,service=~"$service"}[$__rate_interval])) > 0)"#, "{{service}} {{operation}}"),
                timeseries(
                    "Entry latency P99 / P99.9",
                    "P99 and P99.9 of the entry requests' durations per entry operation, from stormglass_entry_duration_seconds summed over instances (within its buckets' 25%; the report's p99_ms and p999_ms are within 2%).",
                )
                    .unit("s")
                    .query(r#"histogram_quantile(0.99, sum by (service, operation, le) (rate(stormglass_entry_duration_seconds_bucket{$series,service=~"$service"}[$__rate_interval])))"#, "P99 {{service}} {{operation}}")
                    .query(r#"histogram_quantile(0.999, sum by (service, operation, le) (rate(stormglass_entry_duration_seconds_bucket{$series,service=~"$service"}[$__rate_interval])))"#, "P99.9 {{service}} {{operation}}"),
            ],
        },
        Dashboard {
            uid: "stormglass-topology",
            title: "stormglass / Budget topology",
            description: "Services and the calls between them, with the timeouts callers give and the budget they have left when they call: where the deadline budget is squeezed.",
            filter: Filter::None,
            panels: vec![
                node_graph(
                    "Budget topology",
                    "Nodes: services, showing the timeout (seconds) their callers give them and sized by it. Edges: calls between them, showing calls per second, as thick as the call rate, and coloured by the caller's remaining budget against the timeout it gives (the most squeezed operation): red below 1 (it gives more time than it has left), orange below 1.5, green above, no colour without a budget. Built for Grafana's Node Graph data API (nodes: id, title, mainstat, noderadius; edges: id, source, target, mainstat, thickness, color), merged and renamed from the queries by transformations. stormglass' own page (GET / on its API port) draws the same view.",
                )
                    .size(24, 14)
                    .table_query(r#"label_replace(label_replace((max by (cluster, job, service) (label_replace(stormglass:edge_timeout:mean_seconds_rate5m{$recorded}, "service", "$1", "callee", "(.*)")) or sum by (cluster, job, service) (rate(stormglass_layer_attempts_total{$series}[$__rate_interval])) * 0), "id", "$1", "service", "(.*)"), "title", "$1", "service", "(.*)")"#)
                    .table_query(r#"label_replace(label_replace(clamp_max(20 + 8 * ln(1 + (max by (cluster, job, service) (label_replace(stormglass:edge_timeout:mean_seconds_rate5m{$recorded}, "service", "$1", "callee", "(.*)")) or sum by (cluster, job, service) (rate(stormglass_layer_attempts_total{$series}[$__rate_interval])) * 0) * 20), 60), "id", "$1", "service", "(.*)"), "title", "$1", "service", "(.*)")"#)
                    .ref_id("E")
                    .table_query(r#"label_join(label_replace(label_replace(sum by (cluster, job, caller, callee) (rate(stormglass_logical_calls_total{$series}[$__rate_interval])), "source", "$1", "caller", "(.*)"), "target", "$1", "callee", "(.*)"), "id", " -> ", "caller", "callee")"#)
                    .ref_id("B")
                    .table_query(r#"label_join(label_replace(label_replace(min by (cluster, job, caller, callee) (histogram_quantile(0.5, sum by (cluster, job, caller, callee, operation, le) (rate(stormglass_remaining_budget_seconds_bucket{$series}[$__rate_interval]))) / on (cluster, job, caller, callee, operation) (stormglass:edge_timeout:mean_seconds_rate5m{$recorded} > 0)), "source", "$1", "caller", "(.*)"), "target", "$1", "callee", "(.*)"), "id", " -> ", "caller", "callee")"#)
                    .ref_id("C")
                    .table_query(r#"label_join(label_replace(label_replace(clamp_max(1 + ln(1 + sum by (cluster, job, caller, callee) (rate(stormglass_logical_calls_total{$series}[$__rate_interval]))), 8), "source", "$1", "caller", "(.*)"), "target", "$1", "callee", "(.*)"), "id", " -> ", "caller", "callee")"#)
                    .ref_id("D")
                    .with(json!({
                        "transformations": [
                            {
                                "id": "merge",
                                "options": {},
                                "filter": {
                                    "id": "byRefId",
                                    "options": "A|E"
                                }
                            },
                            {
                                "id": "merge",
                                "options": {},
                                "filter": {
                                    "id": "byRefId",
                                    "options": "B|C|D"
                                }
                            },
                            {
                                "id": "organize",
                                "options": {
                                    "excludeByName": {
                                        "Time": true,
                                        "cluster": true,
                                        "job": true,
                                        "service": true,
                                        "caller": true,
                                        "callee": true
                                    },
                                    "renameByName": {
                                        "Value #A": "mainstat",
                                        "Value #E": "noderadius",
                                        "Value #B": "mainstat",
                                        "Value #C": "color",
                                        "Value #D": "thickness"
                                    }
                                }
                            }
                        ],
                        "fieldConfig": {
                            "defaults": {
                                "decimals": 2
                            },
                            "overrides": [
                                {
                                    "matcher": {
                                        "id": "byName",
                                        "options": "color"
                                    },
                                    "properties": [
                                        {
                                            "id": "color",
                                            "value": {
                                                "mode": "thresholds"
                                            }
                                        },
                                        {
                                            "id": "thresholds",
                                            "value": {
                                                "mode": "absolute",
                                                "steps": [
                                                    {
                                                        "color": "red",
                                                        "value": null
                                                    },
                                                    {
                                                        "color": "orange",
                                                        "value": 1
                                                    },
                                                    {
                                                        "color": "green",
                                                        "value": 1.5
                                                    }
                                                ]
                                            }
                                        }
                                    ]
                                }
                            ]
                        }
                    })),
                table(
                    "Remaining budget against timeout, per edge",
                    "The caller's median remaining budget when its attempts start, divided by the mean timeout it gives (from stormglass_remaining_budget_seconds and the budget counters, all instances). Below 1 (red) the caller gives more time than it has left: the callee keeps working after the caller gave up. Below 1.5 (orange) the hop is squeezed.",
                )
                    .size(24, 10)
                    .unit("none")
                    .table_query("histogram_quantile(0.5, sum by (cluster, job, caller, callee, operation, le) (rate(stormglass_remaining_budget_seconds_bucket{$series}[$__rate_interval]))) / on (cluster, job, caller, callee, operation) (stormglass:edge_timeout:mean_seconds_rate5m{$recorded} > 0)")
                    .table_query("histogram_quantile(0.5, sum by (cluster, job, caller, callee, operation, le) (rate(stormglass_remaining_budget_seconds_bucket{$series}[$__rate_interval])))")
                    .with(json!({
                        "transformations": [
                            {
                                "id": "merge",
                                "options": {}
                            },
                            {
                                "id": "organize",
                                "options": {
                                    "excludeByName": {
                                        "Time": true,
                                        "cluster": true,
                                        "job": true
                                    },
                                    "renameByName": {
                                        "Value #A": "remaining / timeout",
                                        "Value #B": "remaining budget"
                                    }
                                }
                            }
                        ],
                        "fieldConfig": {
                            "defaults": {
                                "thresholds": {
                                    "steps": [
                                        {
                                            "color": "red",
                                            "value": null
                                        },
                                        {
                                            "color": "orange",
                                            "value": 1
                                        },
                                        {
                                            "color": "green",
                                            "value": 1.5
                                        }
                                    ]
                                },
                                "color": {
                                    "mode": "thresholds"
                                },
                                "decimals": 2,
                                "custom": {
                                    "cellOptions": {
                                        "type": "color-background"
                                    }
                                }
                            },
                            "overrides": [
                                {
                                    "matcher": {
                                        "id": "byName",
                                        "options": "remaining budget"
                                    },
                                    "properties": [
                                        {
                                            "id": "unit",
                                            "value": "s"
                                        },
                                        {
                                            "id": "custom.cellOptions",
                                            "value": {
                                                "type": "auto"
                                            }
                                        }
                                    ]
                                }
                            ]
                        }
                    })),
            ],
        },
    ]
}
