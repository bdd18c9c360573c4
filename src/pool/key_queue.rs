//! The key queues of a pool's ordered keyed mode: per key, the request that
//! runs and the FIFO queue of those admitted behind it; striped by the
//! key's hash, so requests of different keys rarely meet on a lock.
//!
//! # Protocol
//!
//! A key is *present* while one of its requests is out (ready to run, or
//! running) and holds the queue of the ones admitted after it. The caller
//! has already taken the request's unit of capacity; then, under the
//! stripe's lock:
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
//! out in the order the lock admitted them, and every queued request is
//! taken by the finish of the one before it. No request is dropped on
//! shutdown: each one queued holds its unit, so the workers cannot exit
//! before the requests ahead of it finish and hand it out.
//! `loom-tests/tests/loom_key_queue.rs` checks the hand-over racing a new
//! request and shutdown, and a turn left to the caller racing a new
//! request.
//!
//! Each stripe also counts the requests waiting in its queues, on a line
//! of its own ([`anyone_queued`](KeyQueues::anyone_queued)): the hint by
//! which a worker decides whether to pass a blocking call's turn itself.
//!
//! # Identity
//!
//! A key is known by its 64-bit hash (foldhash, seeded per pool). Two keys
//! with the same hash are one key here: their requests are serialized
//! together, which only costs parallelism; each still runs exactly once,
//! in its turn.
//!
//! # Layout
//!
//! A power of two of stripes (four per worker, at most 1,024), each a lock
//! over [`SLOTS`] inline entries and a spill table, on lines of its own.
//! A key lives in a free inline slot when it arrives, else in the spill
//! table (a `hashbrown::HashTable` keyed by the hash), and stays where it
//! is until forgotten; a lookup checks the slots, then the spill table if
//! it holds anything. So the common case (few keys per stripe at a time)
//! touches one line: the lock and the slot beside it (a hash table alone
//! touches three: the lock, its control bytes, the bucket). When a caller
//! passes its own call's turn on, that line stays on its core.
//!
//! The lock is the shim's mutex (parking_lot's, loom's in a model): one
//! uncontended lock per admission and one per finish, and the queue needs
//! a lock whenever it is not empty.

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::sync::{AtomicUsize, Mutex, Ordering};

/// The most stripes: beyond this, more only cost memory.
const MAX_STRIPES: usize = 1024;

/// Stripes per worker: enough that two workers rarely finish on one.
const STRIPES_PER_WORKER: usize = 4;

/// Inline key slots per stripe: two entries, the lock and the spill
/// table's header fill a 128-byte stripe.
const SLOTS: usize = 2;

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

/// One present key: its hash and the requests queued behind the one out.
struct Entry<T> {
    id: u64,
    queue: VecDeque<T>,
}

/// One stripe's keys: inline slots first, the spill table for the rest.
struct Stripe<T> {
    slots: [Option<Entry<T>>; SLOTS],
    spill: HashTable<Entry<T>>,
}

impl<T> Stripe<T> {
    fn new() -> Self {
        Stripe {
            slots: std::array::from_fn(|_| None),
            spill: HashTable::new(),
        }
    }

    /// Key `id`'s entry, wherever it lives.
    fn find(&mut self, id: u64) -> Option<&mut Entry<T>> {
        if let Some(slot) = self
            .slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|e| e.id == id))
        {
            return self.slots[slot].as_mut();
        }
        if self.spill.is_empty() {
            return None;
        }
        self.spill.find_mut(id, |entry| entry.id == id)
    }

    /// Makes key `id` present with an empty queue (it is not).
    fn insert(&mut self, id: u64) {
        let entry = Entry {
            id,
            queue: VecDeque::new(),
        };
        match self.slots.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(entry),
            None => {
                self.spill.insert_unique(id, entry, |entry| entry.id);
            }
        }
    }

    /// Forgets key `id` (present, its queue empty).
    fn remove(&mut self, id: u64) {
        if let Some(slot) = self
            .slots
            .iter_mut()
            .find(|s| s.as_ref().is_some_and(|e| e.id == id))
        {
            *slot = None;
        } else if let Ok(found) = self.spill.find_entry(id, |entry| entry.id == id) {
            found.remove();
        }
    }

    fn len(&self) -> usize {
        self.slots.iter().filter(|slot| slot.is_some()).count() + self.spill.len()
    }

    #[cfg(test)]
    fn entries(&self) -> impl Iterator<Item = &Entry<T>> {
        self.slots.iter().flatten().chain(self.spill.iter())
    }
}

