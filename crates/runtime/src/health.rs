//! Health of the collector's own tasks (assembly's release loop, the analysis), for
//! `/healthz` and `stormglass_internal_errors_total{task}`.
//!
//! A task that panics or fails is caught where it runs, counted here and marked failing;
//! `/healthz` answers 503 naming it until the task completes a round of work again. A task
//! that keeps failing therefore keeps `/healthz` failing, and one that recovers clears it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus::{IntCounterVec, Opts, Registry};

/// An error and every source under it, as one line: `error: cause: cause`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The tasks that report their health.
pub const TASKS: [&str; 3] = ["assembly", "analysis", "archive"];

/// Shared health state. Cheap to clone.
#[derive(Clone)]
pub struct Health {
    errors: IntCounterVec,
    failing: Arc<Mutex<BTreeMap<&'static str, String>>>,
}

impl Health {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let errors = IntCounterVec::new(
            Opts::new(
                "stormglass_internal_errors_total",
                "Panics and errors caught inside the collector's own tasks; each turns /healthz failing until the task works again.",
            ),
            &["task"],
        )?;
        registry.register(Box::new(errors.clone()))?;
        for task in TASKS {
            errors.with_label_values(&[task]);
        }
        Ok(Health {
            errors,
            failing: Arc::new(Mutex::new(BTreeMap::new())),
        })
    }

    pub fn unregistered() -> Self {
        match Self::register(&Registry::new()) {
            Ok(h) => h,
            Err(e) => unreachable!("a fresh registry has no conflicting metrics: {e}"),
        }
    }

    /// `task` failed: count it, log it, and fail `/healthz` until it recovers.
    pub fn failed(&self, task: &'static str, detail: &str) {
        self.errors.with_label_values(&[task]).inc();
        tracing::error!(
            task,
            detail,
            "internal error; /healthz fails until the task recovers"
        );
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(task, detail.to_owned());
    }

    /// `task` completed a round of work.
    pub fn ok(&self, task: &'static str) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing.remove(task).is_some() {
            tracing::info!(task, "task recovered");
        }
    }

    /// Failing tasks and why, empty when healthy.
    pub fn failing(&self) -> Vec<(&'static str, String)> {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(t, d)| (*t, d.clone()))
            .collect()
    }
}

/// The message of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure is counted and reported until the task reports success.
    #[test]
    fn failing_until_recovered() {
        let health = Health::unregistered();
        assert!(health.failing().is_empty());
        health.failed("analysis", "panic: boom");
        assert_eq!(
            health.failing(),
            vec![("analysis", "panic: boom".to_owned())]
        );
        assert_eq!(health.errors.with_label_values(&["analysis"]).get(), 1);
        health.ok("analysis");
        assert!(health.failing().is_empty());
    }
}
