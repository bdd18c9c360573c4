//! The sharded admission table: the one engine behind [`Limiter`], [`Pool`]
//! and [`Supervisor`].
//!
//! [`Limiter`]: crate::Limiter
//! [`Pool`]: crate::Pool
//! [`Supervisor`]: crate::Supervisor
//!
//! # Implementation details
//!
//! **Layout.** Capacity `C` is split over `M` shards. Shard `i` may hold
//! `limit_i` units; the limits are `C / M`, the first `C % M` one more, and
//! add up to exactly `C` (with `C < M` the last shards' limit is 0: they
//! are marked full from the start, and kept so that a resize can grow into
//! them). Each shard is one 128-byte
//! padded line holding two counters:
//!
//! | word    | bits                     | changed by                        |
//! |---------|--------------------------|-----------------------------------|
//! | `taken` | `2 × units ever taken`, bit 0 = CLOSED | CAS in [`Shard::try_take`], `fetch_or` in [`Shard::close`] |
//! | `given` | `2 × units ever given back` | `fetch_add` in [`Shard::give_back_many`] |
//!
//! so `usage = (taken - given) / 2` (wrapping), and a shard's *accepted* and
//! *released* counts are free. Admission is one CAS on `taken`, release one
//! RMW on `given`: the floor of two locked instructions per unit. CLOSED
//! lives in the `taken` word, so admission versus shutdown is decided by that
//! one word's modification order: a take either precedes the close (and is
//! admitted, so the pool drains it) or sees CLOSED and is refused.
//!
//! **The full set.** A bitmap, one bit per shard, says which shards are
//! *marked* full. Callers read it first: under overload every bit is set,
//! so a rejection is answered from one word, and a walk never visits a
//! shard whose bit is set. With more than 64 shards the bitmap spans
//! several words, and a count of set bits (kept only then) is the one word
//! a rejection reads; so a refusal costs the same at 2, 64 or 65,536 shards.
//! Bits are written only when a shard crosses its limit, so while the pool
//! is not full the line stays shared, read-only, in every core's cache.
//!
//! The bitmap is a hint that must never *stay* wrong in the harmful
//! direction. A clear bit on a full shard only costs a failed CAS (and the
//! caller who sees it sets the bit). A set bit on a shard with room would
//! refuse work, so:
//!
//! 1. Whoever sees a shard full with its bit clear (the taker who filled it,
//!    or a walker whose CAS found it full) *marks* it: sets the bit, then
//!    re-reads the shard through an RMW on `given`, and clears the bit
//!    again if the shard has room ([`Table::mark_full`]).
//! 2. A release whose shard is marked clears the bit *before* it gives the
//!    unit back ([`Table::release`]). A releaser descheduled in between
//!    leaves a full shard unmarked (harmless), never a free one marked: a
//!    caller that sees the unit back, through the RMW on `given`, sees the
//!    clear too.
//! 3. After its RMW on `given`, the release reads the bit again and clears
//!    it if set: a marker may have set it between steps 2 and 3.
//!
//! The RMWs on `given` of a marker (step 1) and a release (step 3) are
//! totally ordered. If the marker's comes later, it reads the release and
//! clears its own bit. If the release's comes later, it reads the marker's
//! Release RMW with Acquire, so it sees the bit set, and clears it. Either
//! way a bit set on a shard with room lasts only while the marker or the
//! releaser is still running. (A `SeqCst` load would do the same job for
//! the marker, but loom models a `SeqCst` access as `AcqRel` and would not
//! check it; the RMW is only paid when a shard fills.)
//!
//! **What `Overload` promises.** A caller starts at the shard its [`Probe`]
//! names, tries it if its bit is clear (or if its own counters show room:
//! a caller is never refused by its own shard's stale bit), and otherwise
//! walks the clear bits from there, wrapping once. `Overload` means every
//! shard was *seen* full during the call: tried and found full (confirmed
//! by an RMW on its `given` word, see [`Shard::try_take`]), or marked. The
//! shards are not all read at one instant, so a unit freed on a shard
//! after the caller passed it does not save the call: N threads that each
//! hold at most one unit of capacity N can still, rarely, be refused.
//! Erlang's sidejob answers the same way. A refusal while a shard has room
//! needs one of:
//!
//! * that shard's unit came back after the walk passed it (above), or
//! * a marker set its bit in the few instructions before a release of it
//!   (between steps 2 and 3), and the releaser is still between its RMW on
//!   `given` and step 3. That ends when the releaser runs again. Without a
//!   racing marker, a descheduled releaser never keeps a free shard looking
//!   full: step 2 cleared the bit before the unit came back.
//!
//! `loom-tests/tests/loom_limiter.rs` checks: no false `Full` from the
//! counters, no bit that stays set, and no refusal by a bit (or count)
//! whose shard's release the caller has already seen.

//!
//! # Resize
//!
//! Each shard's limit is an atomic word, changed only by
//! [`Table::set_capacity`] under the control lock, in three steps:
//!
//! 1. **Gate** every shard: set bit 1 of `taken` (GATED). A take either
//!    came before (it is in the holdings read next), or sees GATED and
//!    goes to [`Table::acquire_gated`], which waits for the control lock,
//!    or fails its CAS against the changed word and sees GATED next round.
//! 2. **Read** each shard's holdings: exact, since no take can land, and
//!    from here they only fall. Split the capacity over them
//!    (`split.rs`): every limit at least its shard's holdings, adding up to
//!    the capacity, so `sum(max(held, limit)) = capacity` and nothing is
//!    admitted while that many are held.
//! 3. **Store** the limits, hand new room to waiters while still gated (no
//!    newcomer can take it first), and **un-gate** (clear the bit, Release).
//!    A taker that read the word and the old limit before the gate finds
//!    the same value again and its CAS succeeds; so every take reads the
//!    limit again after its CAS (an Acquire that pairs with the un-gate,
//!    one load of the line it just wrote) and undoes itself above it
//!    (`Take::Over`, given back, counted nowhere). Without that second
//!    read, `loom_resize.rs` fails. (Changing the word instead, with a
//!    phantom unit added and given back, was tried: a reader then saw one
//!    unit fewer than is held, and an empty shard that is not, which a
//!    pool worker's drain rule or `wait_idle` would take at its word. An
//!    over-take errs the other way: for the moment before its undo, a
//!    reader sees one unit more than is held, and a `wait_idle` that reads
//!    it then waits for the next child to leave, or its timeout. After a
//!    close, no take lands, so a pool's drain rule is exact.)
//!
//! If more units are held than the new capacity, no split works: the table
//! is in *debt*. The shards stay gated, so every admission goes through the
//! control lock, where it is refused until a fresh reading finds the
//! holdings back within the capacity; that admission settles the debt
//! (split, un-gate) and goes on. Releases need nothing: they only lower the
//! holdings. A hand-off to a waiter is refused during a debt (it would
//! admit above the capacity).
//!
//! # Waiting
//!
//! A table may have a waiting room (`waiters.rs`): its queue lives in the
//! control lock beside the debt, and a release reads one more word, the
//! number waiting, before and after it gives its unit back. The protocol is
//! in `waiters.rs`. The control lock and the room sit behind `Arc`s so
//! that the room's alarm (`RoomAlarm`) can reach them: the process-wide
//! deadline watcher (`alarm.rs`) holds that alarm weakly and rings it to
//! time out async waiters, which therefore arm no timer of their own.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use crossbeam_utils::CachePadded;

use crate::engine::probe::{thread_index, Probe};
use crate::engine::split;
use crate::engine::waiters::{Policy, Queue, Room, State, Ticket, Wake, Woken};
use crate::error::{ConfigError, Error};
use crate::stats::{RejectCounter, ShardStats, Stats};
use std::time::Instant;

use crate::sync::{
    now, park, Arc, AtomicBool, AtomicUsize, Mutex,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// Bit 0 of `taken`: the shard admits nothing more.
const CLOSED: usize = 1;
/// Bit 1 of `taken`: takes go through [`Table::acquire_gated`]: a resize is
/// in progress, or the table is in debt (see the module docs).
const GATED: usize = 2;
/// The flag bits of `taken`.
const FLAGS: usize = CLOSED | GATED;
/// One unit in `taken` and `given`.
const UNIT: usize = 4;
/// Bits per word of the full set.
const BITS: usize = usize::BITS as usize;
/// How often [`Shard::counts`] retries for an exact reading before it falls
/// back to a lower bound. One under loom, so models reach the fallback.
#[cfg(not(loom))]
const CONSISTENT_READ_TRIES: usize = 8;
#[cfg(loom)]
const CONSISTENT_READ_TRIES: usize = 1;

/// The largest capacity a table accepts: usage is kept in units of four in
/// a `usize`, with one bit to spare.
pub(crate) const MAX_CAPACITY: usize = usize::MAX >> 4;
/// The largest shard count: far beyond any core count, and it keeps the
/// fast modulo within 32 bits.
pub(crate) const MAX_SHARDS: usize = 1 << 16;

/// What one attempt on one shard found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// A unit was taken; `now_full` if it was the shard's last.
    Taken { now_full: bool },
    /// The shard was at its limit.
    Full,
    /// The shard is closed.
    Closed,
    /// The shard is gated: take through [`Table::acquire_gated`].
    Gated,
    /// A unit was taken above a limit that a racing resize lowered: give
    /// it back with [`Table::undo`] and treat the shard as full.
    Over,
}

/// One shard: its limit and its two counters, on a line of its own.
#[derive(Debug)]
pub(crate) struct Shard {
    /// `4 × units ever taken`, plus [`CLOSED`] in bit 0 and [`GATED`] in
    /// bit 1.
    taken: AtomicUsize,
    /// `4 × units ever given back`.
    given: AtomicUsize,
    /// How many units this shard may hold at once. Changed only by a
    /// resize, while the shard is gated.
    limit: AtomicUsize,
    /// The most units ever held at once.
    peak: AtomicUsize,
    /// Units given back by a panic.
    panicked: AtomicUsize,
    /// Units whose holder gave them up for good (`Permit::forget`).
    forgotten: AtomicUsize,
    /// Units that nobody held: takes undone because a racing resize
    /// lowered the limit under them, and units taken for a waiter that left
    /// meanwhile. Each is counted once in `taken` and once in `given`, and
    /// left out of the stats.
    phantom: AtomicUsize,
    /// Raised while this shard's consumer polls for its next request: a
    /// stealing pool's worker (`pool/steal.rs`); no other front-end uses
    /// it. It lives here, beside the counters, because the producer that
    /// reads it has just taken a unit on this line, so the read costs no
    /// cache miss, and the worker writes it beside its release. On a line
    /// of its own it was one more miss per request: a stealing pool's
    /// round trip read a median of 1.18x the plain pool's, against
    /// 1.07-1.10x here (`benches/results/steal-attended-2026-11-26.txt`).
    attended: AtomicBool,
}

