//! The key set: which keys have live children, how many each, and who
//! waits for each key; sharded by the key's hash, so admissions of
//! different keys rarely meet.
//!
//! It bounds the live children *per key* (`per_key`, 1 by default: a
//! workflow's tasks run one after another) on top of the supervisor's
//! global capacity, which the table bounds. A key is present only while it
//! has live children or waiters, so the set holds at most
//! `capacity + max_waiters` keys and is empty when the children have
//! ended.
//!
//! # Shape
//!
//! A power of two of shards (four per table shard, at most 1,024). Each
//! shard has two homes for keys:
//!
//! * **Resident slots**: an array of atomic words, a key's slot chosen by
//!   its hash. A word is `id | count << 1 | PINNED`: the key living there,
//!   its live children, and a bit that sends every caller to the lock. A
//!   key that finds its slot empty, or holding itself unpinned, enters and
//!   leaves with one CAS on that word: no lock, no allocation.
//! * **The overflow map**: a lock over a `hashbrown::HashTable` of entries
//!   `{id, live, queue}` for keys whose slot another key holds, and for
//!   the waiters of any key (a resident key's waiters sit in an entry
//!   marked `resident`).
//!
//! A key is in one home at a time, and stays there while it has a live
//! child: it is resident iff its slot's word carries its id. So the exit
//! of a child finds its count by reading the slot.
//!
//! # Protocol
//!
//! * **Fast enter.** Word 0: CAS it to `id | 1`. Word `id | n`, unpinned,
//!   `n < per_key`: CAS to `n + 1`; `n == per_key`: `KeyBusy`. Anything
//!   else (pinned, another key's, a lost CAS): the locked path.
//! * **Fast exit.** Word `id | n`, unpinned: CAS to `n - 1` (to 0 when
//!   `n == 1`, forgetting the key). Pinned: the locked path.
//! * **Locked path.** Take the shard's lock, then *pin* the slot (a CAS
//!   loop setting `PINNED`): from then on no fast path writes the word, so
//!   under the lock the slot and the map are one consistent state. Enter:
//!   a resident key takes a count if it has room; a key in the map takes
//!   one there; a key in neither claims the slot if it is empty, else gets
//!   a map entry. Exit: hand the unit to the key's oldest waiter if one
//!   waits (the count is unchanged), else decrement where the key lives,
//!   forgetting it at 0. Then *unpin*, unless the map still holds entries
//!   of keys mapped to this slot (a per-slot count, `spills`): while it
//!   does, the slot stays pinned, so a key in the map can never also claim
//!   the empty slot, and a resident key with waiters always exits through
//!   the lock and hands over.
//! * **Granted is "not queued".** A waiter's node is in its key's queue
//!   until a release takes it out (a grant) or the waiter takes itself out
//!   (it gave up). So a waiter that finds its ticket gone under the lock
//!   owns a count; a dropped future in that state releases it, which hands
//!   it to the next waiter: nothing is stranded.
//! * **Invariant.** A queue holds a waiting (not expired) node only while
//!   the key has `per_key` live children: nodes are queued only then, and
//!   a release with a waiting node hands over instead of decrementing. So
//!   a newcomer that finds a count below `per_key` takes it without
//!   jumping the queue.
//! * **Deadlines.** A blocked thread times its own condition-variable
//!   wait. An async waiter's node carries its deadline, and the shard is
//!   rung by the crate's deadline watcher (`alarm.rs`), as the table's
//!   waiting room is: the ring marks past-deadline nodes expired and wakes
//!   them; they take themselves out in their next poll.
//! * **Close.** Under each shard's lock the shard is marked closed and
//!   every waiter woken; a waiter checks the mark under the same lock
//!   before it sleeps, so none sleeps through it. (A fast enter does not
//!   look at the mark: the table's own check, right after, refuses.)
//!
//! # Orderings
//!
//! A fast enter's CAS is Acquire and a fast exit's Release: the exit of a
//! key's child happens-before the admission of the key's next child that
//! reads its word. The pin is an AcqRel CAS (it reads every fast exit
//! before it), and the unpin a Release store (every fast enter after it
//! reads what the locked path did). Between pin and unpin only the lock
//! holder writes the word.
//!
//! # Identity and collisions
//!
//! A key is hashed once (foldhash, seeded per process, as hashbrown's own
//! maps are) and known by its *id*: the hash's top 44 bits (bit 63 forced
//! on, so no id is 0). Bits 32 and up pick the shard, 44 and up the slot.
//! Two different keys with the same id (the chance that any two of 1,000
//! live keys agree is about 2^-24, of a million about 2^-4; the seed keeps
//! an adversary from choosing them) are treated as one key: they share its `per_key` limit
//! and its queue. That is safe, it only serializes more: no key ever has
//! more than `per_key` live children, and every waiter is still served in
//! its turn.
//!
//! The queue is first come first served whatever the supervisor's
//! `queue_order`: a key's waiters are the next tasks of one workflow, and
//! their order is the point.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};
use std::task::Waker;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::engine::foreign::each_then_resume;
use crate::error::Error;
use crate::sync::{
    now, Arc, AtomicU64, AtomicUsize, Condvar, Mutex,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// The hasher keys go through: foldhash with a per-process random seed
/// normally; a fixed one under loom, whose models must replay the same
/// choices on every run.
#[cfg(not(loom))]
type KeyHasher = hashbrown::DefaultHashBuilder;
#[cfg(loom)]
type KeyHasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// The most key shards: beyond this, more shards only cost memory.
const MAX_KEY_SHARDS: usize = 1024;

/// Key shards per table shard (one under loom, so that models meet).
#[cfg(not(loom))]
const KEY_SHARDS_PER_SHARD: usize = 4;
#[cfg(loom)]
const KEY_SHARDS_PER_SHARD: usize = 1;

/// Resident slots per shard: about two per unit of capacity the shard
/// would see, within these bounds (32 KiB of words at most per shard;
/// keys past the slots go to the map, correctly and a little slower).
/// Under loom, one: any two keys share it, so models see the map and the
/// pin as well as the fast paths.
#[cfg(not(loom))]
const MIN_SLOTS: usize = 16;
#[cfg(not(loom))]
const MAX_SLOTS: usize = 4096;
#[cfg(loom)]
const MIN_SLOTS: usize = 1;
#[cfg(loom)]
const MAX_SLOTS: usize = 1;

/// Bit 0 of a slot word: every caller goes through the lock.
const PINNED: u64 = 1;
/// One live child, in the count field (bits 1 to 19).
const ONE: u64 = 1 << 1;
const COUNT_BITS: u32 = 19;
const COUNT_MASK: u64 = ((1 << COUNT_BITS) - 1) << 1;
/// The id field: bits 20 to 63.
const ID_SHIFT: u32 = 20;
const ID_MASK: u64 = !((1 << ID_SHIFT) - 1);
/// The largest `per_key` the count field holds; above it, every slot
/// stays pinned and keys live in the map.
const MAX_RESIDENT_PER_KEY: u32 = (1 << COUNT_BITS) - 1;

#[inline]
fn count_of(word: u64) -> u32 {
    ((word & COUNT_MASK) >> 1) as u32
}

#[inline]
fn id_of(word: u64) -> u64 {
    word & ID_MASK
}

/// The hash the map's table files an entry under: the id's bits, moved so
/// that both the low bits (the bucket) and the top 7 (the control byte)
/// vary.
#[inline]
fn map_hash(id: u64) -> u64 {
    (id >> ID_SHIFT).rotate_left(44)
}

/// The set of busy keys of one supervisor.
pub(crate) struct KeySet {
    shards: Box<[Arc<KeyShard>]>,
    /// `shards.len() - 1`; the count is a power of two.
    mask: usize,
    hasher: KeyHasher,
    /// How many callers may wait for keys at once (0: none may), and for
    /// how long at most.
    max_waiters: usize,
    max_wait: std::time::Duration,
    /// Callers waiting for a key now. Touched only by callers that found
    /// their key busy and may wait, never on the admission path.
    waiting: CachePadded<AtomicUsize>,
    /// The most callers that ever waited for keys at once.
    peak_waiting: AtomicUsize,
    /// Waits for a key that ran out (`Timeout`).
    timed_out: AtomicU64,
}

/// One shard of the key set, on cache lines of its own.
#[repr(align(128))]
pub(crate) struct KeyShard {
    state: Mutex<ShardState>,
    slots: Box<[AtomicU64]>,
    /// `slots.len() - 1`.
    slot_mask: usize,
    per_key: u32,
    /// `per_key` fits the count field: the fast paths may be used.
    resident: bool,
}

struct ShardState {
    map: HashTable<Entry>,
    /// Per slot, the entries of the map whose key maps to it; the slot
    /// stays pinned while it is not 0.
    spills: Box<[u32]>,
    /// Set by `close`: waiters give up with `Shutdown`, none queues.
    closed: bool,
    /// The ticket of the next waiter.
    next_ticket: u64,
    /// The instant this shard is registered with the deadline watcher
    /// for, if any: at or before every waiting async node's deadline.
    #[cfg_attr(loom, allow(dead_code))]
    armed: Option<Instant>,
}

/// A key in the map: with live children (its count lives here), or with
/// waiters.
struct Entry {
    id: u64,
    /// The key is resident (its count is in its slot's word); this entry
    /// only holds its waiters.
    resident: bool,
    /// Live children, when not resident; at most `per_key`.
    live: u32,
    /// Waiters, oldest first.
    queue: VecDeque<Waiter>,
}

impl Entry {
    /// Nothing left to keep: no count here and nobody queued.
    fn is_spent(&self) -> bool {
        self.queue.is_empty() && (self.resident || self.live == 0)
    }
}

struct Waiter {
    ticket: u64,
    wake: Option<Wake>,
    /// When the deadline watcher expires it (async waiters only).
    #[cfg_attr(loom, allow(dead_code))]
    deadline: Option<Instant>,
    /// Timed out by the watcher: skipped by grants, waiting for its owner
    /// to take it out.
    expired: bool,
}

/// How to wake a waiter.
enum Wake {
    Thread(Arc<Condvar>),
    Task(Waker),
}

impl Wake {
    fn wake(self) {
        match self {
            Wake::Thread(condvar) => condvar.notify_all(),
            Wake::Task(waker) => waker.wake(),
        }
    }
}

/// One of a key's `per_key` counts while an admission is under way;
/// dropping it releases the count (to the key's next waiter, if one
/// waits). [`keep`](Self::keep) hands it over to a child's guard, which
/// releases it with [`KeySet::release`] (the guard reaches the set through
/// the supervisor's shared state, so it holds no reference count of its
/// own).
pub(crate) struct KeySlot<'a> {
    set: &'a KeySet,
    id: u64,
}

