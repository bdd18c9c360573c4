//! The one module that names threads, locks and the clock.
//!
//! As in the core crate, every other module imports these through
//! `crate::sync`, so what the keeper blocks on is listed in one place.

pub(crate) use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
pub(crate) use std::sync::{Arc, Weak};
pub(crate) use std::thread;
pub(crate) use std::time::Instant;

use std::sync::{Condvar as StdCondvar, Mutex as StdMutex, MutexGuard, PoisonError};
use std::time::Duration;

/// A mutex whose `lock` ignores poisoning: the keeper's state stays valid
/// even if a user callback panicked while holding it.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(StdMutex<T>);

impl<T> Mutex<T> {
    pub(crate) const fn new(value: T) -> Self {
        Mutex(StdMutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A condition variable over [`Mutex`].
#[derive(Debug, Default)]
pub(crate) struct Condvar(StdCondvar);

impl Condvar {
    pub(crate) fn new() -> Self {
        Condvar(StdCondvar::new())
    }

    pub(crate) fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> MutexGuard<'a, T> {
        match self.0.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}
