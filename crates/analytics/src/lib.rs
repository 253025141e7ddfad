//! stormglass analytics: trace assembly (the `stormglass-assembly` crate) releases complete
//! traces to the live analysis ([`live`]), which reconstructs attempts and logical calls and computes every figure of
//! docs/figures.md with the DataFusion SQL in `queries/` ([`queries`], [`engine`]). Live
//! ([`live`]) and offline ([`files`], [`offline`]) analysis share that SQL and the report
//! ([`report`]).

pub mod advice;
pub mod alerts;
pub mod budget_table;
pub mod clock;
pub mod counts;
pub mod engine;
pub mod figures;
pub mod files;
pub mod histogram;
pub mod lineage;
pub mod live;
pub mod offline;
mod parallel;
pub mod policy;
pub mod queries;
pub mod replay;
pub mod report;
pub mod table;
pub mod whatif;

pub use alerts::{Alert, AlertDefinition, AlertThresholds};
pub use datafusion::prelude::SessionContext;
pub use engine::{AnalysisError, Engine, Params, Partials, WindowContext};
pub use live::{AnalysisMetrics, AnalyticsConfig, Faults, IntervalObserver, LiveAnalysis};
pub use report::{Report, ReportConfig};
pub use stormglass_assembly::{ReleasedTraces, TraceSink};
