//! The request description: what a request asks of the engine (how many
//! units, whether it may wait for them), the one argument of the engine's
//! front door, `Table::admit` (`table/admission.rs`).
//!
//! Every front-end turns its methods into an [`Ask`]: `try_acquire` is a
//! fail-fast ask of one unit, `acquire_many(8)` a waiting ask of eight, a
//! pool's `call_with(ask, request)` whatever the caller built. An option
//! is a field of the ask, not a suffix on every method: the priority class
//! (`.class(c)`, `engine/class.rs`) is one, the tenant key (`.key(k)`,
//! `engine/keys/`) another, which every front-end that takes an `Ask`
//! gains at once.

use std::time::Instant;

use crate::engine::class::Class;

/// What a request asks for: how many units, and whether it waits for them.
///
/// Built by value (`Ask` is `Copy`) and handed to a front-end's `*_with`
/// method: [`Limiter::acquire_with`](crate::Limiter::acquire_with),
/// [`Supervisor::reserve_with`](crate::Supervisor::reserve_with),
/// [`Pool::call_with`](crate::Pool::call_with) and their siblings. The
/// convenient names (`try_acquire_many(n)`, `acquire_many(n)`) are the
/// same asks, spelled the way a tokio user looks for them.
///
/// | ask | units | waits |
/// |---|---|---|
/// | `Ask::new()` | 1 | as the front-end's waiting room says (none: fail fast) |
/// | `.units(n)` | `n` | unchanged |
/// | `.fail_fast()` | unchanged | never: `Overload` at once when the units are not free |
/// | `.wait_until(deadline)` | unchanged | in the waiting room, until `deadline` at the latest (and the room's `max_wait`) |
///
/// A waiting ask waits only in a front-end that has a waiting room
/// (`max_waiters` above 0); without one it fails fast, as `acquire` does.
///
/// `.class(c)` sets its [`Class`]: the share of the capacity its units may
/// take and its place in a waiting room; `.key(k)` its tenant, whose cap
/// and fair share its units count against. The fields are private, so a
/// later option is one more builder method, and code written against
/// this version keeps compiling.
///
/// # Examples
///
/// ```
/// use sidejob::{units::Ask, Error, Limiter};
///
/// let limiter = Limiter::new(8)?;
/// let upload = limiter.acquire_with(Ask::new().units(6).fail_fast())?;
/// assert_eq!(upload.units(), 6);
/// // Two are left: a fail-fast ask of three is refused at once.
/// let third = limiter.acquire_with(Ask::new().units(3).fail_fast());
/// assert_eq!(third.unwrap_err(), Error::Overload);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// How many units, all or nothing.
    pub(crate) units: usize,
    /// How the units are taken.
    pub(crate) how: How,
    /// How important it is: which headroom its units are taken under,
    /// and where it stands in a waiting room.
    pub(crate) class: Class,
    /// Its tenant key's id (`engine/keys/`), or 0 for none.
    pub(crate) key: u64,
}

/// How an ask takes its units. The first two are what users build; the
/// rest are the crate's own front-ends' needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// From the caller's home shard, never waiting; an `Overload` is
    /// counted.
    Try,
    /// From the caller's home shard, then waiting in the waiting room (if
    /// the front-end has one) until `deadline` (if any; `max_wait` bounds
    /// it too).
    Wait(Option<Instant>),
    /// From shard `start` (taken modulo the shard count), never waiting:
    /// the model tests' seam for a caller on a chosen shard.
    #[cfg_attr(not(test), allow(dead_code))]
    At(usize),
    /// The caller's home shard, whatever its limit (the pool's
    /// `*_unbounded` requests); refused only once closed. One unit.
    Unbounded,
    /// As `Try`, but an `Overload` is not counted: the caller waits next
    /// (in an async wait, which counts its own outcome).
    Probe,
}

impl Ask {
    /// One unit, waiting as the front-end's waiting room says: what
    /// `acquire`, `call` and `reserve` ask for.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::units::Ask;
    ///
    /// let ask = Ask::new();
    /// assert_eq!((ask.unit_count(), ask.is_fail_fast(), ask.deadline()), (1, false, None));
    /// ```
    pub const fn new() -> Ask {
        Ask {
            units: 1,
            how: How::Wait(None),
            class: Class::Critical,
            key: 0,
        }
    }

