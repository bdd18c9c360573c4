//! The key set: which keys have live children, how many each, and who
//! waits for each key; sharded by the key's hash, so admissions of
//! different keys rarely meet.
//!
//! It bounds the live children *per key* (`per_key`, 1 by default: a
//! workflow's tasks run one after another) on top of the supervisor's
//! global capacity, which the table bounds. A key is present only while it
//! has live children or waiters, so the set holds at most
//! `capacity + max_waiters` entries and is empty when the children have
//! ended.
//!
//! # Shape
//!
//! A power of two of shards (four per table shard, at most 1,024), each a
//! lock over a `hashbrown::HashTable` of entries `{hash, live, queue}`,
//! alone on its own cache lines. A key is hashed once (foldhash, seeded
//! per process, as hashbrown's own maps are); bits 32 and up pick the
//! shard, the low bits the bucket inside it. The shard's lock is held for
//! a lookup and an increment, never across a wake-up, an allocation of a
//! waiter's condition variable or a call into the table. Why a lock and
//! not a lock-free map: an entry must be created, counted, queued on and
//! removed as one step with its waiters (a lock-free count would need a
//! second protocol for the queue and for removing a key while a newcomer
//! increments it), and with four shards per CPU two admissions take the
//! same lock only when their keys hash to the same shard. It is what the
//! task-worker spec wrote by hand (a `DashSet` is also a sharded lock),
//! minus the global semaphore's shared counter.
//!
//! # Collisions
//!
//! Keys are told apart by their 64-bit hash only. Two different keys with
//! the same hash (about one pair in 2^32 among 2^32 live keys; foldhash's
//! per-process seed keeps an adversary from choosing them) are treated as
//! one key: they share its `per_key` limit and its queue. That is safe,
//! it only serializes more: no key ever has more than `per_key` live
//! children, and every waiter is still served in its turn.
//!
//! # Protocol
//!
//! * **Enter.** Under the shard lock: find or insert the key's entry; if
//!   `live < per_key`, `live += 1` and the caller holds a [`KeySlot`].
//!   Else the key is busy: `KeyBusy`, or (waiting forms, if the policy has
//!   room) queue a waiter at the back of the key's queue and sleep.
//! * **Release** (a keyed child's guard dropped, after its unit went back;
//!   or a [`KeySlot`] dropped by an admission that failed). Under the lock: if a waiter that
//!   has not expired is queued, take it out of the queue: the slot is now
//!   its own (`live` is unchanged), and it is woken after the lock is let
//!   go. Else `live -= 1`, and an entry with no live children and no queue
//!   is removed.
//! * **Granted is "not queued".** A waiter's node is in its key's queue
//!   until a release takes it out (a grant) or the waiter takes itself out
//!   (it gave up). So a waiter that finds its ticket gone under the lock
//!   owns a slot; a dropped future in that state releases it, which hands
//!   it to the next waiter: nothing is stranded.
//! * **Invariant.** A queue holds a waiting (not expired) node only while
//!   the key has `per_key` live children: nodes are queued only then, and
//!   a release with a waiting node hands over instead of decrementing. So
//!   a newcomer that finds `live < per_key` takes the slot without
//!   jumping the queue.
//! * **Deadlines.** A blocked thread times its own condition-variable
//!   wait. An async waiter's node carries its deadline, and the shard is
//!   rung by the crate's deadline watcher (`alarm.rs`), as the table's
//!   waiting room is: the ring marks past-deadline nodes expired and wakes
//!   them; they take themselves out in their next poll.
//! * **Close.** Under each shard's lock the shard is marked closed and
//!   every waiter woken; a waiter checks the mark under the same lock
//!   before it sleeps, so none sleeps through it.
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

use crate::error::Error;
use crate::sync::{now, Arc, AtomicUsize, Condvar, Mutex, Ordering::Relaxed};

/// The hasher keys go through: foldhash with a per-process random seed
/// normally; a fixed one under loom, whose models must replay the same
/// choices on every run.
#[cfg(not(loom))]
type KeyHasher = hashbrown::DefaultHashBuilder;
#[cfg(loom)]
type KeyHasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// The most key shards: beyond this, more shards only cost memory.
const MAX_KEY_SHARDS: usize = 1024;

