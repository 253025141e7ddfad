//! The histogram families (`stormglass_layer_duration_seconds` and the others of
//! [`HISTOGRAMS`]): each interval's buckets added per series, new series deferred and
//! folded as the counters are, and exposed cumulatively.

use std::collections::BTreeMap;

use prometheus::proto::{self, MetricFamily, MetricType};

use super::catalogue::{HISTOGRAMS, Histogram};
use super::{FigureMetrics, Key, State, label_pairs, new_family};

#[derive(Clone, Default)]
pub(super) struct Buckets {
    /// Non-cumulative counts per `le` index; the last is +Inf. Sums of sampling weights,
    /// so fractional; rounded when exposed (the cumulative counts, not each bucket).
    pub(super) counts: Vec<f64>,
    pub(super) sum: f64,
}

impl Buckets {
    /// `width` empty buckets (the bounds and +Inf).
    fn zero(width: usize) -> Buckets {
        Buckets {
            counts: vec![0.0; width],
            sum: 0.0,
        }
    }
}

impl FigureMetrics {
    /// Keys a histogram family may hold: each exposes a series per bucket, `_sum` and
    /// `_count`, and together they stay within the limit (at least one key).
    pub(super) fn histogram_limit(&self) -> usize {
        (self.limit / (self.bounds.len() + 3)).max(1)
    }

    /// Add one interval's rows (series key, `le` index, count, sum) to a histogram family.
    pub(super) fn add_histograms(
        &self,
        state: &mut State,
        family: Histogram,
        rows: impl Iterator<Item = (Key, i64, f64, f64)>,
    ) {
        let width = self.bounds.len() + 1;
        let mut interval: BTreeMap<Key, Buckets> = BTreeMap::new();
        for (key, le, n, seconds) in rows {
            let b = interval.entry(key).or_insert_with(|| Buckets::zero(width));
            b.counts[usize::try_from(le).unwrap_or(0).min(width - 1)] += n;
            b.sum += seconds;
        }
        for (key, b) in interval {
            self.add_histogram(state, family, key, b);
        }
    }

    /// Add one series' buckets; a new series is exposed at 0 and its buckets wait for the
    /// next interval, as a counter's first increment does.
    pub(super) fn add_histogram(&self, state: &mut State, family: Histogram, key: Key, b: Buckets) {
        let (spec, family) = (&HISTOGRAMS[family as usize], family as usize);
        let series = &mut state.histograms[family];
        let key = if series.contains_key(&key) {
            key
        } else {
            self.folded(spec, series, key, self.histogram_limit())
        };
        if let Some(waiting) = state.deferred_histograms[family].get_mut(&key) {
            merge(waiting, &b);
            return;
        }
        match series.get_mut(&key) {
            Some(existing) => merge(existing, &b),
            None => {
                series.insert(key.clone(), Buckets::zero(b.counts.len()));
                state.deferred_histograms[family].insert(key, b);
            }
        }
    }

    /// The histogram families as `/metrics` exposes them: cumulative bucket counts,
    /// rounded (the counts are sums of sampling weights).
    pub(super) fn histogram_families(&self, state: &State) -> Vec<MetricFamily> {
        let mut out = Vec::with_capacity(HISTOGRAMS.len());
        for (spec, family) in HISTOGRAMS.iter().zip(&state.histograms) {
            let mut histograms = new_family(spec, MetricType::HISTOGRAM);
            for (key, b) in family {
                let mut cumulative = 0.0_f64;
                let mut buckets = Vec::with_capacity(self.bounds.len());
                for (bound, n) in self.bounds.iter().zip(&b.counts) {
                    cumulative += n;
                    let mut bucket = proto::Bucket::default();
                    bucket.set_upper_bound(*bound);
                    bucket.set_cumulative_count(cumulative.round() as u64);
                    buckets.push(bucket);
                }
                let mut h = proto::Histogram::default();
                h.set_bucket(buckets);
                h.set_sample_count(b.counts.iter().sum::<f64>().round() as u64);
                h.set_sample_sum(b.sum);
                let mut m = proto::Metric::default();
                m.set_histogram(h);
                m.set_label(label_pairs(spec.labels, key));
                histograms.mut_metric().push(m);
            }
            out.push(histograms);
        }
        out
    }
}

pub(super) fn merge(into: &mut Buckets, from: &Buckets) {
    if into.counts.len() < from.counts.len() {
        into.counts.resize(from.counts.len(), 0.0);
    }
    for (a, b) in into.counts.iter_mut().zip(&from.counts) {
        *a += b;
    }
    into.sum += from.sum;
}
