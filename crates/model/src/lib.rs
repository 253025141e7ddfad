//! The stormglass data model: one Arrow schema for spans ([`schema`]), the attribute
//! conventions that normalise what exporters send ([`conventions`]), the outcome classes of
//! docs/instrumenting.md ([`outcome`]), the OTLP request as received ([`wire`]) and the OTLP -> Arrow
//! encoder ([`mod@encode`]). No I/O lives here.

pub mod attribute;
pub mod conventions;
pub mod encode;
pub mod hash;
pub mod outcome;
pub mod sampling;
pub mod schema;
pub mod synth;
pub mod wire;

pub use conventions::{Concept, Conventions};
pub use encode::{
    EncodeReport, SpanBatchBuilder, SpanRejection, encode, encode_lean, encode_request,
    encode_request_lean,
};
pub use outcome::Outcome;
pub use schema::{HELD_SCHEMA, SPANS_SCHEMA, hold, lean, widen_rows};
