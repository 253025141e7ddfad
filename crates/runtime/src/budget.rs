//! The process's one memory budget (`limits.memory`) and the reservations held against it.
//!
//! Every stage that holds spans reserves their bytes here before keeping them: a request
//! being decoded (an estimate from its size on the wire, reserved before the work), a batch
//! stored in assembly, a released trace waiting for analysis, a window's partials. When a
//! reservation would cross the budget, the receivers refuse with a retryable answer instead
//! of growing: exporters back off and retry, nothing accepted is dropped.
//!
//! The budget is split in two. [`MemoryBudget::analysis_share`] (a quarter) is set aside for
//! the analysis's working set (DataFusion's memory pool and the chunk being analysed), so
//! analysis can always make progress and free what waits for it; everything else is the
//! admission share, which [`MemoryBudget::try_reserve`] checks. Work that must go on once
//! its input was accepted (gathering a released trace, keeping an interval's partials)
//! reserves with [`MemoryBudget::force`]: counted, never refused, bounded by the data
//! already admitted.
//!
//! A [`Reservation`] returns its bytes when dropped, so memory is accounted exactly as long
//! as the value that owns it lives.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prometheus::{IntGauge, Registry};

/// How long after a refusal `/readyz` keeps saying "not ready".
const REFUSING_FOR: Duration = Duration::from_secs(1);

/// The memory budget shared by every stage. Cheap to clone.
#[derive(Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

struct Inner {
    limit: usize,
    admission: usize,
    used: AtomicUsize,
    last_refusal: Mutex<Option<Instant>>,
    used_gauge: IntGauge,
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
    /// A budget of `limit` bytes, exported as `stormglass_memory_limit_bytes` and
    /// `stormglass_memory_used_bytes`.
    pub fn register(limit: usize, registry: &Registry) -> prometheus::Result<Self> {
        let limit_gauge = IntGauge::new(
            "stormglass_memory_limit_bytes",
            "The memory budget (limits.memory) covering every span held, waiting or being analysed.",
        )?;
        let used_gauge = IntGauge::new(
            "stormglass_memory_used_bytes",
            "Bytes reserved against the memory budget now (requests in flight, spans held, waiting for and in analysis, window partials).",
        )?;
        limit_gauge.set(i64::try_from(limit).unwrap_or(i64::MAX));
        registry.register(Box::new(limit_gauge))?;
        registry.register(Box::new(used_gauge.clone()))?;
        Ok(MemoryBudget {
            inner: Arc::new(Inner {
                limit,
                admission: limit - limit / 4,
                used: AtomicUsize::new(0),
                last_refusal: Mutex::new(None),
                used_gauge,
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

    /// The whole budget.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// The part set aside for the analysis's working set (a quarter of the budget).
    pub fn analysis_share(&self) -> usize {
        self.inner.limit - self.inner.admission
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
        let mut used = inner.used.load(Ordering::Relaxed);
        loop {
            if used.saturating_add(bytes) > inner.admission {
                *inner.last_refusal.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Instant::now());
                return Err(OverBudget {
                    requested: bytes,
                    available: inner.admission.saturating_sub(used),
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
        recent || self.used() >= self.inner.admission
    }

    fn release(&self, bytes: usize) {
        self.inner.used.fetch_sub(bytes, Ordering::Relaxed);
        self.publish();
    }

    fn publish(&self) {
        self.inner
            .used_gauge
            .set(i64::try_from(self.used()).unwrap_or(i64::MAX));
    }
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
}
