//! The window: intervals joining and leaving it, and its report rebuilt from them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use stormglass_runtime::Reservation;

use super::LiveAnalysis;
use crate::alerts;
use crate::clock::ClockBounds;
use crate::engine::{AnalysisError, Partials, WindowContext};
use crate::report::{Report, WindowBounds};

pub(super) struct Interval {
    pub(super) start: SystemTime,
    pub(super) end: SystemTime,
    pub(super) partials: Arc<Partials>,
    pub(super) learned: Learned,
    pub(super) _reservation: Reservation,
}

/// What later chunks of the window need from a chunk's partials (its clock bounds), read
/// once when the chunk is analysed rather than again for every chunk after; shared with
/// the chunks analysed meanwhile, not copied.
#[derive(Default)]
pub(super) struct Learned {
    pub(super) clocks: Arc<ClockBounds>,
}

impl Learned {
    pub(super) fn add(&mut self, partials: &Partials) {
        partials.clock_bounds_into(Arc::make_mut(&mut self.clocks));
    }

    fn merge_into(&self, clocks: &mut ClockBounds) {
        for (pair, bound) in self.clocks.iter() {
            crate::clock::add(clocks, pair.clone(), *bound);
        }
    }
}

/// Which intervals with data a report was built from: the same key, the same figures.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct WindowKey {
    pub(super) first: Option<SystemTime>,
    pub(super) last: Option<SystemTime>,
    pub(super) intervals: usize,
}

impl LiveAnalysis {
    /// Add an interval's partials to the window and drop the intervals that left it.
    pub(super) fn add_to_window(
        &self,
        start: SystemTime,
        end: SystemTime,
        partials: Arc<Partials>,
        learned: Learned,
        now: SystemTime,
    ) {
        let reservation = self.budget.force(partials.memory_bytes());
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        window.push_back(Interval {
            start,
            end,
            partials,
            learned,
            _reservation: reservation,
        });
        let horizon = now.checked_sub(self.config.window).unwrap_or(UNIX_EPOCH);
        let mut left = false;
        while window.front().is_some_and(|i| i.end <= horizon) {
            window.pop_front();
            left = true;
        }
        // The window's clock bounds: intersections cannot be taken back, so made anew from
        // the intervals once one left; else the new interval's added.
        let mut clocks = self.window_clocks.lock().unwrap_or_else(|p| p.into_inner());
        if left {
            let mut merged = ClockBounds::default();
            for interval in window.iter() {
                interval.learned.merge_into(&mut merged);
            }
            *clocks = Arc::new(merged);
        } else if let Some(joined) = window.back() {
            joined.learned.merge_into(Arc::make_mut(&mut clocks));
        }
        self.servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, seen| *seen > horizon);
    }

    /// Rebuild the report from the window's intervals and make it the latest. When the
    /// window holds the same data as the last build (intervals that analysed nothing came,
    /// none with data left: input has stopped), that build is reused with the new bounds,
    /// so an idle collector does not merge a wide window again every interval.
    pub(super) async fn rebuild_report(&self) -> Result<Arc<Report>, AnalysisError> {
        let (window, bounds, key) = {
            let window = self.window.lock().unwrap_or_else(|p| p.into_inner());
            let bounds = WindowBounds {
                start_unix_ns: window.front().map(|i| unix_ns(i.start)),
                end_unix_ns: window.back().map(|i| unix_ns(i.end)),
            };
            let with_data: Vec<&Interval> =
                window.iter().filter(|i| !i.partials.is_empty()).collect();
            let key = WindowKey {
                first: with_data.first().map(|i| i.start),
                last: with_data.last().map(|i| i.end),
                intervals: with_data.len(),
            };
            let partials: Vec<Arc<Partials>> = window.iter().map(|i| i.partials.clone()).collect();
            (partials, bounds, key)
        };
        let reused = self
            .built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|(built, _)| *built == key)
            .map(|(_, findings)| findings.clone());
        let Some(findings) = reused else {
            // The last build's findings are kept only for its reuse: not beside the new ones.
            self.built.lock().unwrap_or_else(|p| p.into_inner()).take();
            self.release_if_crowded();
            if let Some(at_least) = self.faults.report_released {
                tokio::time::sleep(at_least).await;
            }
            if (self.faults.report_failures)
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                let injected = "injected report failure (STORMGLASS_TEST_FAULTS)";
                return Err(AnalysisError::query(
                    "report",
                    datafusion::error::DataFusionError::ResourcesExhausted(injected.into()),
                ));
            }
            let mut report = Report::build(&self.engine, &window, bounds).await?;
            self.metrics.builds.inc();
            report.figures = Some(self.metrics.builds.get());
            *self.built.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((key, report.findings.clone()));
            self.evaluate(&mut report);
            let report = Arc::new(report);
            *self.latest.write().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
            return Ok(report);
        };
        // In place: a copy of a wide report each idle interval was a few hundred MiB and
        // most of the idle CPU (`make_mut` copies only while a reader holds it). A reused
        // build is the latest report: only a new build lets it go.
        let mut latest = self.latest.write().unwrap_or_else(|p| p.into_inner());
        let latest = latest.get_or_insert_with(Default::default);
        let report = Arc::make_mut(latest);
        report.window = Report::window_of(&window, bounds);
        report.findings = findings;
        self.evaluate(report);
        Ok(latest.clone())
    }

    /// Let the latest report go before a build when the build beside it would pass
    /// `limits.memory` ([`release_before_build`]), or a fault says to; until the new one is
    /// built, [`LiveAnalysis::report`] has none.
    fn release_if_crowded(&self) {
        let mut latest = self.latest.write().unwrap_or_else(|p| p.into_inner());
        let stale = latest.as_ref().map_or(0, |r| r.held_bytes());
        let resident = stormglass_runtime::memory::resident_bytes()
            .map_or(0, |r| usize::try_from(r).unwrap_or(usize::MAX));
        let forced = self.faults.report_released.is_some() && latest.is_some();
        if forced || release_before_build(resident, stale, self.budget.limit()) {
            *latest = None;
            self.metrics.released.inc();
        }
    }

    /// The alerts of `report` (its findings all there), then its findings bounded.
    pub(super) fn evaluate(&self, report: &mut Report) {
        let started = Instant::now();
        report.alerts = alerts::evaluate(report, &self.thresholds);
        crate::table::timed("alerts", started);
        report.bound_findings(self.report_config.max_findings_per_kind);
    }

    /// What the next chunk needs from the window: the services seen serving, and the clock
    /// bounds of the window's intervals and of the current one's
    /// chunks so far.
    pub(super) async fn window_context(&self) -> WindowContext {
        let servers: Vec<String> = self
            .servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        let window = (self.window_clocks.lock().unwrap_or_else(|p| p.into_inner())).clone();
        let filling = self.filling.lock().await.learned.clocks.clone();
        WindowContext {
            servers,
            clocks: vec![window, filling],
        }
    }
}

