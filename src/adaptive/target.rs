//! [`Target`]: a front-end whose capacity a controller moves.

use super::Feed;
use crate::error::ConfigError;
use crate::pool::worker::Worker;
use crate::stats::Stats;
use crate::supervisor::Supervisor;
use crate::sync::Arc;
use crate::{Limiter, Pool};

/// A front-end whose capacity a [`Controller`](super::Controller) moves:
/// implemented for `Arc<Limiter>`, [`Pool`], `AsyncPool` (feature
/// `tokio`) and [`Supervisor`] (handles), and for any type of yours that has a capacity to set.
///
/// The controller reads [`stats`](Self::stats) once per tick (its
/// `completed`, `rejected`, `waited` and `usage`) and calls
/// [`set_capacity`](Self::set_capacity) only when the limit changes.
/// Neither runs under a lock of the controller's.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use sidejob::adaptive::Target;
/// use sidejob::Limiter;
///
/// let limiter = Arc::new(Limiter::new(4)?);
/// Target::set_capacity(&limiter, 6)?;
/// assert_eq!(Target::capacity(&limiter), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Target: Send + Sync + 'static {
    /// Moves the capacity.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if the front-end cannot take `capacity`; the
    /// controller keeps the limit it had.
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError>;

    /// The capacity in force.
    fn capacity(&self) -> usize;

    /// The front-end's counters.
    fn stats(&self) -> Stats;

    /// Takes `feed` to time its own requests from now on, where it sees
    /// each one's life (see [`Controller::attach`](super::Controller::attach));
    /// true if it does. The default: false, the front-end does not.
    fn attach(&self, feed: Feed) -> bool {
        drop(feed);
        false
    }
}

impl Target for Arc<Limiter> {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        Limiter::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        Limiter::capacity(self)
    }

    fn stats(&self) -> Stats {
        Limiter::stats(self)
    }
}

/// The controller holds a handle: the pool lives (is not shut down by the
/// drop of its other handles) as long as the controller does.
impl<W: Worker> Target for Pool<W> {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        Pool::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        Pool::capacity(self)
    }

    fn stats(&self) -> Stats {
        Pool::stats(self)
    }

    /// Its workers time each handler.
    fn attach(&self, feed: Feed) -> bool {
        self.feed_slot().set(feed).is_ok()
    }
}

/// The controller holds a handle: the pool lives as long as the
/// controller does.
#[cfg(feature = "tokio")]
impl<W: crate::AsyncWorker> Target for crate::AsyncPool<W> {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        crate::AsyncPool::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        crate::AsyncPool::capacity(self)
    }

    fn stats(&self) -> Stats {
        crate::AsyncPool::stats(self)
    }

    /// Its worker tasks time each handler (its future, from creation to
    /// its end, waits included).
    fn attach(&self, feed: Feed) -> bool {
        self.feed_slot().set(feed).is_ok()
    }
}

impl Target for Supervisor {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        Supervisor::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        Supervisor::capacity(self)
    }

    fn stats(&self) -> Stats {
        Supervisor::stats(self)
    }

    /// Its children time themselves: a thread from
    /// [`spawn`](Supervisor::spawn) from the start of its closure to its
    /// return, a task from `spawn_task` and its kin (feature `tokio`) from
    /// its first poll to its output. A panicked or aborted child records
    /// nothing. (A thread child draws on its new thread, whose first draw
    /// is always a sample: every thread child is timed, two clock reads
    /// beside a thread's start; tasks are sampled one in `sample_every`.) Guards from [`reserve`](Supervisor::reserve) are not
    /// timed: wrap them in [`Controller::timed`](super::Controller::timed).
    fn attach(&self, feed: Feed) -> bool {
        self.feed_slot().set(feed).is_ok()
    }
}