impl KeySlot<'_> {
    /// Hands the count over: the caller must release `id` once.
    #[inline]
    pub(crate) fn keep(self) -> u64 {
        let id = self.id;
        std::mem::forget(self);
        id
    }
}

impl Drop for KeySlot<'_> {
    fn drop(&mut self) {
        self.set.release(self.id);
    }
}

/// Where a waiter stands, read under the lock.
enum Standing {
    /// Still queued, not expired.
    Queued,
    /// Expired by the watcher (still queued until taken out).
    Expired,
    /// Taken out of the queue by a release: the waiter owns a count.
    Granted,
}

impl KeySet {
    /// A key set for a supervisor over `table_shards` shards and at most
    /// `max_capacity` children, `per_key` live children per key,
    /// `max_waiters` waiters for keys (0: no waiting) of at most
    /// `max_wait` each.
    pub(crate) fn new(
        table_shards: usize,
        max_capacity: usize,
        per_key: u32,
        max_waiters: usize,
        max_wait: std::time::Duration,
    ) -> KeySet {
        let count = (table_shards * KEY_SHARDS_PER_SHARD)
            .next_power_of_two()
            .min(MAX_KEY_SHARDS);
        let slots = (2 * max_capacity / count)
            .next_power_of_two()
            .clamp(MIN_SLOTS, MAX_SLOTS);
        let resident = per_key <= MAX_RESIDENT_PER_KEY;
        let shards = (0..count)
            .map(|_| {
                Arc::new(KeyShard {
                    state: Mutex::new(ShardState {
                        map: HashTable::new(),
                        // Without the fast paths, pinned for good.
                        spills: vec![u32::from(!resident); slots].into_boxed_slice(),
                        closed: false,
                        next_ticket: 0,
                        armed: None,
                    }),
                    slots: (0..slots)
                        .map(|_| AtomicU64::new(if resident { 0 } else { PINNED }))
                        .collect(),
                    slot_mask: slots - 1,
                    per_key,
                    resident,
                })
            })
            .collect();
        KeySet {
            shards,
            mask: count - 1,
            hasher: KeyHasher::default(),
            max_waiters,
            max_wait,
            waiting: CachePadded::new(AtomicUsize::new(0)),
            peak_waiting: AtomicUsize::new(0),
            timed_out: AtomicU64::new(0),
        }
    }

