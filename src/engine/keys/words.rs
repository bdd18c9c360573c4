//! Resident words: a key's count in one atomic word, `id | count << 1 |
//! PINNED`, in a slot its id picks, entered and left with one CAS; and
//! the pin, which sends every caller of a slot to the lock of whoever
//! owns the words (the tenant ledger's stripe, the key set's shard, a
//! key queue's stripe).
//!
//! Every per-key count in the crate keeps its keys here first: the
//! tenant ledger (`keys/mod.rs`, units per tenant), the supervisor's key
//! set (`keys/children/`, live children per key) and the ordered keyed
//! pool's key queues (`pool/key_queue.rs`, a key's one request out). A
//! key whose slot is empty, idle, or holds itself unpinned, never takes a
//! lock; a key whose slot another key holds (or that has a rule of its
//! own) lives in its owner's map, under the lock, and the slot stays
//! pinned while the map holds any key of it. So a key is in one home at a
//! time: its slot's word carries its id, or its owner's map has it.
//!
//! # Protocol
//!
//! * **Fast enter** of `n`: word 0, CAS it to `id | n`; word `id | c`,
//!   unpinned, `c + n` within the most a word may count: CAS to `c + n`;
//!   past it: the owner tells a busy key from one for the lock; another
//!   key's *idle* word (`other | 0`, unpinned): CAS it to `id | n`, the
//!   slot changing hands. Anything else (pinned, another key's count, a
//!   count the field cannot hold, a lost CAS): the lock.
//! * **Fast exit** of `n`: word `id | c`, unpinned: CAS to `c - n`. At 0
//!   the word stays, *idle*: the key's next enter is one CAS again, and
//!   its owner keeps counting it as it did (the tenant ledger's `W`)
//!   until another key takes the slot or the owner sweeps it. Pinned: the
//!   lock.
//! * **The sweep**, by the owner when an idle word's place in its counts
//!   matters: a CAS of each unpinned idle word to 0.
//! * **The pin**, under the owner's lock: a `fetch_or` of `PINNED`. From
//!   then on no fast path writes the word, so the lock holder reads and
//!   writes it as plain data; it unpins (a store) only when its map holds
//!   no key of the slot.
//!
//! # Orderings
//!
//! A fast enter's CAS is Acquire and a fast exit's Release: the end of a
//! key's use happens-before the next enter that reads its word. The pin
//! is AcqRel (it reads every fast exit before it), the unpin a Release
//! store (a fast enter after it reads what the locked path wrote).
//! Between pin and unpin only the lock holder writes the word.

use crate::sync::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// Bit 0 of a word: every caller goes through the lock.
pub(crate) const PINNED: u64 = 1;

/// One in the count field (bits 1 to 19).
pub(crate) const ONE: u64 = 1 << 1;

const COUNT_BITS: u32 = 19;

/// The largest count a word holds; a key past it lives in the map.
pub(crate) const MAX_COUNT: u64 = (1 << COUNT_BITS) - 1;

const COUNT_MASK: u64 = MAX_COUNT << 1;

/// The id field: bits 20 to 63. An id is a hash's top 44 bits, bit 63
/// set, so no id is 0.
pub(crate) const ID_SHIFT: u32 = 20;

pub(crate) const ID_MASK: u64 = !((1 << ID_SHIFT) - 1);

/// The id made of a 64-bit hash: its top 44 bits, never 0.
#[inline]
pub(crate) fn id_from_hash(hash: u64) -> u64 {
    (hash | 1 << 63) & ID_MASK
}

/// The count in `word`.
#[inline]
pub(crate) fn count_of(word: u64) -> u64 {
    (word & COUNT_MASK) >> 1
}

/// The id in `word` (0: the slot is empty).
#[inline]
pub(crate) fn id_of(word: u64) -> u64 {
    word & ID_MASK
}

/// The count in `word` if it is key `id`'s and unpinned (0: idle), else
/// `None`.
///
/// One subtraction and one test: `word − id` is the count field alone
/// (twice the count) exactly then. Another key's id differs from `id` in
/// bits 20 and up, which the difference keeps; the pin is bit 0.
#[inline(always)]
fn counted_here(word: u64, id: u64) -> Option<u64> {
    let twice = word.wrapping_sub(id);
    (twice & !COUNT_MASK == 0).then_some(twice >> 1)
}

/// The hash a map files key `id` under: the id's bits, moved so that both
/// the low bits (the bucket) and the top 7 (the control byte) vary.
#[inline]
pub(crate) fn map_hash(id: u64) -> u64 {
    (id >> ID_SHIFT).rotate_left(44)
}

/// True for an idle word, unpinned: a key with no count.
#[inline(always)]
fn is_idle(word: u64) -> bool {
    word != 0 && word & (COUNT_MASK | PINNED) == 0
}

