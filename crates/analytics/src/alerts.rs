//! The alert conditions of METRICS.md ("Alerts"), evaluated on a report.
//!
//! This is the condition half of each alert: which series breach their threshold in this
//! window. `for:` durations apply only to an evaluator that watches successive windows
//! (the offline report lists every condition that holds).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::report::Report;

/// One alert whose condition holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub name: String,
    pub severity: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// `alerts.*` thresholds, defaults from METRICS.md.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertThresholds {
    pub amplification: f64,
    pub storm_potential: f64,
    pub retry_contribution: f64,
    pub retry_ratio: f64,
    pub retry_success_rate: f64,
    pub retries_per_minute: f64,
    pub tail_ratio: f64,
    pub orphan_work_seconds_per_minute: f64,
}

impl Default for AlertThresholds {
    fn default() -> Self {
        AlertThresholds {
            amplification: 2.0,
            storm_potential: 8.0,
            retry_contribution: 0.20,
            retry_ratio: 0.10,
            retry_success_rate: 0.70,
            retries_per_minute: 50.0,
            tail_ratio: 2.0,
            orphan_work_seconds_per_minute: 1.0,
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Every alert whose condition holds on `report`.
pub fn evaluate(report: &Report, t: &AlertThresholds) -> Vec<Alert> {
    let mut alerts = Vec::new();
    let mut push = |name: &str, severity: &str, labels, value| {
        alerts.push(Alert {
            name: name.into(),
            severity: severity.into(),
            labels,
            value,
        })
    };
    for l in &report.layers {
        let service = [("service", l.service.as_str())];
        if let Some(a) = l.amplification.filter(|a| *a > t.amplification) {
            push(
                "StormglassRetryAmplificationHigh",
                "critical",
                labels(&service),
                a,
            );
        }
        if let Some(r) = l.tail_ratio.filter(|r| *r > t.tail_ratio) {
            push("StormglassTailRatioHigh", "warning", labels(&service), r);
        }
    }
    for e in &report.entries {
        if e.storm_potential >= t.storm_potential {
            let l = labels(&[("service", &e.service), ("operation", &e.operation)]);
            push(
                "StormglassRetryStormPotential",
                "warning",
                l,
                e.storm_potential,
            );
        }
    }
    let minutes = report.window.seconds.filter(|s| *s > 0.0).map(|s| s / 60.0);
    let mut retries_by_pair: HashMap<(&str, &str), u64> = HashMap::new();
    for e in &report.edges {
        let edge = labels(&[
            ("caller", &e.caller),
            ("callee", &e.callee),
            ("operation", &e.operation),
        ]);
        if let Some(v) = e.retry_contribution.filter(|v| *v > t.retry_contribution) {
            push(
                "StormglassRetryContributionHigh",
                "warning",
                edge.clone(),
                v,
            );
        }
        if let Some(v) = e.retry_ratio.filter(|v| *v > t.retry_ratio) {
            push("StormglassRetryBudgetExceeded", "warning", edge.clone(), v);
        }
        if let Some(v) = e.retry_success_rate.filter(|v| *v < t.retry_success_rate) {
            push("StormglassRetriesFailing", "warning", edge.clone(), v);
        }
        if e.timeout_below_tail == Some(true) {
            push(
                "StormglassTimeoutBelowTail",
                "warning",
                edge.clone(),
                e.timeout_ms.unwrap_or(0.0),
            );
        }
        if e.unsafe_retries > 0 {
            push(
                "StormglassUnsafeRetries",
                "critical",
                edge.clone(),
                e.unsafe_retries as f64,
            );
        }
        if let Some(per_minute) = minutes
            .map(|m| e.orphan_work_seconds / m)
            .filter(|v| *v > t.orphan_work_seconds_per_minute)
        {
            push("StormglassOrphanWork", "warning", edge, per_minute);
        }
        *retries_by_pair.entry((&e.caller, &e.callee)).or_default() += e.retry_attempts;
    }
    if let Some(minutes) = minutes {
        let mut pairs: Vec<_> = retries_by_pair.into_iter().collect();
        pairs.sort();
        for ((caller, callee), retries) in pairs {
            let per_minute = retries as f64 / minutes;
            if per_minute > t.retries_per_minute {
                let l = labels(&[("caller", caller), ("callee", callee)]);
                push("StormglassRetryConcentration", "critical", l, per_minute);
            }
        }
    }
    let mut budget: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for f in &report.findings {
        if f.kind == "deadline_inversion" || f.kind == "overcommit" {
            *budget.entry((&f.caller, &f.callee)).or_default() += f.count;
        }
    }
    for ((caller, callee), count) in budget {
        let l = labels(&[("caller", caller), ("callee", callee)]);
        push("StormglassDeadlineInversion", "warning", l, count as f64);
    }
    alerts
}