impl Shard {
    fn new(limit: usize) -> Self {
        Shard {
            taken: AtomicUsize::new(0),
            given: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            panicked: AtomicUsize::new(0),
            forgotten: AtomicUsize::new(0),
            phantom: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
            attended: AtomicBool::new(false),
        }
    }

    /// The flag a stealing pool's worker raises while it polls this
    /// shard's mailbox; why it lives here is on the field.
    #[inline]
    pub(crate) fn attended(&self) -> &AtomicBool {
        &self.attended
    }

    /// How many units this shard may hold at once.
    #[inline]
    pub(crate) fn limit(&self) -> usize {
        // Relaxed: a take re-reads it after its CAS, which synchronizes with
        // the resize's un-gating RMW (see `try_take`).
        self.limit.load(Relaxed)
    }

    /// Takes one unit if the shard is open and under its limit.
    ///
    /// `Full` is only answered when the shard was full at one instant: the
    /// instant of an RMW on `given`, which reads its newest value. A plain
    /// load of `given` may lag (in the memory model, and across a
    /// preemption) behind releases that came before the `taken` we hold,
    /// and two such reads can add up to a usage the shard never had.
    #[inline]
    pub(crate) fn try_take(&self) -> Take {
        self.try_take_masked(FLAGS)
    }

    /// [`try_take`](Self::try_take), stopping only at the flags in `stop`:
    /// `FLAGS` normally, `CLOSED` alone for a take made under the control
    /// lock for a waiter while the shards are gated.
    #[inline(always)]
    fn try_take_masked(&self, stop: usize) -> Take {
        // Relaxed: the CAS below re-checks this exact value, and the limit
        // is checked again after it (see there).
        let mut taken = self.taken.load(Relaxed);
        // Acquire: pairs with the AcqRel RMW in `give_back_many`, so work done
        // under a released unit happens-before work under the unit that
        // replaces it.
        let mut given = self.given.load(Acquire);
        loop {
            if taken & stop != 0 {
                return if taken & CLOSED != 0 {
                    Take::Closed
                } else {
                    Take::Gated
                };
            }
            let gap = taken.wrapping_sub(given);
            if (gap as isize) < 0 {
                // Units were taken *and* given back after our `taken` was
                // read, so `given` passed it. Every release we read was
                // preceded (happens-before) by its take, so a fresh read of
                // `taken` covers them. Relaxed, as above.
                taken = self.taken.load(Relaxed);
                continue;
            }
            let usage = gap / UNIT;
            let limit = self.limit();
            if usage >= limit {
                // Full by these reads; confirm against the newest `given`.
                // AcqRel RMW (adds nothing): it reads the last release in
                // `given`'s modification order. Unchanged means the shard
                // was full at this RMW (`taken` only grows).
                let newest = self.given.fetch_add(0, AcqRel);
                if newest == given {
                    return Take::Full;
                }
                given = newest;
                continue;
            }
            // Release on success: publishes the releases this taker read,
            // so a reader that reads `taken` and then `given` with Acquire
            // (`Shard::counts`) never computes a usage above the limit.
            // Acquire on success: pairs with the Release of a resize's
            // un-gating RMW on this word, for the limit read below.
            // Relaxed on failure: the loop re-reads. Against a fixed limit
            // the bound needs no ordering: this RMW succeeds only against
            // the value the check used, and `given` can only have grown.
            match self
                .taken
                .compare_exchange_weak(taken, taken + UNIT, AcqRel, Relaxed)
            {
                Ok(_) => {
                    let now = usage + 1;
                    // The limit may have been lowered since it was checked:
                    // a resize gated this word, stored a new limit and
                    // un-gated it, leaving the very value this CAS expected.
                    // The CAS read that un-gating RMW (or a later one), so
                    // this read sees the new limit. Over it, the take is
                    // undone (`Table::undo`): nobody ever held it. One load
                    // of a line this CAS just wrote.
                    let limit = self.limit();
                    if now > limit {
                        return Take::Over;
                    }
                    // Relaxed: a statistic.
                    if now > self.peak.load(Relaxed) {
                        self.peak.fetch_max(now, Relaxed);
                    }
                    return Take::Taken {
                        now_full: now >= limit,
                    };
                }
                Err(actual) => {
                    taken = actual;
                    // Acquire: as above.
                    given = self.given.load(Acquire);
                }
            }
        }
    }

    /// True if one reading of the counters shows the shard at its limit.
    /// No RMW: this is on the rejection fast path.
    #[inline]
    fn looks_full(&self) -> bool {
        // Acquire: pairs with the Release take CAS in `try_take`, so every
        // release that happened-before the take we read is visible to the
        // `given` load below: the gap is a usage the shard had at one
        // instant, never one it did not have.
        let taken = self.taken.load(Acquire);
        // Relaxed: a newer value only shows more room.
        let given = self.given.load(Relaxed);
        let gap = taken.wrapping_sub(given);
        // A negative gap (`given` passed the `taken` we read) means units
        // were given back since: not full.
        (gap as isize) >= 0 && gap / UNIT >= self.limit()
    }

    /// Takes one unit whatever the limit; `false` if the shard is closed.
    /// Used by the pool's `*_unbounded` calls, which must still be counted.
    pub(crate) fn take_unbounded(&self) -> bool {
        // Relaxed: as in `try_take`, the CAS decides against this value.
        let mut taken = self.taken.load(Relaxed);
        loop {
            if taken & CLOSED != 0 {
                return false;
            }
            // Relaxed: the same word's modification order orders this take
            // against `close`; nothing else is published.
            match self
                .taken
                .compare_exchange_weak(taken, taken + UNIT, Relaxed, Relaxed)
            {
                Ok(_) => {
                    // The usage just after this take, with `given` read
                    // after it: never more than the shard held then (a
                    // newer `given` only lowers it), so the peak stays a
                    // usage the shard really had. Relaxed: a statistic.
                    let gap = (taken + UNIT).wrapping_sub(self.given.load(Relaxed));
                    if (gap as isize) > 0 {
                        self.peak.fetch_max(gap / UNIT, Relaxed);
                    }
                    return true;
                }
                Err(actual) => taken = actual,
            }
        }
    }

    /// Gives `units` back in one RMW, `panicked` of them given back by a
    /// panic.
    #[inline]
    pub(crate) fn give_back_many(&self, units: usize, panicked: usize) {
        // Release: pairs with the Acquire load in `try_take` (the next holder
        // sees this holder's work) and with the Acquire in `Table::mark_full`'s
        // re-read. Acquire: pairs with the Release of that same re-read, so
        // the full-set load in `Table::release` sees a bit set by a marker
        // whose re-read came before this RMW.
        self.given.fetch_add(units * UNIT, AcqRel);
        if panicked > 0 {
            // Release, and after `given`: pairs with the Acquire load in
            // `stats`, so a snapshot that counts this panic also counts its
            // unit as given back, and `completed = given - panicked` never
            // goes negative.
            self.panicked.fetch_add(panicked, Release);
        }
    }

    /// Refuses every later take. Takes that came first stay counted.
    pub(crate) fn close(&self) {
        // AcqRel: the close is ordered against every take by `taken`'s
        // modification order (all are RMWs on it); Release/Acquire lets a
        // drainer that reads CLOSED also see what the closer did before.
        self.taken.fetch_or(CLOSED, AcqRel);
    }

    /// True once [`close`](Self::close) has run.
    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with the AcqRel `fetch_or` in `close`.
        self.taken.load(Acquire) & CLOSED != 0
    }

    /// Units held now, as one reading that never exceeds the limit.
    ///
    /// `given` is read before and after `taken`; if it did not move, both
    /// values held at the moment `taken` was read, so the difference is an
    /// exact usage at that moment. Read once each in that order, the gap
    /// could count a unit taken after a release it missed. Under churn that
    /// moves `given` on every try, after a few tries the reading falls back
    /// to `taken` read *before* `given`: a lower bound of the usage at the
    /// `taken` read, and never above the limit (see [`Shard::lower_bound`]).
    /// So a reading is exact, or low under churn, never high.
    pub(crate) fn usage(&self) -> usize {
        self.counts().0
    }

    /// `(usage, taken, given)` in units, read as in [`usage`](Self::usage).
    fn counts(&self) -> (usize, usize, usize) {
        // Acquire on all three: pairs with the AcqRel RMWs in `give_back_many`
        // and `close`, so a drainer that reads 0 has also seen every
        // release (and the work before it) and the CLOSED bit.
        let mut given = self.given.load(Acquire);
        for _ in 0..CONSISTENT_READ_TRIES {
            let taken = self.taken.load(Acquire);
            let again = self.given.load(Acquire);
            if again == given {
                return (taken.wrapping_sub(given) / UNIT, taken / UNIT, given / UNIT);
            }
            given = again;
        }
        self.lower_bound()
    }

    /// `taken`, then `given`: a usage that is never above the limit.
    ///
    /// The Acquire load of `taken` synchronizes with the Release CAS of the
    /// take that wrote it (or heads the release sequence it is in), and that
    /// taker had read some `given` value `g` with `taken - g` at most the
    /// limit. The `given` read here comes after, so it is `g` or newer, and
    /// the gap can only be smaller. It may be negative (units taken after
    /// our `taken` read were given back too): then the usage at the `taken`
    /// read was at least 0, and 0 is answered.
    #[cold]
    fn lower_bound(&self) -> (usize, usize, usize) {
        // Acquire: as the comment above says, pairs with the take's Release.
        let taken = self.taken.load(Acquire);
        // Acquire: pairs with the AcqRel RMW in `give_back_many`, as in `counts`.
        let given = self.given.load(Acquire);
        let gap = taken.wrapping_sub(given);
        let usage = if (gap as isize) < 0 { 0 } else { gap / UNIT };
        (usage, taken / UNIT, given / UNIT)
    }

    /// Re-reads the shard for [`Table::mark_full`]: is it still full?
    fn still_full(&self) -> bool {
        self.usage_synced() >= self.limit()
    }

    /// Units held now, with `given` read through an RMW: the read for a
    /// caller that wrote a flag first and must not miss a racing
    /// [`give_back_many`](Self::give_back_many) that would then miss the flag (the
    /// store→load pattern of [`Table::mark_full`] and of the supervisor's
    /// `wait_idle`).
    pub(crate) fn usage_synced(&self) -> usize {
        // AcqRel RMW (it adds nothing): `given`'s modification order puts it
        // either after a racing `give_back_many` (then it reads that release, and
        // Acquire makes the releaser's earlier writes visible) or before it
        // (then the release's AcqRel RMW reads this one or a later RMW in its
        // release sequence, so whatever the caller wrote before this call is
        // visible to the releaser after its RMW). A plain load could miss
        // both: see the module docs.
        let given = self.given.fetch_add(0, AcqRel);
        // Relaxed: `taken` only grows, and every take whose unit is counted
        // in `given` happened-before the give that counted it, which this
        // RMW synchronized with; so the gap cannot go negative. A stale
        // value can only leave out takes not ordered before this call.
        let taken = self.taken.load(Relaxed);
        taken.wrapping_sub(given) / UNIT
    }

    /// The shard's figures; `handed` is its count of units handed from a
    /// release straight to a waiter (kept under the control lock): each is
    /// one more admission and one more release than `taken` and `given`
    /// count.
    fn stats(&self, handed: usize) -> ShardStats {
        // Acquire, and before `given`: pairs with the Release in `give_back_many`
        // (every panic counted here has its unit counted in `given`).
        let panicked = self.panicked.load(Acquire);
        // Relaxed: a phantom is counted after its unit is back; a snapshot
        // taken between the two counts one in `accepted` and `completed`.
        let phantom = self.phantom.load(Relaxed);
        let (usage, taken, given) = self.counts();
        ShardStats {
            limit: self.limit(),
            usage,
            peak_usage: self.peak.load(Relaxed),
            accepted: taken.wrapping_sub(phantom).wrapping_add(handed) as u64,
            completed: given
                .wrapping_sub(panicked)
                .wrapping_sub(phantom)
                .wrapping_add(handed) as u64,
            panicked: panicked as u64,
            // Relaxed: a count; a forgotten unit stays in `taken` for good.
            forgotten: self.forgotten.load(Relaxed) as u64,
        }
    }
}

