//! What-if: each layer's expected amplification if every request to some services failed
//! with a given probability, from the retry policies a window's report observed.
//!
//! The model, exactly as docs/figures.md states it:
//! * a failed service's requests fail with probability `q = P`; another service's fail when
//!   one of its calls to a failing service fails on every attempt:
//!   `q(s) = 1 - prod over its edges e (1 - q(callee)^m_e)`, edges to services that do not
//!   fail adding nothing;
//! * an edge whose callee fails with probability `q` sends `(1 - q^m) / (1 - q)` attempts per
//!   call on average (`m` when `q = 1`), `m` being the edge's attempts per call at most
//!   (its largest attempt number + 1);
//! * a layer's amplification is the product of the attempts per call along the path from an
//!   entry; where several paths reach it, their mean weighted by the calls each brings with
//!   no retry anywhere (an edge's logical calls over its caller's observed amplification;
//!   entry requests count with amplification 1);
//! * `requests_per_second` = the layer's no-retry attempts in the window per second x its
//!   amplification.
//!
//! A cycle in the call graph is cut where it closes, as the storm potential's walk does.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::report::Report;

/// One layer's expected load if the failures happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerWhatIf {
    pub service: String,
    pub amplification: f64,
    /// Null when the window has no length (no spans).
    pub requests_per_second: Option<f64>,
}

/// One edge of the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EdgeWhatIf {
    pub caller: String,
    pub callee: String,
    pub operation: String,
    /// The most attempts per call observed (largest attempt number + 1).
    pub max_attempts: u32,
    /// The probability that a request to the callee fails.
    pub callee_failure_probability: f64,
    /// Expected attempts per call.
    pub attempts_per_call: f64,
}

/// The what-if of a report: every layer and edge, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WhatIf {
    pub layers: Vec<LayerWhatIf>,
    pub edges: Vec<EdgeWhatIf>,
}

/// Parse `SERVICE=P` (or `SERVICE:P`): a service and a probability in [0, 1].
pub fn parse_failure(text: &str) -> Result<(String, f64), String> {
    let (service, p) = text
        .rsplit_once(['=', ':'])
        .ok_or_else(|| format!("{text:?}: expected SERVICE=P, e.g. db=1 or db=0.5"))?;
    let p: f64 = p
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: {p:?} is not a probability"))?;
    if !(0.0..=1.0).contains(&p) || service.trim().is_empty() {
        return Err(format!(
            "{text:?}: expected a service and a probability from 0 to 1"
        ));
    }
    Ok((service.trim().to_owned(), p))
}

/// The first failed service the report has no layer for (a what-if about it says nothing).
pub fn unknown_service<'f>(report: &Report, failures: &'f [(String, f64)]) -> Option<&'f str> {
    failures
        .iter()
        .map(|(service, _)| service.as_str())
        .find(|s| !report.layers.iter().any(|l| l.service == *s))
}

/// Expected attempts per call of an edge with at most `m` attempts whose callee fails with
/// probability `q`.
pub fn attempts_per_call(q: f64, m: u32) -> f64 {
    if q >= 1.0 {
        f64::from(m)
    } else {
        (1.0 - q.powi(m as i32)) / (1.0 - q)
    }
}

/// The what-if of `report` if requests to each named service failed with its probability.
pub fn what_if(report: &Report, failures: &[(String, f64)]) -> WhatIf {
    let failing: HashMap<&str, f64> = failures.iter().map(|(s, p)| (s.as_str(), *p)).collect();
    let m = |e: &crate::report::EdgeFigures| {
        u32::try_from(e.max_attempt.unwrap_or(0).max(0) + 1).unwrap_or(u32::MAX)
    };
    let mut q: HashMap<&str, f64> = HashMap::new();
    for layer in &report.layers {
        failure_probability(report, &failing, &layer.service, &mut q, &mut Vec::new());
    }
    let edges: Vec<EdgeWhatIf> = report
        .edges
        .iter()
        .map(|e| {
            let q = failure_probability(report, &failing, &e.callee, &mut q, &mut Vec::new());
            EdgeWhatIf {
                caller: e.caller.clone(),
                callee: e.callee.clone(),
                operation: e.operation.clone(),
                max_attempts: m(e),
                callee_failure_probability: q,
                attempts_per_call: attempts_per_call(q, m(e)),
            }
        })
        .collect();

    let observed: HashMap<&str, f64> = report
        .layers
        .iter()
        .map(|l| (l.service.as_str(), l.amplification.unwrap_or(1.0).max(1.0)))
        .collect();
    let mut entries: BTreeMap<&str, f64> = BTreeMap::new();
    for e in &report.entries {
        *entries.entry(e.service.as_str()).or_default() += e.requests as f64;
    }
    // Incoming (caller, no-retry calls, attempts per call) per callee.
    let mut incoming: HashMap<&str, Vec<(&str, f64, f64)>> = HashMap::new();
    for (figures, edge) in report.edges.iter().zip(&edges) {
        let calls =
            figures.logical_calls as f64 / observed.get(figures.caller.as_str()).unwrap_or(&1.0);
        incoming.entry(figures.callee.as_str()).or_default().push((
            figures.caller.as_str(),
            calls,
            edge.attempts_per_call,
        ));
    }
    let mut amplification: HashMap<&str, f64> = HashMap::new();
    let seconds = report.window.seconds.filter(|s| *s > 0.0);
    let layers = report
        .layers
        .iter()
        .map(|l| {
            let a = amplify(
                &l.service,
                &entries,
                &incoming,
                &mut amplification,
                &mut Vec::new(),
            );
            LayerWhatIf {
                service: l.service.clone(),
                amplification: a,
                requests_per_second: seconds.map(|s| l.baseline_attempts as f64 / s * a),
            }
        })
        .collect();
    WhatIf { layers, edges }
}