/// Key shards per table shard.
const KEY_SHARDS_PER_SHARD: usize = 4;

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
}

/// One shard of the key set, on cache lines of its own (its lock, and the
/// reference count of the `Arc` every [`KeySlot`] of it holds).
#[repr(align(128))]
pub(crate) struct KeyShard {
    state: Mutex<ShardState>,
    per_key: u32,
}

#[derive(Default)]
struct ShardState {
    map: HashTable<Entry>,
    /// Set by `close`: waiters give up with `Shutdown`, none queues.
    closed: bool,
    /// The ticket of the next waiter.
    next_ticket: u64,
    /// The instant this shard is registered with the deadline watcher
    /// for, if any: at or before every waiting async node's deadline.
    #[cfg_attr(loom, allow(dead_code))]
    armed: Option<Instant>,
}

/// A key with live children or waiters.
struct Entry {
    hash: u64,
    /// Live children of the key (slots held), at most `per_key`.
    live: u32,
    /// Waiters, oldest first.
    queue: VecDeque<Waiter>,
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

/// One of a key's `per_key` slots while an admission is under way;
/// dropping it releases the slot (to the key's next waiter, if one waits).
/// [`keep`](Self::keep) hands it over to a child's guard, which releases it
/// with [`KeySet::release`] (the guard reaches the set through the
/// supervisor's shared state, so it holds no reference count of its own).
pub(crate) struct KeySlot<'a> {
    set: &'a KeySet,
    hash: u64,
}

impl KeySlot<'_> {
    /// Hands the slot over: the caller must release `hash` once.
    #[inline]
    pub(crate) fn keep(self) -> u64 {
        let hash = self.hash;
        std::mem::forget(self);
        hash
    }
}

impl Drop for KeySlot<'_> {
    fn drop(&mut self) {
        self.set.release(self.hash);
    }
}

/// Where a waiter stands, read under the lock.
enum Standing {
    /// Still queued, not expired.
    Queued,
    /// Expired by the watcher (still queued until taken out).
    Expired,
    /// Taken out of the queue by a release: the waiter owns a slot.
    Granted,
}

impl KeySet {
    /// A key set for a supervisor over `table_shards` shards, `per_key`
    /// live children per key, `max_waiters` waiters for keys (0: no
    /// waiting) of at most `max_wait` each.
    pub(crate) fn new(
        table_shards: usize,
        per_key: u32,
        max_waiters: usize,
        max_wait: std::time::Duration,
    ) -> KeySet {
        let count = (table_shards * KEY_SHARDS_PER_SHARD)
            .next_power_of_two()
            .min(MAX_KEY_SHARDS);
        let shards = (0..count)
            .map(|_| {
                Arc::new(KeyShard {
                    state: Mutex::new(ShardState::default()),
                    per_key,
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
        }
    }

    /// The slot of `hash` whose `live` count the caller took under the
    /// lock.
    #[inline]
    fn slot(&self, hash: u64) -> KeySlot<'_> {
        KeySlot { set: self, hash }
    }

    /// Releases one slot of the key with this hash (module docs: hand it
    /// over or forget the key). For a guard that [`kept`](KeySlot::keep)
    /// the slot.
    #[inline]
    pub(crate) fn release(&self, hash: u64) {
        self.shard(hash).release(hash);
    }

    /// The 64-bit hash keys are told apart by.
    #[inline]
    pub(crate) fn hash<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Arc<KeyShard> {
        // Bits 32 and up: the low bits place the entry inside the shard's
        // table, the top 7 are its control byte.
        &self.shards[(hash >> 32) as usize & self.mask]
    }

    /// Takes one of the key's slots, or `KeyBusy` at once.
    #[inline]
    pub(crate) fn try_enter(&self, hash: u64) -> Result<KeySlot<'_>, Error> {
        let shard = self.shard(hash);
        let mut state = shard.state.lock();
        if state.closed {
            return Err(Error::Shutdown);
        }
        let entry = state.entry(hash);
        if entry.live < shard.per_key {
            entry.live += 1;
            drop(state);
            return Ok(self.slot(hash));
        }
        // Busy: an entry with live children stays.
        Err(Error::KeyBusy)
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
        if self.waiting.fetch_add(1, Relaxed) >= self.max_waiters {
            self.waiting.fetch_sub(1, Relaxed);
            return false;
        }
        true
    }

    fn leave_waiters(&self) {
        // Relaxed: as in `join_waiters`.
        self.waiting.fetch_sub(1, Relaxed);
    }

    /// Takes a slot of a key found busy, waiting (blocking the thread) in
    /// the key's queue until `deadline` (already bounded by `max_wait`:
    /// see [`deadline`](Self::deadline)).
    ///
    /// `KeyBusy` when no more waiters fit, `Timeout` when the wait ran
    /// out, `Shutdown` once closed.
    #[cold]
    pub(crate) fn wait_blocking(
        &self,
        hash: u64,
        deadline: Option<Instant>,
    ) -> Result<KeySlot<'_>, Error> {
        if !self.join_waiters() {
            return Err(Error::KeyBusy);
        }
        let result = self.wait_blocking_counted(hash, deadline);
        self.leave_waiters();
        result
    }

