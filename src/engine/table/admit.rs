//! The hot path: admission from the caller's own shard, the walk over
//! the shards not marked full, the refusal, and the release; down to the
//! shard's CAS on `taken` and its RMW on `given`. Everything else in the
//! table is a cold path this one falls into (a gated shard: `resize.rs`; a
//! waiting room: `room.rs`).
//!
//! **Fast and cold.** What is inlined into a caller is the common case
//! alone, and every other case leaves it by one out-of-line call:
//!
//! * admission ([`Table::acquire`], [`Shard::take_fast`]): the caller's
//!   own shard, one reading of its counters, one CAS, the limit read again
//!   after it, the peak; the shard's last unit, an over-take, a lost CAS,
//!   a flag and the walk are out of line (`took_edge`, `try_at_cold`);
//! * the refusal: the own shard full by that same reading, and the full
//!   set's summary (its one word, or the count) saying every shard is
//!   marked; then the per-thread count;
//! * the release ([`Table::release_shard`]): step 2's read of the shard's
//!   bit and the room's first read of the number waiting, the RMW on
//!   `given`, the same two reads again, the panic question; a marked
//!   shard, a waiter, a table of more than 64 shards are out of line
//!   (`release_off`: `release_general`, `after_release`).
//!
//! `benches/hot_path.rs` counts the instructions of each beside tokio's
//! `Semaphore` and a bare CAS pair (`scripts/hot-path-instructions.sh`).
//!
//! **What `Overload` promises.** A caller starts at the shard its
//! [`Probe`](crate::probe::Probe) names and tries it if its counters show room
//! (so a caller is never refused by its own shard's stale bit); if they
//! show it full, it is refused when every other shard is marked, and
//! otherwise walks the clear bits from there, wrapping once. `Overload`
//! means every shard was *seen* full during the call: tried and found
//! full (by its own counters for the caller's shard, confirmed by an RMW
//! on its `given` word for the others, see [`Shard::try_take`]), or
//! marked. The
//! shards are not all read at one instant, so a unit freed on a shard
//! after the caller passed it does not save the call: N threads that each
//! hold at most one unit of capacity N can still, rarely, be refused.
//! Erlang's sidejob answers the same way. A refusal while a shard has room
//! needs one of:
//!
//! * that shard's unit came back after the walk passed it (above), or
//! * a marker set its bit in the few instructions before a release of it
//!   (between steps 2 and 3 of the full set's protocol, `full.rs`), and the releaser is still between its RMW on
//!   `given` and step 3. That ends when the releaser runs again. Without a
//!   racing marker, a descheduled releaser never keeps a free shard looking
//!   full: step 2 cleared the bit before the unit came back.
//!
//! `loom-tests/tests/loom_limiter.rs` checks: no false `Full` from the
//! counters, no bit that stays set, and no refusal by a bit (or count)
//! whose shard's release the caller has already seen.

use super::{Bound, Shard, Table, Take, BITS, CLOSED, FLAGS, UNIT};
use crate::engine::probe::{raw_thread_index, thread_index};
use crate::engine::waiters::Room;
use crate::error::Error;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// What [`Shard::take_fast`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fast {
    /// A unit was taken, below the limit: nothing more to do.
    Taken,
    /// A unit was taken and the shard now holds `now` units against a
    /// `limit` read after the CAS: its last unit (`now == limit`), or one
    /// over a limit a racing resize lowered (`now > limit`).
    Edge { now: usize, limit: usize },
    /// Nothing taken: no flag is set and one reading of the counters shows
    /// the shard exactly at its limit (the reading of
    /// [`Shard::looks_full`]; over the limit, after a shrink, is `Cold`).
    LooksFull,
    /// Nothing taken, for any other reason: a flag, counters read across a
    /// release, a CAS lost to another taker.
    Cold,
}