    /// The id keys are told apart by (module docs).
    #[inline]
    pub(crate) fn id<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        (self.hasher.hash_one(key) | 1 << 63) & ID_MASK
    }

    #[inline]
    fn shard(&self, id: u64) -> &Arc<KeyShard> {
        &self.shards[(id >> 32) as usize & self.mask]
    }

    /// The count of `id` whose taking the caller has done.
    #[inline]
    fn slot(&self, id: u64) -> KeySlot<'_> {
        KeySlot { set: self, id }
    }

    /// Releases one count of the key `id` (module docs: hand it over or
    /// forget the key). For a guard that [`kept`](KeySlot::keep) it.
    #[inline]
    pub(crate) fn release(&self, id: u64) {
        let shard = self.shard(id);
        if !shard.release_fast(id) {
            shard.release_locked(id);
        }
    }

    /// Takes one of the key's counts, or `KeyBusy` at once.
    #[inline]
    pub(crate) fn try_enter(&self, id: u64) -> Result<KeySlot<'_>, Error> {
        let shard = self.shard(id);
        match shard.enter_fast(id) {
            Some(Ok(())) => Ok(self.slot(id)),
            Some(Err(err)) => Err(err),
            None => self.try_enter_locked(id),
        }
    }

    #[cold]
    fn try_enter_locked(&self, id: u64) -> Result<KeySlot<'_>, Error> {
        let shard = self.shard(id);
        let mut state = shard.state.lock();
        if state.closed {
            return Err(Error::Shutdown);
        }
        let slot = shard.pin(id);
        let entered = shard.enter_pinned(&mut state, id, slot);
        shard.unpin(&state, slot);
        drop(state);
        if entered {
            Ok(self.slot(id))
        } else {
            Err(Error::KeyBusy)
        }
    }

    /// True if callers may wait for a busy key (`max_waiters > 0`).
    #[inline]
    pub(crate) fn can_wait(&self) -> bool {
        self.max_waiters > 0
    }

    /// The earlier of `deadline` and `max_wait` from now.
    pub(crate) fn deadline(&self, deadline: Option<Instant>) -> Option<Instant> {
        let own = now().checked_add(self.max_wait);
        match (deadline, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counts a waiter in, unless `max_waiters` wait already.
    fn join_waiters(&self) -> bool {
        // Relaxed: a bound on a count; nothing is published through it.
        let before = self.waiting.fetch_add(1, Relaxed);
        if before >= self.max_waiters {
            self.waiting.fetch_sub(1, Relaxed);
            return false;
        }
        // Relaxed: a statistic. The count after this join, which every
        // waiter counted in `waiting` then was part of at once.
        self.peak_waiting.fetch_max(before + 1, Relaxed);
        true
    }

    /// A wait for a key ran out: counted for `Stats::timed_out`.
    fn record_timeout(&self) {
        // Relaxed: a count, read by `stats` only.
        self.timed_out.fetch_add(1, Relaxed);
    }

    fn leave_waiters(&self) {
        // Relaxed: as in `join_waiters`.
        self.waiting.fetch_sub(1, Relaxed);
    }

    /// Takes a count of a key found busy, waiting (blocking the thread) in
    /// the key's queue until `deadline` (already bounded by `max_wait`:
    /// see [`deadline`](Self::deadline)).
    ///
    /// `KeyBusy` when no more waiters fit, `Timeout` when the wait ran
    /// out, `Shutdown` once closed.
    #[cold]
    pub(crate) fn wait_blocking(
        &self,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<KeySlot<'_>, Error> {
        if !self.join_waiters() {
            return Err(Error::KeyBusy);
        }
        let result = self.wait_blocking_counted(id, deadline);
        self.leave_waiters();
        if let Err(Error::Timeout) = result {
            self.record_timeout();
        }
        result
    }

    fn wait_blocking_counted(
        &self,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<KeySlot<'_>, Error> {
        let shard = self.shard(id);
        let condvar = Arc::new(Condvar::new());
        let mut state = shard.state.lock();
        // The key may have freed while we allocated.
        let mut wake = Some(Wake::Thread(Arc::clone(&condvar)));
        let ticket = match shard.enqueue(&mut state, id, &mut wake, None) {
            Ok(Some(ticket)) => ticket,
            Ok(None) => return Ok(self.slot(id)),
            Err(err) => return Err(err),
        };
        loop {
            match state.standing(id, ticket) {
                Standing::Granted => return Ok(self.slot(id)),
                Standing::Expired => unreachable_expired(),
                Standing::Queued => {}
            }
            if state.closed {
                // A thread's wake: ours to drop anywhere.
                drop(shard.cancel(&mut state, id, ticket));
                return Err(Error::Shutdown);
            }
            // A deadline too far to represent: wait in long steps.
            let step = deadline.unwrap_or_else(|| now() + std::time::Duration::from_secs(3600));
            let timed_out;
            (state, timed_out) = condvar.wait_until(state, step);
            if timed_out && deadline.is_some_and(|d| now() >= d) {
                if let Standing::Granted = state.standing(id, ticket) {
                    // Handed a count just as time ran out: keep it.
                    return Ok(self.slot(id));
                }
                drop(shard.cancel(&mut state, id, ticket));
                return Err(Error::Timeout);
            }
        }
    }

    /// Takes a count, waiting as a future (never blocking the executor's
    /// thread) if the key is busy and the policy lets it, until `deadline`
    /// (already bounded by `max_wait`). Dropping the future gives up the
    /// wait, releasing a count handed to it meanwhile.
    pub(crate) fn enter_async(&self, id: u64, deadline: Option<Instant>) -> WaitKey<'_> {
        WaitKey {
            set: self,
            id,
            deadline,
            ticket: None,
            done: false,
        }
    }

    /// Marks every shard closed and wakes every waiter. Every shard is
    /// closed before any waiter is woken, and a waker that panics keeps
    /// no other asleep: its panic goes on up once all are woken.
    pub(crate) fn close(&self) {
        let mut woken = Vec::new();
        for shard in self.shards.iter() {
            let mut state = shard.state.lock();
            state.closed = true;
            for entry in state.map.iter_mut() {
                for waiter in entry.queue.iter_mut() {
                    woken.extend(waiter.wake.take());
                }
            }
        }
        each_then_resume(woken, Wake::wake);
    }

    /// How many keys have live children (or waiters) now: a reading, shard
    /// by shard.
    pub(crate) fn busy_keys(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let state = shard.state.lock();
                let in_map = state.map.iter().filter(|entry| !entry.resident).count();
                // Acquire: a reading; pairs with the fast exits' Release.
                let resident = shard
                    .slots
                    .iter()
                    .filter(|word| id_of(word.load(Acquire)) != 0)
                    .count();
                in_map + resident
            })
            .sum()
    }

    /// The live children of the key `id` now.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn live(&self, id: u64) -> u32 {
        let shard = self.shard(id);
        let state = shard.state.lock();
        // Acquire: a reading, as in `busy_keys`.
        let word = shard.slots[shard.slot_index(id)].load(Acquire);
        if id_of(word) == id {
            return count_of(word);
        }
        state
            .map
            .find(map_hash(id), |entry| entry.id == id)
            .map_or(0, |entry| entry.live)
    }

    /// Callers waiting for a key now.
    pub(crate) fn waiting(&self) -> usize {
        // Relaxed: a reading.
        self.waiting.load(Relaxed)
    }

    /// The most callers that ever waited for keys at once.
    pub(crate) fn peak_waiting(&self) -> usize {
        // Relaxed: a reading.
        self.peak_waiting.load(Relaxed)
    }

    /// Waits for a key that ran out.
    pub(crate) fn timed_out(&self) -> u64 {
        // Relaxed: a reading.
        self.timed_out.load(Relaxed)
    }
}

