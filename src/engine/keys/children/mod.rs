//! The key set: which keys have live children, how many each, and who
//! waits for each key; sharded by the key's hash, so admissions of
//! different keys rarely meet.
//!
//! It bounds the live children *per key* (`per_key`, 1 by default: a
//! workflow's tasks run one after another) on top of the supervisor's
//! global capacity, which the table bounds. A key counts only while it
//! has live children or waiters, so the set counts at most
//! `capacity + max_waiters` keys and none when the children have ended.
//!
//! # Shape
//!
//! A power of two of shards (four per table shard, at most 1,024). Each
//! shard has two homes for keys:
//!
//! * **Resident words** (`keys/words.rs`, shared with the tenant ledger):
//!   an array of atomic words, a key's slot chosen by its hash. A word is
//!   `id | count << 1 | PINNED`: the key living there, its live children,
//!   and a bit that sends every caller to the lock. A key that finds its
//!   slot empty, idle (a key's word left at count 0), or holding itself
//!   unpinned, enters and leaves with one CAS on that word: no lock, no
//!   allocation.
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
//! * **Fast enter and exit** are the words' own (`keys/words.rs`): a
//!   count up or down with one CAS, `KeyBusy` at `per_key`. A fast exit
//!   of a key's last child leaves its word *idle* (`id | 0`): the key's
//!   next child enters with one CAS, and another key of the slot takes
//!   the idle word over with one CAS. An idle word counts nothing here:
//!   the set has no figure a sweep would have to correct. Pinned, another
//!   key's count, a lost CAS: the locked path.
//! * **Locked path.** Take the shard's lock, then *pin* the slot: from
//!   then on no fast path writes the word, so under the lock the slot and
//!   the map are one consistent state. Enter: a resident key (idle or
//!   not) takes a count if it has room; a key in the map takes one there;
//!   a key in neither claims the slot if it is empty or idle (an idle
//!   word's key has no entry: a word goes idle only unpinned, so with no
//!   key of its slot in the map), else gets a map entry. Exit: hand the
//!   unit to the key's oldest waiter if one waits (the count is
//!   unchanged), else decrement where the key lives, emptying the word or
//!   forgetting the entry at 0. Then *unpin*, unless the map still holds
//!   entries of keys mapped to this slot (a per-slot count, `spills`):
//!   while it does, the slot stays pinned, so a key in the map can never
//!   also claim the slot, and a resident key with waiters always exits
//!   through the lock and hands over.
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
//! The words' (`keys/words.rs`): a fast enter Acquire, a fast exit
//! Release, the pin AcqRel, the unpin a Release store; between pin and
//! unpin only the lock holder writes the word. The exit of a key's child
//! happens-before the admission of the key's next child that reads its
//! word.
//!
//! # Identity and collisions
//!
//! A key is hashed once, as a tenant key is (`keys::id_of`: foldhash,
//! seeded per process; fixed under loom), and known by its *id*: the
//! hash's top 44 bits (bit 63 forced on, so no id is 0). Bits 32 and up
//! pick the shard, 44 and up the slot. Two different keys with the same
//! id (the chance that any two of 1,000 live keys agree is about 2^-24,
//! of a million about 2^-4; the seed keeps an adversary from choosing
//! them) are treated as one key: they share its `per_key` limit and its
//! queue. That is safe, it only serializes more: no key ever has more
//! than `per_key` live children, and every waiter is still served in its
//! turn.
//!
//! The queue is first come first served whatever the supervisor's
//! `queue_order`: a key's waiters are the next tasks of one workflow, and
//! their order is the point.

use crate::engine::foreign::each_then_resume;
use crate::engine::keys::words::{map_hash, Words, MAX_COUNT};
use crate::error::Error;
use crate::sync::{Arc, AtomicU64, AtomicUsize, Mutex, Ordering::Relaxed};
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use std::hash::Hash;

mod shard;
#[cfg(all(test, not(loom)))]
mod tests;
mod wait;

use shard::{KeyShard, ShardState};
use wait::{Standing, Waiter, Wake};

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

/// The set of busy keys of one supervisor.
pub(crate) struct KeySet {
    shards: Box<[Arc<KeyShard>]>,
    /// `shards.len() - 1`; the count is a power of two.
    mask: usize,
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
        // Past the most a word counts, every slot stays pinned and keys
        // live in the map.
        let resident = u64::from(per_key) <= MAX_COUNT;
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
                    words: Words::new(slots, !resident),
                    per_key,
                    resident,
                })
            })
            .collect();
        KeySet {
            shards,
            mask: count - 1,
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
        crate::engine::keys::id_of(key)
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
                let resident = shard.words.busy();
                in_map + resident
            })
            .sum()
    }

    /// The live children of the key `id` now.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn live(&self, id: u64) -> u32 {
        let shard = self.shard(id);
        let state = shard.state.lock();
        if let Some(count) = shard.words.resident_count(id) {
            return count as u32;
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

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("shards", &self.shards.len())
            .field("waiting", &self.waiting())
            .finish()
    }
}
