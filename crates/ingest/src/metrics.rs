//! Receiver self-metrics as typed events: each function is the one place that counts an
//! event and logs it, so the counters and the log cannot drift apart.

use prometheus::{IntCounterVec, Opts, Registry};
use stormglass_model::EncodeReport;
use stormglass_model::conventions::Concept;

use crate::error::IngestError;

/// Reasons of retryable refusals (overload): logged at debug, since they come in floods.
const RETRYABLE_REASONS: [&str; 3] = ["memory_limit", "max_spans", "concurrency"];

/// The receivers' counters, registered once into the process registry.
#[derive(Clone)]
pub struct IngestMetrics {
    accepted_spans: IntCounterVec,
    refused_spans: IntCounterVec,
    refused_requests: IntCounterVec,
    malformed_fields: IntCounterVec,
}

impl IngestMetrics {
    /// Create the counters and register them into `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntCounterVec> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let metrics = IngestMetrics {
            accepted_spans: counter(
                "stormglass_receiver_accepted_spans_total",
                "Spans accepted by a receiver and handed to trace assembly.",
                &["transport"],
            )?,
            refused_spans: counter(
                "stormglass_receiver_refused_spans_total",
                "Spans refused: invalid (partial success) or over the memory bound (retryable).",
                &["transport", "reason"],
            )?,
            refused_requests: counter(
                "stormglass_receiver_refused_requests_total",
                "Whole requests refused before their spans could be counted (undecodable, too large, unsupported).",
                &["transport", "reason"],
            )?,
            malformed_fields: counter(
                "stormglass_receiver_malformed_fields_total",
                "Contract attributes present but unreadable (kept in the attributes map).",
                &["field"],
            )?,
        };
        // Series exist from the start (at 0), so rates and dashboards have no gaps, and a
        // first refusal is an increase Prometheus sees (a series that appears at 1 is not).
        for transport in Transport::ALL {
            for reason in IngestError::REASONS {
                metrics
                    .refused_requests
                    .with_label_values(&[transport.as_str(), reason]);
            }
        }
        for concept in Concept::ALL.iter().filter(|c| c.is_consumed()) {
            metrics
                .malformed_fields
                .with_label_values(&[concept.as_str()]);
        }
        for transport in [
            Transport::Grpc,
            Transport::HttpProtobuf,
            Transport::HttpJson,
        ] {
            metrics
                .accepted_spans
                .with_label_values(&[transport.as_str()]);
            for reason in ["invalid", "memory_limit", "max_spans"] {
                metrics
                    .refused_spans
                    .with_label_values(&[transport.as_str(), reason]);
            }
        }
        Ok(metrics)
    }

    /// Metrics registered into a private registry, for tests and tools that do not export.
    pub fn unregistered() -> Self {
        match Self::register(&Registry::new()) {
            Ok(m) => m,
            Err(e) => unreachable!("a fresh registry has no conflicting metrics: {e}"),
        }
    }

    pub(crate) fn encoded(&self, transport: Transport, report: &EncodeReport) {
        if report.rejected > 0 {
            self.refused_spans
                .with_label_values(&[transport.as_str(), "invalid"])
                .inc_by(report.rejected);
            tracing::debug!(
                transport = transport.as_str(),
                rejected = report.rejected,
                first = report.first_rejection.as_deref().unwrap_or(""),
                "rejected invalid spans"
            );
        }
        for (field, n) in report.malformed_by_field() {
            self.malformed_fields.with_label_values(&[field]).inc_by(n);
        }
    }

    pub(crate) fn accepted(&self, transport: Transport, spans: u64) {
        self.accepted_spans
            .with_label_values(&[transport.as_str()])
            .inc_by(spans);
    }

    /// A refusal after decoding: the spans are known and counted.
    pub(crate) fn refused_spans(&self, transport: Transport, error: &IngestError, spans: u64) {
        self.refused_spans
            .with_label_values(&[transport.as_str(), error.reason()])
            .inc_by(spans);
        // Retryable refusals are the designed answer to overload and come by the thousand
        // then: counted always, logged at debug only.
        if error.retryable() {
            tracing::debug!(transport = transport.as_str(), spans, %error, "refused spans");
        } else {
            tracing::warn!(transport = transport.as_str(), spans, %error, "refused spans");
        }
    }

    /// A refusal before decoding: only the request is known.
    pub fn refused_request(&self, transport: Transport, reason: &str, detail: &str) {
        self.refused_requests
            .with_label_values(&[transport.as_str(), reason])
            .inc();
        let transport = transport.as_str();
        if RETRYABLE_REASONS.contains(&reason) {
            tracing::debug!(transport, reason, detail, "refused request");
        } else {
            tracing::info!(transport, reason, detail, "refused request");
        }
    }
}

/// How a request arrived; the `transport` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Grpc,
    HttpProtobuf,
    HttpJson,
    /// HTTP requests refused before their encoding was known (bad content type).
    Http,
}

impl Transport {
    /// Every transport label.
    pub const ALL: [Transport; 4] = [
        Transport::Grpc,
        Transport::HttpProtobuf,
        Transport::HttpJson,
        Transport::Http,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::HttpProtobuf => "http_protobuf",
            Transport::HttpJson => "http_json",
            Transport::Http => "http",
        }
    }
}
