//! What the tests of every stormglass crate build their input from (a dev-dependency only):
//! [`otlp`], OTLP requests by hand with small numeric ids, and [`fixtures`], traces of each
//! failure mode built with [`fixtures::Spans`], each with the figures it must produce worked
//! out by hand in its doc comment, and [`mesh`], a wide mesh of many services. The end-to-end tests' process helpers (starting the
//! binary, Prometheus, Alertmanager) live beside them in `tests/common`.
#![allow(clippy::unwrap_used)]

pub mod fixtures;
pub mod mesh;
pub mod otlp;
