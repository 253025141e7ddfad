//! stormglass analytics: trace assembly ([`assembly`]) feeding a [`TraceSink`]; the
//! DataFusion analysis of retries and timeouts will consume the released traces.

pub mod assembly;
pub mod duration;
pub mod sink;

pub use assembly::{Assembly, AssemblyConfig, AssemblyMetrics};
pub use sink::{DiscardSink, MemorySink, ReleasedTraces, TraceSink};
