//! Time for balancers whose rule has a period (`smg_cache_aware`'s tree eviction). The
//! controller's loop calls the balancer, so time is read at decision time from a [`Clock`]
//! the balancer owns: the monotonic clock in the process, a [`ManualClock`] in tests, which
//! keeps decisions a pure function of their inputs and the clock's readings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time elapsed since some fixed origin; never decreasing.
pub trait Clock: Send {
    fn now(&self) -> Duration;
}

/// The process's monotonic clock, from when it was made.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock a test moves by hand; clones share one reading.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed))
    }
}
