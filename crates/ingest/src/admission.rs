//! Admission: the checks a request passes before it is read and decoded, so that an
//! overloaded collector refuses cheaply instead of doing the expensive work first.
//!
//! Order, cheapest first: the bearer token when `auth.token` is set, a request slot (at most `limits.max_concurrent_requests` requests
//! are read, decoded and stored at once), then a reservation against the memory budget
//! sized from the request's length on the wire ([`estimate`]), taken from HTTP's
//! `Content-Length` before the body is read, or from the gRPC body once received (gRPC
//! sends no length up front; the read is bounded by `limits.max_request_bytes` and by the
//! request slots). Both refusals are retryable (`UNAVAILABLE` with `RetryInfo`, HTTP 503
//! with `Retry-After`). The reservation lives until the request's spans are stored by
//! assembly, which then holds them under a reservation of their own.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::IngestError;
use stormglass_runtime::Overload;
use stormglass_runtime::auth::BearerToken;
use stormglass_runtime::budget::{MemoryBudget, Reservation};

/// How long a client refused for memory or concurrency should wait: about how long the
/// analysis takes to free a chunk's worth of memory.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// `limits.request_timeout`'s default: time for a request's body to arrive.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Decoded protobuf messages plus the Arrow batch built from them, per byte of request.
const DECODED_PER_BYTE: usize = 3;
/// How much OTLP shrinks under gzip or zstd, for estimating a compressed request.
const COMPRESSION_RATIO: usize = 8;

/// The admission checks shared by both receivers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Admission {
    budget: MemoryBudget,
    slots: Arc<Semaphore>,
    max_request_bytes: usize,
    token: Option<BearerToken>,
    body_timeout: Duration,
}

/// A request let in: its slot and, once sized, its memory reservation. Dropping it (when
/// the answer is sent) frees both.
#[derive(Debug)]
pub struct Admitted {
    _slot: OwnedSemaphorePermit,
    reservation: Option<Reservation>,
}

impl Admitted {
    /// True once the request's memory is reserved.
    pub fn sized(&self) -> bool {
        self.reservation.is_some()
    }
}

impl Admission {
    pub fn new(
        budget: MemoryBudget,
        max_concurrent_requests: usize,
        max_request_bytes: usize,
    ) -> Self {
        Admission {
            budget,
            slots: Arc::new(Semaphore::new(max_concurrent_requests)),
            max_request_bytes,
            token: None,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }

    /// Refuse a request whose body takes longer than `timeout` to arrive
    /// (`limits.request_timeout`): a slow or stalled client must not hold a request slot.
    pub fn with_body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// Read a request body within `limits.request_timeout`, or refuse it.
    pub async fn read_body<T>(
        &self,
        read: impl std::future::Future<Output = Result<T, IngestError>>,
    ) -> Result<T, IngestError> {
        tokio::time::timeout(self.body_timeout, read)
            .await
            .unwrap_or(Err(IngestError::Timeout {
                limit: self.body_timeout,
            }))
    }

    /// Require `token` (`auth.token`) on every request.
    pub fn with_token(mut self, token: Option<BearerToken>) -> Self {
        self.token = token;
        self
    }

    /// The first check, before a slot is taken: the bearer token when one is required.
    pub fn authenticate(
        &self,
        authorization: Option<&axum::http::HeaderValue>,
    ) -> Result<(), IngestError> {
        match &self.token {
            Some(token) if !token.admits(authorization) => Err(IngestError::Unauthenticated),
            _ => Ok(()),
        }
    }

    pub fn max_request_bytes(&self) -> usize {
        self.max_request_bytes
    }

    /// Take a request slot, or refuse when every slot is busy.
    pub fn enter(&self) -> Result<Admitted, IngestError> {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => Ok(Admitted {
                _slot: slot,
                reservation: None,
            }),
            Err(_) => Err(IngestError::Overloaded {
                retry_after: RETRY_AFTER,
                limit: Overload::Concurrency,
            }),
        }
    }

    /// Reserve the memory a request of `wire_bytes` will take, or refuse it whole.
    pub fn reserve(
        &self,
        admitted: &mut Admitted,
        wire_bytes: usize,
        compressed: bool,
    ) -> Result<(), IngestError> {
        let bytes = estimate(
            wire_bytes,
            compressed,
            self.max_request_bytes,
            self.budget.limit() / 4,
        );
        match self.budget.try_reserve(bytes) {
            Ok(reservation) => {
                admitted.reservation = Some(reservation);
                Ok(())
            }
            Err(_) => Err(IngestError::Overloaded {
                retry_after: RETRY_AFTER,
                limit: Overload::Memory,
            }),
        }
    }
}

/// Memory a request takes while it is decoded and encoded, from its size on the wire: the
/// decompressed size (compressed bodies are assumed to shrink [`COMPRESSION_RATIO`] times,
/// and none may exceed `max_request_bytes`) times [`DECODED_PER_BYTE`]. Capped at `cap` (a
/// quarter of the budget), so that a lone request always fits an idle collector.
pub fn estimate(
    wire_bytes: usize,
    compressed: bool,
    max_request_bytes: usize,
    cap: usize,
) -> usize {
    let raw = if compressed {
        wire_bytes.saturating_mul(COMPRESSION_RATIO)
    } else {
        wire_bytes
    };
    raw.min(max_request_bytes)
        .saturating_mul(DECODED_PER_BYTE)
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots and memory both refuse with retryable errors naming their limit, and free
    /// themselves when the request is done.
    #[test]
    fn slots_and_memory_bound_requests() {
        let budget = MemoryBudget::unregistered(4000);
        let admission = Admission::new(budget.clone(), 1, 1000);
        let mut first = admission.enter().expect("a free slot");
        let busy = admission.enter().expect_err("one slot");
        assert_eq!(busy.reason(), "concurrency");
        admission
            .reserve(&mut first, 300, false)
            .expect("900 of 3000");
        assert_eq!(budget.used(), 900);
        drop(first);
        assert_eq!(budget.used(), 0);
        let mut second = admission.enter().expect("the slot is free again");
        assert!(!second.sized());
        let _hog = budget.try_reserve(2500).expect("fits");
        let refused = admission
            .reserve(&mut second, 300, false)
            .expect_err("over");
        assert_eq!(refused.reason(), "memory_limit");
    }

    /// Compressed requests are sized as decompressed, and no estimate passes the caps.
    #[test]
    fn estimates() {
        assert_eq!(estimate(100, false, 1 << 20, usize::MAX), 300);
        assert_eq!(estimate(100, true, 1 << 20, usize::MAX), 2400);
        assert_eq!(estimate(1 << 20, true, 1 << 20, usize::MAX), 3 << 20);
        assert_eq!(estimate(1 << 20, false, 1 << 20, 1000), 1000);
    }
}
