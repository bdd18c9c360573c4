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
//! # Slots: a key's turn without the lock
//!
//! A stripe has [`SLOTS`] inline slots, each one atomic word: `EMPTY`, or a
//! key and its state, one of
//!
//! | state | the key is | written by |
//! |---|---|---|
//! | `IDLE` | absent, but kept in the slot | a finish (`BUSY` to `IDLE`) |
//! | `BUSY` | present, nothing queued | an admission (`IDLE` or a free slot to `BUSY`); a finish that empties the queue |
//! | `QUEUED` | present, its queue (under the lock) not empty | an admission that queues (`BUSY` to `QUEUED`) |
//!
//! The common case, a key's requests one after another with nobody
//! queued, is an admission `IDLE` to `BUSY` and a finish `BUSY` to `IDLE`,
//! one CAS each and no lock: the key stays in its slot between requests.
//! Everything else takes the stripe's lock: queuing, handing out the next
//! queued request, a key not in a slot, and giving a slot to a new key.
//!
//! Why the two kinds of access cannot cross:
//!
//! * Which key a slot holds changes only under the lock (an admission
//!   that finds its key nowhere takes an `EMPTY` slot or one whose key is
//!   `IDLE`, by CAS). So under the lock the keys in the slots stand still
//!   and a key is in at most one place, a slot or the spill table: a key
//!   goes into a slot or the spill table only after the lock showed it in
//!   neither.
//! * Without the lock only two moves are made, each by CAS on the whole
//!   word: `IDLE` to `BUSY` (an admission of that key) and `BUSY` to `IDLE`
//!   (the finish of its turn's holder, the one thread that may end it). A
//!   CAS that fails means the word moved; the thread falls back to the
//!   lock, where `QUEUED` only changes under the lock.
//! * A queuing admission turns `BUSY` into `QUEUED` by CAS under the lock
//!   before it pushes; a finish whose CAS then fails takes the lock, so it
//!   finds the request pushed, and hands it out. If the finish's CAS wins,
//!   the admission's fails, it reads `IDLE`, and its request runs at once.
//! * The whole word is compared, so an `IDLE` slot that went to another
//!   key and came back (ABA) is still exactly "this key, absent, here".
//!
//! Order between one request of a key and the next: the finish's CAS to
//! `IDLE` is `Release`, the admission's CAS from it `Acquire`; a request
//! handed out of a queue is ordered by the lock.
//! `loom-tests/tests/loom_key_queue.rs` checks the hand-over racing a new
//! request and shutdown, a turn left to the caller racing a new request,
//! and a slot taken from an idle key racing that key's own admission.
//!
//! # Identity
//!
//! A key is known by its 64-bit hash (foldhash, seeded per pool), less the
//! two low bits, which hold a slot's state. Two keys whose hashes agree on
//! the other 62 are one key here: their requests are serialized together,
//! which only costs parallelism; each still runs exactly once, in its
//! turn.
//!
//! # Layout
//!
//! A power of two of stripes (four per worker, at most 1,024), each on a
//! line of its own: the slot words, then a lock over the slots' queues and
//! a spill table (a `hashbrown::HashTable` keyed by the hash) for keys
//! that find no slot. So the common case touches one line, and when a
//! caller passes its own call's turn on, that line stays on its core.

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::sync::{AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

/// The most stripes: beyond this, more only cost memory.
const MAX_STRIPES: usize = 1024;

/// Stripes per worker: enough that two workers rarely finish on one.
const STRIPES_PER_WORKER: usize = 4;

/// Inline key slots per stripe: their words, the lock, their queues and
/// the spill table's header fill a 128-byte stripe.
const SLOTS: usize = 2;

/// A slot word's state bits (module docs, "Slots"); a word with none set
/// is `EMPTY`.
const STATE: u64 = 0b11;
const BUSY: u64 = 0b01;
const QUEUED: u64 = 0b10;
const IDLE: u64 = 0b11;
/// A slot word with no key.
const EMPTY: u64 = 0;

/// Key `id` as a slot word holds it (module docs, "Identity").
#[inline]
fn key_of(id: u64) -> u64 {
    id & !STATE
}

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

/// A present key of the spill table: its key and the requests queued
/// behind the one out.
struct Entry<T> {
    key: u64,
    pub(super) queue: VecDeque<T>,
}

/// One stripe: the slot words, and under the lock the rest.
struct Stripe<T> {
    /// `EMPTY`, or a key and its state (module docs, "Slots").
    words: [AtomicU64; SLOTS],
    locked: Mutex<Locked<T>>,
}

/// What a stripe's lock guards.
struct Locked<T> {
    /// The queue of the key in slot `i` while it is `QUEUED`; empty
    /// otherwise.
    queues: [VecDeque<T>; SLOTS],
    /// Present keys that found no slot.
    spill: HashTable<Entry<T>>,
}

impl<T> Stripe<T> {
    fn new() -> Self {
        Stripe {
            words: std::array::from_fn(|_| AtomicU64::new(EMPTY)),
            locked: Mutex::new(Locked {
                queues: std::array::from_fn(|_| VecDeque::new()),
                spill: HashTable::new(),
            }),
        }
    }

    /// One of the two moves made without the lock (module docs, "Slots"):
    /// the slot holding `key` in state `from` goes to state `to`, by CAS
    /// with `order` on success. False if no slot holds it so, or if the
    /// word moved first: the caller goes to the lock.
    #[inline]
    fn flip(&self, key: u64, from: u64, to: u64, order: Ordering) -> bool {
        for word in &self.words {
            // Relaxed: a first look; the CAS decides.
            if word.load(Ordering::Relaxed) == key | from {
                return word
                    .compare_exchange(key | from, key | to, order, Ordering::Relaxed)
                    .is_ok();
            }
        }
        false
    }

    /// The slot holding `key` (in any state). Under the lock, where the
    /// slots' keys stand still (module docs, "Slots").
    fn slot_of(&self, key: u64, _locked: &MutexGuard<'_, Locked<T>>) -> Option<usize> {
        // Relaxed: only the key bits are used, and they change under the
        // lock, which orders them.
        self.words.iter().position(|word| {
            let word = word.load(Ordering::Relaxed);
            word != EMPTY && word & !STATE == key
        })
    }

    /// Present keys (a reading).
    fn present(&self, locked: &Locked<T>) -> usize {
        let in_slots = self
            .words
            .iter()
            .filter(|word| {
                // Relaxed: a reading.
                let word = word.load(Ordering::Relaxed);
                word != EMPTY && word & STATE != IDLE
            })
            .count();
        in_slots + locked.spill.len()
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

    /// The stripe of key `id`: the hash's top bits (the low ones pick the
    /// bucket inside the stripe's table).
    fn stripe_index(&self, id: u64) -> usize {
        let bits = self.stripes.len().trailing_zeros();
        if bits == 0 {
            0
        } else {
            (id >> (64 - bits)) as usize
        }
    }

    /// Whether any request waits in a queue of key `id`'s stripe: a hint,
    /// read without the lock (a request may queue just after it reads
    /// false). Whoever passes the key's turn on does so correctly either
    /// way; the hint only picks who (`ordered.rs`, "Who passes the
    /// turn").
    #[inline]
    pub(crate) fn anyone_queued(&self, id: u64) -> bool {
        // Relaxed: a hint, never a decision about a request (see above).
        self.queued[self.stripe_index(id)].load(Ordering::Relaxed) != 0
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

    /// Admits `item` for key `id`; see [`Admit`].
    pub(crate) fn admit(&self, id: u64, item: T) -> Admit<T> {
        let key = key_of(id);
        let index = self.stripe_index(id);
        let stripe = &self.stripes[index];
        // Without the lock: the key kept idle in a slot (module docs).
        // Acquire: pairs with the Release of the finish that left the key
        // idle (its request was handled before this one).
        if stripe.flip(key, IDLE, BUSY, Ordering::Acquire) {
            return Admit::Run(item);
        }
        let mut locked = stripe.locked.lock();
        if let Some(at) = stripe.slot_of(key, &locked) {
            let word = &stripe.words[at];
            // Acquire: as the CAS above, for a finish that left it idle.
            let mut current = word.load(Ordering::Acquire);
            loop {
                let next = match current & STATE {
                    IDLE => key | BUSY,
                    BUSY if self.cap > 1 => key | QUEUED,
                    BUSY => return Admit::Busy(item),
                    // `QUEUED`: changes only under this lock.
                    _ => return self.queue_behind(&mut locked.queues[at], index, item),
                };
                // Acquire: as above. The only moves it races are the
                // lock-free `IDLE` <-> `BUSY` of this key.
                match word.compare_exchange(current, next, Ordering::Acquire, Ordering::Acquire) {
                    Ok(_) if next & STATE == BUSY => return Admit::Run(item),
                    Ok(_) => {
                        // `QUEUED` before the push: the finish whose CAS
                        // this made fail waits for the lock (module docs).
                        return self.queue_behind(&mut locked.queues[at], index, item);
                    }
                    Err(moved) => current = moved,
                }
            }
        }
        if let Some(entry) = locked.spill.find_mut(key, |entry| entry.key == key) {
            return self.queue_behind(&mut entry.queue, index, item);
        }
        // Absent: a free slot, or one whose key is kept idle.
        for word in &stripe.words {
            // Relaxed: the CAS decides; a slot's previous key shares
            // nothing with this one.
            let current = word.load(Ordering::Relaxed);
            if (current == EMPTY || current & STATE == IDLE)
                && word
                    .compare_exchange(current, key | BUSY, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                return Admit::Run(item);
            }
        }
        locked.spill.insert_unique(
            key,
            Entry {
                key,
                queue: VecDeque::new(),
            },
            |entry| entry.key,
        );
        Admit::Run(item)
    }

    /// The request of key `id` that was out has finished: the key's next
    /// request, which is now out, or `None` (the key is forgotten). Only
    /// the holder of the key's turn calls it.
    pub(crate) fn finish(&self, id: u64) -> Option<T> {
        let key = key_of(id);
        let index = self.stripe_index(id);
        let stripe = &self.stripes[index];
        // Without the lock: nobody queued (module docs). Release: pairs
        // with the Acquire of the key's next admission (this request was
        // handled before that one).
        if stripe.flip(key, BUSY, IDLE, Ordering::Release) {
            return None;
        }
        // Queued (perhaps meanwhile), or spilled: under the lock.
        let mut locked = stripe.locked.lock();
        if let Some(at) = stripe.slot_of(key, &locked) {
            let word = &stripe.words[at];
            // Relaxed: with the lock and the turn held, nobody else moves
            // this word (module docs).
            let current = word.load(Ordering::Relaxed);
            if current & STATE == BUSY {
                // Release: as the CAS above.
                word.store(key | IDLE, Ordering::Release);
                return None;
            }
            debug_assert_eq!(current & STATE, QUEUED, "a finish for a key not present");
            let next = self.pop_queued(&mut locked.queues[at], index);
            if locked.queues[at].is_empty() {
                // Relaxed: under the lock, which orders it for the slow
                // paths; the next turn's holder is handed it after this.
                word.store(key | BUSY, Ordering::Relaxed);
            }
            return next;
        }
        let Ok(mut found) = locked.spill.find_entry(key, |entry| entry.key == key) else {
            debug_assert!(false, "a finish for a key that is not present");
            return None;
        };
        let next = self.pop_queued(&mut found.get_mut().queue, index);
        if next.is_none() {
            // Forgotten: memory stays bounded by the requests admitted.
            found.remove();
        }
        next
    }

    /// How many keys are present (a reading; takes every stripe's lock in
    /// turn).
    pub(crate) fn keys(&self) -> usize {
        self.stripes
            .iter()
            .map(|stripe| stripe.present(&stripe.locked.lock()))
            .sum()
    }

    /// Requests of key `id` admitted and unfinished: the one out and its
    /// queue (0 for a key not present).
    #[cfg(test)]
    pub(crate) fn load(&self, id: u64) -> usize {
        let key = key_of(id);
        let stripe = &self.stripes[self.stripe_index(id)];
        let mut locked = stripe.locked.lock();
        if let Some(at) = stripe.slot_of(key, &locked) {
            let word = stripe.words[at].load(Ordering::Relaxed);
            return if word & STATE == IDLE {
                0
            } else {
                1 + locked.queues[at].len()
            };
        }
        locked
            .spill
            .find_mut(key, |entry| entry.key == key)
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

    /// The `n`th key of stripe 0 (the two low bits are the slot's state).
    fn k(n: u64) -> u64 {
        n << 2
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
