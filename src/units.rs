//! Units: what a request asks for ([`Ask`], the request description every
//! front-end's `*_with` method takes) and how many units a permit holds
//! ([`One`], the hot path's, a marker of no size; or [`Many`], any number,
//! on one shard or several).
//!
//! A permit is generic over it (`Permit<'a, U = One>`), so the permit of
//! [`Limiter::try_acquire`](crate::Limiter::try_acquire) is exactly what
//! it was before permits had units: two references, given back by the
//! one-unit release. A permit of [`Limiter::try_acquire_many`](crate::Limiter::try_acquire_many)
//! carries a box that says where its units are; [`Permit::split`](crate::Permit::split)
//! and [`Permit::merge`](crate::Permit::merge) move units between such
//! permits, and a one-unit permit becomes one with
//! [`Permit::into_many`](crate::Permit::into_many).
//!
//! Why two types and not a count in every permit: a count (or a pointer
//! to check) in the one-unit permit cost its admission and release 9 more
//! instructions (61 to 70 in `scripts/hot-path-instructions.sh`), because
//! the permit's drop grew past what the compiler inlines.

use std::fmt;

pub use crate::engine::ask::Ask;

use crate::engine::class::Class;
use crate::engine::table::{Grant, Part, Shard, Table};
use crate::sync::os_thread;

/// How many units a permit holds: [`One`] or [`Many`]. Sealed: the crate
/// implements it for those two alone.
pub trait Units: sealed::Sealed + Send + Sync + fmt::Debug + 'static {}

// The sealed trait's methods name the engine's crate-private types: users
// can name `Sealed` through `Units`' bounds but neither implement it (its
// module is private) nor call its methods on anything but `One` and `Many`,
// whose arguments they cannot make.
#[allow(private_interfaces)]
pub(crate) mod sealed {
    use super::{Grant, Shard, Table};

    /// What a permit asks of its units. Crate-private methods of the
    /// public [`Units`](super::Units).
    pub trait Sealed {
        /// True for [`One`](super::One): a permit of it holds no heap,
        /// so taking its grant leaves nothing to drop.
        const ONE: bool;

        /// How many units are held.
        fn count(&self) -> usize;

        /// Gives every unit back to `table`, the first of them being on
        /// `shard`; asks whether the thread panics only once they are.
        fn release(&mut self, table: &Table, shard: &Shard);

        /// The units as a grant whose first shard is `shard`. For
        /// [`Many`](super::Many) it leaves none behind; a one-unit permit's
        /// holder must forget the permit after it (`ONE`).
        fn take(&mut self, shard: usize) -> Grant;
    }
}

/// One unit: the permit of [`Limiter::try_acquire`](crate::Limiter::try_acquire)
/// and its siblings. No size: the permit is two references.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct One;

impl Units for One {}

#[allow(private_interfaces)]
impl sealed::Sealed for One {
    const ONE: bool = true;

    #[inline(always)]
    fn count(&self) -> usize {
        1
    }

    #[inline(always)]
    fn release(&mut self, table: &Table, shard: &Shard) {
        // `panicking` is asked only once the unit is back (`release_shard`):
        // std's answer has a slow path, a call, that made every release
        // save and restore registers when it was asked first.
        table.release_shard(shard, os_thread::panicking);
    }

    fn take(&mut self, shard: usize) -> Grant {
        Grant::one(shard)
    }
}

/// Any number of units (none included), on one shard or several: the
/// permit of [`Limiter::try_acquire_many`](crate::Limiter::try_acquire_many)
/// and its siblings, or of [`Permit::into_many`](crate::Permit::into_many).
/// Units on the permit's own shard are a count; only units on other
/// shards (a take wider than one shard, a merge) are in a `Vec`, so a
/// permit of `n` units from one shard allocates nothing.
pub struct Many {
    /// Units on the permit's shard.
    pub(crate) here: usize,
    /// Units on other shards, one part a shard.
    pub(crate) rest: Vec<Part>,
    /// The class they were admitted to, if the limiter counts its units
    /// (it has a min share; else `Critical`): a gated class's units are
    /// counted out of its holdings when they are given back.
    pub(crate) class: Class,
    /// The tenant key they are counted to, or 0: they are counted out of
    /// its units when they are given back.
    pub(crate) key: u64,
}

impl Many {
    pub(crate) fn from_grant(grant: Grant) -> (usize, Many) {
        let Grant {
            shard,
            here,
            rest,
            class,
            key,
        } = grant;
        (
            shard,
            Many {
                here,
                rest,
                class,
                key,
            },
        )
    }

    /// Counts its units out of its gated class's holdings and its key's,
    /// as its give-back starts (`Table::release_class`,
    /// `Table::release_key`). Out of line: the default class's unkeyed
    /// permits never come here.
    #[cold]
    #[inline(never)]
    fn release_counted(&mut self, table: &Table) {
        use sealed::Sealed;
        let n = self.count();
        table.release_class(self.class, n);
        table.release_key(std::mem::take(&mut self.key), n);
    }

    /// Gives back the units on other shards: out of line, a permit of
    /// units from one shard never comes here.
    #[cold]
    #[inline(never)]
    fn release_rest(&mut self, table: &Table, panicked: bool) {
        for part in std::mem::take(&mut self.rest) {
            table.release_units(part.shard, part.units, panicked);
        }
    }
}

impl fmt::Debug for Many {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use sealed::Sealed;
        f.debug_struct("Many")
            .field("units", &self.count())
            .finish()
    }
}

impl Units for Many {}

#[allow(private_interfaces)]
impl sealed::Sealed for Many {
    const ONE: bool = false;

    fn count(&self) -> usize {
        // A permit of one shard's units (the common one) sums no parts.
        if self.rest.is_empty() {
            self.here
        } else {
            self.here + self.rest.iter().map(|p| p.units).sum::<usize>()
        }
    }

    #[inline]
    fn release(&mut self, table: &Table, shard: &Shard) {
        if self.class.gate().is_some() || self.key != 0 {
            self.release_counted(table);
        }
        if !self.rest.is_empty() {
            self.release_rest(table, os_thread::panicking());
        }
        let here = std::mem::take(&mut self.here);
        if here > 0 {
            table.release_run(shard, here, os_thread::panicking);
        }
    }

    fn take(&mut self, shard: usize) -> Grant {
        Grant {
            shard,
            here: std::mem::take(&mut self.here),
            rest: std::mem::take(&mut self.rest),
            class: self.class,
            key: std::mem::take(&mut self.key),
        }
    }
}
