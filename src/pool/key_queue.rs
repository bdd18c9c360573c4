//! The key queues of a pool's ordered keyed mode: per key, the request that
//! runs and the FIFO queue of those admitted behind it; striped by the
//! key's hash, so requests of different keys rarely meet on a lock.
//!
//! # Protocol
//!
//! A key is *present* while one of its requests is out (ready to run, or
//! running) and holds the queue of the ones admitted after it. The caller
//! has already taken the request's unit of capacity; then:
//!
//! * **Admit.** An absent key becomes present with an empty queue, and the
//!   request is the one to run now ([`Admit::Run`]). A present key with
//!   fewer than `cap` requests (the one out plus its queue) queues it at
//!   the back ([`Admit::Queued`]); at `cap` it is refused
//!   ([`Admit::Busy`], handed back, and its caller gives its unit back).
//! * **Finish.** When the request that is out has been handled (its unit
//!   already given back), whoever holds its turn (its worker, or the
//!   blocking caller the worker left it to: `ordered.rs`, "Who passes the
//!   turn") takes the front of the queue: that is the key's next request
//!   to run, and the key stays present; with an empty queue the key is
//!   forgotten.
//!
//! So exactly one request per present key is out at any instant, they go
//! out in the order they were admitted, and every queued request is taken
//! by the finish of the one before it. No request is dropped on shutdown:
//! each one queued holds its unit, so the workers cannot exit before the
//! requests ahead of it finish and hand it out.
//!
//! Each stripe also counts the requests waiting in its queues, on a line
//! of its own ([`anyone_queued`](KeyQueues::anyone_queued)): the hint by
//! which a worker decides whether to pass a blocking call's turn itself.
//!
//! # Resident words: a key's turn without the lock
//!
//! A key's turn is a count of 0 or 1 in the engine's resident words
//! (`engine/keys/words.rs`, the format and protocol the tenant ledger and
//! the supervisor's key set count in): a stripe has [`SLOTS`] words on its
//! own line, a key's slot picked by its id. A word is `id | out << 1 |
//! PINNED`:
//!
//! | word | the key is |
//! |---|---|
//! | `id \| 0` | absent, but kept in its slot (*idle*) |
//! | `id \| 1` | present, nothing queued |
//! | `id \| 1 \| PINNED` | present, its queue (under the lock) not empty; or another caller of the slot holds the lock |
//!
//! The common case, a key's requests one after another with nobody
//! queued, is an admission `id | 0` to `id | 1` and a finish back, one
//! CAS each and no lock: the key stays in its slot between requests. A
//! key whose slot is empty, or holds another key's idle word, takes it
//! with one CAS too. Everything else takes the stripe's lock and pins the
//! slot: queuing behind the one out, handing out the next queued request,
//! a key whose slot another present key holds (it goes to the stripe's
//! spill table).
//!
//! Why the two kinds of access cannot cross (the words' own argument,
//! `words.rs`): under the pin only the lock holder writes the word, so
//! the slot, its queue and the spill table are one state under the lock.
//! The slot stays pinned while its queue is not empty or the spill table
//! holds a key of it: so a finish with a request queued behind it always
//! takes the lock and hands it out, and a key in the spill table never
//! also takes its emptied slot. An admission that queues pins before it
//! looks: a finish that exits first leaves the word at `id | 0`, which the
//! admission reads and runs at once; a finish after the pin finds it and
//! takes the lock, behind the push.
//!
//! Order between one request of a key and the next: the finish's exit is
//! `Release`, the admission's enter `Acquire`; a request handed out of a
//! queue is ordered by the lock. `loom-tests/tests/loom_key_queue.rs`
//! checks the hand-over racing a new request and shutdown, a turn left to
//! the caller racing a new request, and a slot taken from an idle key
//! racing that key's own admission.
//!
//! # Identity
//!
//! A key is known by its id: the top 44 bits of its 64-bit hash
//! (foldhash, seeded per pool), as in the words. Two keys whose ids agree
//! are one key here: their requests are serialized together, which only
//! costs parallelism; each still runs exactly once, in its turn.
//!
//! # Layout
//!
//! A power of two of stripes (four per worker, at most 1,024), picked by
//! the id's bits 44 and up, each on a line of its own: the words (a slot
//! picked by bit 20 and up), then a lock over the slots' queues and a
//! spill table (a `hashbrown::HashTable`) for keys whose slot is taken.
//! So the common case touches one line, and when a caller passes its own
//! call's turn on, that line stays on its core.

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::engine::keys::words::{
    count_of, id_from_hash, id_of, map_hash, Enter, Inline, Words, ONE, PINNED,
};
use crate::sync::{AtomicUsize, Mutex, Ordering};

