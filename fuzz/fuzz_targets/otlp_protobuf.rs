//! Any bytes as a binary OTLP ExportTraceServiceRequest, as the gRPC and HTTP/protobuf
//! receivers decode them, then encoded into the span batch (full and lean, as the archive
//! and the live path do). Never a panic; every span is either in the batch or rejected.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;

mod check;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) =
        opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(data)
    {
        check::encode(&request);
    }
});
