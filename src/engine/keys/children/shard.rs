//! One shard of the key set: its resident words (`keys/words.rs`: a word
//! per key, entered and left with one CAS), the overflow map under the
//! shard's lock, the pin that sends every caller of a slot to the lock,
//! and the deadline watcher's ring.

use super::{Standing, Waiter, Wake};
use crate::engine::keys::words::{
    count_of, id_of, map_hash, Boxed, Enter, Words, MAX_COUNT, ONE, PINNED,
};
use crate::error::Error;
use crate::sync::Mutex;
use hashbrown::HashTable;
use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

/// One shard of the key set, on cache lines of its own.
#[repr(align(128))]
pub(crate) struct KeyShard {
    pub(super) state: Mutex<ShardState>,
    /// The resident words: an id's bits 44 and up pick its slot.
    pub(super) words: Words<44, Boxed>,
    pub(super) per_key: u32,
    /// `per_key` fits the count field: the fast paths may be used.
    pub(super) resident: bool,
}

pub(super) struct ShardState {
    pub(super) map: HashTable<Entry>,
    /// Per slot, the entries of the map whose key maps to it; the slot
    /// stays pinned while it is not 0.
    pub(super) spills: Box<[u32]>,
    /// Set by `close`: waiters give up with `Shutdown`, none queues.
    pub(super) closed: bool,
    /// The ticket of the next waiter.
    pub(super) next_ticket: u64,
    /// The instant this shard is registered with the deadline watcher
    /// for, if any: at or before every waiting async node's deadline.
    #[cfg_attr(loom, allow(dead_code))]
    pub(super) armed: Option<Instant>,
}

/// A key in the map: with live children (its count lives here), or with
/// waiters.
pub(super) struct Entry {
    pub(super) id: u64,
    /// The key is resident (its count is in its slot's word); this entry
    /// only holds its waiters.
    pub(super) resident: bool,
    /// Live children, when not resident; at most `per_key`.
    pub(super) live: u32,
    /// Waiters, oldest first.
    pub(super) queue: VecDeque<Waiter>,
}

impl Entry {
    /// Nothing left to keep: no count here and nobody queued.
    fn is_spent(&self) -> bool {
        self.queue.is_empty() && (self.resident || self.live == 0)
    }
}

impl KeyShard {
    /// The lock-free enter (module docs): `Some(Ok)` entered,
    /// `Some(Err(KeyBusy))` busy, `None` to be decided under the lock.
    #[inline]
    pub(super) fn enter_fast(&self, id: u64) -> Option<Result<(), Error>> {
        // The most a word counts is `per_key` (less one, as `enter` takes
        // it); a `per_key` too large for a word leaves every slot pinned,
        // so the clamp only keeps the argument in range.
        let most_less_one = u64::from(self.per_key).min(MAX_COUNT).saturating_sub(1);
        match self.words.enter(id, 1, most_less_one, || {}, || {}) {
            Enter::Entered(_) | Enter::Claimed => Some(Ok(())),
            Enter::Over(_) => Some(Err(Error::KeyBusy)),
            Enter::Locked => None,
        }
    }

    /// The lock-free exit: true if done (a last count leaves the word
    /// idle: the key's next child enters with one CAS, another key's
    /// takes the slot over), false if the lock must do it (the slot is
    /// pinned, or the key is not resident).
    #[inline]
    pub(super) fn release_fast(&self, id: u64) -> bool {
        self.words.exit(id, 1).is_some()
    }

    /// Pins `id`'s slot (under the lock): no fast path writes it until
    /// [`unpin`](Self::unpin). Returns the slot's index.
    pub(super) fn pin(&self, id: u64) -> usize {
        self.words.pin(id)
    }

    /// Unpins slot `index` unless the map holds keys of it (under the
    /// lock, after a pin).
    pub(super) fn unpin(&self, state: &ShardState, index: usize) {
        self.words.unpin(index, state.spills[index]);
    }

    /// Enters `id` under the lock with its slot pinned: true if a count
    /// was taken, false if the key is busy.
    pub(super) fn enter_pinned(&self, state: &mut ShardState, id: u64, index: usize) -> bool {
        let word = self.words.pinned(index);
        if id_of(word) == id {
            // Resident (idle, perhaps).
            if count_of(word) >= u64::from(self.per_key) {
                return false;
            }
            self.words.set_pinned(index, word + ONE);
            return true;
        }
        if let Some(entry) = state.map.find_mut(map_hash(id), |entry| entry.id == id) {
            if entry.live >= self.per_key {
                return false;
            }
            entry.live += 1;
            return true;
        }
        if count_of(word) == 0 && self.resident {
            // An empty slot, or another key's idle word (that key has no
            // entry: a word goes idle only unpinned), and the key
            // nowhere: it moves in.
            self.words.set_pinned(index, id | ONE | PINNED);
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
    pub(super) fn release_locked(&self, id: u64) {
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
        let word = self.words.pinned(index);
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
            self.words.set_pinned(index, next);
        } else {
            debug_assert!(false, "a released key is neither resident nor in the map");
        }
        None
    }

    /// Under the lock, for a caller that found the key busy: takes a count
    /// if one freed meanwhile (`None`), else queues a waiter (its ticket)
    /// with the wake taken out of `wake`. A wake not taken is the caller's
    /// to drop after the lock (a waker is code we do not own).
    pub(super) fn enqueue(
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
            let resident = id_of(self.words.pinned(index)) == id;
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
    pub(super) fn cancel(&self, state: &mut ShardState, id: u64, ticket: u64) -> Option<Wake> {
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

    pub(super) fn standing(&self, id: u64, ticket: u64) -> Standing {
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
    pub(super) fn outcome(&self, id: u64, ticket: u64) -> Option<Result<(), Error>> {
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
    pub(super) fn will_wake(&mut self, id: u64, ticket: u64, waker: &Waker) -> bool {
        self.waiter_mut(id, ticket)
            .is_some_and(|waiter| matches!(&waiter.wake, Some(Wake::Task(w)) if w.will_wake(waker)))
    }

    /// Points a queued task at `wake`; the wake it replaces (or `wake`
    /// itself if the waiter is gone), for the caller to drop after the
    /// lock.
    #[must_use = "drop the old wake after the lock"]
    pub(super) fn replace_wake(&mut self, id: u64, ticket: u64, wake: Wake) -> Option<Wake> {
        match self.waiter_mut(id, ticket) {
            Some(waiter) => waiter.wake.replace(wake),
            None => Some(wake),
        }
    }

    /// Arms the shard for an async waiter's `deadline`: true if the caller
    /// must register it with the watcher (after letting the lock go).
    #[cfg(not(loom))]
    pub(super) fn arm(&mut self, deadline: Instant) -> bool {
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
