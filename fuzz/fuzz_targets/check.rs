//! What both targets check once a request decoded.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use stormglass_model::{Conventions, SPANS_SCHEMA, encode_request, encode_request_lean};

/// Encode `request` both ways: the batches have the span schema, and every span of the
/// request is either a row or counted as rejected.
pub fn encode(request: &ExportTraceServiceRequest) {
    let spans = stormglass_model::encode::spans_of(request).count();
    let conventions = Conventions::default();
    for (batch, report) in [
        encode_request(&conventions, request),
        encode_request_lean(&conventions, request),
    ] {
        assert_eq!(batch.schema(), *SPANS_SCHEMA);
        assert_eq!(batch.num_rows() as u64, report.accepted);
        assert_eq!(report.accepted + report.rejected, spans as u64);
    }
}