    fn wait_blocking_counted(
        &self,
        hash: u64,
        deadline: Option<Instant>,
    ) -> Result<KeySlot<'_>, Error> {
        let shard = self.shard(hash);
        let condvar = Arc::new(Condvar::new());
        let mut state = shard.state.lock();
        // The key may have freed while we allocated.
        let ticket = match state.enqueue(
            hash,
            shard.per_key,
            Wake::Thread(Arc::clone(&condvar)),
            None,
        ) {
            Ok(Some(ticket)) => ticket,
            Ok(None) => return Ok(self.slot(hash)),
            Err(err) => return Err(err),
        };
        loop {
            match state.standing(hash, ticket) {
                Standing::Granted => return Ok(self.slot(hash)),
                Standing::Expired => unreachable_expired(),
                Standing::Queued => {}
            }
            if state.closed {
                state.cancel(hash, ticket);
                return Err(Error::Shutdown);
            }
            // A deadline too far to represent: wait in long steps.
            let step = deadline.unwrap_or_else(|| now() + std::time::Duration::from_secs(3600));
            let timed_out;
            (state, timed_out) = condvar.wait_until(state, step);
            if timed_out && deadline.is_some_and(|d| now() >= d) {
                if let Standing::Granted = state.standing(hash, ticket) {
                    // Handed a slot just as time ran out: keep it.
                    return Ok(self.slot(hash));
                }
                state.cancel(hash, ticket);
                return Err(Error::Timeout);
            }
        }
    }

    /// Takes a slot, waiting as a future (never blocking the executor's
    /// thread) if the key is busy and the policy lets it, until `deadline`
    /// (already bounded by `max_wait`). Dropping the future gives up the
    /// wait, releasing a slot handed to it meanwhile.
    pub(crate) fn enter_async(&self, hash: u64, deadline: Option<Instant>) -> WaitKey<'_> {
        WaitKey {
            set: self,
            hash,
            deadline,
            ticket: None,
            done: false,
        }
    }

    /// Marks every shard closed and wakes every waiter.
    pub(crate) fn close(&self) {
        for shard in self.shards.iter() {
            let mut woken = Vec::new();
            let mut state = shard.state.lock();
            state.closed = true;
            for entry in state.map.iter_mut() {
                for waiter in entry.queue.iter_mut() {
                    woken.extend(waiter.wake.take());
                }
            }
            drop(state);
            for wake in woken {
                wake.wake();
            }
        }
    }

    /// How many keys have live children (or waiters) now: a reading, shard
    /// by shard.
    pub(crate) fn busy_keys(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.state.lock().map.len())
            .sum()
    }

    /// The live children of the key with this hash now.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn live(&self, hash: u64) -> u32 {
        let state = self.shard(hash).state.lock();
        state
            .map
            .find(hash, |entry| entry.hash == hash)
            .map_or(0, |entry| entry.live)
    }

    /// Callers waiting for a key now.
    pub(crate) fn waiting(&self) -> usize {
        // Relaxed: a reading.
        self.waiting.load(Relaxed)
    }
}