/// The per-key queues; see the module docs.
pub(crate) struct KeyQueues<T> {
    stripes: Box<[CachePadded<Mutex<Stripe<T>>>]>,
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
                .map(|_| CachePadded::new(Mutex::new(Stripe::new())))
                .collect(),
            queued: (0..stripes)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            cap: cap.max(1),
        }
    }

    /// The stripe of key `id`: the hash's top bits (the low ones pick the
    /// bucket inside the stripe's table).
    fn stripe(&self, id: u64) -> &Mutex<Stripe<T>> {
        &self.stripes[self.stripe_index(id)]
    }

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
    /// false). Whoever passes the key's turn on does so under the lock
    /// either way; the hint only picks who (`worker.rs`, "passing the
    /// turn").
    #[inline]
    pub(crate) fn anyone_queued(&self, id: u64) -> bool {
        // Relaxed: a hint, never a decision about a request (see above).
        self.queued[self.stripe_index(id)].load(Ordering::Relaxed) != 0
    }

    /// Admits `item` for key `id`; see [`Admit`].
    pub(crate) fn admit(&self, id: u64, item: T) -> Admit<T> {
        let mut stripe = self.stripe(id).lock();
        match stripe.find(id) {
            None => {
                stripe.insert(id);
                Admit::Run(item)
            }
            // `len + 1`: the request that is out counts too.
            Some(entry) if entry.queue.len() + 1 >= self.cap => Admit::Busy(item),
            Some(entry) => {
                entry.queue.push_back(item);
                // Relaxed: under the stripe's lock; read as a hint.
                self.queued[self.stripe_index(id)].fetch_add(1, Ordering::Relaxed);
                Admit::Queued
            }
        }
    }

    /// The request of key `id` that was out has finished: the key's next
    /// request, which is now out, or `None` (the key is forgotten).
    pub(crate) fn finish(&self, id: u64) -> Option<T> {
        let mut stripe = self.stripe(id).lock();
        let Some(entry) = stripe.find(id) else {
            debug_assert!(false, "a finish for a key that is not present");
            return None;
        };
        match entry.queue.pop_front() {
            Some(next) => {
                // Relaxed: under the stripe's lock; read as a hint.
                self.queued[self.stripe_index(id)].fetch_sub(1, Ordering::Relaxed);
                Some(next)
            }
            None => {
                // Forgotten: memory stays bounded by the requests admitted.
                stripe.remove(id);
                None
            }
        }
    }

    /// How many keys are present (a reading; takes every stripe's lock in
    /// turn).
    pub(crate) fn keys(&self) -> usize {
        self.stripes.iter().map(|stripe| stripe.lock().len()).sum()
    }

    /// Requests of key `id` admitted and unfinished: the one out and its
    /// queue (0 for a key not present).
    #[cfg(test)]
    pub(crate) fn load(&self, id: u64) -> usize {
        let mut stripe = self.stripe(id).lock();
        stripe.find(id).map_or(0, |entry| 1 + entry.queue.len())
    }

    /// How many requests are queued behind their key's running one (a
    /// reading, as [`keys`](Self::keys)).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.stripes
            .iter()
            .map(|stripe| {
                stripe
                    .lock()
                    .entries()
                    .map(|e| e.queue.len())
                    .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Admit, KeyQueues};

    #[test]
    fn one_out_per_key_in_admission_order() {
        let keys = KeyQueues::new(2, 3);
        assert_eq!(keys.admit(7, 'a'), Admit::Run('a'));
        assert_eq!(keys.admit(7, 'b'), Admit::Queued);
        assert_eq!(keys.admit(9, 'x'), Admit::Run('x')); // another key runs at once
        assert_eq!(keys.admit(7, 'c'), Admit::Queued);
        assert_eq!(keys.admit(7, 'd'), Admit::Busy('d')); // 'a' out, 'b' and 'c' queued: cap 3
        assert_eq!((keys.keys(), keys.queued()), (2, 2));
        assert_eq!(keys.finish(7), Some('b'));
        assert_eq!(keys.admit(7, 'e'), Admit::Queued);
        assert_eq!(keys.finish(7), Some('c'));
        assert_eq!(keys.finish(7), Some('e'));
        assert_eq!(keys.finish(7), None);
        assert_eq!(keys.finish(9), None);
        assert_eq!((keys.keys(), keys.queued()), (0, 0));
        assert_eq!(keys.admit(7, 'f'), Admit::Run('f')); // forgotten, so fresh
    }

    #[test]
    fn cap_one_refuses_while_out() {
        let keys = KeyQueues::new(1, 1);
        assert_eq!(keys.admit(1, 1), Admit::Run(1));
        assert_eq!(keys.admit(1, 2), Admit::Busy(2));
        assert_eq!(keys.finish(1), None);
        assert_eq!(keys.admit(1, 3), Admit::Run(3));
    }

    /// More keys on one stripe than it has slots: the rest spill, and a
    /// key stays where it is while present.
    #[test]
    fn keys_spill_past_the_slots() {
        let keys = KeyQueues::new(1, 4); // 4 stripes: top 2 bits
        let ids: Vec<u64> = (1..=6).collect(); // all on stripe 0
        for &id in &ids {
            assert_eq!(keys.admit(id, id * 10), Admit::Run(id * 10));
            assert_eq!(keys.admit(id, id * 10 + 1), Admit::Queued);
        }
        assert_eq!((keys.keys(), keys.queued()), (6, 6));
        // Free a slot; a spilled key is still found in the spill table.
        assert_eq!(keys.finish(1), Some(11));
        assert_eq!(keys.finish(1), None);
        assert_eq!(keys.admit(6, 62), Admit::Queued);
        assert_eq!(keys.load(6), 3);
        assert_eq!(keys.admit(7, 70), Admit::Run(70)); // takes the free slot
        for id in 2..=6 {
            assert_eq!(keys.finish(id), Some(id * 10 + 1));
        }
        assert_eq!(keys.finish(6), Some(62));
        for id in 2..=7 {
            assert_eq!(keys.finish(id), None);
        }
        assert_eq!(keys.keys(), 0);
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
