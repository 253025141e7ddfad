//! stormglass analytics: trace assembly ([`assembly`]) releases complete traces to the
//! analysis, which reconstructs attempts and logical calls and computes every figure of
//! METRICS.md with the DataFusion SQL in `queries/` ([`queries`], [`engine`]). Live
//! ([`live`]) and offline ([`files`]) analysis share that SQL and the report ([`report`]).

pub mod alerts;
pub mod assembly;
pub mod duration;
pub mod engine;
pub mod files;
pub mod histogram;
pub mod lineage;
pub mod live;
pub mod queries;
pub mod report;
pub mod sink;

pub use alerts::{Alert, AlertDefinition, AlertThresholds};
pub use assembly::{Assembly, AssemblyConfig, AssemblyMetrics};
pub use engine::{AnalysisError, Engine, Params, Partials};
pub use live::{AnalysisMetrics, AnalyticsConfig, IntervalObserver, LiveAnalysis};
pub use report::Report;
pub use sink::{MemorySink, ReleasedTraces, TraceSink};