/// Not reachable: only async waiters carry a deadline the watcher expires.
#[cold]
fn unreachable_expired() {
    debug_assert!(false, "a blocked waiter was expired by the watcher");
}

impl KeyShard {
    #[inline]
    fn slot_index(&self, id: u64) -> usize {
        (id >> 44) as usize & self.slot_mask
    }

    /// The lock-free enter (module docs): `Some(Ok)` entered,
    /// `Some(Err(KeyBusy))` busy, `None` to be decided under the lock.
    #[inline]
    fn enter_fast(&self, id: u64) -> Option<Result<(), Error>> {
        let slot = &self.slots[self.slot_index(id)];
        // Relaxed: a guess; the CAS below decides, with Acquire.
        let word = slot.load(Relaxed);
        if word == 0 {
            // Acquire: pairs with the Release of the exit (fast, or the
            // unpin of a locked one) that emptied the slot.
            return slot
                .compare_exchange(0, id | ONE, Acquire, Relaxed)
                .ok()
                .map(|_| Ok(()));
        }
        if word & (ID_MASK | PINNED) != id {
            return None; // pinned, or another key's
        }
        if count_of(word) >= self.per_key {
            return Some(Err(Error::KeyBusy));
        }
        // Acquire: as above, with the exit that left this count.
        slot.compare_exchange(word, word + ONE, Acquire, Relaxed)
            .ok()
            .map(|_| Ok(()))
    }