pub(super) fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Whether to let the last report go before building the next: the build's working set
/// (the new report and the tables it is read from, about twice a report) beside what the
/// process holds would pass `limit`, and the last report is worth freeing (a 32nd of the
/// limit: a wide window's, ~1.3 KiB an edge). At 160,000 edges the last report is ~200 MiB
/// of a collector at 1 GiB that is ~0.8 GiB resident when it builds.
fn release_before_build(resident: usize, stale: usize, limit: usize) -> bool {
    stale >= limit / 32 && resident.saturating_add(stale.saturating_mul(2)) > limit
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use stormglass_assembly::{ReleasedTraces, TraceSink};
    use stormglass_model::{Conventions, encode_request};
    use stormglass_runtime::MemoryBudget;
    use stormglass_testkit::fixtures;

    use super::release_before_build;
    use crate::alerts::AlertThresholds;
    use crate::engine::Engine;
    use crate::live::{AnalysisMetrics, AnalyticsConfig, LiveAnalysis};

    const MIB: usize = 1 << 20;

    /// Each chunk's context shares the window's clock bounds, not a copy merged for it (at
    /// width ~160,000 pairs per chunk); an interval leaving the window takes its bounds
    /// with it.
    #[tokio::test]
    async fn chunks_share_the_window_clocks_until_their_interval_leaves() {
        let config = AnalyticsConfig {
            window: Duration::from_secs(60),
            ..AnalyticsConfig::default()
        };
        let live = LiveAnalysis::new(
            Engine::default(),
            AlertThresholds::default(),
            config,
            AnalysisMetrics::unregistered(),
        );
        let budget = MemoryBudget::unregistered(1 << 30);
        let spans = fixtures::skewed_calls(40.0, 1..=28);
        let (batch, _) = encode_request(&Conventions::default(), &spans.request());
        live.release(ReleasedTraces::reserved(batch, 28, &budget));
        let t0 = SystemTime::now();
        live.run_interval(t0).await.unwrap();

        let (a, b) = (live.window_context().await, live.window_context().await);
        assert!(
            !a.clocks[0].is_empty(),
            "the interval's bounds: {:?}",
            a.clocks
        );
        assert!(
            Arc::ptr_eq(&a.clocks[0], &b.clocks[0]),
            "shared, not copied"
        );
        live.run_interval(t0 + Duration::from_secs(10))
            .await
            .unwrap();
        assert!(
            !live.window_context().await.clocks[0].is_empty(),
            "still inside"
        );
        live.run_interval(t0 + Duration::from_secs(120))
            .await
            .unwrap();
        assert!(
            live.window_context().await.clocks[0].is_empty(),
            "gone with it"
        );
    }

    /// A wide report goes when its build beside the process would pass the limit; a
    /// small one, or one with room to build beside it, stays (the API keeps answering).
    #[test]
    fn a_wide_report_goes_before_a_build_that_would_pass_the_limit() {
        let limit = 1024 * MIB;
        assert!(release_before_build(800 * MIB, 200 * MIB, limit));
        assert!(
            !release_before_build(500 * MIB, 200 * MIB, limit),
            "room beside it"
        );
        assert!(
            !release_before_build(1000 * MIB, MIB, limit),
            "too small to matter"
        );
        assert!(release_before_build(1000 * MIB, 32 * MIB, limit));
        assert!(
            !release_before_build(0, 0, limit),
            "no report, nothing to let go"
        );
    }
}
