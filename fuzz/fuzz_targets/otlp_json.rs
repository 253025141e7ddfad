//! Any bytes as an OTLP/JSON ExportTraceServiceRequest, as the HTTP/JSON receiver and
//! `stormglass analyze` read them, then encoded into the span batch. Never a panic; every
//! span is either in the batch or rejected.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod check;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<
        opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
    >(data)
    {
        check::encode_both(&stormglass_model::wire::from_proto(&request));
    }
});
