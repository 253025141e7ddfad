//! What both targets check once a request decoded.

use stormglass_model::wire::ExportRequest;
use stormglass_model::{Conventions, SPANS_SCHEMA, encode, encode_lean};

/// Encode `request` both ways: the batches have the span schema, and every span of the
/// request is either a row or counted as rejected.
pub fn encode_both(request: &ExportRequest) {
    let spans = stormglass_model::encode::spans_of(request).count();
    let conventions = Conventions::default();
    for (batch, report) in [
        encode(&conventions, request),
        encode_lean(&conventions, request),
    ] {
        assert_eq!(batch.schema(), *SPANS_SCHEMA);
        assert_eq!(batch.num_rows() as u64, report.accepted);
        assert_eq!(report.accepted + report.rejected, spans as u64);
    }
}
