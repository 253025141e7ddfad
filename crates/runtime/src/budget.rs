//! The process's one memory bound (`limits.memory`) and the reservations held against it.
//!
//! Every stage that holds spans reserves their bytes here before keeping them: a request
//! being decoded (an estimate from its size on the wire, reserved before the work), a batch
//! stored in assembly, a released trace waiting for analysis, a window's partials. When a
//! reservation would cross the budget, the receivers refuse with a retryable answer instead
//! of growing: exporters back off and retry, nothing accepted is dropped.
//!
//! `limits.memory` bounds the whole process, as a container's memory limit does, not only
//! the data: the data budget is what is left of it after the process's own footprint
//! (code, runtimes, the analysis's working set, what the allocator keeps after frees),
//! measured as the resident size minus the bytes reserved ([`MemoryBudget::observe`],
//! re-read as it runs by [`MemoryBudget::follow_footprint`]).
//!
//! A quarter of the limit, [`MemoryBudget::analysis_share`], sizes the analysis (DataFusion's
//! memory pool and the chunk being analysed) and is kept free of admitted data, so the
//! analysis's working set, which no reservation covers, can grow between two readings and
//! analysis can always make progress and free what waits for it; [`MemoryBudget::try_reserve`]
//! checks the rest, the admission share. Work that must go on once its input was accepted (gathering a
//! released trace, keeping an interval's partials) reserves with [`MemoryBudget::force`]:
//! counted, never refused, bounded by the data already admitted.
//!
//! A [`Reservation`] returns its bytes when dropped, so memory is accounted exactly as long
//! as the value that owns it lives.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use prometheus::{IntGauge, Registry};

/// How long after a refusal `/readyz` keeps saying "not ready".
const REFUSING_FOR: Duration = Duration::from_secs(1);

/// The least time between two calls of [`MemoryBudget::follow_footprint`]'s `release`
/// within the limit.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

/// How soon after the last release the allocator's free memory is worth handing back (see
/// [`MemoryBudget::follow_footprint`]), if at all: at once while the process is resident
/// beyond the limit itself; at most every [`RELEASE_EVERY`] while the footprint takes more
/// than half the limit and the receivers refuse or little data is held (an eighth of the
/// limit).
fn release_every(footprint: usize, used: usize, limit: usize, refusing: bool) -> Option<Duration> {
    if footprint.saturating_add(used) > limit {
        Some(Duration::ZERO)
    } else if footprint > limit / 2 && (refusing || used < limit / 8) {
        Some(RELEASE_EVERY)
    } else {
        None
    }
}

/// The memory budget shared by every stage. Cheap to clone.
#[derive(Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

struct Inner {
    limit: usize,
    /// The most the admission share can be: the limit less the analysis's share.
    max_admission: usize,
    /// The admission share now: the data budget less the analysis's share.
    admission: AtomicUsize,
    used: AtomicUsize,
    last_refusal: Mutex<Option<Instant>>,
    used_gauge: IntGauge,
    footprint_gauge: IntGauge,
    data_budget_gauge: IntGauge,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.inner.limit)
            .field("used", &self.used())
            .finish()
    }
}