    /// The lock-free exit: true if done, false if the lock must do it (the
    /// slot is pinned, or the key is not resident).
    #[inline]
    fn release_fast(&self, id: u64) -> bool {
        let slot = &self.slots[self.slot_index(id)];
        // Relaxed: the CAS below decides.
        let mut word = slot.load(Relaxed);
        loop {
            if word & (ID_MASK | PINNED) != id {
                return false;
            }
            let next = if count_of(word) == 1 { 0 } else { word - ONE };
            // Release: pairs with the Acquire of the next enter of this
            // slot (fast, or the pin of a locked one).
            match slot.compare_exchange_weak(word, next, Release, Relaxed) {
                Ok(_) => return true,
                Err(seen) => word = seen,
            }
        }
    }

    /// Pins `id`'s slot (under the lock): no fast path writes it until
    /// [`unpin`](Self::unpin). Returns the slot's index.
    fn pin(&self, id: u64) -> usize {
        let index = self.slot_index(id);
        // AcqRel: reads (Acquire) every fast exit that came before, and
        // orders our reading of the word before our writes under the pin.
        self.slots[index].fetch_or(PINNED, AcqRel);
        index
    }

    /// Unpins slot `index` unless the map holds keys of it (under the
    /// lock, after a pin).
    fn unpin(&self, state: &ShardState, index: usize) {
        if state.spills[index] == 0 {
            // Release: publishes the locked path's writes to the fast
            // enters that read the unpinned word. Only the lock holder
            // writes a pinned word, so no update is lost.
            let slot = &self.slots[index];
            slot.store(slot.load(Relaxed) & !PINNED, Release);
        }
    }

    /// Enters `id` under the lock with its slot pinned: true if a count
    /// was taken, false if the key is busy.
    fn enter_pinned(&self, state: &mut ShardState, id: u64, index: usize) -> bool {
        let slot = &self.slots[index];
        // Relaxed: only the lock holder writes a pinned word.
        let word = slot.load(Relaxed);
        if id_of(word) == id {
            // Resident.
            if count_of(word) >= self.per_key {
                return false;
            }
            slot.store(word + ONE, Relaxed);
            return true;
        }
        if let Some(entry) = state.map.find_mut(map_hash(id), |entry| entry.id == id) {
            if entry.live >= self.per_key {
                return false;
            }
            entry.live += 1;
            return true;
        }
        if id_of(word) == 0 && self.resident {
            // An empty slot and the key nowhere: it moves in.
            slot.store(word | id | ONE, Relaxed);
            return true;
        }
        state.insert(
            index,
            Entry {
                id,
                resident: false,
                live: 1,
                queue: VecDeque::new(),
            },
        );
        true
    }

    /// Releases a count of `id` under the lock (module docs).
    #[cold]
    fn release_locked(&self, id: u64) {
        let mut state = self.state.lock();
        let index = self.pin(id);
        let wake = self.release_pinned(&mut state, id, index);
        self.unpin(&state, index);
        drop(state);
        // After the lock: a woken thread does not wake into a held lock,
        // and no executor code runs under it.
        if let Some(wake) = wake {
            wake.wake();
        }
    }

    fn release_pinned(&self, state: &mut ShardState, id: u64, index: usize) -> Option<Wake> {
        let slot = &self.slots[index];
        // Relaxed: only the lock holder writes a pinned word.
        let word = slot.load(Relaxed);
        let resident = id_of(word) == id;
        let hash = map_hash(id);
        if let Ok(mut found) = state.map.find_entry(hash, |entry| entry.id == id) {
            let entry = found.get_mut();
            if let Some(at) = entry.queue.iter().position(|waiter| !waiter.expired) {
                // The count passes to the waiter, unchanged.
                let wake = entry.queue.remove(at).and_then(|waiter| waiter.wake);
                if entry.is_spent() {
                    // A resident key's last waiter: its entry goes.
                    found.remove();
                    state.spills[index] -= 1;
                }
                return wake;
            }
            if !resident {
                entry.live -= 1;
                if entry.is_spent() {
                    found.remove();
                    state.spills[index] -= 1;
                }
                return None;
            }
            // Resident with only expired waiters: if this was the last
            // count, the key leaves the slot and its entry keeps the
            // expired nodes (and no count) until they are taken out.
            if count_of(word) == 1 {
                entry.resident = false;
                entry.live = 0;
            }
        }
        if resident {
            let next = if count_of(word) == 1 {
                word & PINNED
            } else {
                word - ONE
            };
            slot.store(next, Relaxed);
        } else {
            debug_assert!(false, "a released key is neither resident nor in the map");
        }
        None
    }

    /// Under the lock, for a caller that found the key busy: takes a count
    /// if one freed meanwhile (`None`), else queues a waiter (its ticket)
    /// with the wake taken out of `wake`. A wake not taken is the caller's
    /// to drop after the lock (a waker is code we do not own).
    fn enqueue(
        &self,
        state: &mut ShardState,
        id: u64,
        wake: &mut Option<Wake>,
        deadline: Option<Instant>,
    ) -> Result<Option<u64>, Error> {
        if state.closed {
            return Err(Error::Shutdown);
        }
        let index = self.pin(id);
        let queued = if self.enter_pinned(state, id, index) {
            None
        } else {
            let ticket = state.next_ticket;
            state.next_ticket = ticket.wrapping_add(1);
            // Relaxed: pinned, as above.
            let resident = id_of(self.slots[index].load(Relaxed)) == id;
            let hash = map_hash(id);
            if state.map.find(hash, |entry| entry.id == id).is_none() {
                state.insert(
                    index,
                    Entry {
                        id,
                        resident,
                        live: 0,
                        queue: VecDeque::new(),
                    },
                );
            }
            let entry = state
                .map
                .find_mut(hash, |entry| entry.id == id)
                .expect("inserted above");
            entry.queue.push_back(Waiter {
                ticket,
                wake: wake.take(),
                deadline,
                expired: false,
            });
            Some(ticket)
        };
        self.unpin(state, index);
        Ok(queued)
    }

