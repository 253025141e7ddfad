//! Faults the live-path tests inject (a panicking, slow or failing analysis).

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

/// Faults injected on purpose, for tests of the live path (`STORMGLASS_TEST_FAULTS`):
/// never set in production.
#[derive(Debug, Default)]
pub struct Faults {
    /// Panic inside the analysis of this many chunks.
    pub panics: AtomicUsize,
    /// Make every chunk's analysis take at least this long (a slow analysis).
    pub delay: Duration,
    /// Let the latest report go before every new build, and build for at least this long
    /// (what a wide window under memory pressure does, made visible).
    pub report_released: Option<Duration>,
    /// Fail this many report builds, as a query out of its memory pool fails.
    pub report_failures: AtomicUsize,
}

impl Faults {
    /// Parse `analysis_panics=N,analysis_delay=DURATION,report_released=DURATION,
    /// report_failures=N`.
    pub fn parse(text: &str) -> Result<Faults, String> {
        let mut faults = Faults::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: write key=value"))?;
            match key {
                "analysis_panics" => {
                    let n = value.parse().map_err(|e| format!("{item:?}: {e}"))?;
                    faults.panics = AtomicUsize::new(n);
                }
                "analysis_delay" => {
                    faults.delay =
                        humantime::parse_duration(value).map_err(|e| format!("{item:?}: {e}"))?;
                }
                "report_released" => {
                    faults.report_released = Some(
                        humantime::parse_duration(value).map_err(|e| format!("{item:?}: {e}"))?,
                    );
                }
                "report_failures" => {
                    let n = value.parse().map_err(|e| format!("{item:?}: {e}"))?;
                    faults.report_failures = AtomicUsize::new(n);
                }
                other => return Err(format!("unknown fault {other:?}")),
            }
        }
        Ok(faults)
    }
}