/// A reservation would cross the budget: nothing was reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverBudget {
    pub requested: usize,
    pub available: usize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes, exported as `stormglass_memory_limit_bytes`,
    /// `stormglass_memory_used_bytes`, `stormglass_memory_footprint_bytes` and
    /// `stormglass_memory_data_budget_bytes`. Until a footprint is observed, all of the
    /// limit is the data budget.
    pub fn register(limit: usize, registry: &Registry) -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let limit_gauge = gauge(
            "stormglass_memory_limit_bytes",
            "The process's memory bound (limits.memory, or 80% of the cgroup's memory limit when unset).",
        )?;
        let used_gauge = gauge(
            "stormglass_memory_used_bytes",
            "Bytes reserved against the memory budget now (requests in flight, spans held, waiting for and in analysis, window partials).",
        )?;
        let footprint_gauge = gauge(
            "stormglass_memory_footprint_bytes",
            "The process's resident memory at the last reading (what a container's memory limit counts).",
        )?;
        let data_budget_gauge = gauge(
            "stormglass_memory_data_budget_bytes",
            "What is left of the memory limit for data after the process's own footprint (resident memory less the bytes reserved).",
        )?;
        limit_gauge.set(as_i64(limit));
        data_budget_gauge.set(as_i64(limit));
        let max_admission = limit - limit / 4;
        Ok(MemoryBudget {
            inner: Arc::new(Inner {
                limit,
                max_admission,
                admission: AtomicUsize::new(max_admission),
                used: AtomicUsize::new(0),
                last_refusal: Mutex::new(None),
                used_gauge,
                footprint_gauge,
                data_budget_gauge,
            }),
        })
    }

    /// A budget that exports nothing, for tests and tools.
    pub fn unregistered(limit: usize) -> Self {
        match Self::register(limit, &Registry::new()) {
            Ok(b) => b,
            Err(e) => unreachable!("a fresh registry has no conflicting metrics: {e}"),
        }
    }

    /// The whole bound, `limits.memory`.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// What sizes the analysis's working set: a quarter of the limit.
    pub fn analysis_share(&self) -> usize {
        self.inner.limit / 4
    }

    /// The admission share now: what [`MemoryBudget::try_reserve`] lets the reserved bytes
    /// reach.
    pub fn admission(&self) -> usize {
        self.inner.admission.load(Ordering::Relaxed)
    }

    /// Take a reading of the process's resident size: what it holds beyond the bytes
    /// reserved is its own footprint, and the data budget is the limit less that footprint
    /// (at least an eighth of the limit, so the process always admits a little and a
    /// footprint the allocator will return soon does not lock it out). The admission share
    /// is the data budget less the analysis's share, at least a sixteenth of the limit.
    pub fn observe(&self, resident: usize) {
        let inner = &self.inner;
        let footprint = resident.saturating_sub(self.used());
        let data = inner.limit.saturating_sub(footprint).max(inner.limit / 8);
        let admission = data
            .saturating_sub(inner.limit - inner.max_admission)
            .max(inner.limit / 16);
        inner.admission.store(admission, Ordering::Relaxed);
        inner.footprint_gauge.set(as_i64(resident));
        inner.data_budget_gauge.set(as_i64(data));
    }

    /// Read the process's resident size ([`crate::memory::resident_bytes`]) every `every`
    /// on a thread of its own, and [`MemoryBudget::observe`] it, for as long as the budget
    /// lives. Does nothing where the resident size cannot be read.
    ///
    /// When the footprint takes more than half the limit while the receivers refuse or
    /// little data is held (an eighth of the limit), `release` is called (at most once a
    /// second) to hand the allocator's free memory back to the kernel: what it keeps after
    /// a burst counts as resident until it does, and would keep the receivers refusing for
    /// the allocator's own purge delay although nothing holds it. Not under steady load
    /// that is admitted: a forced purge makes the next interval fault its working set in
    /// again, for nothing; unless the process is resident beyond the limit, where free
    /// memory is handed back at every reading (a wide window's report build frees and
    /// allocates a few hundred MiB within a second).
    pub fn follow_footprint(&self, every: Duration, release: fn()) -> std::io::Result<()> {
        let Some(resident) = crate::memory::resident_bytes() else {
            tracing::info!(
                "the resident size cannot be read here: limits.memory bounds the data only"
            );
            return Ok(());
        };
        let resident = usize::try_from(resident).unwrap_or(usize::MAX);
        self.observe(resident);
        if resident > self.limit() / 2 {
            tracing::warn!(
                resident_bytes = resident,
                limit_bytes = self.limit(),
                "the process's own footprint is over half of limits.memory: little is left for spans"
            );
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name("stormglass-footprint".into())
            .spawn(move || {
                let mut released = Instant::now();
                loop {
                    std::thread::sleep(every);
                    let Some(inner) = weak.upgrade() else { return };
                    let budget = MemoryBudget { inner };
                    let read = || {
                        crate::memory::resident_bytes()
                            .map(|r| usize::try_from(r).unwrap_or(usize::MAX))
                    };
                    let Some(mut resident) = read() else { continue };
                    let footprint = resident.saturating_sub(budget.used());
                    let every =
                        release_every(footprint, budget.used(), budget.limit(), budget.refusing());
                    if every.is_some_and(|every| released.elapsed() >= every) {
                        release();
                        released = Instant::now();
                        resident = read().unwrap_or(resident);
                    }
                    budget.observe(resident);
                }
            })?;
        Ok(())
    }

    /// The largest chunk of released spans analysed at once: the analysis's working set
    /// (lineage, derived tables, DataFusion's operators) measured ~15x the chunk's Arrow
    /// bytes, so a 32nd of the share keeps it inside; at least 1 MiB, at most 256 MiB.
    pub fn chunk_bytes(&self) -> usize {
        (self.analysis_share() / 32).clamp(1 << 20, 256 << 20)
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// Reserve `bytes` if they fit in the admission share; otherwise reserve nothing and
    /// remember the refusal (for `/readyz`).
    pub fn try_reserve(&self, bytes: usize) -> Result<Reservation, OverBudget> {
        let inner = &self.inner;
        let admission = self.admission();
        let mut used = inner.used.load(Ordering::Relaxed);
        loop {
            if used.saturating_add(bytes) > admission {
                *inner.last_refusal.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Instant::now());
                return Err(OverBudget {
                    requested: bytes,
                    available: admission.saturating_sub(used),
                });
            }
            match inner.used.compare_exchange_weak(
                used,
                used + bytes,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        self.publish();
        Ok(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    /// Reserve `bytes` unconditionally: for memory that follows from data already admitted.
    pub fn force(&self, bytes: usize) -> Reservation {
        self.inner.used.fetch_add(bytes, Ordering::Relaxed);
        self.publish();
        Reservation {
            budget: self.clone(),
            bytes,
        }
    }

    /// True while the receivers refuse: a reservation was refused within the last second,
    /// or the admission share is full. `/readyz` reports it.
    pub fn refusing(&self) -> bool {
        let recent = self
            .inner
            .last_refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < REFUSING_FOR);
        recent || self.used() >= self.admission()
    }

    fn release(&self, bytes: usize) {
        self.inner.used.fetch_sub(bytes, Ordering::Relaxed);
        self.publish();
    }

    fn publish(&self) {
        self.inner.used_gauge.set(as_i64(self.used()));
    }
}

fn as_i64(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Bytes held against a [`MemoryBudget`]; returned when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    bytes: usize,
}

impl Reservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Change the reserved amount to `bytes`, unconditionally (the memory exists already).
    pub fn resize(&mut self, bytes: usize) {
        if bytes > self.bytes {
            let grow = bytes - self.bytes;
            self.budget.inner.used.fetch_add(grow, Ordering::Relaxed);
            self.budget.publish();
        } else if bytes < self.bytes {
            self.budget.release(self.bytes - bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.release(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reservations count while they live, refuse past the admission share, and a refusal
    /// makes the budget report that it is refusing.
    #[test]
    fn reservations_are_bounded_and_returned() {
        let budget = MemoryBudget::unregistered(1000);
        assert_eq!(budget.analysis_share(), 250);
        assert_eq!(budget.admission(), 750);
        let a = budget.try_reserve(600).expect("fits");
        assert!(!budget.refusing());
        let refused = budget.try_reserve(200).expect_err("600 + 200 > 750");
        assert_eq!(refused.available, 150);
        assert!(budget.refusing());
        let mut b = budget.force(300);
        assert_eq!(budget.used(), 900);
        b.resize(100);
        assert_eq!(budget.used(), 700);
        drop(a);
        assert_eq!(budget.used(), 100);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    /// The process's own footprint (resident beyond what is reserved) comes off the data
    /// budget, and the admission share follows it both ways, down to its floor.
    /// Free memory goes back after a burst (refusing, or drained), never under steady load
    /// that is admitted, where a purge only makes the next interval fault its memory in,
    /// unless the process is resident beyond the limit: then at once.
    #[test]
    fn release_after_a_burst_not_under_steady_load() {
        const MIB: usize = 1 << 20;
        let limit = 256 * MIB;
        let every = |footprint, used, refusing| release_every(footprint, used, limit, refusing);
        assert_eq!(
            every(200 * MIB, 50 * MIB, true),
            Some(RELEASE_EVERY),
            "refusing"
        );
        assert_eq!(every(200 * MIB, 0, false), Some(RELEASE_EVERY), "drained");
        assert_eq!(every(200 * MIB, 50 * MIB, false), None, "steady");
        assert_eq!(every(100 * MIB, 0, true), None, "small footprint");
        assert_eq!(
            every(200 * MIB, 60 * MIB, false),
            Some(Duration::ZERO),
            "over the limit"
        );
    }

    #[test]
    fn the_footprint_comes_off_the_data_budget() {
        let registry = Registry::new();
        let budget = MemoryBudget::register(1600, &registry).unwrap();
        let gauge = |name: &str| {
            registry
                .gather()
                .iter()
                .find(|f| f.name() == name)
                .map(|f| f.get_metric()[0].get_gauge().get_value())
                .unwrap()
        };
        let held = budget.force(300);
        // 500 resident, 300 of it reserved: a footprint of 200.
        budget.observe(500);
        assert_eq!(gauge("stormglass_memory_data_budget_bytes"), 1400.0);
        assert_eq!(gauge("stormglass_memory_footprint_bytes"), 500.0);
        assert_eq!(budget.admission(), 1400 - 400);
        assert!(budget.try_reserve(701).is_err(), "300 + 701 > 1000");
        // The footprint grows past the limit: the floors hold.
        budget.observe(3000);
        assert_eq!(gauge("stormglass_memory_data_budget_bytes"), 200.0);
        assert_eq!(budget.admission(), 100);
        assert!(budget.refusing());
        // ... and shrinks again (the allocator returned what it kept).
        drop(held);
        budget.observe(100);
        assert_eq!(budget.admission(), 1500 - 400);
        assert_eq!(gauge("stormglass_memory_limit_bytes"), 1600.0);
    }
}