/// The most stripes: beyond this, more only cost memory.
const MAX_STRIPES: usize = 1024;

/// Stripes per worker: enough that two workers rarely finish on one.
const STRIPES_PER_WORKER: usize = 4;

/// Key slots per stripe: their words, the lock, their queues and the
/// spill table's header fill a 128-byte stripe. Under loom, one: any two
/// keys share it, so models see the spill table and the pin as well as
/// the fast paths.
#[cfg(not(loom))]
const SLOTS: usize = 2;

#[cfg(loom)]
const SLOTS: usize = 1;

/// The id bit a slot is picked from (the lowest of an id).
const SLOT_SHIFT: u32 = 20;

/// The id bit a stripe is picked from.
const STRIPE_SHIFT: u32 = 44;

/// What [`KeyQueues::admit`] decided for a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit<T> {
    /// The key was idle: run this request now.
    Run(T),
    /// Queued behind the key's earlier requests; a finish will hand it out.
    Queued,
    /// The key has `cap` requests admitted: refused, handed back.
    Busy(T),
}

/// A present key of the spill table: its id and the requests queued
/// behind the one out.
struct Entry<T> {
    id: u64,
    queue: VecDeque<T>,
}

/// One stripe: the slot words, and under the lock the rest.
struct Stripe<T> {
    /// The resident keys (module docs, "Resident words").
    words: Words<SLOT_SHIFT, Inline<SLOTS>>,
    locked: Mutex<Locked<T>>,
}

/// What a stripe's lock guards.
struct Locked<T> {
    /// The queue of the key in slot `i`; empty unless it is present with
    /// requests behind the one out.
    queues: [VecDeque<T>; SLOTS],
    /// Present keys whose slot another key held.
    spill: HashTable<Entry<T>>,
    /// Per slot, the spill table's keys of it.
    spilled: [u32; SLOTS],
}

impl<T> Locked<T> {
    /// What keeps slot `index` pinned (0: nothing): its queue, and the
    /// spill table's keys of it (module docs, "Resident words").
    fn holds(&self, index: usize) -> u32 {
        self.spilled[index] + u32::from(!self.queues[index].is_empty())
    }
}

impl<T> Stripe<T> {
    fn new() -> Self {
        Stripe {
            words: Words::new(SLOTS, false),
            locked: Mutex::new(Locked {
                queues: std::array::from_fn(|_| VecDeque::new()),
                spill: HashTable::new(),
                spilled: [0; SLOTS],
            }),
        }
    }
}

/// The per-key queues; see the module docs.
pub(crate) struct KeyQueues<T> {
    stripes: Box<[CachePadded<Stripe<T>>]>,
    /// Per stripe, how many requests wait in its keys' queues: written
    /// under the stripe's lock, read without it as a hint
    /// ([`anyone_queued`](Self::anyone_queued)). On lines of their own,
    /// which only a request that queues (and the finish that hands it
    /// out) writes, so a worker reads its stripe's count from its own
    /// cache while nobody queues.
    queued: Box<[CachePadded<AtomicUsize>]>,
    /// Most requests per key admitted and unfinished: the one out plus
    /// the queue. At least 1.
    cap: usize,
}

impl<T> KeyQueues<T> {
    /// Queues for a pool of `workers`, at most `cap` (at least 1) requests
    /// per key.
    pub(crate) fn new(workers: usize, cap: usize) -> Self {
        let stripes = (workers.max(1) * STRIPES_PER_WORKER)
            .next_power_of_two()
            .min(MAX_STRIPES);
        KeyQueues {
            stripes: (0..stripes)
                .map(|_| CachePadded::new(Stripe::new()))
                .collect(),
            queued: (0..stripes)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            cap: cap.max(1),
        }
    }

    /// The stripe of key `id`.
    #[inline]
    fn stripe_index(&self, id: u64) -> usize {
        (id >> STRIPE_SHIFT) as usize & (self.stripes.len() - 1)
    }

    /// Whether any request waits in a queue of the stripe of the key
    /// hashed `hash`: a hint, read without the lock (a request may queue
    /// just after it reads false). Whoever passes the key's turn on does
    /// so correctly either way; the hint only picks who (`ordered.rs`,
    /// "Who passes the turn").
    #[inline]
    pub(crate) fn anyone_queued(&self, hash: u64) -> bool {
        // Relaxed: a hint, never a decision about a request (see above).
        self.queued[self.stripe_index(id_from_hash(hash))].load(Ordering::Relaxed) != 0
    }

