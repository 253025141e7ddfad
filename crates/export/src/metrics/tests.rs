use super::gauges::Bounded;
use super::*;

fn key(values: &[&str]) -> Key {
    values.iter().map(|v| (*v).to_owned()).collect()
}

/// Each family's variant sits at its own place in `ALL` (what indexes the state), and
/// no name is used twice.
#[test]
fn catalogue_is_indexed_by_its_variants() {
    assert!(
        Counter::ALL
            .iter()
            .enumerate()
            .all(|(i, c)| *c as usize == i)
    );
    assert!(
        Histogram::ALL
            .iter()
            .enumerate()
            .all(|(i, h)| *h as usize == i)
    );
    assert!(Gauge::ALL.iter().enumerate().all(|(i, g)| *g as usize == i));
    let mut names: Vec<&str> = COUNTERS
        .iter()
        .chain(HISTOGRAMS.iter())
        .chain(GAUGES.iter())
        .map(|s| s.name)
        .collect();
    let all = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all);
}

/// Over the limit, a new edge folds into operation="__overflow__" when that series
/// exists, otherwise into the all-identity overflow series; existing series still grow.
#[test]
fn folding_keeps_series_bounded() {
    let spec = &Counter::OrphanWork.spec();
    let mut series = BTreeMap::new();
    series.insert(key(&["a", "b", "op1"]), 1.0);
    let Folded::Yes(first) = fold(spec, &series, key(&["a", "b", "op2"]), 1) else {
        panic!("over the limit must fold");
    };
    assert_eq!(first, key(&[OVERFLOW, OVERFLOW, OVERFLOW]));
    series.insert(key(&["a", "b", OVERFLOW]), 0.0);
    let Folded::Yes(second) = fold(spec, &series, key(&["a", "b", "op3"]), 1) else {
        panic!("over the limit must fold");
    };
    assert_eq!(second, key(&["a", "b", OVERFLOW]));
    assert!(matches!(
        fold(spec, &series, key(&["x", "y", "z"]), 10),
        Folded::No(_)
    ));
}

/// Closed-set labels (attempt kind, outcome) survive folding; cause, free text, folds.
#[test]
fn folding_keeps_closed_labels() {
    let spec = &Counter::Attempts.spec();
    let series: BTreeMap<Key, f64> = [(key(&["a", "b", "op", "first", "ok", "none"]), 1.0)].into();
    let Folded::Yes(folded) = fold(
        spec,
        &series,
        key(&["c", "d", "op", "retry", "deadline", "deadline"]),
        1,
    ) else {
        panic!("over the limit must fold");
    };
    assert_eq!(
        folded,
        key(&[OVERFLOW, OVERFLOW, OVERFLOW, "retry", "deadline", OVERFLOW])
    );
}

/// A histogram's label sets share the series limit with their buckets, `_sum` and
/// `_count`: at 120 series, two label sets (54 series each), the third folded into the
/// overflow set and counted.
#[test]
fn histograms_share_the_series_limit() {
    let registry = Registry::new();
    let metrics = FigureMetrics::register(&registry, 120).unwrap();
    assert_eq!(metrics.histogram_limit(), 2);
    let mut state = metrics.lock();
    let one = |n: f64| Buckets {
        counts: vec![n; metrics.bounds.len() + 1],
        sum: n,
    };
    for service in ["a", "b", "c"] {
        metrics.add_histogram(
            &mut state,
            Histogram::LayerDuration,
            key(&[service]),
            one(1.0),
        );
    }
    let series: Vec<&Key> = state.histograms[Histogram::LayerDuration as usize]
        .keys()
        .collect();
    assert_eq!(series, [&key(&[OVERFLOW]), &key(&["a"]), &key(&["b"])]);
    drop(state);
    let folded = metrics
        .metrics
        .overflow
        .with_label_values(&["stormglass_layer_duration_seconds"])
        .get();
    assert_eq!(folded, 1);
}

