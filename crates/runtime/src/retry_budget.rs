//! A retry budget as it runs, as Linkerd's `retryBudget` (after Finagle's) does: each call
//! deposits `ratio`, each retry withdraws one, both forgotten after [`WINDOW_NS`]; a retry
//! goes while the deposits plus the floor's reserve (`min_per_second` x the window) cover
//! it. `stormglass replay` runs it over the observed calls and the demo's clients obey it,
//! so what one predicts is what the other does.

use std::collections::VecDeque;

/// How long a budget remembers its calls and retries (Linkerd's `ttl`, 10 s).
pub const WINDOW_NS: i64 = 10_000_000_000;

/// One edge's budget. Times are nanoseconds from any fixed origin, never decreasing.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    min_per_second: f64,
    /// (when, calls, retries) per event still remembered, oldest first.
    recent: VecDeque<(i64, f64, f64)>,
    calls: f64,
    retries: f64,
}

impl RetryBudget {
    pub fn new(ratio: f64, min_per_second: f64) -> RetryBudget {
        RetryBudget {
            ratio,
            min_per_second,
            recent: VecDeque::new(),
            calls: 0.0,
            retries: 0.0,
        }
    }

    /// A call of weight `w` (the calls it stands for) made at `at`.
    pub fn call(&mut self, at: i64, w: f64) {
        self.forget_before(at);
        self.calls += w;
        self.recent.push_back((at, w, 0.0));
    }

    /// Take a retry of weight `w` at `at` from the budget; false when it does not cover it.
    pub fn retry(&mut self, at: i64, w: f64) -> bool {
        self.forget_before(at);
        let reserve = self.min_per_second * WINDOW_NS as f64 / 1e9;
        // The slack absorbs the sums' rounding (a budget of exactly one retry allows it).
        if reserve + self.ratio * self.calls - self.retries < w - 1e-9 {
            return false;
        }
        self.retries += w;
        self.recent.push_back((at, 0.0, w));
        true
    }

    fn forget_before(&mut self, at: i64) {
        while let Some(&(when, calls, retries)) = self.recent.front() {
            if when > at - WINDOW_NS {
                break;
            }
            self.calls -= calls;
            self.retries -= retries;
            self.recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten calls at 10% cover one retry, not two; a floor of 1/s is a reserve of ten
    /// retries over the window, on top of the deposits; both are forgotten after it.
    #[test]
    fn deposits_reserve_and_window() {
        let mut b = RetryBudget::new(0.1, 0.0);
        for _ in 0..9 {
            b.call(0, 1.0);
        }
        assert!(!b.retry(0, 1.0), "0.9 of a retry deposited");
        b.call(1, 1.0);
        assert!(b.retry(1, 1.0));
        assert!(!b.retry(1, 1.0));
        b.call(WINDOW_NS + 1, 1.0);
        assert!(
            !b.retry(WINDOW_NS + 1, 1.0),
            "the earlier deposits are forgotten"
        );
        let mut b = RetryBudget::new(0.1, 1.0);
        b.call(0, 1.0);
        assert_eq!((0..20).filter(|_| b.retry(0, 1.0)).count(), 10);
        assert!(
            b.retry(WINDOW_NS, 1.0),
            "the window's retries are forgotten"
        );
    }
}