/// What a fast enter found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enter {
    /// Entered: the key's count is now this.
    Entered(u64),
    /// Entered a slot that was empty: the key was nowhere, and counts `n`
    /// now. The owner counted it in first (`first`).
    Claimed,
    /// Nothing entered: the key would count this many, past the most
    /// the caller lets a word count. Its owner tells a key over its cap
    /// (busy) from one that the lock may still take.
    Over(u64),
    /// Nothing entered: the lock decides.
    Locked,
}

/// Where a [`Words`] keeps its slots: an array of a length known when
/// compiled, in place in its owner ([`Inline`]: no pointer to follow, no
/// bounds check), or a boxed slice of a length chosen when built
/// ([`Boxed`]). A power of two either way.
pub(crate) trait Slots {
    /// `len` slots, each `word`.
    fn build(len: usize, word: u64) -> Self;
    /// Slot `index` (below the length).
    fn slot(&self, index: usize) -> &AtomicU64;
    /// The length less one.
    fn mask(&self) -> usize;
}

/// `N` slots in place.
pub(crate) type Inline<const N: usize> = [AtomicU64; N];

impl<const N: usize> Slots for Inline<N> {
    fn build(len: usize, word: u64) -> Self {
        const { assert!(N.is_power_of_two()) };
        debug_assert_eq!(len, N);
        std::array::from_fn(|_| AtomicU64::new(word))
    }

    #[inline(always)]
    fn slot(&self, index: usize) -> &AtomicU64 {
        &self[index]
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        N - 1
    }
}

/// Slots as many as chosen when built.
pub(crate) struct Boxed {
    slots: Box<[AtomicU64]>,
    mask: usize,
}

impl Slots for Boxed {
    fn build(len: usize, word: u64) -> Self {
        debug_assert!(len.is_power_of_two());
        Boxed {
            slots: (0..len).map(|_| AtomicU64::new(word)).collect(),
            mask: len - 1,
        }
    }

    #[inline(always)]
    fn slot(&self, index: usize) -> &AtomicU64 {
        &self.slots[index]
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.mask
    }
}

/// One owner's slots, picked by the id's bits from `SHIFT` up.
pub(crate) struct Words<const SHIFT: u32, S> {
    slots: S,
}

impl<const SHIFT: u32, S: Slots> Words<SHIFT, S> {
    /// `len` slots (a power of two), empty; or every one pinned for good
    /// if `pinned` (an owner whose counts the field cannot hold).
    pub(crate) fn new(len: usize, pinned: bool) -> Self {
        Words {
            slots: S::build(len, u64::from(pinned) * PINNED),
        }
    }

    /// How many slots there are.
    pub(crate) fn len(&self) -> usize {
        self.slots.mask() + 1
    }

    /// The slot key `id` lives in when resident.
    #[inline]
    pub(crate) fn index(&self, id: u64) -> usize {
        (id >> SHIFT) as usize & self.slots.mask()
    }

    /// The lock-free enter of `n` (`0 < n`), a word counting at most
    /// `most_less_one + 1` (at most `MAX_COUNT`; given less one, so that
    /// for `n` of 1 a new word needs no test: a most is at least 1).
    /// `first` runs before a key that was nowhere claims an empty slot,
    /// and `undo` if the claim is lost: an owner counting its keys counts
    /// one in before it is visible, so a racing sweep never takes it
    /// below zero. A key taking another's idle word changes no count:
    /// one key out, one in.
    #[inline(always)]
    pub(crate) fn enter(
        &self,
        id: u64,
        n: u64,
        most_less_one: u64,
        first: impl FnOnce(),
        undo: impl FnOnce(),
    ) -> Enter {
        debug_assert!(n > 0 && most_less_one < MAX_COUNT);
        let slot = self.slots.slot(self.index(id));
        // Relaxed: a guess; the CAS below decides, with Acquire.
        let word = slot.load(Relaxed);
        let Some(count) = counted_here(word, id) else {
            return self.enter_new(slot, word, id, n, most_less_one, first, undo);
        };
        // `count + n - 1`: saturating, for any `n`.
        let past = count.saturating_add(n - 1);
        if past > most_less_one {
            return Enter::Over(past.saturating_add(1));
        }
        // Acquire on success: pairs with the Release of the exit (fast, or
        // the unpin of a locked one) that left this count. Relaxed on
        // failure: nothing is entered, the caller goes to the lock.
        match slot.compare_exchange(word, word + n * ONE, Acquire, Relaxed) {
            Ok(_) => Enter::Entered(past + 1),
            Err(_) => Enter::Locked,
        }
    }

