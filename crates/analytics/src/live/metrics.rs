//! The live analysis's self-metrics.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

/// Analysis self-metrics.
#[derive(Clone)]
pub struct AnalysisMetrics {
    pub(super) spans: IntCounter,
    pub(super) pending: IntGauge,
    pub(super) duration: Histogram,
    pub(super) chunk_duration: Histogram,
    pub(super) failures: IntCounter,
    pub(super) builds: IntCounter,
    pub(super) released: IntCounter,
}

impl AnalysisMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let spans = IntCounter::new(
            "stormglass_analysis_spans_total",
            "Spans analysed (released by assembly and aggregated into an interval).",
        )?;
        let pending = IntGauge::new(
            "stormglass_analysis_pending_spans",
            "Released spans waiting for analysis.",
        )?;
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "stormglass_analysis_duration_seconds",
                "Time to finish one interval (its last chunks) and rebuild the window's report.",
            )
            .buckets(prometheus::exponential_buckets(0.005, 2.0, 14)?),
        )?;
        let chunk_duration = Histogram::with_opts(
            HistogramOpts::new(
                "stormglass_analysis_chunk_duration_seconds",
                "Time to analyse one chunk of released traces into partial aggregates.",
            )
            .buckets(prometheus::exponential_buckets(0.005, 2.0, 14)?),
        )?;
        let failures = IntCounter::new(
            "stormglass_analysis_failures_total",
            "Chunks or reports whose analysis failed (their spans are counted as analysed but not in the figures).",
        )?;
        let builds = IntCounter::new(
            "stormglass_analysis_report_builds_total",
            "Window reports built by merging the window's partials; an interval that changes no data in the window reuses the last one.",
        )?;
        let released = IntCounter::new(
            "stormglass_analysis_reports_released_total",
            "Reports let go before the next was built, so the build stayed within limits.memory; /api/v1/report answered 503 until it was built.",
        )?;
        registry.register(Box::new(spans.clone()))?;
        registry.register(Box::new(released.clone()))?;
        registry.register(Box::new(builds.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(chunk_duration.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        Ok(AnalysisMetrics {
            spans,
            pending,
            duration,
            chunk_duration,
            failures,
            builds,
            released,
        })
    }

    pub fn unregistered() -> Self {
        match Self::register(&Registry::new()) {
            Ok(m) => m,
            Err(e) => unreachable!("a fresh registry has no conflicting metrics: {e}"),
        }
    }
}