/// Not reachable: only async waiters carry a deadline the watcher expires.
#[cold]
fn unreachable_expired() {
    debug_assert!(false, "a blocked waiter was expired by the watcher");
}

impl KeyShard {
    /// Releases one slot of the key (module docs: hand over or forget).
    fn release(&self, hash: u64) {
        let mut state = self.state.lock();
        let Ok(mut found) = state.map.find_entry(hash, |entry| entry.hash == hash) else {
            debug_assert!(false, "a released key is not in its shard");
            return;
        };
        let entry = found.get_mut();
        let wake = match entry.queue.iter().position(|waiter| !waiter.expired) {
            // The slot passes to the waiter: `live` is unchanged.
            Some(at) => entry.queue.remove(at).and_then(|waiter| waiter.wake),
            None => {
                entry.live -= 1;
                if entry.live == 0 && entry.queue.is_empty() {
                    found.remove();
                }
                None
            }
        };
        drop(state);
        // After the lock: a woken thread does not wake into a held lock,
        // and no executor code runs under it.
        if let Some(wake) = wake {
            wake.wake();
        }
    }
}

impl ShardState {
    /// The key's entry, inserted with no live children if absent.
    #[inline]
    fn entry(&mut self, hash: u64) -> &mut Entry {
        self.map
            .entry(hash, |entry| entry.hash == hash, |entry| entry.hash)
            .or_insert_with(|| Entry {
                hash,
                live: 0,
                queue: VecDeque::new(),
            })
            .into_mut()
    }

    /// Under the lock, for a caller that found the key busy: takes a slot
    /// if one freed meanwhile (`None`), else queues a waiter (its ticket).
    fn enqueue(
        &mut self,
        hash: u64,
        per_key: u32,
        wake: Wake,
        deadline: Option<Instant>,
    ) -> Result<Option<u64>, Error> {
        if self.closed {
            return Err(Error::Shutdown);
        }
        let ticket = self.next_ticket;
        let entry = self.entry(hash);
        if entry.live < per_key {
            entry.live += 1;
            return Ok(None);
        }
        entry.queue.push_back(Waiter {
            ticket,
            wake: Some(wake),
            deadline,
            expired: false,
        });
        self.next_ticket = ticket.wrapping_add(1);
        Ok(Some(ticket))
    }

    fn standing(&self, hash: u64, ticket: u64) -> Standing {
        let waiter = self
            .map
            .find(hash, |entry| entry.hash == hash)
            .and_then(|entry| entry.queue.iter().find(|waiter| waiter.ticket == ticket));
        match waiter {
            None => Standing::Granted,
            Some(waiter) if waiter.expired => Standing::Expired,
            Some(_) => Standing::Queued,
        }
    }

    /// Takes a waiter that gives up out of its queue (it must still be
    /// queued), forgetting the key if nothing else holds it.
    fn cancel(&mut self, hash: u64, ticket: u64) {
        let Ok(mut found) = self.map.find_entry(hash, |entry| entry.hash == hash) else {
            return;
        };
        let entry = found.get_mut();
        if let Some(at) = entry
            .queue
            .iter()
            .position(|waiter| waiter.ticket == ticket)
        {
            entry.queue.remove(at);
        }
        if entry.live == 0 && entry.queue.is_empty() {
            found.remove();
        }
    }

