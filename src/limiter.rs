//! [`Limiter`]: the bare admission table, handing out permits for work done
//! on the caller's own thread.

use std::fmt;

use crate::error::{ConfigError, Error};
use crate::probe::Probe;
use crate::stats::Stats;
use crate::sync::{os_thread, Arc};
use crate::table::Table;

/// A fail-fast, sharded concurrency limit: at most `capacity` permits are
/// out at once, and the next [`try_acquire`](Limiter::try_acquire) is
/// refused with [`Error::Overload`] at once.
///
/// There is no waiting: a `Limiter` answers "yes, go" or "no, shed this",
/// in a few nanoseconds, from any number of threads. Capacity is split
/// across shards (by default one per CPU), each a counter on its own cache
/// line; a caller starts at its own shard and moves on only if that one is
/// full, so callers on different cores do not contend. The split is exact:
/// the shard limits add up to `capacity`, and a permit is refused only when
/// every shard is at its limit.
///
/// # Memory ordering
///
/// Dropping a permit *synchronizes with* a later `try_acquire` that is
/// admitted on the same shard: everything the holder did before the drop
/// happens-before everything the next holder does. Permits on different
/// shards are not ordered with each other; use your own synchronization if
/// you need that.
///
/// # Examples
///
/// Limit the number of requests being handled at the same time, shedding
/// the rest:
///
/// ```
/// use std::sync::Arc;
/// use std::thread;
/// use sidejob::{Error, Limiter};
///
/// let limiter = Arc::new(Limiter::new(4)?);
/// let handles: Vec<_> = (0..8)
///     .map(|_| {
///         let limiter = Arc::clone(&limiter);
///         thread::spawn(move || match limiter.try_acquire() {
///             Ok(_permit) => true,               // handle the request here
///             Err(Error::Overload) => false,     // shed it: answer "busy"
///             Err(other) => panic!("{other}"),
///         })
///     })
///     .collect();
/// let served = handles.into_iter().map(|h| h.join().unwrap()).filter(|&ok| ok).count();
/// // At least one thread always gets in; never more than 4 at once.
/// assert!(served >= 1);
/// assert_eq!(limiter.usage(), 0);
/// let stats = limiter.stats();
/// assert_eq!(stats.accepted + stats.rejected, 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Limiter {
    table: Table,
}

impl Limiter {
    /// A limiter of `capacity` permits over one shard per CPU.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is 0 or absurdly large.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = sidejob::Limiter::new(100)?;
    /// assert_eq!(limiter.capacity(), 100);
    /// assert!(sidejob::Limiter::new(0).is_err());
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn new(capacity: usize) -> Result<Limiter, ConfigError> {
        Limiter::builder().capacity(capacity).build()
    }

    /// A builder, to choose the shard count or the [`Probe`].
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// Takes a permit if any shard has room; never waits.
    ///
    /// The permit is given back when it is dropped, on every path
    /// (unwinding included; a permit dropped while its thread panics is
    /// counted in [`Stats::panicked`]).
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when every shard is at its limit; the refusal is
    /// counted in [`Stats::rejected`].
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::new(1)?;
    /// let permit = limiter.try_acquire()?;
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    /// drop(permit);
    /// assert!(limiter.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_>, Error> {
        let shard = self.table.acquire()?;
        Ok(Permit {
            limiter: self,
            shard,
        })
    }

    /// Like [`try_acquire`](Self::try_acquire), but the permit owns a clone
    /// of the `Arc`, so it can move into another thread or task.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when every shard is at its limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    ///
    /// let limiter = Arc::new(Limiter::new(2)?);
    /// let permit = limiter.try_acquire_owned()?;
    /// let worker = std::thread::spawn(move || {
    ///     let _permit = permit; // released when this thread is done
    /// });
    /// worker.join().unwrap();
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Result<OwnedPermit, Error> {
        let shard = self.table.acquire()?;
        Ok(OwnedPermit {
            limiter: Arc::clone(self),
            shard,
        })
    }

    /// Permits out now.
    pub fn usage(&self) -> usize {
        self.table.usage()
    }

    /// The most permits that can be out at once.
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// How many shards the capacity is split over (at most `capacity`).
    pub fn shards(&self) -> usize {
        self.table.shard_count()
    }

    /// A snapshot of the counters; see [`Stats`].
    pub fn stats(&self) -> Stats {
        self.table.stats()
    }

    /// Takes a unit and returns its shard, for a guard kept elsewhere (the
    /// tower layer's), which must give it back with [`release`](Self::release).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn take_unit(&self) -> Result<usize, Error> {
        self.table.acquire()
    }

    // Inline: a permit's drop is half of the hot path, and it is called from
    // the user's crate, where it would otherwise be a call through the GOT.
    #[inline]
    pub(crate) fn release(&self, shard: usize) {
        self.table.release(shard, os_thread::panicking());
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .field("usage", &self.usage())
            .finish()
    }
}

/// Configures a [`Limiter`]; made by [`Limiter::builder`].
///
/// # Examples
///
/// ```
/// use sidejob::Limiter;
///
/// let limiter = Limiter::builder().capacity(10).shards(4).build()?;
/// assert_eq!((limiter.capacity(), limiter.shards()), (10, 4));
///
/// // More shards than capacity: only `capacity` shards are kept.
/// let small = Limiter::builder().capacity(2).shards(8).build()?;
/// assert_eq!(small.shards(), 2);
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct LimiterBuilder {
    capacity: Option<usize>,
    shards: Option<usize>,
    probe: Probe,
}

impl LimiterBuilder {
    /// How many permits may be out at once. Required; at least 1.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// How many shards to split the capacity over. Defaults to the number
    /// of CPUs; more shards than `capacity` are trimmed to `capacity`.
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.shards = Some(shards);
        self
    }

    /// Where a caller starts probing; see [`Probe`].
    pub fn probe(&mut self, probe: Probe) -> &mut Self {
        self.probe = probe;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or too
    /// large, or `shards` is 0 or too large.
    pub fn build(&self) -> Result<Limiter, ConfigError> {
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        let shards = self.shards.unwrap_or_else(num_cpus::get);
        Ok(Limiter {
            table: Table::new(capacity, shards, self.probe)?,
        })
    }
}

/// A unit of a [`Limiter`]'s capacity, given back on drop.
///
/// Made by [`Limiter::try_acquire`]. Hold it for as long as the guarded
/// work runs.
#[must_use = "the permit is released as soon as it is dropped"]
#[clippy::has_significant_drop]
pub struct Permit<'a> {
    limiter: &'a Limiter,
    shard: usize,
}

impl Permit<'_> {
    /// The shard this permit was taken from.
    pub fn shard(&self) -> usize {
        self.shard
    }
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.limiter.release(self.shard);
    }
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("shard", &self.shard)
            .finish()
    }
}

/// A unit of a [`Limiter`]'s capacity that owns an `Arc` of it, so it is
/// `'static` and can move to another thread or task. Given back on drop.
///
/// Made by [`Limiter::try_acquire_owned`].
#[must_use = "the permit is released as soon as it is dropped"]
#[clippy::has_significant_drop]
pub struct OwnedPermit {
    limiter: Arc<Limiter>,
    shard: usize,
}

impl OwnedPermit {
    /// The shard this permit was taken from.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// The limiter this permit belongs to.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }
}

impl Drop for OwnedPermit {
    #[inline]
    fn drop(&mut self) {
        self.limiter.release(self.shard);
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("shard", &self.shard)
            .finish()
    }
}
