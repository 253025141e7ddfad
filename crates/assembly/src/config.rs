//! `assembly.*` configuration.

use std::time::Duration;

use serde::Deserialize;

use stormglass_runtime::duration;

/// How long traces are held and how many spans may be held at once.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AssemblyConfig {
    /// Release a trace once no span arrived for this long.
    #[serde(with = "duration")]
    pub idle: Duration,
    /// Release a trace this long after its first span, however busy.
    #[serde(with = "duration")]
    pub max_age: Duration,
    /// Most spans held at once; over it new spans are refused with a retryable answer.
    pub max_spans: usize,
    /// How many released trace ids are remembered, so that spans arriving after their trace
    /// are counted as late instead of re-opening it as a new, partial trace; 0 sizes it
    /// from `limits.memory` (a 32nd of it, at [`crate::RELEASED_ID_BYTES`] per id: about
    /// a million ids per GiB). The oldest half is forgotten when it is full.
    pub released_ids: usize,
}

impl Default for AssemblyConfig {
    fn default() -> Self {
        AssemblyConfig {
            idle: Duration::from_secs(10),
            max_age: Duration::from_secs(60),
            max_spans: 2_000_000,
            released_ids: 0,
        }
    }
}

impl AssemblyConfig {
    /// Every problem at once, each as (key path, what is wrong and how to fix it).
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &str, msg: &str| {
            if !ok {
                problems.push((format!("{prefix}.{key}"), msg.to_owned()));
            }
        };
        check(
            !self.idle.is_zero(),
            "idle",
            "must be greater than 0 (e.g. 10s)",
        );
        check(
            self.max_age >= self.idle,
            "max_age",
            "must be at least assembly.idle, or no trace could ever go idle",
        );
        check(
            self.max_spans > 0,
            "max_spans",
            "must be greater than 0 (e.g. 2000000)",
        );
        problems
    }

    /// How often the release loop looks for due traces: a quarter of `idle`, kept between
    /// 10 ms and 1 s, so release lags due time by at most that.
    pub fn tick(&self) -> Duration {
        (self.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}