    /// Queues `item` behind its key's running request in `queue` (of
    /// stripe `index`), unless the key is at its cap (`len + 1`: the
    /// request that is out counts too). Under the stripe's lock.
    fn queue_behind(&self, queue: &mut VecDeque<T>, index: usize, item: T) -> Admit<T> {
        if queue.len() + 1 >= self.cap {
            return Admit::Busy(item);
        }
        queue.push_back(item);
        // Relaxed: under the stripe's lock; read as a hint.
        self.queued[index].fetch_add(1, Ordering::Relaxed);
        Admit::Queued
    }

    /// The next request queued in `queue` (of stripe `index`), counted out
    /// of the stripe's hint. Under the stripe's lock.
    fn pop_queued(&self, queue: &mut VecDeque<T>, index: usize) -> Option<T> {
        let next = queue.pop_front();
        if next.is_some() {
            // Relaxed: as in `queue_behind`.
            self.queued[index].fetch_sub(1, Ordering::Relaxed);
        }
        next
    }

    /// Admits `item` for the key hashed `hash`; see [`Admit`].
    pub(crate) fn admit(&self, hash: u64, item: T) -> Admit<T> {
        let id = id_from_hash(hash);
        let index = self.stripe_index(id);
        let stripe = &self.stripes[index];
        // Without the lock: the key idle in its slot, or a slot empty or
        // idle (module docs). The words' enter is Acquire: it pairs with
        // the Release of the finish that left the word so.
        match stripe.words.enter(id, 1, 0, || {}, || {}) {
            Enter::Entered(_) | Enter::Claimed => return Admit::Run(item),
            // One out, nothing queued, and no room behind it.
            Enter::Over(_) if self.cap == 1 => return Admit::Busy(item),
            Enter::Over(_) | Enter::Locked => {}
        }
        let mut locked = stripe.locked.lock();
        let slot = stripe.words.pin(id);
        let admitted = self.admit_pinned(stripe, &mut locked, index, id, slot, item);
        stripe.words.unpin(slot, locked.holds(slot));
        admitted
    }

    /// [`admit`](Self::admit) under the lock, `id`'s slot pinned.
    fn admit_pinned(
        &self,
        stripe: &Stripe<T>,
        locked: &mut Locked<T>,
        index: usize,
        id: u64,
        slot: usize,
        item: T,
    ) -> Admit<T> {
        let word = stripe.words.pinned(slot);
        if id_of(word) == id {
            if count_of(word) == 0 {
                // Idle: its request runs now.
                stripe.words.set_pinned(slot, word + ONE);
                return Admit::Run(item);
            }
            return self.queue_behind(&mut locked.queues[slot], index, item);
        }
        if let Some(entry) = locked.spill.find_mut(map_hash(id), |entry| entry.id == id) {
            return self.queue_behind(&mut entry.queue, index, item);
        }
        if count_of(word) == 0 {
            // An empty slot, or another key's idle word (a key with
            // nothing queued: a queue keeps its slot pinned at 1), and the
            // key nowhere: it moves in.
            stripe.words.set_pinned(slot, id | ONE | PINNED);
            return Admit::Run(item);
        }
        locked.spill.insert_unique(
            map_hash(id),
            Entry {
                id,
                queue: VecDeque::new(),
            },
            |entry| map_hash(entry.id),
        );
        locked.spilled[slot] += 1;
        Admit::Run(item)
    }

    /// The request of the key hashed `hash` that was out has finished: the
    /// key's next request, which is now out, or `None` (the key is
    /// forgotten). Only the holder of the key's turn calls it.
    pub(crate) fn finish(&self, hash: u64) -> Option<T> {
        let id = id_from_hash(hash);
        let index = self.stripe_index(id);
        let stripe = &self.stripes[index];
        // Without the lock: nobody queued, the word left idle (module
        // docs). The words' exit is Release: it pairs with the Acquire of
        // the key's next admission (this request was handled before it).
        if stripe.words.exit(id, 1).is_some() {
            return None;
        }
        // Queued (perhaps meanwhile), or spilled: under the lock.
        let mut locked = stripe.locked.lock();
        let slot = stripe.words.pin(id);
        let word = stripe.words.pinned(slot);
        let next = if id_of(word) == id {
            debug_assert_eq!(count_of(word), 1, "a finish for a key not present");
            let next = self.pop_queued(&mut locked.queues[slot], index);
            if next.is_none() {
                // Nothing queued: the key stays, idle.
                stripe.words.set_pinned(slot, word - ONE);
            }
            next
        } else if let Ok(mut found) = locked
            .spill
            .find_entry(map_hash(id), |entry| entry.id == id)
        {
            let next = self.pop_queued(&mut found.get_mut().queue, index);
            if next.is_none() {
                // Forgotten: memory stays bounded by the requests admitted.
                found.remove();
                locked.spilled[slot] -= 1;
            }
            next
        } else {
            debug_assert!(false, "a finish for a key that is not present");
            None
        };
        stripe.words.unpin(slot, locked.holds(slot));
        next
    }

