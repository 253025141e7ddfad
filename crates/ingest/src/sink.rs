//! Where receivers hand decoded spans: [`Pipeline`], the transport-independent half of
//! every export request, into a [`SpanSink`] (the runtime crate's contract; trace assembly
//! and the archive implement it).

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use stormglass_model::Conventions;
use stormglass_model::wire::ExportRequest;

use crate::error::IngestError;
use crate::metrics::{IngestMetrics, Transport};
use stormglass_runtime::SpanSink;

/// The shared export path of both transports: encode, count, hand to the sink, answer.
#[derive(Clone)]
pub struct Pipeline {
    sink: Arc<dyn SpanSink>,
    conventions: Arc<Conventions>,
    metrics: IngestMetrics,
    lean: bool,
}

impl Pipeline {
    pub fn new(
        sink: Arc<dyn SpanSink>,
        conventions: Arc<Conventions>,
        metrics: IngestMetrics,
    ) -> Self {
        Pipeline {
            sink,
            conventions,
            metrics,
            lean: false,
        }
    }

    /// Encode only the columns the analysis reads (the live path, where nothing else
    /// reads the spans): no per-attribute allocations for a map that would be dropped.
    pub fn lean(mut self) -> Self {
        self.lean = true;
        self
    }

    pub fn metrics(&self) -> &IngestMetrics {
        &self.metrics
    }

    /// Encode and store one decoded request. Invalid spans become a partial success; a full
    /// sink refuses the whole request with a retryable error.
    pub fn export(
        &self,
        transport: Transport,
        request: &ExportRequest,
    ) -> Result<ExportTraceServiceResponse, IngestError> {
        let (batch, report) = if self.lean {
            stormglass_model::encode_lean(&self.conventions, request)
        } else {
            stormglass_model::encode(&self.conventions, request)
        };
        self.metrics.encoded(transport, &report);
        let spans = batch.num_rows() as u64;
        if spans > 0 {
            if let Err(full) = self.sink.accept(batch) {
                let error = IngestError::Overloaded {
                    retry_after: full.retry_after,
                    limit: full.limit,
                };
                self.metrics.refused_spans(transport, &error, spans);
                return Err(error);
            }
            self.metrics.accepted(transport, spans);
        }
        Ok(ExportTraceServiceResponse {
            partial_success: report.partial_success_message().map(|message| {
                ExportTracePartialSuccess {
                    rejected_spans: i64::try_from(report.rejected).unwrap_or(i64::MAX),
                    error_message: message,
                }
            }),
        })
    }
}