    /// Points a queued task at `waker`.
    fn set_waker(&mut self, hash: u64, ticket: u64, waker: &Waker) {
        let waiter = self
            .map
            .find_mut(hash, |entry| entry.hash == hash)
            .and_then(|entry| {
                entry
                    .queue
                    .iter_mut()
                    .find(|waiter| waiter.ticket == ticket)
            });
        if let Some(waiter) = waiter {
            if let Some(Wake::Task(stored)) = &waiter.wake {
                if stored.will_wake(waker) {
                    return;
                }
            }
            waiter.wake = Some(Wake::Task(waker.clone()));
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
        for wake in woken {
            wake.wake();
        }
        next
    }
}

/// The future of [`KeySet::enter_async`].
pub(crate) struct WaitKey<'a> {
    set: &'a KeySet,
    hash: u64,
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
        let shard = set.shard(this.hash);
        let hash = this.hash;
        let Some(ticket) = this.ticket else {
            // First poll: the fast path, then queue.
            match set.try_enter(hash) {
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
            let mut state = shard.state.lock();
            let queued = state.enqueue(
                hash,
                shard.per_key,
                Wake::Task(cx.waker().clone()),
                deadline,
            );
            let ticket = match queued {
                Ok(Some(ticket)) => ticket,
                other => {
                    drop(state);
                    set.leave_waiters();
                    this.done = true;
                    return Poll::Ready(other.map(|_| set.slot(hash)));
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
        let outcome = match state.standing(hash, ticket) {
            Standing::Granted => Ok(()),
            Standing::Expired => Err(Error::Timeout),
            Standing::Queued if state.closed => Err(Error::Shutdown),
            Standing::Queued => {
                state.set_waker(hash, ticket, cx.waker());
                return Poll::Pending;
            }
        };
        if outcome.is_err() {
            state.cancel(hash, ticket);
        }
        drop(state);
        this.ticket = None;
        this.done = true;
        set.leave_waiters();
        Poll::Ready(outcome.map(|()| set.slot(hash)))
    }
}

impl Drop for WaitKey<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let shard = self.set.shard(self.hash);
        let mut state = shard.state.lock();
        let granted = matches!(state.standing(self.hash, ticket), Standing::Granted);
        if !granted {
            state.cancel(self.hash, ticket);
        }
        drop(state);
        self.set.leave_waiters();
        if granted {
            // Handed a slot we no longer want: pass it on.
            drop(self.set.slot(self.hash));
        }
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

    #[test]
    fn a_key_is_forgotten_when_its_last_slot_goes() {
        let set = KeySet::new(2, 2, 0, Duration::ZERO);
        let a = set.hash(&"a");
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

    #[test]
    fn a_colliding_hash_is_one_key() {
        // Two keys told apart only by their hash: forcing the same hash is
        // a collision, which serializes them and is otherwise harmless.
        let set = KeySet::new(1, 1, 0, Duration::ZERO);
        let h = set.hash(&1u64);
        let first = set.try_enter(h).unwrap();
        assert_eq!(set.try_enter(h).err(), Some(Error::KeyBusy));
        drop(first);
        assert!(set.try_enter(h).is_ok());
    }

    struct Noop;

    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    #[test]
    fn a_release_hands_the_slot_to_the_oldest_waiter_and_skips_the_expired() {
        let set = KeySet::new(1, 1, 8, Duration::from_secs(3600));
        let h = set.hash(&"k");
        let held = set.try_enter(h).unwrap();
        let shard = Arc::clone(set.shard(h));
        let (first, second) = {
            let mut state = shard.state.lock();
            let waker = Waker::from(Arc::new(Noop));
            let first = state
                .enqueue(h, 1, Wake::Task(waker.clone()), None)
                .unwrap()
                .unwrap();
            let second = state
                .enqueue(h, 1, Wake::Task(waker.clone()), None)
                .unwrap()
                .unwrap();
            state.map.find_mut(h, |e| e.hash == h).unwrap().queue[0].expired = true;
            (first, second)
        };
        drop(held);
        let state = shard.state.lock();
        assert!(matches!(state.standing(h, first), Standing::Expired));
        assert!(matches!(state.standing(h, second), Standing::Granted));
        assert_eq!(state.map.find(h, |e| e.hash == h).unwrap().live, 1);
    }

    #[test]
    fn shards_are_a_power_of_two() {
        for shards in [1, 3, 4, 7, 1000] {
            let set = KeySet::new(shards, 1, 0, Duration::ZERO);
            assert!(set.shards.len().is_power_of_two());
            assert!(set.shards.len() >= shards.min(MAX_KEY_SHARDS / 4));
            assert!(set.shards.len() <= MAX_KEY_SHARDS);
        }
    }
}