/// The edge-labelled counters share one row per edge: a new edge's series appear at 0 in
/// every one of them and grow one interval later; past the limit an edge folds into the
/// overflow row, and each family counts its own folded updates.
#[test]
fn edge_counters_share_rows() {
    use stormglass_analytics::counts::{EdgeCounts, IntervalCounts};
    let registry = Registry::new();
    let metrics = FigureMetrics::register(&registry, 2).unwrap();
    let interval = |edges: &[&str]| IntervalCounts {
        edges: edges
            .iter()
            .map(|op| EdgeCounts {
                caller: "a".into(),
                callee: "b".into(),
                operation: (*op).into(),
                values: vec![1.0; EDGE_COUNTS.len()],
            })
            .collect(),
        ..IntervalCounts::default()
    };
    let family = edge_count_family(0);
    let name = COUNTERS[family].name;
    let series = |metrics: &FigureMetrics| -> Vec<(Key, f64)> {
        let state = metrics.lock();
        let column = metrics.edge_columns[family].unwrap();
        state
            .edges
            .series(column)
            .map(|(k, v)| (k.clone(), v))
            .collect()
    };
    metrics.add_interval(&interval(&["op1", "op2", "op3"]));
    let zero = |op: &str| (key(&["a", "b", op]), 0.0);
    let overflow = key(&[OVERFLOW, OVERFLOW, OVERFLOW]);
    assert_eq!(
        series(&metrics),
        [(overflow.clone(), 0.0), zero("op1"), zero("op2")]
    );
    metrics.add_interval(&interval(&["op1", "op3"]));
    let scale = EDGE_COUNTS[0].unit.to_base();
    assert_eq!(
        series(&metrics),
        [
            (overflow, 2.0 * scale),
            (key(&["a", "b", "op1"]), 2.0 * scale),
            (key(&["a", "b", "op2"]), scale),
        ]
    );
    let folded = |name: &str| metrics.metrics.overflow.with_label_values(&[name]).get();
    assert_eq!(folded(name), 2);
    assert_eq!(folded(Counter::OrphanWork.spec().name), 2);
    assert_eq!(folded(Counter::LogicalCalls.spec().name), 0);
}

/// A gauge family past the limit keeps the first series in label order, whatever order
/// they are set in, and counts the others; setting a kept series again replaces it.
#[test]
fn gauges_keep_the_first_series_in_label_order() {
    let mut family = Bounded::new(2);
    for (op, v) in [("c", 1.0), ("a", 2.0), ("d", 3.0), ("b", 4.0), ("a", 5.0)] {
        family.set(&["x", op], Some(v));
    }
    family.set(&["x", "e"], None);
    family.set(&["x", "f"], Some(f64::NAN));
    let kept: Vec<(Key, f64)> = family.series.into_iter().collect();
    assert_eq!(kept, [(key(&["x", "a"]), 5.0), (key(&["x", "b"]), 4.0)]);
    assert_eq!(family.dropped, 2);
}

/// An edge's zero series in its other families (orphan pairs by outcome, deadline
/// violations by kind) are made when it is first seen with room: an interval that sees
/// the same edges again folds nothing more.
#[test]
fn edges_seen_again_make_no_zero_series_again() {
    use stormglass_analytics::counts::{EdgeCounts, IntervalCounts};
    let registry = Registry::new();
    let metrics = FigureMetrics::register(&registry, 2).unwrap();
    let interval = IntervalCounts {
        edges: ["op1", "op2", "op3"]
            .map(|op| EdgeCounts {
                caller: "a".into(),
                callee: "b".into(),
                operation: op.into(),
                values: vec![0.0; EDGE_COUNTS.len()],
            })
            .into(),
        ..IntervalCounts::default()
    };
    let folded = || {
        [Counter::OrphanPairs, Counter::DeadlineViolations].map(|c| {
            metrics
                .metrics
                .overflow
                .with_label_values(&[c.spec().name])
                .get()
        })
    };
    metrics.add_interval(&interval);
    let first = folded();
    assert!(first.iter().all(|&n| n > 0), "{first:?}");
    metrics.add_interval(&interval);
    metrics.add_interval(&interval);
    assert_eq!(folded(), first);
    let state = metrics.lock();
    let pairs = &state.counters[Counter::OrphanPairs as usize].series;
    assert!(pairs.contains_key(&key(&["a", "b", "op1", "ok"])));
}