    /// Takes a waiter that gives up out of its queue (it must still be
    /// queued), forgetting the entry if nothing else holds it. Its wake
    /// comes back, for the caller to drop after the lock.
    #[must_use = "drop the wake after the lock"]
    fn cancel(&self, state: &mut ShardState, id: u64, ticket: u64) -> Option<Wake> {
        let index = self.pin(id);
        let mut wake = None;
        if let Ok(mut found) = state.map.find_entry(map_hash(id), |entry| entry.id == id) {
            let entry = found.get_mut();
            if let Some(at) = entry
                .queue
                .iter()
                .position(|waiter| waiter.ticket == ticket)
            {
                wake = entry.queue.remove(at).and_then(|waiter| waiter.wake);
            }
            if entry.is_spent() {
                found.remove();
                state.spills[index] -= 1;
            }
        }
        self.unpin(state, index);
        wake
    }
}

impl ShardState {
    /// Files a new entry for slot `index` (whose word the caller pinned).
    fn insert(&mut self, index: usize, entry: Entry) {
        self.spills[index] += 1;
        self.map
            .insert_unique(map_hash(entry.id), entry, |e| map_hash(e.id));
    }

    fn standing(&self, id: u64, ticket: u64) -> Standing {
        let waiter = self
            .map
            .find(map_hash(id), |entry| entry.id == id)
            .and_then(|entry| entry.queue.iter().find(|waiter| waiter.ticket == ticket));
        match waiter {
            None => Standing::Granted,
            Some(waiter) if waiter.expired => Standing::Expired,
            Some(_) => Standing::Queued,
        }
    }

    /// How a queued wait stands, as its poll answers it: `None` while it
    /// waits, else its outcome (granted, timed out, or closed).
    fn outcome(&self, id: u64, ticket: u64) -> Option<Result<(), Error>> {
        match self.standing(id, ticket) {
            Standing::Granted => Some(Ok(())),
            Standing::Expired => Some(Err(Error::Timeout)),
            Standing::Queued if self.closed => Some(Err(Error::Shutdown)),
            Standing::Queued => None,
        }
    }

    /// The queued waiter of `id` with `ticket`, if it is queued.
    fn waiter_mut(&mut self, id: u64, ticket: u64) -> Option<&mut Waiter> {
        self.map
            .find_mut(map_hash(id), |entry| entry.id == id)
            .and_then(|entry| {
                entry
                    .queue
                    .iter_mut()
                    .find(|waiter| waiter.ticket == ticket)
            })
    }

    /// True if the queued task would be woken through `waker` already (a
    /// comparison of pointers, no code of the waker's).
    fn will_wake(&mut self, id: u64, ticket: u64, waker: &Waker) -> bool {
        self.waiter_mut(id, ticket)
            .is_some_and(|waiter| matches!(&waiter.wake, Some(Wake::Task(w)) if w.will_wake(waker)))
    }

    /// Points a queued task at `wake`; the wake it replaces (or `wake`
    /// itself if the waiter is gone), for the caller to drop after the
    /// lock.
    #[must_use = "drop the old wake after the lock"]
    fn replace_wake(&mut self, id: u64, ticket: u64, wake: Wake) -> Option<Wake> {
        match self.waiter_mut(id, ticket) {
            Some(waiter) => waiter.wake.replace(wake),
            None => Some(wake),
        }
    }

    /// Arms the shard for an async waiter's `deadline`: true if the caller
    /// must register it with the watcher (after letting the lock go).
    #[cfg(not(loom))]
    fn arm(&mut self, deadline: Instant) -> bool {
        if self.armed.is_some_and(|armed| armed <= deadline) {
            return false;
        }
        self.armed = Some(deadline);
        true
    }
}

#[cfg(not(loom))]
impl crate::engine::alarm::Alarm for KeyShard {
    /// Expires every async waiter past its deadline and wakes it; the
    /// earliest deadline left, to ring at next.
    fn ring(&self, at: Instant) -> Option<Instant> {
        let mut woken = Vec::new();
        let mut state = self.state.lock();
        let mut next: Option<Instant> = None;
        for entry in state.map.iter_mut() {
            for waiter in entry.queue.iter_mut().filter(|waiter| !waiter.expired) {
                let Some(deadline) = waiter.deadline else {
                    continue;
                };
                if deadline <= at {
                    waiter.expired = true;
                    woken.extend(waiter.wake.take());
                } else {
                    next = Some(next.map_or(deadline, |n| n.min(deadline)));
                }
            }
        }
        state.armed = next;
        drop(state);
        // On the watcher's own thread: a waker that panics has no caller
        // to tell (the panic hook has reported it), and must neither keep
        // the others asleep nor stop the watcher.
        crate::engine::foreign::each_quietly(woken, Wake::wake);
        next
    }
}