    /// [`enter`](Self::enter) of a key not in `word`: into the slot if it
    /// is empty or another key's idle word, else the lock.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn enter_new(
        &self,
        slot: &AtomicU64,
        word: u64,
        id: u64,
        n: u64,
        most_less_one: u64,
        first: impl FnOnce(),
        undo: impl FnOnce(),
    ) -> Enter {
        if word != 0 && !is_idle(word) {
            return Enter::Locked; // pinned, or another key's count
        }
        if n - 1 > most_less_one {
            return Enter::Over(n);
        }
        if word != 0 {
            // Acquire: as in `enter`, with the exit that left it idle.
            return match slot.compare_exchange(word, id | (n * ONE), Acquire, Relaxed) {
                Ok(_) => Enter::Entered(n),
                Err(_) => Enter::Locked,
            };
        }
        first();
        // Acquire: as in `enter`, with the sweep or unpin that emptied it.
        match slot.compare_exchange(0, id | (n * ONE), Acquire, Relaxed) {
            Ok(_) => Enter::Claimed,
            Err(_) => {
                undo();
                Enter::Locked
            }
        }
    }

    /// The lock-free exit of `n` (the key holds at least `n` here): the
    /// count left (0: the word stays, idle), or `None` if the lock must do
    /// it (the slot is pinned, or the key is not resident).
    #[inline(always)]
    pub(crate) fn exit(&self, id: u64, n: u64) -> Option<u64> {
        let slot = self.slots.slot(self.index(id));
        // Relaxed: the CAS below decides.
        let mut word = slot.load(Relaxed);
        loop {
            // Pinned, another key's, or fewer than `n` here (a bug the
            // lock's path asserts on): the lock.
            let count = match counted_here(word, id) {
                Some(count) if count >= n => count,
                _ => return None,
            };
            // Release: pairs with the Acquire of the next enter of this
            // slot (fast, or the pin of a locked one). Relaxed on failure:
            // the word seen is only the next guess, the next CAS decides.
            match slot.compare_exchange_weak(word, word - n * ONE, Release, Relaxed) {
                Ok(_) => return Some(count - n),
                Err(seen) => word = seen,
            }
        }
    }

    /// Empties every unpinned idle word, calling `freed` for each: the
    /// owner's counting it out.
    pub(crate) fn sweep(&self, mut freed: impl FnMut()) {
        for index in 0..self.len() {
            let slot = self.slots.slot(index);
            // Relaxed: a guess; the CAS decides.
            let word = slot.load(Relaxed);
            // Acquire: pairs with the exit that left it idle, as an enter
            // does. Relaxed on failure: the word is busy again, or taken.
            if is_idle(word) && slot.compare_exchange(word, 0, Acquire, Relaxed).is_ok() {
                freed();
            }
        }
    }

    /// Pins `id`'s slot (under the owner's lock): no fast path writes it
    /// until [`unpin`](Self::unpin). Returns the slot's index.
    pub(crate) fn pin(&self, id: u64) -> usize {
        let index = self.index(id);
        // AcqRel: reads (Acquire) every fast exit that came before, and
        // orders our reading of the word before our writes under the pin.
        self.slots.slot(index).fetch_or(PINNED, AcqRel);
        index
    }

    /// Unpins slot `index` if `spills` (the owner's map's keys of it) is 0
    /// (under the lock, after a pin).
    pub(crate) fn unpin(&self, index: usize, spills: u32) {
        if spills == 0 {
            let slot = self.slots.slot(index);
            // Release: publishes the locked path's writes to the fast
            // enters that read the unpinned word. Relaxed load: a pinned
            // word only the lock holder writes, so it reads its own last
            // write.
            slot.store(slot.load(Relaxed) & !PINNED, Release);
        }
    }

    /// Slot `index`'s word, pinned by the caller (under the lock).
    pub(crate) fn pinned(&self, index: usize) -> u64 {
        // Relaxed: only the lock holder writes a pinned word.
        self.slots.slot(index).load(Relaxed)
    }

    /// Writes slot `index`'s word, pinned by the caller (under the lock);
    /// `word` keeps the pin.
    pub(crate) fn set_pinned(&self, index: usize, word: u64) {
        debug_assert!(word & PINNED != 0);
        // Relaxed: a pinned word; the unpin's Release (or, while it stays
        // pinned, the lock) publishes it.
        self.slots.slot(index).store(word, Relaxed);
    }

    /// Slot `index`'s word as it stands: a reading.
    pub(crate) fn read(&self, index: usize) -> u64 {
        // Acquire: a reading; pairs with the fast exits' Release.
        self.slots.slot(index).load(Acquire)
    }

    /// The count key `id` holds in its slot if it is resident there now
    /// (pinned or not); `None` if the slot holds another key or none.
    pub(crate) fn resident_count(&self, id: u64) -> Option<u64> {
        let word = self.read(self.index(id));
        (id_of(word) == id).then(|| count_of(word))
    }

    /// How many slots hold a key with a count now (idle words aside): a
    /// reading.
    pub(crate) fn busy(&self) -> usize {
        (0..self.len())
            .filter(|&index| count_of(self.read(index)) != 0)
            .count()
    }
}