    /// How many keys are present (a reading; takes every stripe's lock in
    /// turn).
    pub(crate) fn keys(&self) -> usize {
        self.stripes
            .iter()
            .map(|stripe| {
                let locked = stripe.locked.lock();
                stripe.words.busy() + locked.spill.len()
            })
            .sum()
    }

    /// Requests of the key hashed `hash` admitted and unfinished: the one
    /// out and its queue (0 for a key not present).
    #[cfg(test)]
    pub(crate) fn load(&self, hash: u64) -> usize {
        let id = id_from_hash(hash);
        let stripe = &self.stripes[self.stripe_index(id)];
        let locked = stripe.locked.lock();
        let slot = stripe.words.index(id);
        if let Some(out) = stripe.words.resident_count(id) {
            return if out == 0 {
                0
            } else {
                1 + locked.queues[slot].len()
            };
        }
        locked
            .spill
            .find(map_hash(id), |entry| entry.id == id)
            .map_or(0, |entry| 1 + entry.queue.len())
    }

    /// How many requests are queued behind their key's running one (a
    /// reading, as [`keys`](Self::keys)).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.stripes
            .iter()
            .map(|stripe| {
                let locked = stripe.locked.lock();
                locked.queues.iter().map(VecDeque::len).sum::<usize>()
                    + locked.spill.iter().map(|e| e.queue.len()).sum::<usize>()
            })
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::{HashMap, VecDeque};

    use super::{Admit, KeyQueues, SLOTS};

    /// The hash of the `n`th key of stripe 0, in slot `n % 2` (an id is
    /// a hash's bits 20 and up).
    fn k(n: u64) -> u64 {
        n << 20
    }

    #[test]
    fn one_out_per_key_in_admission_order() {
        let keys = KeyQueues::new(2, 3);
        let (seven, nine) = (k(7), k(9));
        assert_eq!(keys.admit(seven, 'a'), Admit::Run('a'));
        assert_eq!(keys.admit(seven, 'b'), Admit::Queued);
        assert_eq!(keys.admit(nine, 'x'), Admit::Run('x')); // another key runs at once
        assert_eq!(keys.admit(seven, 'c'), Admit::Queued);
        assert_eq!(keys.admit(seven, 'd'), Admit::Busy('d')); // 'a' out, 'b' and 'c' queued: cap 3
        assert_eq!((keys.keys(), keys.queued()), (2, 2));
        assert!(keys.anyone_queued(seven));
        assert_eq!(keys.finish(seven), Some('b'));
        assert_eq!(keys.admit(seven, 'e'), Admit::Queued);
        assert_eq!(keys.finish(seven), Some('c'));
        assert_eq!(keys.finish(seven), Some('e'));
        assert!(!keys.anyone_queued(seven));
        assert_eq!(keys.finish(seven), None);
        assert_eq!(keys.finish(nine), None);
        assert_eq!((keys.keys(), keys.queued()), (0, 0));
        assert_eq!(keys.admit(seven, 'f'), Admit::Run('f')); // forgotten, so fresh
    }

    #[test]
    fn cap_one_refuses_while_out() {
        let keys = KeyQueues::new(1, 1);
        assert_eq!(keys.admit(k(1), 1), Admit::Run(1));
        assert_eq!(keys.admit(k(1), 2), Admit::Busy(2));
        assert_eq!(keys.finish(k(1)), None);
        assert_eq!(keys.admit(k(1), 3), Admit::Run(3));
    }

