//! `analytics.*`: the window, the interval, and the check that they fit together.

use std::time::Duration;

use serde::Deserialize;
use stormglass_runtime::duration;

/// `analytics.*` configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AnalyticsConfig {
    /// Length of the sliding window the figures describe.
    #[serde(with = "duration")]
    pub window: Duration,
    /// How often released traces are analysed (one partial per interval).
    #[serde(with = "duration")]
    pub interval: Duration,
}

impl Default for AnalyticsConfig {
    fn default() -> Self {
        AnalyticsConfig {
            window: Duration::from_secs(300),
            interval: Duration::from_secs(10),
        }
    }
}

impl AnalyticsConfig {
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.interval.is_zero() {
            problems.push((
                format!("{prefix}.interval"),
                "must be greater than 0 (e.g. 10s)".into(),
            ));
        }
        if self.window < self.interval {
            problems.push((
                format!("{prefix}.window"),
                "must be at least analytics.interval (e.g. 5m)".into(),
            ));
        }
        problems
    }
}
