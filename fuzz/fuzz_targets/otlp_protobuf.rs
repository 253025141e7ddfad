//! Any bytes as a binary OTLP ExportTraceServiceRequest, as the gRPC and HTTP/protobuf
//! receivers decode them (stormglass's lean messages, strings checked for UTF-8), then
//! encoded into the span batch (full and lean, as the archive and the live path do). Never a
//! panic; every span is either in the batch or rejected.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod check;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = stormglass_model::wire::decode(data) {
        check::encode_both(&request);
    }
});
