//! A unit held by the work it admitted: given back exactly once, by its
//! holder or by its guard's `Drop`; or kept with others of its shard in a
//! [`Batch`] and given back in one RMW. The pool's workers hold their
//! requests' units this way, and a weighed request's [`Grant`] in a
//! [`Held`].

use std::mem::ManuallyDrop;

use super::{Grant, Table};
use crate::sync::os_thread;

/// The units of a plain pool worker's finished casts, kept to be given back
/// in one RMW: one producer casting to one worker with a trivial handler
/// otherwise moves the shard's line between their cores on every message
/// (`pool/mailbox.rs` says what else that loop needed).
///
/// A unit is kept only after its cast was handled, so it is held longer,
/// never shorter, and the bound stays exact. The batch goes back when it
/// reaches its size (at most an eighth of the shard's limit, read again
/// whenever the mailbox runs empty, so a resize is followed), when the
/// worker finds its mailbox empty, and with the unit of the next call,
/// before that call's reply. So a kept unit waits at most while the
/// worker handles `size - 1` more casts (31 at most), fewer when the
/// mailbox runs empty or a call comes first, and at most `size` units
/// wait at once.
pub(crate) struct Batch {
    /// The worker's shard: every kept unit is one of its own.
    index: usize,
    pub(crate) size: usize,
    pub(crate) held: usize,
    /// How many of the kept units were given back by a panic.
    panicked: usize,
}

impl Batch {
    pub(crate) fn new(index: usize, size: usize) -> Self {
        Batch {
            index,
            size,
            held: 0,
            panicked: 0,
        }
    }

    /// Keeps the unit of a handled cast, or gives it back at once if
    /// batches are off or it belongs to another shard.
    pub(crate) fn keep(&mut self, unit: Unit<'_>, panicked: bool) {
        if self.size == 1 || unit.index != self.index {
            unit.release(panicked);
            return;
        }
        self.hold(unit, panicked);
    }

    /// Adds a unit of this worker's shard to the batch.
    fn hold(&mut self, unit: Unit<'_>, panicked: bool) {
        debug_assert_eq!(unit.index, self.index);
        // Forgotten, not dropped: the batch gives it back.
        let _ = ManuallyDrop::new(unit);
        self.held += 1;
        self.panicked += usize::from(panicked);
    }

    /// Gives the batch back if it reached its size.
    #[inline]
    pub(crate) fn give_back_if_full(&mut self, table: &Table) {
        if self.held >= self.size {
            self.give_back(table);
        }
    }

    /// Gives every kept unit back.
    pub(crate) fn give_back(&mut self, table: &Table) {
        table.release_many(self.index, self.held, self.panicked);
        self.held = 0;
        self.panicked = 0;
    }

    /// Gives every kept unit back together with `unit` (a call's).
    pub(crate) fn give_back_with(&mut self, table: &Table, unit: Unit<'_>, panicked: bool) {
        if unit.index == self.index {
            self.hold(unit, panicked);
            self.give_back(table);
        } else {
            self.give_back(table);
            unit.release(panicked);
        }
    }
}

/// One admitted unit of shard `index`, held while the work it admitted
/// runs (a pool worker's envelope): given back by
/// [`release`](Self::release), which says whether that work panicked, or
/// by `Drop` if the holder goes first: counted as a panic while the thread
/// unwinds (a handler that panicked before `release`), as completed
/// otherwise (an async worker's task dropped mid-handler). Exactly once
/// either way; or kept in a [`Batch`], which gives back many in one RMW.
#[must_use = "dropping the unit releases it at once"]
pub(crate) struct Unit<'a> {
    table: &'a Table,
    index: usize,
}

impl<'a> Unit<'a> {
    pub(crate) fn new(table: &'a Table, index: usize) -> Self {
        Unit { table, index }
    }

    /// Gives the unit back; `panicked` says whether its handler panicked.
    pub(crate) fn release(self, panicked: bool) {
        // Forgetting `self` (no destructor runs) is what makes the release
        // happen once: the guard's `Drop` is for the path where the holder
        // goes first.
        let unit = ManuallyDrop::new(self);
        unit.table.release(unit.index, panicked);
    }
}

impl Drop for Unit<'_> {
    fn drop(&mut self) {
        // Only reached when the holder went before `release`: unwinding
        // from a panic, or an async task dropped mid-handler.
        self.table.release(self.index, os_thread::panicking());
    }
}

/// The [`Grant`] of a request of many units, held while the work it
/// admitted runs (a pool worker's weighed envelope): [`Unit`] for a grant.
/// Given back by [`release`](Self::release), or by `Drop` if the holder
/// goes first (counted as a panic while the thread unwinds); exactly once
/// either way.
#[must_use = "dropping the grant releases its units at once"]
pub(crate) struct Held<'a> {
    table: &'a Table,
    grant: Grant,
}

impl<'a> Held<'a> {
    pub(crate) fn new(table: &'a Table, grant: Grant) -> Self {
        Held { table, grant }
    }

    /// Gives every unit back; `panicked` says whether its handler
    /// panicked. Hands back the grant as plain data (its parts say which
    /// shards got units back).
    pub(crate) fn release(mut self, panicked: bool) -> Grant {
        let (table, grant) = (
            self.table,
            std::mem::replace(&mut self.grant, Grant::on(0, 0)),
        );
        // Forgotten, not dropped: what it holds now is a grant of nothing
        // (no allocation), and `Drop` would give back what comes next.
        let _ = ManuallyDrop::new(self);
        table.release_grant(&grant, panicked);
        grant
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Only reached when the holder went before `release`: unwinding
        // from a panic, or an async task dropped mid-handler.
        self.table
            .release_grant(&self.grant, os_thread::panicking());
    }
}