/// `q(service)`, memoised; a service met again on the path (a cycle) adds nothing.
fn failure_probability<'r>(
    report: &'r Report,
    failing: &HashMap<&str, f64>,
    service: &'r str,
    memo: &mut HashMap<&'r str, f64>,
    path: &mut Vec<&'r str>,
) -> f64 {
    if let Some(p) = failing.get(service) {
        return *p;
    }
    if let Some(q) = memo.get(service) {
        return *q;
    }
    if path.contains(&service) {
        return 0.0;
    }
    path.push(service);
    let mut succeeds = 1.0;
    for e in report.edges.iter().filter(|e| e.caller == service) {
        let q = failure_probability(report, failing, &e.callee, memo, path);
        let m = e.max_attempt.unwrap_or(0).max(0) + 1;
        succeeds *= 1.0 - q.powi(i32::try_from(m).unwrap_or(i32::MAX));
    }
    path.pop();
    let q = 1.0 - succeeds;
    memo.insert(service, q);
    q
}

/// A layer's amplification, memoised: its entry requests at 1 and each incoming edge's
/// no-retry calls at the caller's amplification x the edge's attempts per call, weighted by
/// those calls. A caller met again on the path (a cycle) counts at 1.
fn amplify<'r>(
    service: &'r str,
    entries: &BTreeMap<&'r str, f64>,
    incoming: &HashMap<&'r str, Vec<(&'r str, f64, f64)>>,
    memo: &mut HashMap<&'r str, f64>,
    path: &mut Vec<&'r str>,
) -> f64 {
    if let Some(a) = memo.get(service) {
        return *a;
    }
    if path.contains(&service) {
        return 1.0;
    }
    path.push(service);
    let own = entries.get(service).copied().unwrap_or(0.0);
    let (mut weighted, mut weights) = (own, own);
    for &(caller, calls, per_call) in incoming.get(service).into_iter().flatten() {
        let upstream = amplify(caller, entries, incoming, memo, path);
        weighted += calls * upstream * per_call;
        weights += calls;
    }
    path.pop();
    let a = if weights > 0.0 {
        weighted / weights
    } else {
        1.0
    };
    memo.insert(service, a);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attempts per call of an edge: m when the callee always fails, 1 when it never
    /// does, the geometric sum between (3 attempts at q = 0.5: 1 + 0.5 + 0.25).
    #[test]
    fn attempts_per_call_is_the_geometric_sum() {
        assert_eq!(attempts_per_call(1.0, 3), 3.0);
        assert_eq!(attempts_per_call(0.0, 3), 1.0);
        assert_eq!(attempts_per_call(0.5, 3), 1.75);
    }

    /// `SERVICE=P` and `SERVICE:P` parse; anything else is an error saying what is expected.
    #[test]
    fn failures_parse() {
        assert_eq!(parse_failure("db=1"), Ok(("db".into(), 1.0)));
        assert_eq!(parse_failure("db:0.5"), Ok(("db".into(), 0.5)));
        assert!(parse_failure("db").unwrap_err().contains("SERVICE=P"));
        assert!(parse_failure("db=2").is_err());
        assert!(parse_failure("db=x").is_err());
        assert!(parse_failure("=0.5").is_err());
    }
}
