//! The gauge families: replaced from each window's report, at most the limit's series per
//! family (the others counted in `stormglass_export_dropped_series`).

use std::collections::BTreeMap;

use prometheus::proto::{self, MetricFamily, MetricType};
use stormglass_analytics::Report;

use super::catalogue::{GAUGES, Gauge};
use super::{Family, FigureMetrics, Key, State, family_of};

impl FigureMetrics {
    /// Replace the gauges with the figures of a window's report (unless they already hold
    /// them: an idle window's reused report).
    pub fn set_window(&self, report: &Report) {
        if report.figures.is_some() && self.lock().gauges_of == report.figures {
            return;
        }
        let mut gauges: Vec<Bounded> = GAUGES.iter().map(|_| Bounded::new(self.limit)).collect();
        let mut set = |family: Gauge, labels: &[&str], v: Option<f64>| {
            gauges[family as usize].set(labels, v);
        };
        let seconds = |ms: Option<f64>| ms.map(|ms| ms / 1e3);
        for e in &report.edges {
            let edge = [e.caller.as_str(), &e.callee, &e.operation];
            set(Gauge::EffectiveSuccess, &edge, e.effective_success_rate);
            set(Gauge::RawSuccess, &edge, e.raw_success_rate);
            set(Gauge::RetryContribution, &edge, e.retry_contribution);
            set(Gauge::RetrySuccess, &edge, e.retry_success_rate);
            set(Gauge::RetryRatio, &edge, e.retry_ratio);
            set(Gauge::SynchronisedRetries, &edge, e.synchronised_retries);
            set(Gauge::Timeout, &edge, seconds(e.timeout_ms));
            set(
                Gauge::RecommendedTimeout,
                &edge,
                seconds(e.recommended_timeout_ms),
            );
            set(Gauge::CalleeP999, &edge, seconds(e.callee_p999_ms));
        }
        // One series per pair, each operation's edge giving it: the last that has it.
        let mut pairs = std::collections::HashSet::new();
        for e in report.edges.iter().rev() {
            let skew = seconds(e.clock_skew_ms).filter(|v| v.is_finite());
            if skew.is_some() && pairs.insert((e.caller.as_str(), e.callee.as_str())) {
                set(Gauge::ClockSkew, &[&e.caller, &e.callee], skew);
            }
        }
        for l in &report.layers {
            let service = [l.service.as_str()];
            set(Gauge::Amplification, &service, l.amplification);
            set(Gauge::LayerP99, &service, seconds(l.p99_ms));
            set(Gauge::LayerP999, &service, seconds(l.p999_ms));
            set(Gauge::TailRatio, &service, l.tail_ratio);
        }
        for c in &report.coverage.edges {
            for (field, share) in c.shares.named() {
                let labels = [c.caller.as_str(), &c.callee, &c.operation, field];
                set(Gauge::Coverage, &labels, share);
            }
        }
        for e in &report.entries {
            let labels = [e.service.as_str(), &e.operation];
            set(Gauge::StormPotential, &labels, Some(e.storm_potential));
        }
        let gauges = GAUGES
            .iter()
            .zip(gauges)
            .map(|(spec, family)| {
                self.metrics
                    .dropped_gauges
                    .with_label_values(&[spec.name])
                    .set(i64::try_from(family.dropped).unwrap_or(i64::MAX));
                Family {
                    series: family.series,
                }
            })
            .collect();
        let mut state = self.lock();
        state.gauges = gauges;
        state.gauges_of = report.figures;
    }
}

/// The gauge families as `/metrics` exposes them.
pub(super) fn gauge_families(state: &State) -> Vec<MetricFamily> {
    let mut out = Vec::with_capacity(GAUGES.len());
    for (spec, family) in GAUGES.iter().zip(&state.gauges) {
        let series = family.series.iter().map(|(k, v)| (k, *v));
        out.push(family_of(spec, MetricType::GAUGE, series, |v| {
            let mut g = proto::Gauge::default();
            g.set_value(v);
            let mut m = proto::Metric::default();
            m.set_gauge(g);
            m
        }));
    }
    out
}

/// A gauge family filled from a report: the first `limit` series in label order (those a
/// sorted family cut at the limit keeps), the others counted; no key is built for a series
/// past the limit, so a wide window costs its edges, not a key per edge and gauge.
pub(super) struct Bounded {
    pub(super) series: BTreeMap<Key, f64>,
    limit: usize,
    /// Series left out (each distinct set of labels once: the callers set each once).
    pub(super) dropped: usize,
}

impl Bounded {
    pub(super) fn new(limit: usize) -> Bounded {
        Bounded {
            series: BTreeMap::new(),
            limit,
            dropped: 0,
        }
    }

    /// Set the series `labels` to `v`, unless `v` is null or not finite (no series).
    pub(super) fn set(&mut self, labels: &[&str], v: Option<f64>) {
        let Some(v) = v.filter(|v| v.is_finite()) else {
            return;
        };
        if self.series.len() >= self.limit {
            let past = self.series.last_key_value().is_some_and(|(last, _)| {
                labels.iter().copied().cmp(last.iter().map(String::as_str))
                    == std::cmp::Ordering::Greater
            });
            if past {
                self.dropped += 1;
                return;
            }
        }
        let key: Key = labels.iter().map(|l| (*l).to_owned()).collect();
        if self.series.insert(key, v).is_none() && self.series.len() > self.limit {
            self.series.pop_last();
            self.dropped += 1;
        }
    }
}