/// Which shards are at their limit, one bit each (see the module docs).
#[derive(Debug)]
struct FullSet {
    /// Word 0, inline: with up to 64 shards (the usual case) every probe
    /// and release reads it, and one load beats a pointer and a load.
    first: CachePadded<AtomicUsize>,
    /// Words 1 and up, for tables of more than 64 shards.
    rest: Box<[CachePadded<AtomicUsize>]>,
}

impl FullSet {
    fn new(shards: usize) -> Self {
        FullSet {
            first: CachePadded::new(AtomicUsize::new(0)),
            rest: (1..shards.div_ceil(BITS))
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
        }
    }

    /// How many words there are.
    fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// Word `w`.
    #[inline]
    fn slot(&self, w: usize) -> &AtomicUsize {
        if w == 0 {
            &self.first
        } else {
            &self.rest[w - 1]
        }
    }

    /// The bits of word `w`.
    #[inline]
    fn word(&self, w: usize) -> usize {
        // Relaxed: a hint. A bit's harm is bounded by the protocol in the
        // module docs, which orders through `given`, not through this load;
        // coherence alone makes a clear that happened-before this load seen.
        self.slot(w).load(Relaxed)
    }

    #[inline]
    fn contains(&self, shard: usize) -> bool {
        self.word(shard / BITS) & (1 << (shard % BITS)) != 0
    }

    /// Sets `shard`'s bit; true if this call set it (it was clear).
    fn insert(&self, shard: usize) -> bool {
        let bit = 1 << (shard % BITS);
        // Relaxed: published to releasers by the Release RMW on `given` that
        // follows it in `mark_full`.
        self.slot(shard / BITS).fetch_or(bit, Relaxed) & bit == 0
    }

    /// Clears `shard`'s bit; true if this call cleared it (it was set).
    fn remove(&self, shard: usize) -> bool {
        let bit = 1 << (shard % BITS);
        // Relaxed: a clear publishes nothing of its own. A caller that must
        // see it after a release sees it through that release's RMW on
        // `given`, which comes after it in program order (`Table::release`).
        self.slot(shard / BITS).fetch_and(!bit, Relaxed) & bit != 0
    }
}

/// The future of [`Table::acquire_async`]: a unit's shard.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct WaitUnit<'a> {
    table: &'a Table,
    /// The caller's own deadline, if any; `max_wait` bounds it too.
    deadline: Option<Instant>,
    /// The waiter's node and ticket, while it is queued. Its deadline is
    /// the room's watcher's business (`alarm.rs`): the future arms no
    /// timer.
    queued: Option<Queued>,
}

/// A queued waiter's hold on its place: the node's key (valid while the
/// ticket says `Waiting`), the ticket, and when it arrived on the room's
/// clock (`Room::ticks`).
#[derive(Debug)]
struct Queued {
    key: usize,
    ticket: Arc<Ticket>,
    since_ticks: u64,
}

impl std::fmt::Debug for WaitUnit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitUnit")
            .field("queued", &self.queued.is_some())
            .finish()
    }
}

impl std::future::Future for WaitUnit<'_> {
    type Output = Result<usize, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;

        let this = self.get_mut();
        let table = this.table;
        let Some(room) = table.room.as_deref() else {
            // No room: the fast path alone.
            return Poll::Ready(match table.try_at::<false>(table.home_shard()) {
                Err(Error::Overload) => {
                    table.count_refusal();
                    Err(Error::Overload)
                }
                other => other,
            });
        };
        if let Some(queued) = &this.queued {
            // Granted, closed or expired: read without the lock (the
            // ticket's Acquire load pairs with the Release store of whoever
            // ended the wait, under the lock).
            let state = queued.ticket.state();
            if state != State::Waiting {
                this.queued = None;
                return Poll::Ready(table.finished(room, state));
            }
            // Still waiting: point the node at this waker, under the lock
            // that a grant takes, so the grant wakes the right task. A
            // waker is code we do not own (its clone and drop may re-enter
            // this table): it is compared under the lock, cloned and
            // dropped outside it.
            let control = table.control.lock();
            let state = queued.ticket.state();
            if state != State::Waiting {
                drop(control);
                this.queued = None;
                return Poll::Ready(table.finished(room, state));
            }
            // Still queued (so its node is its own): the same task, as a
            // re-poll usually brings, needs nothing.
            if control.queue.will_wake(queued.key, cx.waker()) {
                return Poll::Pending;
            }
            drop(control);
            let wake = Wake::Task(cx.waker().clone());
            let mut control = table.control.lock();
            let state = queued.ticket.state();
            if state != State::Waiting {
                // Ended while the waker was cloned: the clone goes unused.
                drop(control);
                drop(wake);
                this.queued = None;
                return Poll::Ready(table.finished(room, state));
            }
            let old = control.queue.replace_wake(queued.key, wake);
            drop(control);
            // The old waker's drop may release a unit into this very
            // table, which may hand it to this very waiter: the new waker,
            // now in place, is woken for it.
            drop(old);
            return Poll::Pending;
        }
        // First poll: the fast path, then the queue.
        match table.try_at::<false>(table.home_shard()) {
            Err(Error::Overload) => {}
            other => return Poll::Ready(other),
        }
        let now = now();
        let deadline = table.wait_deadline(room, this.deadline, now);
        // Already past (a zero `max_wait`, a caller's deadline gone by):
        // queue without one, re-check once, then time out below, as a timer
        // armed for zero would.
        let overdue = deadline.is_some_and(|deadline| deadline <= now);
        let watched = deadline.filter(|_| !overdue);
        let wake = Wake::Task(cx.waker().clone());
        let entered = table.enter_room(room, wake, now, watched);
        let (queued, arm) = match entered {
            Ok(entered) => entered,
            Err(err) => return Poll::Ready(Err(err)),
        };
        if arm {
            // Before the re-check, even if it finds a unit: the queue now
            // counts on a registration at this instant (`Queue::arm`'s
            // invariant).
            table.arm(watched);
        }
        if let Some(shard) = table.recheck(room, &queued) {
            return Poll::Ready(Ok(shard));
        }
        if overdue {
            return Poll::Ready(table.give_up(room, queued));
        }
        this.queued = Some(queued);
        Poll::Pending
    }
}

impl Drop for WaitUnit<'_> {
    fn drop(&mut self) {
        let Some(queued) = self.queued.take() else {
            return;
        };
        self.table.abandon(queued);
    }
}

/// What [`Table::take_any`] found.
enum Found {
    /// A unit of this shard, taken.
    Unit(usize),
    /// No room on an open shard, but a gated one was passed over.
    Gated,
    /// No room, or the table is closed.
    Nothing,
}

/// What the deadline watcher rings (`alarm.rs`): a table's control lock and
/// room, shared with the table. The watcher holds it weakly, and the table
/// holds the only strong handle, so a dropped table is never rung.
#[cfg(not(loom))]
#[derive(Debug)]
struct RoomAlarm {
    control: Arc<Mutex<Control>>,
    room: Arc<Room>,
}

#[cfg(not(loom))]
impl crate::engine::alarm::Alarm for RoomAlarm {
    /// Expires the waiters whose deadline passed, under the control lock,
    /// and wakes them after it: each then finishes with `Timeout` (counted)
    /// in its poll. A grant and an expiry of one node are both under the
    /// lock, so a waiter is either handed a unit or timed out, never both.
    fn ring(&self, now: Instant) -> Option<Instant> {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let next = control.queue.expire(&self.room, now, &mut woken);
        drop(control);
        // On the watcher's own thread, a waker's panic has no caller to go
        // to: the panic hook has reported it, every other waiter was woken
        // (`Woken::wake_all`), and the watcher must go on ringing.
        crate::engine::foreign::quietly(|| woken.wake_all(&self.room));
        next
    }
}

/// What the control lock guards.
#[derive(Debug, Default)]
struct Control {
    /// More units are held than the capacity in force: every shard stays
    /// gated, and `acquire_gated` admits nothing until `settle` ends it.
    /// No unit is handed to a waiter meanwhile.
    debt: bool,
    /// The waiters, if the table has a waiting room (`waiters.rs`).
    queue: Queue,
    /// Per shard, the units handed from a release straight to a waiter
    /// (see `Shard::stats`). Empty until the first hand-off.
    handed: Vec<usize>,
}