/// The future of [`KeySet::enter_async`].
pub(crate) struct WaitKey<'a> {
    set: &'a KeySet,
    id: u64,
    deadline: Option<Instant>,
    /// The ticket while queued (and counted in `KeySet::waiting`).
    ticket: Option<u64>,
    /// Resolved: nothing left to clean up.
    done: bool,
}

impl<'a> std::future::Future for WaitKey<'a> {
    type Output = Result<KeySlot<'a>, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.done {
            // Polled after completion: a bug in the caller; answer as a
            // closed set would rather than panic.
            return Poll::Ready(Err(Error::Shutdown));
        }
        let set = this.set;
        let shard = set.shard(this.id);
        let id = this.id;
        let Some(ticket) = this.ticket else {
            // First poll: the fast path, then queue.
            match set.try_enter(id) {
                Err(Error::KeyBusy) if set.max_waiters > 0 => {}
                other => {
                    this.done = true;
                    return Poll::Ready(other);
                }
            }
            if !set.join_waiters() {
                this.done = true;
                return Poll::Ready(Err(Error::KeyBusy));
            }
            let deadline = this.deadline;
            // Cloned before the lock, and dropped after it if unused: a
            // waker is code we do not own.
            let mut wake = Some(Wake::Task(cx.waker().clone()));
            let mut state = shard.state.lock();
            let queued = shard.enqueue(&mut state, id, &mut wake, deadline);
            let ticket = match queued {
                Ok(Some(ticket)) => ticket,
                other => {
                    drop(state);
                    set.leave_waiters();
                    this.done = true;
                    // A count taken (`Ok(None)`) is held by the slot made
                    // here, so a panicking drop of the wake strands nothing.
                    let outcome = other.map(|_| set.slot(id));
                    drop(wake);
                    return Poll::Ready(outcome);
                }
            };
            this.ticket = Some(ticket);
            #[cfg(not(loom))]
            let register = deadline.filter(|&deadline| state.arm(deadline));
            drop(state);
            #[cfg(not(loom))]
            if let Some(at) = register {
                let alarm: crate::sync::Weak<dyn crate::engine::alarm::Alarm> =
                    Arc::downgrade(shard) as _;
                crate::engine::alarm::arm(at, alarm);
            }
            return Poll::Pending;
        };
        let mut state = shard.state.lock();
        let mut outcome = state.outcome(id, ticket);
        if outcome.is_none() && !state.will_wake(id, ticket, cx.waker()) {
            // Still queued, with another waker: cloned outside the lock,
            // swapped in under it, the old one dropped outside it.
            drop(state);
            let wake = Wake::Task(cx.waker().clone());
            state = shard.state.lock();
            outcome = state.outcome(id, ticket);
            let unused = match outcome {
                None => state.replace_wake(id, ticket, wake),
                Some(_) => Some(wake),
            };
            if outcome.is_none() {
                drop(state);
                // The old waker's drop may end a child of this very key,
                // which hands its count to this waiter: the new waker, in
                // place now, is woken for it.
                drop(unused);
                return Poll::Pending;
            }
            let ended = this.finish(state, outcome);
            drop(unused);
            return ended;
        }
        if outcome.is_none() {
            return Poll::Pending;
        }
        this.finish(state, outcome)
    }
}

impl<'a> WaitKey<'a> {
    /// Ends the wait with `outcome` (read under `state`'s lock, which this
    /// lets go): out of the queue unless granted, out of the waiters'
    /// count, a timeout counted, and the waker dropped after the lock.
    fn finish(
        &mut self,
        mut state: crate::sync::MutexGuard<'_, ShardState>,
        outcome: Option<Result<(), Error>>,
    ) -> std::task::Poll<Result<KeySlot<'a>, Error>> {
        let (set, id) = (self.set, self.id);
        let outcome = outcome.expect("a finished wait has an outcome");
        let ticket = self.ticket.take().expect("a queued wait has a ticket");
        let wake = match outcome {
            Ok(()) => None,
            Err(_) => set.shard(id).cancel(&mut state, id, ticket),
        };
        drop(state);
        self.done = true;
        set.leave_waiters();
        if let Err(Error::Timeout) = outcome {
            set.record_timeout();
        }
        let result = outcome.map(|()| set.slot(id));
        // Last: a granted count is in its slot guard by now.
        drop(wake);
        std::task::Poll::Ready(result)
    }
}