    /// A key kept idle in its slot is taken back by its next request; an
    /// idle slot goes to a new key when no slot is free; ids that differ
    /// only in the two low bits are one key.
    #[test]
    fn idle_keys_keep_their_slots_until_needed() {
        let keys = KeyQueues::new(1, 4);
        for n in 1..=SLOTS as u64 {
            assert_eq!(keys.admit(k(n), n), Admit::Run(n));
            assert_eq!(keys.finish(k(n)), None);
        }
        assert_eq!(keys.keys(), 0, "idle in their slots, not present");
        assert_eq!(keys.admit(k(1), 10), Admit::Run(10));
        assert_eq!(keys.admit(k(1) | 0b11, 11), Admit::Queued, "the same key");
        assert_eq!(keys.load(k(1)), 2);
        // A new key takes the slot of an idle one; the evicted key comes
        // back into a slot or the spill table, whichever is free.
        assert_eq!(keys.admit(k(50), 50), Admit::Run(50));
        assert_eq!(keys.admit(k(2), 20), Admit::Run(20));
        assert_eq!(keys.keys(), 3);
        assert_eq!(keys.finish(k(1)), Some(11));
        for n in [1, 50, 2] {
            assert_eq!(keys.finish(k(n)), None);
        }
        assert_eq!((keys.keys(), keys.queued()), (0, 0));
    }

    /// More keys on one stripe than it has slots: the rest spill, and a
    /// key stays where it is while present.
    #[test]
    fn keys_spill_past_the_slots() {
        let keys = KeyQueues::new(1, 4); // 4 stripes: top 2 bits
        let ids: Vec<u64> = (1..=6).map(k).collect(); // all on stripe 0
        for &id in &ids {
            assert_eq!(keys.admit(id, id * 10), Admit::Run(id * 10));
            assert_eq!(keys.admit(id, id * 10 + 1), Admit::Queued);
        }
        assert_eq!((keys.keys(), keys.queued()), (6, 6));
        // Free a slot; a spilled key is still found in the spill table.
        assert_eq!(keys.finish(k(1)), Some(k(1) * 10 + 1));
        assert_eq!(keys.finish(k(1)), None);
        assert_eq!(keys.admit(k(6), 62), Admit::Queued);
        assert_eq!(keys.load(k(6)), 3);
        assert_eq!(keys.admit(k(7), 70), Admit::Run(70)); // takes the free slot
        for id in (2..=6).map(k) {
            assert_eq!(keys.finish(id), Some(id * 10 + 1));
        }
        assert_eq!(keys.finish(k(6)), Some(62));
        for id in (2..=7).map(k) {
            assert_eq!(keys.finish(id), None);
        }
        assert_eq!(keys.keys(), 0);
    }

    proptest::proptest! {
        /// Admissions and finishes over six keys of one stripe (two slots:
        /// keys kept idle, slots given to new keys, keys spilled), with
        /// ids that vary in the state bits, against a model: per key, the
        /// requests admitted and unfinished, the one out first.
        #[test]
        fn sequences_match_a_model(
            ops in proptest::collection::vec((0..6u64, proptest::bool::ANY), 1..200),
            cap in 1usize..4,
        ) {
            let keys = KeyQueues::new(1, cap);
            let mut model: HashMap<u64, VecDeque<u32>> = HashMap::new();
            let mut n = 0u32;
            for (key, admit) in ops {
                n += 1;
                let id = k(key + 1) | u64::from(n & 0b11);
                let queue = model.entry(key).or_default();
                if admit {
                    let admitted = keys.admit(id, n);
                    if queue.is_empty() {
                        assert_eq!(admitted, Admit::Run(n));
                        queue.push_back(n);
                    } else if queue.len() >= cap {
                        assert_eq!(admitted, Admit::Busy(n));
                    } else {
                        assert_eq!(admitted, Admit::Queued);
                        queue.push_back(n);
                    }
                } else if queue.pop_front().is_some() {
                    assert_eq!(keys.finish(id), queue.front().copied());
                }
                let present = model.values().filter(|q| !q.is_empty()).count();
                let queued: usize = model.values().map(|q| q.len().saturating_sub(1)).sum();
                assert_eq!((keys.keys(), keys.queued()), (present, queued));
                assert_eq!(keys.anyone_queued(k(1)), queued > 0);
                for (key, queue) in &model {
                    assert_eq!(keys.load(k(key + 1)), queue.len(), "key {}", key);
                }
            }
        }
    }

    /// The slot words, the lock, the queues and the spill table's header
    /// share one 128-byte line (module docs, "Layout").
    #[test]
    fn a_stripe_fits_its_line() {
        assert!(std::mem::size_of::<super::Stripe<[u8; 64]>>() <= 128);
    }

    #[test]
    fn keys_on_every_stripe() {
        let keys = KeyQueues::new(4, 2);
        let ids: Vec<u64> = (0..64)
            .map(|i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        for &id in &ids {
            assert_eq!(keys.admit(id, id), Admit::Run(id));
        }
        assert_eq!(keys.keys(), ids.len());
        for &id in &ids {
            assert_eq!(keys.finish(id), None);
        }
        assert_eq!(keys.keys(), 0);
    }
}
