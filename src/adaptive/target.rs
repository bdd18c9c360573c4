//! [`Target`]: a front-end whose capacity a controller moves.

use super::Feed;
use crate::engine::table::MAX_CAPACITY;
use crate::error::ConfigError;
use crate::stats::Stats;

/// A front-end whose capacity a [`Controller`](super::Controller) moves:
/// implemented for `Arc<Limiter>`, [`Pool`](crate::Pool), `AsyncPool` (feature
/// `tokio`) and [`Supervisor`](crate::Supervisor) (handles), and for any type of yours that has a capacity to set.
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

    /// The largest capacity [`set_capacity`](Self::set_capacity) takes.
    /// A controller's ceiling is checked against it when the controller
    /// is built (its default ceiling is kept under it), so no tick asks
    /// for a limit the front-end refuses. The default: the largest
    /// capacity of any front-end (2^60 - 1 on 64-bit targets); a
    /// [`Supervisor`](crate::Supervisor) answers its `max_capacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::adaptive::Target;
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(4).max_capacity(64).build()?;
    /// assert_eq!(Target::max_capacity(&sup), 64);
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    fn max_capacity(&self) -> usize {
        MAX_CAPACITY
    }

    /// Takes `feed` to time its own requests from now on, where it sees
    /// each one's life (see [`Controller::attach`](super::Controller::attach));
    /// true if it does. The default: false, the front-end does not.
    fn attach(&self, feed: Feed) -> bool {
        drop(feed);
        false
    }
}