/// The admission table shared by every front-end.
#[derive(Debug)]
pub(crate) struct Table {
    shards: Box<[CachePadded<Shard>]>,
    full: FullSet,
    /// `shards - 1` when the shard count is a power of two (the common
    /// case: one shard per CPU), else 0 and [`Table::reduce`] uses `magic`.
    mask: usize,
    /// `u64::MAX / shards + 1`, for Lemire's fast modulo in [`Table::reduce`].
    magic: u64,
    /// The full set's value when every shard is full, if it fits one word
    /// (up to 64 shards); otherwise 0, and `full_count` says it.
    all_full: usize,
    /// With more shards than one word of the full set holds: how many bits
    /// are set, so that a refusal is one load whatever the shard count.
    /// Kept only then (`counted`); with one word, the word is the summary.
    full_count: CachePadded<AtomicUsize>,
    counted: bool,
    /// The capacity in force: the sum of the shard limits.
    capacity: AtomicUsize,
    /// Each shard's largest limit, if bounded (the supervisor's slots).
    caps: Option<Box<[usize]>>,
    /// Serializes resizes, the gated path and the waiting room. In an
    /// `Arc` so that the room's alarm can reach it.
    control: Arc<Mutex<Control>>,
    /// The waiting room, if the front-end's builder asked for one.
    room: Option<Arc<Room>>,
    /// What the deadline watcher rings for this room's async waiters; the
    /// watcher holds it weakly.
    #[cfg(not(loom))]
    alarm: Option<Arc<RoomAlarm>>,
    probe: Probe,
    rejected: RejectCounter,
    /// Set once shutdown begins; read only to tell `Shutdown` from
    /// `Overload` on the cold path.
    closed: AtomicBool,
}

impl Table {
    /// A table of `capacity` units over `shards` shards. Every shard is
    /// kept whatever the capacity (a shard whose limit is 0 is full), so the
    /// table can grow into all of them.
    pub(crate) fn new(capacity: usize, shards: usize, probe: Probe) -> Result<Self, ConfigError> {
        Table::with_caps(capacity, shards, probe, None)
    }

    /// As [`new`](Self::new), with each shard's limit bounded by the even
    /// split of `max_capacity` (whatever later resizes ask for): for the
    /// supervisor, whose registry has that many slots per shard.
    pub(crate) fn with_max(
        capacity: usize,
        max_capacity: usize,
        shards: usize,
        probe: Probe,
    ) -> Result<Self, ConfigError> {
        if capacity > max_capacity {
            return Err(ConfigError::too_large("capacity", max_capacity));
        }
        if shards == 0 {
            return Err(ConfigError::zero("shards"));
        }
        let caps = split::even(max_capacity, shards, None).into_boxed_slice();
        Table::with_caps(capacity, shards, probe, Some(caps))
    }

