//! Assembly self-metrics as typed events (see the ingest crate's metrics for the pattern).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Why a trace left assembly; the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReason {
    Idle,
    MaxAge,
    /// The trace reached the largest size released at once (a chunk, 256 MiB at most).
    MaxSize,
    Shutdown,
}

impl ReleaseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::Idle => "idle",
            ReleaseReason::MaxAge => "max_age",
            ReleaseReason::MaxSize => "max_size",
            ReleaseReason::Shutdown => "shutdown",
        }
    }
}

#[derive(Clone)]
pub struct AssemblyMetrics {
    spans: IntGauge,
    traces: IntGauge,
    memory_bytes: IntGauge,
    max_spans: IntGauge,
    released_ids: IntGauge,
    late_spans: IntCounter,
    duplicate_spans: IntCounter,
    released_spans: IntCounter,
    compactions: IntCounter,
    released_traces: IntCounterVec,
}

impl AssemblyMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let released_traces = IntCounterVec::new(
            Opts::new(
                "stormglass_assembly_released_traces_total",
                "Traces released from assembly to analysis, by why they were released.",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(released_traces.clone()))?;
        for reason in [
            ReleaseReason::Idle,
            ReleaseReason::MaxAge,
            ReleaseReason::MaxSize,
            ReleaseReason::Shutdown,
        ] {
            released_traces.with_label_values(&[reason.as_str()]);
        }
        Ok(AssemblyMetrics {
            spans: gauge(
                "stormglass_assembly_spans",
                "Spans held in assembly now (open traces).",
            )?,
            traces: gauge("stormglass_assembly_traces", "Traces open in assembly now.")?,
            memory_bytes: gauge(
                "stormglass_assembly_memory_bytes",
                "Memory holding the open traces (held spans: analysed columns, strings dictionary-encoded): Arrow buffers of the stored batches plus the index.",
            )?,
            max_spans: gauge(
                "stormglass_assembly_max_spans",
                "The assembly.max_spans bound; spans are refused (retryably) above it.",
            )?,
            released_ids: gauge(
                "stormglass_assembly_released_ids_limit",
                "Released trace ids remembered at most (assembly.released_ids): a span of a remembered trace is late; of a forgotten one, it opens a new trace.",
            )?,
            late_spans: counter(
                "stormglass_assembly_late_spans_total",
                "Spans that arrived after their trace was released: counted, not analysed.",
            )?,
            duplicate_spans: counter(
                "stormglass_assembly_duplicate_spans_total",
                "Spans seen twice in an open trace (same span id): kept once, counted here.",
            )?,
            released_spans: counter(
                "stormglass_assembly_released_spans_total",
                "Spans released from assembly to analysis.",
            )?,
            compactions: counter(
                "stormglass_assembly_compactions_total",
                "Stored batches whose few open rows were copied out so the rest could be freed.",
            )?,
            released_traces,
        })
    }

    pub fn unregistered() -> Self {
        match Self::register(&Registry::new()) {
            Ok(m) => m,
            Err(e) => unreachable!("a fresh registry has no conflicting metrics: {e}"),
        }
    }

    pub(crate) fn limit(&self, max_spans: usize, released_ids: usize) {
        self.max_spans
            .set(i64::try_from(max_spans).unwrap_or(i64::MAX));
        self.released_ids
            .set(i64::try_from(released_ids).unwrap_or(i64::MAX));
    }

    pub(crate) fn open(&self, spans: usize, traces: usize, bytes: usize) {
        self.spans.set(i64::try_from(spans).unwrap_or(i64::MAX));
        self.traces.set(i64::try_from(traces).unwrap_or(i64::MAX));
        self.memory_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub(crate) fn late(&self, spans: u64) {
        self.late_spans.inc_by(spans);
        tracing::debug!(spans, "late spans: their trace was already released");
    }

    pub(crate) fn duplicates(&self, spans: u64) {
        self.duplicate_spans.inc_by(spans);
        tracing::debug!(spans, "duplicate spans: kept once");
    }

    pub(crate) fn compacted(&self) {
        self.compactions.inc();
    }

    pub(crate) fn released(&self, reason: ReleaseReason, traces: u64, spans: u64) {
        self.released_traces
            .with_label_values(&[reason.as_str()])
            .inc_by(traces);
        self.released_spans.inc_by(spans);
    }
}