    /// Asks for `n` units, all or nothing. `0` asks for nothing (a permit
    /// of no units, where the front-end allows one); more than the
    /// capacity in force is refused with [`Error::TooLarge`](crate::Error::TooLarge),
    /// never a wait that cannot end.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Limiter};
    ///
    /// let limiter = Limiter::new(16)?;
    /// let job = limiter.acquire_with(Ask::new().units(4))?; // 4 of 16 cores
    /// assert_eq!(limiter.available(), 12);
    /// # drop(job);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn units(mut self, n: usize) -> Ask {
        self.units = n;
        self
    }

    /// Never waits: [`Error::Overload`](crate::Error::Overload) at once
    /// when the units are not free, whatever the front-end's waiting room.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(1).max_waiters(8).build()?;
    /// let _held = limiter.try_acquire()?;
    /// let refused = limiter.acquire_with(Ask::new().fail_fast());
    /// assert_eq!(refused.unwrap_err(), Error::Overload);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn fail_fast(mut self) -> Ask {
        self.how = How::Try;
        self
    }

    /// Waits in the front-end's waiting room until `deadline` at the
    /// latest (its `max_wait` still bounds the wait): then
    /// [`Error::Timeout`](crate::Error::Timeout). A deadline already
    /// past still tries once, without waiting.
    ///
    /// A deadline, not a duration, so that an ask built once and used
    /// for several requests means one instant for all of them; build it
    /// with `Instant::now() + duration` where a duration is meant.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use sidejob::{units::Ask, Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(1).max_waiters(8).build()?;
    /// let _held = limiter.try_acquire()?;
    /// let soon = Instant::now() + Duration::from_millis(5);
    /// let late = limiter.acquire_with(Ask::new().wait_until(soon));
    /// assert_eq!(late.unwrap_err(), Error::Timeout);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn wait_until(mut self, deadline: Instant) -> Ask {
        self.how = How::Wait(Some(deadline));
        self
    }

    /// Of class `class` (default [`Class::Critical`]): the fraction of the
    /// capacity its units may fill, and its place in a waiting room (a
    /// freed unit goes to the most important class waiting). See
    /// [`Class`].
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Class, Error, Limiter};
    ///
    /// let limiter = Limiter::builder()
    ///     .capacity(10)
    ///     .headroom(Class::Sheddable, 0.5)
    ///     .build()?;
    /// let prefetch = Ask::new().class(Class::Sheddable).units(5).fail_fast();
    /// let held = limiter.acquire_with(prefetch)?;
    /// // Half the capacity is held: no more for the sheddable class...
    /// let more = limiter.acquire_with(Ask::new().class(Class::Sheddable).fail_fast());
    /// assert_eq!(more.unwrap_err(), Error::Overload);
    /// // ...while the default class still has the other half.
    /// let checkout = limiter.acquire_with(Ask::new().units(5).fail_fast())?;
    /// # drop((held, checkout));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn class(mut self, class: Class) -> Ask {
        self.class = class;
        self
    }

    /// For tenant `key` (a tenant's name or id, a path segment: anything
    /// `Hash`): its units count to the key, against the key's cap, and,
    /// while the capacity binds, against its fair share, `capacity ×
    /// weight / the weight of the keys holding units` (the guide's
    /// "Fair shares"). A key's weight and cap are the front-end's
    /// settings (`key_weight`, `key_cap`, `per_key_cap`).
    ///
    /// The key is hashed here, once, and known by its 64-bit hash from
    /// then on: its cost is its `Hash`'s (a 1 MB string is read once),
    /// nothing of it is kept, and two keys of one hash are one key. So a
    /// tenant is the same tenant wherever its key has the same `Hash`: a
    /// `&str` and a `String` are one tenant, a `&[u8]` of the same bytes
    /// another (its `Hash` differs): name a tenant the same way in its
    /// asks and in the front-end's `key_weight` and `key_cap`.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(8).per_key_cap(2).build()?;
    /// let a = limiter.acquire_with(Ask::new().key("tenant-a").units(2).fail_fast())?;
    /// // Tenant a has its cap; tenant b has its own.
    /// let more = limiter.acquire_with(Ask::new().key("tenant-a").fail_fast());
    /// assert_eq!(more.unwrap_err(), Error::KeyBusy);
    /// let b = limiter.acquire_with(Ask::new().key("tenant-b").fail_fast())?;
    /// # drop((a, b));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn key<K: std::hash::Hash + ?Sized>(mut self, key: &K) -> Ask {
        self.key = crate::engine::keys::id_of(key);
        self
    }

    /// Whether it has a tenant key.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::units::Ask;
    ///
    /// assert!(Ask::new().key(&42_u64).is_keyed());
    /// assert!(!Ask::new().is_keyed());
    /// ```
    pub const fn is_keyed(&self) -> bool {
        self.key != 0
    }

    /// Its class.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Class};
    ///
    /// assert_eq!(Ask::new().class_of(), Class::Critical);
    /// assert_eq!(Ask::new().class(Class::Sheddable).class_of(), Class::Sheddable);
    /// ```
    pub const fn class_of(&self) -> Class {
        self.class
    }

    /// How many units it asks for.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::units::Ask;
    ///
    /// assert_eq!(Ask::new().units(3).unit_count(), 3);
    /// ```
    pub const fn unit_count(&self) -> usize {
        self.units
    }

    /// Whether it never waits.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::units::Ask;
    ///
    /// assert!(Ask::new().fail_fast().is_fail_fast());
    /// assert!(!Ask::new().is_fail_fast());
    /// ```
    pub const fn is_fail_fast(&self) -> bool {
        !matches!(self.how, How::Wait(_))
    }

    /// The instant its wait ends at the latest, if it has one of its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Instant;
    /// use sidejob::units::Ask;
    ///
    /// let now = Instant::now();
    /// assert_eq!(Ask::new().wait_until(now).deadline(), Some(now));
    /// assert_eq!(Ask::new().fail_fast().deadline(), None);
    /// ```
    pub const fn deadline(&self) -> Option<Instant> {
        match self.how {
            How::Wait(deadline) => deadline,
            _ => None,
        }
    }

    /// Whether it is the hot path's ask: one unit of the default class.
    #[inline(always)]
    pub(crate) const fn is_one(&self) -> bool {
        self.units == 1 && matches!(self.class, Class::Critical) && self.key == 0
    }
}

impl Default for Ask {
    /// [`Ask::new`]: one unit, waiting as the front-end says.
    fn default() -> Ask {
        Ask::new()
    }
}
