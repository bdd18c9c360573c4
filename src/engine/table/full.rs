//! **The full set.** A bitmap, one bit per shard, says which shards are
//! *marked* full. A caller whose own shard is full reads it next: under
//! overload every bit is set, so a rejection is answered from one word,
//! and a walk never visits a shard whose bit is set. With more than 64
//! shards the bitmap spans several words, and a count of set bits (kept
//! only then) is the one word a rejection reads; so a refusal costs the
//! same at 65 or 65,536 shards (and less up to 64, where the fast path
//! reads the one word alone).
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
//!    unit back ([`Table::release_shard`]). A releaser descheduled in between
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

use crossbeam_utils::CachePadded;

use super::{FullSet, Table, BITS};
use crate::sync::{AtomicUsize, Ordering::Relaxed};

impl FullSet {
    pub(super) fn new(shards: usize) -> Self {
        FullSet {
            first: CachePadded::new(AtomicUsize::new(0)),
            rest: (1..shards.div_ceil(BITS))
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
        }
    }

    /// How many words there are.
    pub(super) fn len(&self) -> usize {
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
    pub(super) fn word(&self, w: usize) -> usize {
        // Relaxed: a hint. A bit's harm is bounded by the protocol in the
        // module docs, which orders through `given`, not through this load;
        // coherence alone makes a clear that happened-before this load seen.
        self.slot(w).load(Relaxed)
    }

    /// True if `shard`'s bit is set.
    #[inline]
    pub(super) fn contains(&self, shard: usize) -> bool {
        self.word(shard / BITS) & (1 << (shard % BITS)) != 0
    }

    /// The bits of the first word, which holds every bit of a table of at
    /// most 64 shards.
    #[inline(always)]
    pub(super) fn first_word(&self) -> usize {
        // Relaxed: as in `word`.
        self.first.load(Relaxed)
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
        // `given`, which comes after it in program order (`Table::release_shard`).
        self.slot(shard / BITS).fetch_and(!bit, Relaxed) & bit != 0
    }
}

impl Table {
    /// The bits of word `w` that stand for real shards.
    pub(super) fn valid_bits(&self, w: usize) -> usize {
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
    pub(super) fn all_marked(&self, word: usize) -> bool {
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

    /// True if shard `start`'s bit is set and every shard is marked full:
    /// the fast refusal's test, for a caller whose own shard's counters
    /// showed it full (so it is not refused by its own stale bit).
    #[inline(always)]
    pub(super) fn all_marked_from(&self, start: usize) -> bool {
        let word = self.full.word(start / BITS);
        // With up to 64 shards, a word equal to `all_full` has every bit,
        // `start`'s included: one compare. Beyond, `start`'s bit and the
        // count (Relaxed: as in `all_marked`).
        word == self.all_full
            || (self.counted
                && word & (1 << (start % BITS)) != 0
                && self.full_count.load(Relaxed) == self.shards.len())
    }

    /// Sets shard `i`'s full bit, then takes it back if the shard has room
    /// (step 1 of the protocol in the module docs).
    pub(super) fn mark_full(&self, i: usize) {
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
    pub(super) fn unmark(&self, i: usize) {
        if self.full.remove(i) && self.counted {
            // Relaxed: as in `mark_full`; a wrap below zero while a racing
            // marker has yet to count its bit only reads as "not all full".
            self.full_count.fetch_sub(1, Relaxed);
        }
    }
}
