//! The alert conditions on hand-made reports, and the rules they render.

use super::*;
use crate::report::LayerFigures;

/// Values print with three significant digits, whole above 100; shares as percentages with four.
#[test]
fn values_format_with_three_significant_digits() {
    assert_eq!(format_value(27.0), "27");
    assert_eq!(format_value(2.3456), "2.35");
    assert_eq!(format_value(0.25), "0.25");
    assert_eq!(format_value(0.1), "0.1");
    assert_eq!(format_value(1234.0), "1234");
    assert_eq!(format_percent(0.003), "0.3%");
    assert_eq!(format_percent(1.0 / 3.0), "33.33%");
}

/// Every placeholder of every text is filled for the alert's own labels.
#[test]
fn texts_render_completely() {
    let t = AlertThresholds::default();
    let all: BTreeMap<String, String> = ["service", "operation", "caller", "callee"]
        .iter()
        .map(|k| ((*k).to_owned(), format!("<{k}>")))
        .collect();
    for d in DEFINITIONS {
        for text in [d.summary, d.description] {
            let rendered = d.render(text, &all, 3.0, &t);
            assert!(!rendered.contains('{'), "{}: {rendered}", d.name);
            let template = d.template(text, &t);
            assert!(
                !template.replace("{{", "").replace("}}", "").contains('{'),
                "{}: {template}",
                d.name
            );
        }
    }
}

fn layer(service: &str, requests: u64, p99_ms: f64, p999_ms: f64) -> LayerFigures {
    LayerFigures {
        service: service.to_owned(),
        requests,
        baseline_attempts: requests,
        amplification: Some(1.0),
        p99_ms: Some(p99_ms),
        p999_ms: Some(p999_ms),
        tail_ratio: Some(p999_ms / p99_ms),
        timeout_rate: None,
        error_rate: None,
        operations: Vec::new(),
        operations_total: 0,
    }
}

fn names_and_services(report: &Report, t: &AlertThresholds) -> Vec<(String, String)> {
    evaluate(report, t)
        .into_iter()
        .map(|a| (a.name, a.labels["service"].clone()))
        .collect()
}

/// A ratio alert needs `min_events_per_minute` of its denominator: three slow requests
/// a minute do not make a tail, three thousand do.
#[test]
fn ratio_alerts_need_minimum_traffic() {
    let mut report = Report::default();
    report.window.seconds = Some(60.0);
    report.layers = vec![
        layer("quiet", 3, 100.0, 300.0),
        layer("busy", 3000, 100.0, 300.0),
    ];
    let t = AlertThresholds::default();
    assert_eq!(
        names_and_services(&report, &t),
        [("StormglassTailRatioHigh".to_owned(), "busy".to_owned())]
    );
    let t = AlertThresholds {
        min_events_per_minute: 1.0,
        ..t
    };
    assert_eq!(names_and_services(&report, &t).len(), 2);
}

/// Drift compares each layer's P99.9 with the baseline report's, both ways, beyond
/// `latency_drift`; layers without a baseline are not judged.
#[test]
fn latency_drift_against_the_baseline() {
    let mut report = Report::default();
    report.window.seconds = Some(60.0);
    report.layers = vec![
        layer("slower", 1000, 100.0, 150.0),
        layer("faster", 1000, 100.0, 150.0),
        layer("same", 1000, 100.0, 150.0),
        layer("new", 1000, 100.0, 150.0),
    ];
    let t = AlertThresholds {
        baseline_p999_ms: [("slower", 100.0), ("faster", 200.0), ("same", 130.0)]
            .map(|(s, ms)| (s.to_owned(), ms))
            .into(),
        ..AlertThresholds::default()
    };
    let drift: Vec<(String, f64)> = evaluate(&report, &t)
        .into_iter()
        .filter(|a| a.name == "StormglassLatencyDrift")
        .map(|a| (a.labels["service"].clone(), a.value))
        .collect();
    assert_eq!(
        drift,
        [("slower".to_owned(), 1.5), ("faster".to_owned(), 0.75)]
    );
}

/// The baseline is read from a JSON report's layers.
#[test]
fn baseline_reads_a_report() {
    let scratch = tempfile::Builder::new()
        .prefix("stormglass-baseline-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let path = dir.join("baseline.json");
    std::fs::write(
        &path,
        r#"{"layers": [{"service": "db", "p999_ms": 120.5}, {"service": "idle", "p999_ms": null}]}"#,
    )
    .unwrap();
    assert_eq!(
        read_baseline(&path).unwrap(),
        [("db".to_owned(), 120.5)].into()
    );
    std::fs::write(&path, "{}").unwrap();
    assert!(
        read_baseline(&path)
            .unwrap_err()
            .contains("not a stormglass JSON report")
    );
}

/// Names are unique and follow docs/alerts.md's table.
#[test]
fn twenty_four_unique_alerts() {
    let mut names: Vec<_> = DEFINITIONS.iter().map(|d| d.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 24);
}