impl Table {
    /// `position mod shard_count`, without a division (Lemire, "Faster
    /// remainder by direct computation", 2019): exact for 32-bit positions
    /// and shard counts below 2^32.
    #[inline]
    pub(crate) fn reduce(&self, position: usize) -> usize {
        // Thread indices are dense from 0, so with a shard per CPU most
        // callers' positions are already below the count: one compare, and
        // it tells the compiler the answer indexes `shards` (no bounds
        // check after it).
        if position < self.shards.len() {
            return position;
        }
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
    #[inline(always)]
    pub(crate) fn acquire(&self) -> Result<usize, Error> {
        self.acquire_shard().map(Shard::index)
    }

    /// [`acquire`](Self::acquire), answering the shard itself: for a
    /// holder that keeps it to release it by
    /// ([`release_shard`](Self::release_shard)).
    #[inline(always)]
    pub(crate) fn acquire_shard(&self) -> Result<&Shard, Error> {
        if self.thread_home {
            // The thread's index as stored: not assigned yet (or given
            // back), it is far above any shard count. Below the count, it
            // is the home shard as it is: one compare checks it, reduces
            // it and bounds the shard.
            let index = raw_thread_index();
            if let Some(shard) = self.shards.get(index) {
                return self.try_shard::<true>(index, shard, true);
            }
        }
        let start = self.home_shard();
        self.try_shard::<true>(start, &self.shards[start], false)
    }

    /// Admits one unit, trying shard `start` first; an `Overload` is
    /// counted.
    #[inline]
    pub(crate) fn acquire_at(&self, start: usize) -> Result<usize, Error> {
        self.try_at::<true>(start)
    }

    /// [`acquire_at`](Self::acquire_at), counting an `Overload` only if
    /// `COUNT` (not for a caller that may wait instead).
    #[inline(always)]
    pub(super) fn try_at<const COUNT: bool>(&self, start: usize) -> Result<usize, Error> {
        self.try_shard::<COUNT>(start, &self.shards[start], false)
            .map(Shard::index)
    }

    /// [`try_at`](Self::try_at), given shard `start` itself, and `home`:
    /// `start` is the caller's thread index in a table of at most 64
    /// shards (see `thread_home`). Then the cold calls read the index from
    /// the shard (a load on the line just read) rather than take `start`,
    /// so the inlined path keeps no index in a register across the take:
    /// an instruction less on an admission and on a refusal.
    ///
    /// The fast path answers the two common cases alone: a unit under the
    /// limit of the caller's own shard ([`Shard::take_fast`]), and a
    /// refusal when that shard looks full and every shard is marked.
    /// Everything else (a flag, a lost CAS, the shard's last unit, a walk)
    /// goes to [`try_at_cold`](Self::try_at_cold), out of line, so that
    /// what is inlined into the caller is a few loads, one CAS and a
    /// compare or two.
    // inline(always): this is the hot path, and left to itself the
    // compiler kept it out of line once the cold paths (gated, waiting)
    // grew around it, a call that cost 5 to 10 % of an acquire + release
    // (benches/admission.rs against the earlier code).
    #[inline(always)]
    fn try_shard<'a, const COUNT: bool>(
        &'a self,
        start: usize,
        shard: &'a Shard,
        home: bool,
    ) -> Result<&'a Shard, Error> {
        // The index the cold calls take (see above).
        let first = || if home { shard.index } else { start };
        let answer = match shard.take_fast() {
            Fast::Taken => return Ok(shard),
            Fast::Edge { now, limit } => self.took_edge::<COUNT>(first(), now, limit),
            // The own shard is full by its own counters (so not by a stale
            // bit) and every other shard is marked full: under overload,
            // this is the whole answer, whatever the shard count.
            Fast::LooksFull => match home {
                // One word holds every bit: equal to `all_full`, it holds
                // the shard's too (`all_marked_from`).
                true if self.full.first_word() == self.all_full => {
                    if COUNT {
                        shard.count_home_refusal();
                    }
                    return Err(Error::Overload);
                }
                false if self.all_marked_from(first()) => return Err(self.refuse::<COUNT>()),
                _ => self.try_at_cold::<COUNT>(first()),
            },
            Fast::Cold => self.try_at_cold::<COUNT>(first()),
        };
        answer.map(|i| &*self.shards[i])
    }

    /// The fast path's take landed at or over the shard's limit: it took
    /// the last unit (mark the shard full, as [`take_at`](Self::take_at)
    /// does), or a racing resize lowered the limit under it (undo it and
    /// walk on).
    #[cold]
    #[inline(never)]
    fn took_edge<const COUNT: bool>(
        &self,
        start: usize,
        now: usize,
        limit: usize,
    ) -> Result<usize, Error> {
        if now > limit {
            self.undo(start);
            let result = self.acquire_slow(start, false);
            if COUNT && result == Err(Error::Overload) {
                self.count_refusal();
            }
            return result;
        }
        self.shards[start].raise_peak(now);
        self.mark_full(start);
        Ok(start)
    }

    /// What [`try_at`](Self::try_at) does when the fast path cannot
    /// answer: the own shard through [`take_at`](Self::take_at) (its
    /// confirmed `Full`, its flags), then the walk.
    #[cold]
    #[inline(never)]
    fn try_at_cold<const COUNT: bool>(&self, start: usize) -> Result<usize, Error> {
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
            // count (`refused` tells a close from an overload).
            let result = self.refused();
            if COUNT && result == Err(Error::Overload) {
                self.count_refusal();
            }
            return result;
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
    pub(super) fn acquire_slow(&self, start: usize, except_start: bool) -> Result<usize, Error> {
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

    /// One take on shard `i` with the full-set steps that follow every
    /// take (the protocol in the module docs): the shard's bit is set when
    /// this take filled it or found it full, and a take that landed over a
    /// limit lowered meanwhile is undone. The one place those steps are
    /// written, for the fast path, the walk and the pinned take alike.
    #[inline(always)]
    pub(super) fn take_at(&self, i: usize) -> Take {
        let take = self.shards[i].try_take();
        match take {
            Take::Taken { now_full: true } | Take::Full => self.mark_full(i),
            Take::Over => self.undo(i),
            Take::Taken { now_full: false } | Take::Closed | Take::Gated => {}
        }
        take
    }

    /// Every shard was full: `Overload` (counted by the caller's entry
    /// point), unless shutdown has begun. Inlined: under overload this is
    /// the hot path.
    #[inline]
    pub(super) fn refused(&self) -> Result<usize, Error> {
        // Relaxed: only picks the more useful error; a caller racing with
        // shutdown may get either, and neither admits anything.
        if self.closed.load(Relaxed) {
            return Err(Error::Shutdown);
        }
        Err(Error::Overload)
    }

    /// The fast refusal: `Overload`, counted if `COUNT` (under the
    /// caller's thread index), for a caller whose own shard looked full
    /// with no flag set ([`Fast::LooksFull`]). The caller whose own shard
    /// is its thread index's counts on that shard instead
    /// ([`Shard::count_home_refusal`]), with the same answer.
    ///
    /// No load of `closed`, unlike [`refused`](Self::refused): the own
    /// shard's word had no CLOSED bit, so a close that began has not
    /// reached that shard yet, and a call racing with a close may be
    /// answered either way. A call that begins after the close has reached
    /// every shard ([`is_closed`](Self::is_closed)) reads CLOSED in its own
    /// shard's word, goes the cold way and gets `Shutdown`.
    #[inline(always)]
    fn refuse<const COUNT: bool>(&self) -> Error {
        if COUNT {
            self.count_refusal();
        }
        Error::Overload
    }

    /// Counts one `Overload` answered to the calling thread (also for a
    /// caller that answered it after an uncounted [`probe`](Self::probe)).
    #[inline]
    pub(crate) fn count_refusal(&self) {
        self.count_refusal_at(raw_thread_index());
    }

    /// [`count_refusal`](Self::count_refusal), given the calling thread's
    /// index as stored: below the slot count it is this thread's (not
    /// assigned, or given back, it is far above), so one compare checks
    /// it and bounds the slot.
    #[inline(always)]
    fn count_refusal_at(&self, index: usize) {
        if index < self.rejected.slots() {
            self.rejected.record(index);
        } else {
            self.count_refusal_slow();
        }
    }

    /// [`count_refusal`](Self::count_refusal) for a thread without an index
    /// yet, or with one beyond the slots.
    #[cold]
    #[inline(never)]
    fn count_refusal_slow(&self) {
        self.rejected.record(thread_index());
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

    /// Gives back one unit taken from shard `i`, `panicked` if its holder
    /// was unwinding: steps 2 and 3 of the full set's protocol
    /// (`full.rs`), and with a waiting room its hand-off and wake-up
    /// (`release_to_room`).
    #[inline(always)]
    pub(crate) fn release(&self, i: usize, panicked: bool) {
        self.release_shard(&self.shards[i], || panicked);
    }

    /// [`release`](Self::release) of a unit of `shard`, one of this
    /// table's, asking `panicked` (a front-end passes `thread::panicking`)
    /// only once the unit is back.
    ///
    /// Inline, the common case alone: at most 64 shards, the shard not
    /// marked (step 2's read, with the shard's own bit), nobody waiting
    /// (the room's first read), the RMW on `given`, the same two reads
    /// again (step 3's and the room's second), then the panic question.
    /// Anything else goes out of line, to the same steps written once, so
    /// that the inlined part stays under LLVM's cost threshold: it is
    /// inlined into a permit's drop glue, and that into its caller, only
    /// below it.
    ///
    /// Both ways out are one call, to [`release_off`](Self::release_off),
    /// told which of the two reads sent it there: two calls (one to the
    /// whole protocol, one to its end) put the drop glue of a
    /// `Result<Permit, Error>` at LLVM's threshold (a cost of 250 against
    /// 250), so a caller's `try_acquire().is_err()` called it out of line
    /// and paid for the call on every refusal, where nothing is dropped
    /// (its cost is 205 with one call). The refusal in a caller's loop
    /// fell by 6 instructions (`scripts/hot-path-instructions.sh`;
    /// PERFORMANCE.md, item 12).
    #[inline(always)]
    pub(crate) fn release_shard<P: FnOnce() -> bool>(&self, shard: &Shard, panicked: P) {
        debug_assert!(std::ptr::eq(shard, &*self.shards[shard.index]));
        let room = self.room.as_deref();
        // Step 2's read: a marked shard takes the whole protocol, and so do
        // the shards of a table whose full set has more than one word. The
        // room's first read only picks the path (a hand-off re-checks under
        // the lock).
        let given = 'fast: {
            if !self.one_word || self.full.first_word() & shard.bit != 0 || waiting(room) {
                break 'fast false;
            }
            shard.give_back_one();
            // Step 3's read and the room's second, after the RMW on `given`,
            // which orders them after a racing marker's `insert` and after a
            // waiter's count store (see `give_back_many`, `release_to_room`).
            if self.full.first_word() & shard.bit != 0 || waiting(room) {
                break 'fast true;
            }
            // After `given`, as `give_back_many` counts a panic.
            if panicked() {
                shard.count_panicked();
            }
            return;
        };
        self.release_off(shard, panicked, given);
    }

    /// The release's way out of line: the whole protocol
    /// ([`release_general`](Self::release_general)) when the first reads
    /// found something to do, or, once the unit is back (`given`), its end
    /// ([`after_release`](Self::after_release)). It takes the shard, not
    /// its index: the loads that saves keep `release_shard` under LLVM's
    /// inlining threshold.
    ///
    /// Cold, though with more than 64 shards every release comes here:
    /// marked so, the inlined release keeps its fast path in a straight
    /// line, and such a table pays the call either way.
    #[cold]
    #[inline(never)]
    fn release_off<P: FnOnce() -> bool>(&self, shard: &Shard, panicked: P, given: bool) {
        if given {
            self.after_release(shard, panicked);
        } else {
            self.release_general(shard, panicked);
        }
    }

    /// A release through the whole protocol: `release_to_room` with a room
    /// (a waiter may be handed the unit), `give_back_many` without.
    #[inline(always)]
    fn release_general<P: FnOnce() -> bool>(&self, shard: &Shard, panicked: P) {
        let (i, panicked) = (shard.index, panicked());
        match self.room.as_deref() {
            Some(room) => self.release_to_room(room, i, panicked),
            None => self.give_back(i, panicked),
        }
    }

    /// The end of a release whose second reads found something to do:
    /// step 3 (clear a bit a marker set before the RMW on `given`), the
    /// panic count, and the room's wake-up (a waiter came in while the
    /// unit went back: `release_to_room`).
    #[inline(always)]
    fn after_release<P: FnOnce() -> bool>(&self, shard: &Shard, panicked: P) {
        if self.full.contains(shard.index) {
            self.unmark(shard.index);
        }
        if panicked() {
            shard.count_panicked();
        }
        if waiting(self.room.as_deref()) {
            self.grant_from_table();
        }
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
    #[inline]
    pub(super) fn give_back(&self, i: usize, panicked: bool) {
        self.give_back_many(i, 1, usize::from(panicked));
    }

    /// `units` units of shard `i` back in the table in one RMW, with the
    /// full-set steps (a run of units is one release to the protocol).
    #[inline(always)]
    pub(super) fn give_back_many(&self, i: usize, units: usize, panicked: usize) {
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
}

/// True if `room` has waiters: one read of its count, Relaxed. The
/// release's first read only picks the path, and its second is ordered
/// after a waiter's count store by the RMW on `given` before it
/// (`release_to_room`, `waiters.rs`).
#[inline(always)]
fn waiting(room: Option<&Room>) -> bool {
    room.is_some_and(|room| room.count.load(Relaxed) > 0)
}

impl Shard {
    /// Counts one `Overload` answered on the fast path to the thread whose
    /// index is this shard's (see `refused_home`).
    #[inline(always)]
    pub(super) fn count_home_refusal(&self) {
        // Relaxed load and store, not an RMW: the thread holding this
        // shard's index is the only writer (the index registry's lock
        // orders a previous holder before the next, as for the
        // `RejectCounter`'s slots). A count that publishes nothing.
        let count = self.refused_home.load(Relaxed);
        self.refused_home.store(count.wrapping_add(1), Relaxed);
    }

    /// The refusals [`count_home_refusal`](Self::count_home_refusal)
    /// counted.
    pub(super) fn home_refusals(&self) -> usize {
        // Relaxed: a reading for a snapshot, ordered with nothing.
        self.refused_home.load(Relaxed)
    }

    /// One attempt to take a unit, the fast path's: one reading of the
    /// counters and at most one CAS, no loop and no RMW but the CAS. What
    /// it cannot settle alone it leaves to the caller ([`Fast`]), which
    /// goes on through [`try_take`](Self::try_take) out of line.
    #[inline(always)]
    pub(super) fn take_fast(&self) -> Fast {
        // Acquire: pairs with the Release of the take CAS that wrote this
        // value (below, or in `try_take_masked`), so every release that
        // happened-before that take is visible to the `given` load next:
        // the gap is a usage the shard had at one instant, never one it did
        // not have (the argument of `looks_full`, which `LooksFull` answers
        // for).
        let taken = self.taken.load(Acquire);
        // Acquire: pairs with the AcqRel RMW in `give_back_many`, so work
        // done under a released unit happens-before work under the unit
        // that replaces it.
        let given = self.given.load(Acquire);
        // The gap rotated right by the flag bits: with no flag set and
        // `given` not past `taken`, the usage; with a flag (CLOSED, GATED)
        // the flag lands in the top bits, and a negative gap (`given` passed
        // the `taken` we read: units taken and given back in between) has
        // its top bit in bit 61. Either way far above any limit (at most
        // `MAX_CAPACITY`, below 2^60), so one compare refuses all three.
        let gap = taken.wrapping_sub(given);
        let usage = gap.rotate_right(UNIT.trailing_zeros());
        let limit = self.limit();
        if usage >= limit {
            // Usage below 2^61: no flag, no negative gap, a real reading
            // that shows the shard at its limit. Otherwise `try_take` and
            // the gate's path sort it out, out of line.
            // Exactly at the limit: no flag, no negative gap (either puts
            // the usage above 2^61, past any limit), a real reading that
            // shows the shard full. Over it (a flag, a negative gap, or
            // units over a limit a shrink lowered, a deficit that releases
            // repay), `try_take` and the gate's path sort it out, out of
            // line. One compare settles both: the refusal's fast path is
            // the `usage >= limit` compare's own flags.
            return if usage == limit {
                Fast::LooksFull
            } else {
                Fast::Cold
            };
        }
        // The orderings of `try_take_masked`'s CAS, argued there: Release
        // publishes the releases this taker read, Acquire pairs with a
        // resize's un-gating RMW for the limit read below; Relaxed on
        // failure, which reads nothing further (the cold path re-reads).
        // A strong CAS: a spurious failure would send a free shard's taker
        // down the cold path.
        if self
            .taken
            .compare_exchange(taken, taken + UNIT, AcqRel, Relaxed)
            .is_err()
        {
            return Fast::Cold;
        }
        let now = usage + 1;
        // The limit again, after the CAS: required for exactness under a
        // resize (see `try_take_masked`); one load of the line the CAS
        // just wrote. One compare catches both the last unit and an
        // over-take, which the caller handles out of line.
        let limit = self.limit();
        if now >= limit {
            return Fast::Edge { now, limit };
        }
        self.raise_peak(now);
        Fast::Taken
    }

    /// Records `now` units held as the peak if it is a new high.
    #[inline(always)]
    pub(super) fn raise_peak(&self, now: usize) {
        // Relaxed: a statistic; the load keeps the common case (no new
        // high) free of an RMW.
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
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
    /// lock for a waiter while the shards are gated. The take of one unit
    /// of [`try_take_n`](Self::try_take_n), whose body (and the argument
    /// of its orderings) is the one both share.
    #[inline(always)]
    pub(super) fn try_take_masked(&self, stop: usize) -> Take {
        self.try_take_n(1, stop, Bound::Limit)
    }

    /// True if one reading of the counters shows the shard at or over its
    /// limit: [`Fast::LooksFull`]'s reading (which the fast path takes only
    /// exactly at the limit), for the cold path's check of the caller's own
    /// marked shard. No RMW.
    #[inline]
    fn looks_full(&self) -> bool {
        // Acquire: pairs with the Release take CAS in `take_fast` or
        // `try_take`, so every
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

    /// [`give_back_many`](Self::give_back_many) of one unit, not by a
    /// panic: the release's fast path.
    #[inline(always)]
    pub(super) fn give_back_one(&self) {
        // AcqRel: as in `give_back_many`, which argues both halves.
        self.given.fetch_add(UNIT, AcqRel);
    }

    /// Counts a unit already given back as given back by a panic.
    #[inline(always)]
    pub(super) fn count_panicked(&self) {
        // Release, and after `given`: as in `give_back_many`.
        self.panicked.fetch_add(1, Release);
    }

    /// Gives `units` back in one RMW, `panicked` of them given back by a
    /// panic.
    #[inline]
    pub(crate) fn give_back_many(&self, units: usize, panicked: usize) {
        // Release: pairs with the Acquire load of `given` in `take_fast` and
        // `try_take` (the next holder sees this holder's work) and with the
        // Acquire in `Table::mark_full`'s re-read. Acquire: pairs with the
        // Release of that same re-read, so step 3's load of the full set
        // (in `Table::give_back_many` and `Table::release_shard`) sees a bit
        // set by a marker whose re-read came before this RMW.
        self.given.fetch_add(units * UNIT, AcqRel);
        if panicked > 0 {
            // Release, and after `given`: pairs with the Acquire load in
            // `stats`, so a snapshot that counts this panic also counts its
            // unit as given back, and `completed = given - panicked` never
            // goes negative.
            self.panicked.fetch_add(panicked, Release);
        }
    }
}