    fn with_caps(
        capacity: usize,
        count: usize,
        probe: Probe,
        caps: Option<Box<[usize]>>,
    ) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::zero("capacity"));
        }
        if capacity > MAX_CAPACITY {
            return Err(ConfigError::too_large("capacity", MAX_CAPACITY));
        }
        if count == 0 {
            return Err(ConfigError::zero("shards"));
        }
        if count > MAX_SHARDS {
            return Err(ConfigError::too_large("shards", MAX_SHARDS));
        }
        let shards: Box<[_]> = split::even(capacity, count, caps.as_deref())
            .into_iter()
            .map(|limit| CachePadded::new(Shard::new(limit)))
            .collect();
        let slots = (2 * count.max(num_cpus::get())).clamp(16, 256);
        let table = Table {
            full: FullSet::new(count),
            mask: if count.is_power_of_two() {
                count - 1
            } else {
                0
            },
            magic: (u64::MAX / count as u64).wrapping_add(1),
            all_full: if count <= BITS {
                usize::MAX >> (BITS - count)
            } else {
                0
            },
            full_count: CachePadded::new(AtomicUsize::new(0)),
            counted: count > BITS,
            shards,
            capacity: AtomicUsize::new(capacity),
            caps,
            control: Arc::new(Mutex::new(Control::default())),
            room: None,
            #[cfg(not(loom))]
            alarm: None,
            probe,
            rejected: RejectCounter::new(slots),
            closed: AtomicBool::new(false),
        };
        // Shards whose limit is 0 are full from the start.
        for i in 0..count {
            if table.shards[i].limit() == 0 {
                table.mark_full(i);
            }
        }
        Ok(table)
    }

    /// Gives the table the waiting room `policy` asks for (none when its
    /// `max_waiters` is 0).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `max_waiters` or `queue_order`.
    pub(crate) fn with_policy(mut self, policy: &Policy) -> Result<Self, ConfigError> {
        self.room = policy.room()?;
        #[cfg(not(loom))]
        {
            self.alarm = self.room.as_ref().map(|room| {
                Arc::new(RoomAlarm {
                    control: Arc::clone(&self.control),
                    room: Arc::clone(room),
                })
            });
        }
        Ok(self)
    }

    /// True if the table has a waiting room.
    pub(crate) fn has_room(&self) -> bool {
        self.room.is_some()
    }

    /// One attempt from the caller's home shard that does not count an
    /// `Overload`: for a caller that will wait next.
    pub(crate) fn probe(&self) -> Result<usize, Error> {
        self.try_at::<false>(self.home_shard())
    }

    /// How many wait for a unit now.
    pub(crate) fn waiting(&self) -> usize {
        self.room.as_ref().map_or(0, |room| room.waiting())
    }

    /// Admits one unit from the caller's home shard, waiting in the room
    /// (if any) when every shard is full, until `deadline` at the latest
    /// (`None`: `max_wait` alone bounds it). Blocks the thread.
    ///
    /// `Overload` (counted) when there is no room or it is full,
    /// `Timeout` when the wait ran out, `Shutdown` once closed.
    // inline(always): `Supervisor::reserve`, `Pool::call` and `cast` come
    // here on every admission; out of line it cost the supervisor's
    // reserve + drop a third (benches/supervisor.rs).
    #[inline(always)]
    pub(crate) fn acquire_waiting(&self, deadline: Option<Instant>) -> Result<usize, Error> {
        match self.try_at::<false>(self.home_shard()) {
            Err(Error::Overload) => self.acquire_or_wait(deadline),
            other => other,
        }
    }

    /// Every shard was full: wait in the room, or `Overload` (counted).
    #[cold]
    fn acquire_or_wait(&self, deadline: Option<Instant>) -> Result<usize, Error> {
        match &self.room {
            Some(room) => self.wait_blocking(room, deadline),
            None => {
                self.count_refusal();
                Err(Error::Overload)
            }
        }
    }

    /// The earlier of `deadline` and the room's `max_wait` from now.
    fn wait_deadline(
        &self,
        room: &Room,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Option<Instant> {
        let own = now.checked_add(room.policy.max_wait);
        match (own, deadline) {
            (Some(own), Some(deadline)) => Some(own.min(deadline)),
            (own, deadline) => own.or(deadline),
        }
    }

    /// Queues the caller, if the room has space and the table is open: its
    /// hold on its place, and whether it must [`arm`](Self::arm) the
    /// watcher for `deadline` next. `deadline` is an async waiter's (the
    /// watcher expires it); a blocked thread passes `None` and times
    /// itself. `Overload` (counted) when the room is full.
    fn enter_room(
        &self,
        room: &Room,
        wake: Wake,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Result<(Queued, bool), Error> {
        let mut control = self.control.lock();
        if self.is_closing() {
            drop(control);
            // A waker is dropped outside the lock (`waiters.rs`, "Foreign
            // code").
            drop(wake);
            return Err(Error::Shutdown);
        }
        if control.queue.len() >= room.policy.max_waiters {
            drop(control);
            drop(wake);
            self.count_refusal();
            return Err(Error::Overload);
        }
        let (key, ticket, since_ticks) = control.queue.push(room, wake, now, deadline);
        let arm = deadline.is_some_and(|deadline| control.queue.arm(deadline));
        let queued = Queued {
            key,
            ticket,
            since_ticks,
        };
        Ok((queued, arm))
    }

    /// Registers the room with the deadline watcher for `deadline` (which
    /// `enter_room` armed). Never under the control lock (`alarm.rs`, "Lock
    /// order"). Under loom, nothing: there is no watcher, and models set no
    /// deadline.
    fn arm(&self, deadline: Option<Instant>) {
        #[cfg(not(loom))]
        if let (Some(deadline), Some(alarm)) = (deadline, &self.alarm) {
            crate::engine::alarm::arm(deadline, Arc::downgrade(alarm) as _);
        }
        #[cfg(loom)]
        let _ = deadline;
    }

    /// Takes a waiter's node out of the queue if its wait has not ended
    /// yet; the state its ticket had under the lock (`Waiting` if the node
    /// was taken out here, else the outcome someone else gave it).
    /// `took_own`: the waiter took a unit from the table itself, an
    /// admission after waiting that no grant counted: counted here.
    ///
    /// With `Waiting`, the waiter's own waker comes back too: the caller
    /// drops it once its own bookkeeping is done (`waiters.rs`, "Foreign
    /// code"), since its drop may panic.
    fn withdraw(&self, room: &Room, queued: &Queued, took_own: bool) -> (State, Option<Wake>) {
        let mut control = self.control.lock();
        // Under the lock, the state is settled: only a holder of the lock
        // ends a wait.
        let state = queued.ticket.state();
        let mut wake = None;
        if state == State::Waiting {
            wake = control.queue.cancel(room, queued.key);
            if took_own {
                control.queue.count_waited(true);
            }
        }
        (state, wake)
    }

    /// After queuing, the caller took `shard` from the table itself (its
    /// re-check): leave the queue, and give back a second unit if one was
    /// handed over meanwhile.
    fn leave_with(&self, room: &Room, queued: &Queued, shard: usize) -> usize {
        let (state, wake) = self.withdraw(room, queued, true);
        match state {
            // A second unit, handed over meanwhile: its grant counted this
            // wait; the unit goes to the next waiter, or back to the table.
            State::Granted(second) => self.return_unused(second),
            _ => room.add_waited_time(queued.since_ticks, room.ticks()),
        }
        // The waiter's waker, last. If its drop panics, the unit taken
        // goes back before the panic goes on: nobody holds it.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(move || drop(wake))) {
            self.return_unused(shard);
            resume_unwind(panic);
        }
        shard
    }

    /// Gives back a unit that was admitted but never used: a waiter was
    /// handed it and gave up (or took another itself), or a keyed request
    /// took it and was refused by its key. Released as usual, so the next
    /// waiter gets it, and counted as a phantom, so that its admission,
    /// which nobody used, is not counted in `accepted` (nor its return in
    /// `completed`).
    pub(crate) fn return_unused(&self, shard: usize) {
        self.release(shard, false);
        // Relaxed: a count for `stats`.
        self.shards[shard].phantom.fetch_add(1, Relaxed);
    }

    /// The result of a wait that ended in `state` (read from its ticket),
    /// with its figures: the time waited, or a timeout.
    fn finished(&self, room: &Room, state: State) -> Result<usize, Error> {
        match state {
            // Counted by the grant (`Queue::end`), and its time by the
            // releaser after the wake-up, so this waiter does not read the
            // clock.
            State::Granted(shard) => Ok(shard),
            State::Closed => Err(Error::Shutdown),
            State::Expired | State::Waiting => {
                room.record_timeout();
                Err(Error::Timeout)
            }
        }
    }

    /// The waiter's own deadline passed: `Timeout`, unless its wait ended
    /// meanwhile (then that outcome: a unit handed over just now is kept).
    fn give_up(&self, room: &Room, queued: Queued) -> Result<usize, Error> {
        let (state, wake) = self.withdraw(room, &queued, false);
        let result = self.finished(room, state);
        // Some only if the wait had not ended: nothing was handed over, so
        // nothing is lost if the waker's drop panics.
        drop(wake);
        result
    }

    /// A queued future was dropped: out of the queue, and a unit handed to
    /// it meanwhile goes to the next waiter or back to the table. Never
    /// stranded.
    fn abandon(&self, queued: Queued) {
        let Some(room) = self.room.as_deref() else {
            return;
        };
        let mut state = queued.ticket.state();
        let mut wake = None;
        if state == State::Waiting {
            (state, wake) = self.withdraw(room, &queued, false);
        }
        if let State::Granted(shard) = state {
            // The grant counted a wait that admitted nobody.
            self.control.lock().queue.count_waited(false);
            self.return_unused(shard);
        }
        // Last, after the lock: the waiter's own waker, if it was still
        // queued (then nothing was handed to it).
        drop(wake);
    }

    #[cold]
    fn wait_blocking(&self, room: &Room, deadline: Option<Instant>) -> Result<usize, Error> {
        let start = now();
        let deadline = self.wait_deadline(room, deadline, start);
        // No deadline in the node: this thread times its own wait below.
        let wake = Wake::Thread(park::current());
        let (queued, _) = self.enter_room(room, wake, start, None)?;
        if let Some(shard) = self.recheck(room, &queued) {
            return Ok(shard);
        }
        loop {
            // Acquire (in `state`): pairs with the Release store of whoever
            // ended the wait; the unpark follows that store.
            let state = queued.ticket.state();
            if state != State::Waiting {
                return self.finished(room, state);
            }
            if deadline.is_some_and(|deadline| now() >= deadline) {
                return self.give_up(room, queued);
            }
            // An unpark that came before this park is not lost (std's park
            // keeps a token); an early return only re-checks.
            park::park_until(deadline);
        }
    }

    /// [`acquire_waiting`](Self::acquire_waiting) as a future: never blocks
    /// the executor's thread. Cancel safe: dropping it leaves nothing
    /// queued and strands no unit (one handed over meanwhile goes to the
    /// next waiter or back to the table).
    pub(crate) fn acquire_async(&self, deadline: Option<Instant>) -> WaitUnit<'_> {
        WaitUnit {
            table: self,
            deadline,
            queued: None,
        }
    }

    /// Keeps the count of marked shards even with few shards, so loom
    /// models can check the protocol that tables of more than 64 shards use
    /// without building 65 of them.
    #[cfg(loom)]
    pub(crate) fn force_counted(&mut self) {
        self.counted = true;
    }

    /// The capacity in force.
    pub(crate) fn capacity(&self) -> usize {
        // Relaxed: a reading; the limits themselves decide admission.
        self.capacity.load(Relaxed)
    }

    /// Units free now: the capacity less the usage (0 while units above a
    /// shrunk capacity drain). A reading, not a reservation.
    pub(crate) fn available(&self) -> usize {
        self.capacity().saturating_sub(self.usage())
    }

    /// The most units shard `i` can ever hold: its cap, or its limit in a
    /// table without caps.
    pub(crate) fn cap(&self, i: usize) -> usize {
        match &self.caps {
            Some(caps) => caps[i],
            None => self.shards[i].limit(),
        }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn shard(&self, i: usize) -> &Shard {
        &self.shards[i]
    }

    /// `position mod shard_count`, without a division (Lemire, "Faster
    /// remainder by direct computation", 2019): exact for 32-bit positions
    /// and shard counts below 2^32.
    #[inline]
    pub(crate) fn reduce(&self, position: usize) -> usize {
        if self.mask != 0 || self.shards.len() == 1 {
            return position & self.mask;
        }
        let low = self.magic.wrapping_mul(position as u32 as u64);
        ((u128::from(low) * self.shards.len() as u128) >> 64) as usize
    }

    /// The shard the calling thread would try first.
    #[inline]
    pub(crate) fn home_shard(&self) -> usize {
        self.reduce(self.probe.start())
    }

    /// Admits one unit, starting where the caller's probe says.
    ///
    /// Returns the shard it was taken from; `Overload` (counted) when every
    /// shard is at its limit, `Shutdown` once closed.
    #[inline]
    pub(crate) fn acquire(&self) -> Result<usize, Error> {
        self.acquire_at(self.home_shard())
    }

    /// Admits one unit, trying shard `start` first; an `Overload` is
    /// counted.
    #[inline]
    pub(crate) fn acquire_at(&self, start: usize) -> Result<usize, Error> {
        self.try_at::<true>(start)
    }

    /// [`acquire_at`](Self::acquire_at), counting an `Overload` only if
    /// `COUNT` (not for a caller that may wait instead).
    // inline(always), like the release steps below: this is the hot path,
    // and left to itself the compiler kept it out of line once the cold
    // paths (gated, waiting) grew around it, a call that cost 5 to 10 % of
    // an acquire + release (benches/admission.rs against the earlier code).
    #[inline(always)]
    fn try_at<const COUNT: bool>(&self, start: usize) -> Result<usize, Error> {
        debug_assert!(start < self.shards.len());
        let word = self.full.word(start / BITS);
        let marked = word & (1 << (start % BITS)) != 0;
        // A set bit on the caller's own shard is checked against the shard
        // itself (two loads of a line this caller's core usually holds): a
        // bit can be set for a moment after a release (see the module
        // docs), and a caller must not be refused by its own shard's stale
        // bit. Other shards' bits are trusted: checking them all would make
        // a rejection cost grow with the shard count.
        if !marked || !self.shards[start].looks_full() {
            match self.take_at(start) {
                Take::Taken { .. } => return Ok(start),
                // Marked full or undone by `take_at`: walk on.
                Take::Full | Take::Over => {}
                Take::Closed => return Err(Error::Shutdown),
                Take::Gated => {
                    let result = self.acquire_gated(start, false);
                    if COUNT && result == Err(Error::Overload) {
                        self.count_refusal();
                    }
                    return result;
                }
            }
        } else if self.all_marked(word) {
            // The own shard is full and every other shard is marked full:
            // under overload, this is the whole answer, whatever the shard
            // count.
            return self.refuse::<COUNT>();
        }
        let result = self.acquire_slow(start, false);
        if COUNT && result == Err(Error::Overload) {
            self.count_refusal();
        }
        result
    }

    /// The walk: every shard after `start` whose bit is clear, wrapping once.
    /// `except_start`: the caller must not be served by `start` (see
    /// [`acquire_except`](Self::acquire_except)); only the gated path needs
    /// to know, since the walk never comes back to `start`.
    #[cold]
    fn acquire_slow(&self, start: usize, except_start: bool) -> Result<usize, Error> {
        let words = self.full.len();
        let (first_word, first_bit) = (start / BITS, start % BITS);
        for step in 0..=words {
            let w = (first_word + step) % words;
            // Bits after `start` in its own word on the first visit, bits
            // before it on the wrap-around visit, all bits in between.
            let mut wanted = usize::MAX;
            if step == 0 {
                wanted = usize::MAX.checked_shl(first_bit as u32 + 1).unwrap_or(0);
            }
            if step == words {
                wanted = (1 << first_bit) - 1;
            }
            let mut candidates = !self.full.word(w) & wanted & self.valid_bits(w);
            while candidates != 0 {
                let bit = candidates.trailing_zeros() as usize;
                candidates &= candidates - 1;
                let i = w * BITS + bit;
                match self.take_at(i) {
                    Take::Taken { .. } => return Ok(i),
                    Take::Full | Take::Over => {}
                    Take::Closed => return Err(Error::Shutdown),
                    Take::Gated => return self.acquire_gated(start, except_start),
                }
            }
        }
        self.refused()
    }

    /// Admission through a gated shard: a resize is in progress, or the
    /// table is in debt. Waits for the control lock (a resize holds it for
    /// a few RMWs per shard), settles a debt if enough units came back,
    /// then probes again, still under the lock: while it is held and there
    /// is no debt, no shard is gated, so the probe cannot come back here.
    #[cold]
    fn acquire_gated(&self, start: usize, except_start: bool) -> Result<usize, Error> {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let result = if control.debt && !self.settle(&mut control, &mut woken) {
            self.refused()
        } else if except_start {
            self.acquire_slow(start, true)
        } else {
            self.try_at::<false>(start)
        };
        drop(control);
        // The waiters a settled debt served, after the lock.
        self.wake_keeping(woken, result.ok());
        result
    }

    /// Ends a debt if the units held are back within the capacity: splits
    /// it over the holdings and un-gates, pushing the waiters it served
    /// onto `woken`. True if there is no debt now. Under the control lock.
    fn settle(&self, control: &mut Control, woken: &mut Woken) -> bool {
        // While in debt every shard is gated, so no bounded take lands:
        // these readings only fall (unbounded takes aside, which the next
        // settle sees).
        let held: Vec<usize> = self.shards.iter().map(|s| s.usage_synced()).collect();
        match split::split(self.capacity(), &held, self.caps.as_deref()) {
            Some(limits) => {
                control.debt = false;
                self.apply(control, &limits, true, woken);
                true
            }
            None => false,
        }
    }

    /// Wakes the waiters in `woken`, after the control lock (`waiters.rs`,
    /// "Foreign code"). A waker's panic goes on up to the caller.
    fn wake(&self, woken: Woken) {
        if let Some(room) = self.room.as_deref() {
            woken.wake_all(room);
        }
    }

    /// [`wake`](Self::wake) for a caller that has just taken a unit of
    /// shard `taken` and not yet handed it to anyone: if a waker panics,
    /// the unit goes back to the table before the panic goes on, so the
    /// panic strands nothing.
    fn wake_keeping(&self, woken: Woken, taken: Option<usize>) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.wake(woken))) {
            if let Some(shard) = taken {
                self.return_unused(shard);
            }
            resume_unwind(panic);
        }
    }

    /// True while more units are held than the capacity (after a shrink).
    #[cfg(any(loom, test))]
    pub(crate) fn in_debt(&self) -> bool {
        self.control.lock().debt
    }

    /// Sets the capacity to `capacity`; see the module docs ("Resize").
    pub(crate) fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        let max = match &self.caps {
            Some(caps) => caps.iter().sum(),
            None => MAX_CAPACITY,
        };
        if capacity > max {
            return Err(ConfigError::too_large("capacity", max));
        }
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        // 1. Gate: from here every take goes to `acquire_gated`, which waits
        //    for this lock. AcqRel: the RMW puts the gate in each word's
        //    modification order, so a take either came before it (and is
        //    in the holdings read below) or sees GATED, or fails its CAS.
        for shard in self.shards.iter() {
            shard.taken.fetch_or(GATED, AcqRel);
        }
        // 2. The holdings: exact, since no take can land, and from here they
        //    only fall (releases).
        let held: Vec<usize> = self.shards.iter().map(|s| s.usage_synced()).collect();
        // Relaxed: a reading for `capacity()`; the limits decide admission.
        self.capacity.store(capacity, Relaxed);
        // 3. New limits: at or above each shard's holdings and adding up to
        //    `capacity`; or, if more is held than that, a debt: the shards
        //    stay gated until `settle` finds the units back within it.
        match split::split(capacity, &held, self.caps.as_deref()) {
            Some(limits) => {
                control.debt = false;
                self.apply(&mut control, &limits, true, &mut woken);
            }
            None => {
                control.debt = true;
                let limits = split::even(capacity, self.shards.len(), self.caps.as_deref());
                self.apply(&mut control, &limits, false, &mut woken);
            }
        }
        drop(control);
        // 4. Wake the waiters a grow served: un-gated and unlocked, so a
        //    waker that calls back into the table finds it open, and one
        //    that panics leaves it consistent.
        self.wake(woken);
        Ok(())
    }

    /// Stores `limits`, hands new room to waiters (pushing them onto
    /// `woken`, for the caller to wake after the lock), un-gates every
    /// shard if `ungate`, and marks each shard full or not under its new
    /// limit. Under the control lock.
    fn apply(&self, control: &mut Control, limits: &[usize], ungate: bool, woken: &mut Woken) {
        for (shard, &limit) in self.shards.iter().zip(limits) {
            // Relaxed: published by the Release un-gating RMW below (or, in
            // debt, by the control lock that `settle` takes before it
            // un-gates).
            shard.limit.store(limit, Relaxed);
        }
        if ungate {
            // Growing hands the new room to waiters first: while the shards
            // are still gated, no newcomer can take it. They are woken by
            // the caller, after the un-gate and the lock.
            self.grant_waiting(control, woken);
            for shard in self.shards.iter() {
                // Release: pairs with the AcqRel CAS in `try_take` that
                // reads this value (or a later one in its release
                // sequence), so that take's second limit read sees the
                // store above. (This leaves the word as it was before the
                // gate, so a taker that read it then can still succeed with
                // a stale limit: that second read is what catches it. Making
                // the word change instead, with a phantom unit, would let a
                // reader see a unit fewer than is held, an empty shard that
                // is not: a pool worker could then think itself drained.)
                shard.taken.fetch_and(!GATED, Release);
            }
        }
        for i in 0..self.shards.len() {
            if self.shards[i].still_full() {
                self.mark_full(i);
            } else {
                self.unmark(i);
            }
        }
    }

    /// Every shard was full: `Overload` (counted by the caller's entry
    /// point), unless shutdown has begun. Inlined: under overload this is
    /// the hot path.
    #[inline]
    fn refused(&self) -> Result<usize, Error> {
        // Relaxed: only picks the more useful error; a caller racing with
        // shutdown may get either, and neither admits anything.
        if self.closed.load(Relaxed) {
            return Err(Error::Shutdown);
        }
        Err(Error::Overload)
    }

    /// [`refused`](Self::refused), counting an `Overload` if `COUNT`: the
    /// fast refusal, one load of `closed` and the per-thread count.
    #[inline]
    fn refuse<const COUNT: bool>(&self) -> Result<usize, Error> {
        // Relaxed: as in `refused`.
        if self.closed.load(Relaxed) {
            return Err(Error::Shutdown);
        }
        if COUNT {
            self.count_refusal();
        }
        Err(Error::Overload)
    }

    /// Counts one `Overload` answered to the calling thread (also for a
    /// caller that answered it after an uncounted [`probe`](Self::probe)).
    #[inline]
    pub(crate) fn count_refusal(&self) {
        self.rejected.record(thread_index());
    }

    /// The bits of word `w` that stand for real shards.
    fn valid_bits(&self, w: usize) -> usize {
        let rest = self.shards.len() - w * BITS;
        if rest >= BITS {
            usize::MAX
        } else {
            (1 << rest) - 1
        }
    }

    /// True if every shard is marked full, given `word`, the full set's word
    /// of the caller's own shard: that word itself with up to 64 shards,
    /// the count of marked shards beyond.
    #[inline]
    fn all_marked(&self, word: usize) -> bool {
        // The word first: with up to 64 shards this is the whole answer
        // (one compare, as on the fast path before the count existed).
        // Counted tables have `all_full == 0`, which a word holding the
        // caller's own set bit never equals.
        word == self.all_full
            // Relaxed: a hint, like the words themselves. A decrement that
            // happened-before this load (through a release's RMW on
            // `given`, see `release`) is seen by coherence.
            || (self.counted && self.full_count.load(Relaxed) == self.shards.len())
    }

    /// Sets shard `i`'s full bit, then takes it back if the shard has room
    /// (step 1 of the protocol in the module docs).
    fn mark_full(&self, i: usize) {
        if self.full.insert(i) && self.counted {
            // Relaxed: a hint; see `all_marked`. Only the caller that set
            // the bit counts it, so the count is the number of set bits
            // once the callers that flipped them have returned.
            self.full_count.fetch_add(1, Relaxed);
        }
        if !self.shards[i].still_full() {
            self.unmark(i);
        }
    }

    /// Clears shard `i`'s full bit, and uncounts it if this call cleared it.
    #[inline]
    fn unmark(&self, i: usize) {
        if self.full.remove(i) && self.counted {
            // Relaxed: as in `mark_full`; a wrap below zero while a racing
            // marker has yet to count its bit only reads as "not all full".
            self.full_count.fetch_sub(1, Relaxed);
        }
    }

    /// Admits one unit on any shard but `skip`, walking from the one after
    /// it: for a caller that must not be served by shard `skip` (a pool
    /// worker calling its own pool). `Overload` (counted) when every other
    /// shard is full, and with a single shard.
    pub(crate) fn acquire_except(&self, skip: usize) -> Result<usize, Error> {
        debug_assert!(skip < self.shards.len());
        // The walk from `skip` visits every shard but `skip` itself.
        let result = self.acquire_slow(skip, true);
        if let Err(Error::Overload) = result {
            self.count_refusal();
        }
        result
    }

    /// Admits one unit on shard `i` and on no other (a pinned keyed pool
    /// request, whose worker is fixed by its key). `Overload` (counted)
    /// when that shard is at its limit, whatever room the others have;
    /// never waits.
    pub(crate) fn acquire_only(&self, i: usize) -> Result<usize, Error> {
        debug_assert!(i < self.shards.len());
        let result = match self.take_only(i) {
            Take::Taken { .. } => Ok(i),
            Take::Closed => Err(Error::Shutdown),
            Take::Full | Take::Over | Take::Gated => Err(Error::Overload),
        };
        if result == Err(Error::Overload) {
            self.count_refusal();
        }
        result
    }

    /// [`take_at`](Self::take_at) on shard `i`, through the control lock
    /// if the shard is gated (as `acquire_gated`: under the lock with no
    /// debt, no shard is gated).
    fn take_only(&self, i: usize) -> Take {
        match self.take_at(i) {
            Take::Gated => {
                let mut woken = Woken::default();
                let mut control = self.control.lock();
                let take = if control.debt && !self.settle(&mut control, &mut woken) {
                    Take::Full
                } else {
                    self.take_at(i)
                };
                drop(control);
                let taken = matches!(take, Take::Taken { .. }).then_some(i);
                self.wake_keeping(woken, taken);
                take
            }
            take => take,
        }
    }

    /// One take on shard `i` with the full-set steps that follow every
    /// take (the protocol in the module docs): the shard's bit is set when
    /// this take filled it or found it full, and a take that landed over a
    /// limit lowered meanwhile is undone. The one place those steps are
    /// written, for the fast path, the walk and the pinned take alike.
    #[inline(always)]
    fn take_at(&self, i: usize) -> Take {
        let take = self.shards[i].try_take();
        match take {
            Take::Taken { now_full: true } | Take::Full => self.mark_full(i),
            Take::Over => self.undo(i),
            Take::Taken { now_full: false } | Take::Closed | Take::Gated => {}
        }
        take
    }

    /// Records that the unit held on shard `i` will never be given back
    /// (its holder called `forget`): it stays counted in the usage, so the
    /// capacity shrinks by one for good, and the stats say why.
    pub(crate) fn forget(&self, i: usize) {
        // Relaxed: a count, read only by `stats`.
        self.shards[i].forgotten.fetch_add(1, Relaxed);
    }

    /// Takes one unit on the caller's home shard whatever the limit
    /// (`*_unbounded` calls). `Shutdown` once closed.
    pub(crate) fn acquire_unbounded(&self) -> Result<usize, Error> {
        self.acquire_unbounded_on(self.home_shard())
    }

    /// Takes one unit on shard `i` whatever the limit (an `*_unbounded`
    /// call that must not land on the caller's own shard). `Shutdown` once
    /// closed.
    pub(crate) fn acquire_unbounded_on(&self, i: usize) -> Result<usize, Error> {
        debug_assert!(i < self.shards.len());
        if self.shards[i].take_unbounded() {
            Ok(i)
        } else {
            Err(Error::Shutdown)
        }
    }

    /// Gives back one unit taken from shard `i` (steps 2 and 3 of the
    /// protocol in the module docs).
    #[inline(always)]
    pub(crate) fn release(&self, i: usize, panicked: bool) {
        match self.room.as_deref() {
            None => self.give_back(i, panicked),
            Some(room) => self.release_to_room(room, i, panicked),
        }
    }

    /// A release in a table with a waiting room: one more word read before
    /// the give-back and after it (`waiters.rs`, "Hand-off" and "Wake-up").
    /// Relaxed loads: the first only picks the path (the hand-off re-checks
    /// under the lock); the second is ordered after a waiter's count store
    /// by the RMW on `given` in `give_back_many` (see there).
    #[inline(always)]
    fn release_to_room(&self, room: &Room, i: usize, panicked: bool) {
        if room.count.load(Relaxed) > 0 && self.hand_off(room, i, panicked) {
            return;
        }
        self.give_back(i, panicked);
        if room.count.load(Relaxed) > 0 {
            self.grant_from_table();
        }
    }

    /// Hands a released unit of shard `i` straight to the next waiter;
    /// false if there is none (or the table is in debt, when a hand-off
    /// would admit above the capacity).
    #[cold]
    fn hand_off(&self, room: &Room, i: usize, panicked: bool) -> bool {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let shards = self.shards.len();
        let Control {
            debt,
            queue,
            handed,
        } = &mut *control;
        let counted = || {
            // Under the lock, which `stats` takes: a waiter's own `stats()`
            // after its wait returns includes this hand-off.
            if handed.is_empty() {
                handed.resize(shards, 0);
            }
            handed[i] += 1;
            if panicked {
                // Relaxed: a count for `stats`; the waiter sees it through
                // its ticket, written after this.
                self.shards[i].panicked.fetch_add(1, Relaxed);
            }
        };
        let handed = !*debt && queue.grant(room, i, now, counted, &mut woken);
        drop(control);
        woken.wake_all(room);
        handed
    }

    /// A waiter came in while this release gave its unit back: take units
    /// from the table for the waiters while there are any (`waiters.rs`,
    /// "Wake-up").
    #[cold]
    fn grant_from_table(&self) {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        self.grant_waiting(&mut control, &mut woken);
        drop(control);
        self.wake(woken);
    }

    /// Takes units from the table for waiters, in the room's order, while
    /// there are both; what to wake. Under the control lock, so no resize
    /// is half-way: the shards are gated only by the resize that holds the
    /// lock and calls this before un-gating (its new room goes to waiters
    /// first), or by a debt, when nothing is granted.
    fn grant_waiting(&self, control: &mut Control, woken: &mut Woken) {
        let Some(room) = self.room.as_deref() else {
            return;
        };
        // In a debt, the waiters' only hope is that the releases repaid it:
        // settle it here (a release with waiters comes here), or they would
        // sleep to their deadline with room free, since only an admission
        // settles a debt otherwise. Settling un-gates and grants the
        // waiters itself (`apply`).
        if control.debt {
            self.settle(control, woken);
            return;
        }
        while control.queue.len() > 0 && !control.debt {
            // Under the lock, with no debt: nothing is gated but by the
            // resize calling this, whose gate `CLOSED` alone ignores.
            let Found::Unit(shard) = self.take_any(CLOSED) else {
                break;
            };
            // The unit's take was counted by `take_any`.
            if !control.queue.grant(room, shard, now, || {}, woken) {
                // The adaptive order expired the last waiters: nobody took
                // it. Not an admission: give it back unseen (nobody waits
                // now, and a newcomer re-checks the table).
                self.give_back_unseen(shard);
                break;
            }
        }
    }

    /// One unit from any shard that has room, read through an RMW on each
    /// shard's `given` (so a release ordered before it is seen), stopping
    /// at the flags in `stop`.
    fn take_any(&self, stop: usize) -> Found {
        let start = self.home_shard();
        let count = self.shards.len();
        let mut found = Found::Nothing;
        for step in 0..count {
            let i = (start + step) % count;
            let shard = &self.shards[i];
            if shard.usage_synced() >= shard.limit() {
                continue;
            }
            match shard.try_take_masked(stop) {
                Take::Taken { now_full } => {
                    if now_full {
                        self.mark_full(i);
                    }
                    return Found::Unit(i);
                }
                Take::Full => self.mark_full(i),
                Take::Over => self.undo(i),
                Take::Closed => return Found::Nothing,
                Take::Gated => found = Found::Gated,
            }
        }
        found
    }

    /// A new waiter's re-check, after its count is out (`waiters.rs`,
    /// "Wake-up"): a unit from the table (leaving the queue), or nothing.
    /// A gated shard is a resize (which grants the waiters itself before
    /// it un-gates) or a debt, which nobody else may come to settle if the
    /// releases that repaid it came before this waiter was counted: so the
    /// waiter settles it, and is granted with the others, under the lock.
    fn recheck(&self, room: &Room, queued: &Queued) -> Option<usize> {
        match self.take_any(FLAGS) {
            Found::Unit(shard) => Some(self.leave_with(room, queued, shard)),
            Found::Gated => {
                self.grant_from_table();
                None
            }
            Found::Nothing => None,
        }
    }

    /// Gives back a take above a limit that a racing resize lowered under
    /// it (`Take::Over`): nobody held it, so it is left out of the stats,
    /// and like every unit that comes back it serves the room: a waiter
    /// may have queued while the unit was counted (it saw the shard full)
    /// and re-checked before it came back. The hand-off is not used (the
    /// unit is over its shard's limit, so nobody may hold it): the unit
    /// goes back, then units are taken for waiters under the limits, as a
    /// release that found a waiter on its way out does (`waiters.rs`,
    /// "Wake-up").
    ///
    /// Never under the control lock: a take made under it cannot land
    /// over its limit, since limits change only under that lock, so both
    /// its reads of the limit see the same value.
    #[cold]
    fn undo(&self, i: usize) {
        self.give_back_unseen(i);
        if let Some(room) = self.room.as_deref() {
            // Relaxed: ordered after a waiter's count store by the RMW on
            // `given` just made, as in `release_to_room`.
            if room.count.load(Relaxed) > 0 {
                self.grant_from_table();
            }
        }
    }

    /// Gives back a unit nobody held (an over-take, or a unit taken for a
    /// waiter that left before it got it), left out of the stats. The
    /// shard is full (or near it) after an over-take, so it is marked as a
    /// filler would.
    fn give_back_unseen(&self, i: usize) {
        self.give_back(i, false);
        // Relaxed: a count, read by `stats` only.
        self.shards[i].phantom.fetch_add(1, Relaxed);
        self.mark_full(i);
    }

    /// Gives back `units` units of shard `i` at once, `panicked` of them
    /// by a panic: one RMW where no waiter can take them, else one
    /// release each (a waiter may be handed each).
    pub(crate) fn release_many(&self, i: usize, units: usize, panicked: usize) {
        if units == 0 {
            return;
        }
        if self.room.is_some() {
            for k in 0..units {
                self.release(i, k < panicked);
            }
            return;
        }
        self.give_back_many(i, units, panicked);
    }

    /// The unit of shard `i` back in the table, with the full-set steps.
    #[inline(always)]
    fn give_back(&self, i: usize, panicked: bool) {
        self.give_back_many(i, 1, usize::from(panicked));
    }

    /// `units` units of shard `i` back in the table in one RMW, with the
    /// full-set steps (a run of units is one release to the protocol).
    #[inline(always)]
    fn give_back_many(&self, i: usize, units: usize, panicked: usize) {
        // Step 2: unmark *before* the units come back. If this thread is
        // descheduled between the two, the shard is still full, so the
        // clear bit only sends a caller to a shard it finds full: the
        // harmless direction. Whoever sees the units back (through the RMW
        // in `give_back_many`) also sees this clear.
        if self.full.contains(i) {
            self.unmark(i);
        }
        self.shards[i].give_back_many(units, panicked);
        // Step 3: a marker that saw the shard full before this release (its
        // re-read RMW on `given` came first) may have set the bit again;
        // the AcqRel RMW in `give_back_many` makes its `insert` visible
        // here.
        if self.full.contains(i) {
            self.unmark(i);
        }
    }

    /// Refuses all later admissions; units already taken stay counted.
    pub(crate) fn close(&self) {
        // Relaxed: the flag only chooses between two refusals (see
        // `refuse`); the shard words carry the real decision.
        self.closed.store(true, Relaxed);
        for shard in self.shards.iter() {
            shard.close();
        }
        if let Some(room) = &self.room {
            let mut woken = Woken::default();
            let mut control = self.control.lock();
            control.queue.close_all(room, &mut woken);
            drop(control);
            woken.wake_all(room);
        }
    }

    /// True once [`close`](Self::close) has begun: to tell `Shutdown` from
    /// another refusal. A take may still be admitted on a shard the close
    /// has not reached yet.
    pub(crate) fn is_closing(&self) -> bool {
        // Relaxed: informational; callers that act on it read the shard word.
        self.closed.load(Relaxed)
    }

    /// True once [`close`](Self::close) has closed every shard: a take
    /// that begins after this answered true is refused, whatever its
    /// shard. (While the close runs, [`is_closing`](Self::is_closing) is
    /// true and this is not yet.)
    pub(crate) fn is_closed(&self) -> bool {
        // The last shard: a closer closes the shards in order, so whoever
        // closed it closed every other one before. Its Acquire load
        // (`Shard::is_closed`) pairs with that closer's AcqRel `fetch_or`,
        // so each earlier close happens-before this read, and a take that
        // follows it reads its shard's word at or after the close: CLOSED.
        self.shards.last().is_some_and(|shard| shard.is_closed())
    }

    /// Units held now, summed over the shards.
    ///
    /// Read as one snapshot: the shards' `given` words, their `taken`
    /// words, then `given` again, until no release landed in between (after
    /// a few tries, a lower bound: see the end of the function). A sum
    /// of per-shard readings taken one after the other could count a unit
    /// twice, on the shard it was released from and on the shard it was
    /// taken again at, and read one more than the capacity. With no release
    /// during the read, each shard's reading is exact when its `taken` is
    /// read and only grows after it: the sum is at most what is held at the
    /// end of the read, and at least what was held at its start.
    pub(crate) fn usage(&self) -> usize {
        for _ in 0..CONSISTENT_READ_TRIES {
            let before = self.given_total();
            let taken = self.taken_total();
            // Every `given` only grows (by a unit per release), so an equal
            // total means no shard's changed.
            if self.given_total() == before {
                return taken.wrapping_sub(before) / UNIT;
            }
        }
        // Releases kept landing: every `taken`, then every `given`. A unit
        // counted is held from its shard's `taken` read to its `given`
        // read, so at the instant between the last of the one and the
        // first of the other: the sum is at most what was held then (a
        // lower bound, never a double count), and 0 if releases overtook it.
        let taken = self.taken_total();
        let gap = taken.wrapping_sub(self.given_total());
        if (gap as isize) < 0 {
            0
        } else {
            gap / UNIT
        }
    }

    /// The sum of the shards' `taken` words, their flag bits masked off so
    /// that they cannot carry into the units.
    fn taken_total(&self) -> usize {
        self.shards.iter().fold(0usize, |sum, shard| {
            // Acquire: as in `Shard::counts`.
            sum.wrapping_add(shard.taken.load(Acquire) & !FLAGS)
        })
    }

    /// The sum of the shards' `given` words.
    fn given_total(&self) -> usize {
        self.shards.iter().fold(0usize, |sum, shard| {
            // Acquire: pairs with the AcqRel RMW in `give_back_many`, as in
            // `Shard::counts`.
            sum.wrapping_add(shard.given.load(Acquire))
        })
    }

    pub(crate) fn stats(&self) -> Stats {
        // The figures kept under the control lock, if there is a room (no
        // hand-off happens without one).
        let (handed, counts) = match &self.room {
            Some(_) => {
                let control = self.control.lock();
                (control.handed.clone(), Some(control.queue.counts()))
            }
            None => (Vec::new(), None),
        };
        let shards: Vec<ShardStats> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, shard)| shard.stats(handed.get(i).copied().unwrap_or(0)))
            .collect();
        let room = match (&self.room, counts) {
            (Some(room), Some(counts)) => room.stats(counts),
            _ => Default::default(),
        };
        Stats {
            capacity: self.capacity(),
            usage: shards.iter().map(|s| s.usage).sum(),
            peak_usage: shards.iter().map(|s| s.peak_usage).sum(),
            accepted: shards.iter().map(|s| s.accepted).sum(),
            rejected: self.rejected.total(),
            completed: shards.iter().map(|s| s.completed).sum(),
            panicked: shards.iter().map(|s| s.panicked).sum(),
            forgotten: shards.iter().map(|s| s.forgotten).sum(),
            waiting: room.waiting,
            peak_waiting: room.peak_waiting,
            waiting_for_keys: 0,
            peak_waiting_for_keys: 0,
            timed_out: room.timed_out,
            waited: room.waited,
            waited_time: room.waited_time,
            shards,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn limits(table: &Table) -> Vec<usize> {
        table.shards.iter().map(|s| s.limit()).collect()
    }

    /// Polls `future` on this thread, parking between polls; the waker
    /// unparks it. No runtime: only the crate's own watcher can time out.
    fn block_on_parked<F: std::future::Future + Unpin>(mut future: F) -> F::Output {
        struct Unpark(crate::sync::os_thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::task::Waker::from(Arc::new(Unpark(crate::sync::os_thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        loop {
            if let std::task::Poll::Ready(output) = std::pin::Pin::new(&mut future).poll(&mut cx) {
                return output;
            }
            crate::sync::os_thread::park();
        }
    }

    #[test]
    fn an_async_waiter_times_out_at_its_callers_deadline_before_max_wait() {
        let policy = Policy {
            max_waiters: 4,
            max_wait: std::time::Duration::from_secs(3600),
            ..Policy::default()
        };
        let table = Table::new(1, 1, Probe::Thread)
            .unwrap()
            .with_policy(&policy)
            .unwrap();
        let held = table.acquire().unwrap();
        // The caller's deadline, far earlier than `max_wait`: the watcher
        // must ring for it, the only thing that can wake this waiter.
        for wait_ms in [5, 1, 0] {
            let deadline = now() + std::time::Duration::from_millis(wait_ms);
            let result = block_on_parked(table.acquire_async(Some(deadline)));
            assert_eq!(result, Err(Error::Timeout));
            assert!(now() >= deadline);
            assert_eq!(table.waiting(), 0);
        }
        // A deadline already past times out after one re-check, unqueued.
        let past = now();
        assert_eq!(
            block_on_parked(table.acquire_async(Some(past))),
            Err(Error::Timeout)
        );
        assert_eq!(table.stats().timed_out, 4);
        table.release(held, false);
        assert_eq!(table.usage(), 0);
    }

    #[test]
    fn limits_add_up_to_capacity() {
        for capacity in 1..40 {
            for shards in 1..12 {
                let table = Table::new(capacity, shards, Probe::Thread).unwrap();
                let limits = limits(&table);
                assert_eq!(limits.iter().sum::<usize>(), capacity);
                // Every shard is kept: with less capacity than shards, the
                // last ones start at 0 (and full), ready to grow into.
                assert_eq!(limits.len(), shards);
                let (min, max) = (limits.iter().min().unwrap(), limits.iter().max().unwrap());
                assert!(max - min <= 1, "{limits:?}");
                for (i, &limit) in limits.iter().enumerate() {
                    assert_eq!(table.full.contains(i), limit == 0, "{limits:?}");
                }
            }
        }
    }

    #[test]
    fn reduce_is_modulo() {
        for shards in [1, 2, 3, 5, 7, 64, 65, 1000] {
            let table = Table::new(10_000, shards, Probe::Thread).unwrap();
            for position in (0..5000).chain([u32::MAX as usize - 1, u32::MAX as usize]) {
                assert_eq!(table.reduce(position), position % shards.min(10_000));
            }
        }
    }

    #[test]
    fn walk_covers_every_shard_from_every_start_across_words() {
        for shards in [1, 2, 63, 64, 65, 130] {
            for start in 0..shards {
                let table = Table::new(shards, shards, Probe::Thread).unwrap();
                let mut got: Vec<usize> = (0..shards)
                    .map(|_| table.acquire_at(start).unwrap())
                    .collect();
                assert_eq!(got[0], start);
                assert_eq!(table.acquire_at(start), Err(Error::Overload));
                got.sort_unstable();
                assert_eq!(got, (0..shards).collect::<Vec<_>>());
                // Every bit is set now, and one release clears exactly one.
                table.release(shards - 1, false);
                assert_eq!(table.acquire_at(start), Ok(shards - 1));
            }
        }
    }

    #[test]
    fn refusal_past_64_shards_reads_the_count() {
        for shards in [65, 130, 1024] {
            let table = Table::new(shards, shards, Probe::Thread).unwrap();
            assert!(table.counted);
            let got: Vec<usize> = (0..shards).map(|_| table.acquire_at(7).unwrap()).collect();
            // Every shard is marked, and counted once.
            assert_eq!(table.full_count.load(Relaxed), shards);
            assert!(table.all_marked(table.full.word(0)));
            assert_eq!(table.acquire_at(3), Err(Error::Overload));
            // A release uncounts its shard before its unit is back.
            table.release(got[10], false);
            assert_eq!(table.full_count.load(Relaxed), shards - 1);
            assert_eq!(table.acquire_at(3), Ok(got[10]));
            assert_eq!(table.full_count.load(Relaxed), shards);
            for &shard in &got {
                table.release(shard, false);
            }
            assert_eq!(table.full_count.load(Relaxed), 0);
            assert_eq!(table.usage(), 0);
        }
        let small = Table::new(64, 64, Probe::Thread).unwrap();
        assert!(!small.counted);
    }

    #[test]
    fn a_shrink_below_the_holdings_is_a_debt_until_they_drain() {
        let table = Table::new(4, 2, Probe::Thread).unwrap();
        let held: Vec<usize> = (0..4).map(|_| table.acquire().unwrap()).collect();
        table.set_capacity(2).unwrap();
        assert!(table.in_debt());
        assert_eq!(table.available(), 0);
        // Two back: still 2 held, the new capacity; the debt settles at the
        // next admission, which is refused (full).
        table.release(held[0], false);
        table.release(held[1], false);
        assert_eq!(table.acquire(), Err(Error::Overload));
        assert!(!table.in_debt());
        let limits = limits(&table);
        assert_eq!(limits.iter().sum::<usize>(), 2);
        table.release(held[2], false);
        let again = table.acquire().unwrap();
        assert_eq!(table.acquire(), Err(Error::Overload));
        table.release(again, false);
        table.release(held[3], false);
        assert_eq!(table.usage(), 0);
        // Stats see no trace of the gate: accepted = completed.
        let stats = table.stats();
        assert_eq!(stats.accepted, stats.completed);
        assert_eq!(stats.accepted, 5);
    }

    #[test]
    fn resize_respects_the_caps() {
        let table = Table::with_max(2, 6, 3, Probe::Thread).unwrap();
        assert_eq!((table.cap(0), table.cap(1), table.cap(2)), (2, 2, 2));
        table.set_capacity(6).unwrap();
        assert_eq!(limits(&table), [2, 2, 2]);
        assert_eq!(table.set_capacity(7).unwrap_err().field(), "capacity");
        assert!(Table::with_max(7, 6, 3, Probe::Thread).is_err());
    }

    #[test]
    fn a_release_unmarks_before_its_unit_is_back() {
        // Single-threaded, the order is invisible; check the end state the
        // protocol promises: no mark on a shard with room, for every shard.
        let table = Table::new(3, 3, Probe::Thread).unwrap();
        let held: Vec<usize> = (0..3).map(|_| table.acquire().unwrap()).collect();
        assert_eq!(table.full.word(0), 0b111);
        table.release(held[1], false);
        assert_eq!(table.full.word(0), 0b111 & !(1 << held[1]));
    }

    #[test]
    fn lower_bound_is_exact_when_quiet_and_never_above_the_limit() {
        let table = Table::new(4, 1, Probe::Thread).unwrap();
        let shard = table.shard(0);
        for expected in 1..=4 {
            table.acquire().unwrap();
            assert_eq!(shard.lower_bound().0, expected);
            assert_eq!(shard.counts(), shard.lower_bound());
        }
    }

    #[test]
    fn walk_takes_the_next_shard_in_order() {
        let table = Table::new(4, 4, Probe::Thread).unwrap();
        assert_eq!(table.acquire_at(2), Ok(2));
        assert_eq!(table.acquire_at(2), Ok(3));
        assert_eq!(table.acquire_at(2), Ok(0));
        assert_eq!(table.acquire_at(2), Ok(1));
    }

    #[test]
    fn closed_table_refuses_with_shutdown_and_keeps_counts() {
        let table = Table::new(2, 2, Probe::Thread).unwrap();
        let held = table.acquire_at(0).unwrap();
        table.close();
        assert_eq!(table.acquire_at(0), Err(Error::Shutdown));
        assert_eq!(table.acquire_at(1), Err(Error::Shutdown));
        assert_eq!(table.acquire_unbounded(), Err(Error::Shutdown));
        assert_eq!(table.usage(), 1);
        table.release(held, false);
        assert_eq!(table.usage(), 0);
        assert_eq!(table.stats().rejected, 0);
    }

    #[test]
    fn unbounded_takes_are_counted_beyond_the_limit() {
        let table = Table::new(1, 1, Probe::Thread).unwrap();
        table.acquire().unwrap();
        assert_eq!(table.acquire(), Err(Error::Overload));
        table.acquire_unbounded().unwrap();
        assert_eq!(table.usage(), 2);
        // Units taken beyond the limit count in the peak too.
        assert_eq!(table.stats().peak_usage, 2);
        table.release(0, false);
        assert_eq!(table.acquire(), Err(Error::Overload));
        table.release(0, true);
        assert_eq!(table.acquire(), Ok(0));
        let stats = table.stats();
        assert_eq!((stats.accepted, stats.completed, stats.panicked), (3, 1, 1));
        assert_eq!(stats.rejected, 2);
    }
}