impl Drop for WaitKey<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let shard = self.set.shard(self.id);
        let mut state = shard.state.lock();
        let granted = matches!(state.standing(self.id, ticket), Standing::Granted);
        let mut wake = None;
        if !granted {
            wake = shard.cancel(&mut state, self.id, ticket);
        }
        drop(state);
        self.set.leave_waiters();
        if granted {
            // Handed a count we no longer want: pass it on.
            drop(self.set.slot(self.id));
        }
        // After the lock: the waiter's own waker, if it was still queued
        // (then no count was handed to it).
        drop(wake);
    }
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("shards", &self.shards.len())
            .field("waiting", &self.waiting())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    fn set(per_key: u32, max_waiters: usize) -> KeySet {
        KeySet::new(1, 8, per_key, max_waiters, Duration::from_secs(3600))
    }

    /// An id of shard 0 and slot `slot`, told apart by `tag`.
    fn id_at(set: &KeySet, slot: usize, tag: u64) -> u64 {
        let shard = &set.shards[0];
        let id = 1 << 63 | (slot as u64) << 44 | tag << ID_SHIFT;
        assert_eq!(
            (set.shard(id).slot_index(id), shard.slot_index(id)),
            (slot, slot)
        );
        assert!(Arc::ptr_eq(set.shard(id), shard));
        id
    }

    #[test]
    fn a_key_is_forgotten_when_its_last_count_goes() {
        let set = set(2, 0);
        let a = set.id(&"a");
        let one = set.try_enter(a).unwrap();
        let two = set.try_enter(a).unwrap();
        assert_eq!(set.try_enter(a).err(), Some(Error::KeyBusy));
        assert_eq!((set.live(a), set.busy_keys()), (2, 1));
        drop(one);
        assert_eq!(set.live(a), 1);
        let three = set.try_enter(a).unwrap();
        drop((two, three));
        assert_eq!((set.live(a), set.busy_keys()), (0, 0));
    }

    /// Two keys of one slot: the first is resident, the second goes to the
    /// map and pins the slot; both keep their own limit; when both are
    /// gone the slot is empty and unpinned.
    #[test]
    fn keys_sharing_a_slot_spill_to_the_map_and_unpin_when_gone() {
        let set = set(1, 0);
        let shard = Arc::clone(&set.shards[0]);
        let (a, b) = (id_at(&set, 3, 1), id_at(&set, 3, 2));
        let ga = set.try_enter(a).unwrap();
        assert_eq!(shard.slots[3].load(Relaxed), a | ONE, "resident, unpinned");
        let gb = set.try_enter(b).unwrap();
        assert_eq!(shard.slots[3].load(Relaxed), a | ONE | PINNED, "b spilled");
        assert_eq!(set.try_enter(a).err(), Some(Error::KeyBusy));
        assert_eq!(set.try_enter(b).err(), Some(Error::KeyBusy));
        assert_eq!(set.busy_keys(), 2);
        // a leaves: the slot empties but stays pinned while b is in the
        // map, so a newcomer b cannot also move in.
        drop(ga);
        assert_eq!(shard.slots[3].load(Relaxed), PINNED);
        assert_eq!(set.try_enter(b).err(), Some(Error::KeyBusy));
        drop(gb);
        assert_eq!(shard.slots[3].load(Relaxed), 0);
        assert_eq!(set.busy_keys(), 0);
        // Now b moves in.
        let gb = set.try_enter(b).unwrap();
        assert_eq!(shard.slots[3].load(Relaxed), b | ONE);
        drop(gb);
    }

    #[test]
    fn equal_ids_are_one_key() {
        // Keys told apart only by their id: the same id is a collision,
        // which serializes them and is otherwise harmless.
        let set = set(1, 0);
        let id = set.id(&1u64);
        let first = set.try_enter(id).unwrap();
        assert_eq!(set.try_enter(id).err(), Some(Error::KeyBusy));
        drop(first);
        assert!(set.try_enter(id).is_ok());
    }

    struct Noop;

    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    #[test]
    fn a_release_hands_the_count_to_the_oldest_waiter_and_skips_the_expired() {
        let set = set(1, 8);
        let shard = Arc::clone(&set.shards[0]);
        let h = id_at(&set, 5, 7);
        let held = set.try_enter(h).unwrap();
        let (first, second) = {
            let mut state = shard.state.lock();
            let waker = Waker::from(Arc::new(Noop));
            let first = shard.enqueue(&mut state, h, &mut Some(Wake::Task(waker.clone())), None);
            let second = shard.enqueue(&mut state, h, &mut Some(Wake::Task(waker.clone())), None);
            let (first, second) = (first.unwrap().unwrap(), second.unwrap().unwrap());
            let entry = state.map.find_mut(map_hash(h), |e| e.id == h).unwrap();
            assert!(entry.resident);
            entry.queue[0].expired = true;
            (first, second)
        };
        assert_ne!(
            shard.slots[5].load(Relaxed) & PINNED,
            0,
            "waiters pin the slot"
        );
        drop(held);
        let mut state = shard.state.lock();
        assert!(matches!(state.standing(h, first), Standing::Expired));
        assert!(matches!(state.standing(h, second), Standing::Granted));
        assert_eq!(count_of(shard.slots[5].load(Relaxed)), 1, "handed over");
        // The expired waiter leaves; the entry goes, the slot unpins.
        drop(shard.cancel(&mut state, h, first));
        drop(state);
        assert_eq!(shard.slots[5].load(Relaxed), h | ONE);
        drop(set.slot(h)); // the granted count, released
        assert_eq!((set.busy_keys(), shard.slots[5].load(Relaxed)), (0, 0));
    }

    #[test]
    fn a_huge_per_key_keeps_every_key_in_the_map() {
        let set = KeySet::new(1, 8, u32::MAX, 0, Duration::ZERO);
        let a = set.id(&"a");
        let guards: Vec<_> = (0..3).map(|_| set.try_enter(a).unwrap()).collect();
        assert_eq!((set.live(a), set.busy_keys()), (3, 1));
        drop(guards);
        assert_eq!(set.busy_keys(), 0);
    }

    #[test]
    fn shards_and_slots_are_powers_of_two() {
        for (shards, capacity) in [(1, 1), (3, 100), (4, 10_000), (7, 1 << 24), (1000, 5)] {
            let set = KeySet::new(shards, capacity, 1, 0, Duration::ZERO);
            assert!(set.shards.len().is_power_of_two());
            assert!(set.shards.len() >= shards.min(MAX_KEY_SHARDS / 4));
            assert!(set.shards.len() <= MAX_KEY_SHARDS);
            let slots = set.shards[0].slots.len();
            assert!(slots.is_power_of_two() && (MIN_SLOTS..=MAX_SLOTS).contains(&slots));
        }
    }
}
