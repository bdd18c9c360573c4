//! A pool worker's mailbox: a bounded ring for the requests its shard
//! admits, and an overflow list for whatever does not fit, kept in one
//! order per sender.
//!
//! # Why a ring
//!
//! A mailbox never holds more than its shard's limit of admitted requests,
//! but `*_unbounded` requests go past the limit and a resize may raise it,
//! so it must be able to grow. crossbeam's list channel grows, but a
//! receiver that has caught up with its sender reads the sender's tail on
//! every receive (the list keeps no "written" mark a receiver could poll
//! instead), so each message moves two lines between the cores. Its array
//! channel marks each slot with a stamp: a receiver reads only the slots,
//! a sender only writes them, and neither reads the other's index until
//! the ring is full or empty. One producer casting to one worker with a
//! trivial handler (`benches/dispatch.rs`, the worker loop) took 37-44 ns
//! a message over the ring and 153-224 ns over the list, with the worker
//! giving units back in runs either way
//! (`PERFORMANCE.md`, the dispatch bench).
//!
//! So each mailbox is both: an array channel (the *ring*), sized from the
//! shard's limit at build time, and an unbounded list channel (the
//! *overflow*) for what finds the ring full.
//!
//! # One order per sender
//!
//! A sender's envelopes are taken in the order it sent them, as through one
//! channel (a cast then a call from one thread reach a single worker in
//! that order). Two queues keep that by three rules:
//!
//! 1. **A sender uses the ring only while nothing is pending in the
//!    overflow.** `pending` counts envelopes sent to the overflow and not
//!    yet handed out; a sender counts its envelope *before* sending it. A
//!    sender always reads its own increments (coherence), so once one of
//!    its envelopes went to the overflow, its later ones follow it there
//!    until that one is handed out.
//! 2. **A receiver takes the ring first.**
//! 3. **An envelope taken from the overflow waits while the ring holds
//!    anything.** Taking it synchronizes with its send, so every envelope
//!    its sender put in the ring before it is visible to a look at the ring
//!    made afterwards. If that look finds one, the overflow's envelope is
//!    kept aside (the *stash*, still counted as pending) and the ring's is
//!    handed out; the stash goes out once the ring is empty. Anything in
//!    the ring then is older than the stash for its own sender, or from
//!    another sender, whose order against this one is not defined.
//!
//! The overflow path (taking from it, the stash) runs under a lock, so
//! several receivers (a stealing pool's thieves) take each envelope once.
//! `loom-tests/tests/loom_mailbox.rs` checks the rules on lanes loom can
//! see: each envelope taken once, each sender's in order.

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError, TrySendError};
use crossbeam_utils::CachePadded;

use crate::sync::{
    Arc, AtomicUsize, Mutex,
    Ordering::{AcqRel, Acquire, Release},
};

/// The largest ring: past this many envelopes, the overflow takes the
/// rest. A ring is allocated whole when the pool is built.
const RING_MAX: usize = 4096;
/// The most memory one ring may take, in bytes; a large request type gets
/// a shorter ring.
const RING_BYTES: usize = 256 * 1024;
/// The smallest ring.
const RING_MIN: usize = 8;

/// How many envelopes of `size` bytes the ring of a mailbox whose shard
/// may hold `limit` gets.
pub(crate) fn ring_len(limit: usize, size: usize) -> usize {
    let by_memory = RING_BYTES / size.max(1);
    limit.min(RING_MAX).min(by_memory).max(RING_MIN)
}

/// What a look at one lane (the ring or the overflow) found.
pub(crate) enum Look<T> {
    /// The oldest envelope, now taken.
    Took(T),
    /// Nothing now.
    Empty,
    /// Nothing, ever again: every sender is gone.
    Gone,
}

/// Why the ring refused an envelope.
pub(crate) enum Refusal<T> {
    /// The ring is full: the envelope goes to the overflow.
    Full(T),
    /// Every receiver is gone.
    Gone(T),
}

/// The state the two lanes share: what keeps one order per sender (the
/// three rules in the module docs), whatever the lanes are.
pub(crate) struct Spill<T> {
    /// Envelopes sent to the overflow and not yet handed out, the stash
    /// included. Written only while the overflow is in use, so on the
    /// plain path its line stays shared in every sender's cache.
    pending: CachePadded<AtomicUsize>,
    /// An envelope taken from the overflow while the ring still held
    /// older ones (rule 3).
    stash: Mutex<Option<T>>,
}

impl<T> Spill<T> {
    pub(crate) fn new() -> Self {
        Spill {
            pending: CachePadded::new(AtomicUsize::new(0)),
            stash: Mutex::new(None),
        }
    }

    /// Sends `value`: to the ring if nothing is pending and it has room,
    /// else to the overflow. `Err` gives it back if the receivers are gone.
    #[inline]
    pub(crate) fn send(
        &self,
        value: T,
        ring: impl FnOnce(T) -> Result<(), Refusal<T>>,
        overflow: impl FnOnce(T) -> Result<(), T>,
    ) -> Result<(), T> {
        // Acquire: pairs with the Release decrement in `take`. A sender's
        // own increments are visible to it whatever the ordering (rule 1).
        let value = if self.pending.load(Acquire) == 0 {
            match ring(value) {
                Ok(()) => return Ok(()),
                Err(Refusal::Gone(value)) => return Err(value),
                Err(Refusal::Full(value)) => value,
            }
        } else {
            value
        };
        self.spill(value, overflow)
    }

    #[cold]
    fn spill(&self, value: T, overflow: impl FnOnce(T) -> Result<(), T>) -> Result<(), T> {
        // Counted before it is sent (rule 1): a receiver that takes it
        // finds it counted. AcqRel: the count is an RMW chain every
        // sender and receiver of the overflow takes part in.
        self.pending.fetch_add(1, AcqRel);
        overflow(value).map_err(|value| {
            // Release: as the decrement in `take`.
            self.pending.fetch_sub(1, Release);
            value
        })
    }

    /// Takes the next envelope: the ring's, else the stash, else the
    /// overflow's (rule 3).
    #[inline]
    pub(crate) fn take(
        &self,
        ring: impl Fn() -> Look<T>,
        overflow: impl FnOnce() -> Look<T>,
    ) -> Look<T> {
        let ring_gone = match ring() {
            Look::Took(value) => return Look::Took(value),
            Look::Empty => false,
            Look::Gone => true,
        };
        // Acquire: pairs with a sender's increment. Only a hint: a count
        // not seen yet is an envelope this look misses, as a channel's
        // receive misses a send that has not landed.
        if self.pending.load(Acquire) == 0 {
            return if ring_gone { Look::Gone } else { Look::Empty };
        }
        self.take_spilled(ring, overflow, ring_gone)
    }

    #[cold]
    fn take_spilled(
        &self,
        ring: impl Fn() -> Look<T>,
        overflow: impl FnOnce() -> Look<T>,
        ring_gone: bool,
    ) -> Look<T> {
        let mut stash = self.stash.lock();
        if let Some(value) = stash.take() {
            // The ring was empty just now, so everything older than the
            // stash for its sender is out.
            self.handed_out();
            return Look::Took(value);
        }
        match overflow() {
            // Its sender's earlier ring envelopes are visible from here.
            Look::Took(value) => match ring() {
                Look::Took(older) => {
                    *stash = Some(value);
                    Look::Took(older)
                }
                Look::Empty | Look::Gone => {
                    self.handed_out();
                    Look::Took(value)
                }
            },
            // Counted, not sent yet: on its way.
            Look::Empty => Look::Empty,
            Look::Gone if ring_gone => Look::Gone,
            Look::Gone => Look::Empty,
        }
    }

    fn handed_out(&self) {
        // Release: pairs with the Acquire load of a sender in `send`.
        self.pending.fetch_sub(1, Release);
    }

    /// Envelopes pending in the overflow, the stash included (a reading).
    #[inline]
    pub(crate) fn pending(&self) -> usize {
        // Acquire: as in `take`.
        self.pending.load(Acquire)
    }

    /// True if no envelope is pending in the overflow (a reading).
    #[inline]
    pub(crate) fn nothing_pending(&self) -> bool {
        // Acquire: as in `take`.
        self.pending.load(Acquire) == 0
    }
}

/// Creates a mailbox whose ring holds `ring` envelopes.
pub(crate) fn mailbox<T>(ring: usize) -> (Outbox<T>, Inbox<T>) {
    let (ring_tx, ring_rx) = crossbeam_channel::bounded(ring);
    let (overflow_tx, overflow_rx) = crossbeam_channel::unbounded();
    let spill = Arc::new(Spill::new());
    (
        Outbox {
            ring: ring_tx,
            overflow: overflow_tx,
            spill: spill.clone(),
        },
        Inbox {
            ring: ring_rx,
            overflow: overflow_rx,
            spill,
        },
    )
}

/// The sending half of a mailbox; clones share it. The mailbox is gone
/// for the receivers once every clone is dropped.
pub(crate) struct Outbox<T> {
    ring: Sender<T>,
    overflow: Sender<T>,
    spill: Arc<Spill<T>>,
}

impl<T> Clone for Outbox<T> {
    fn clone(&self) -> Self {
        Outbox {
            ring: self.ring.clone(),
            overflow: self.overflow.clone(),
            spill: self.spill.clone(),
        }
    }
}

impl<T> Outbox<T> {
    /// Queues `value`; never blocks. `Err` gives it back if every receiver
    /// is gone.
    #[inline]
    pub(crate) fn send(&self, value: T) -> Result<(), T> {
        self.spill.send(
            value,
            |value| {
                self.ring.try_send(value).map_err(|refused| match refused {
                    TrySendError::Full(value) => Refusal::Full(value),
                    TrySendError::Disconnected(value) => Refusal::Gone(value),
                })
            },
            |value| self.overflow.send(value).map_err(|refused| refused.0),
        )
    }

    /// True if nothing is queued (a reading).
    pub(crate) fn is_empty(&self) -> bool {
        self.ring.is_empty() && self.spill.nothing_pending()
    }
}

/// The receiving half of a mailbox; clones share it (a stealing pool's
/// workers each hold every mailbox's).
pub(crate) struct Inbox<T> {
    ring: Receiver<T>,
    overflow: Receiver<T>,
    spill: Arc<Spill<T>>,
}

impl<T> Clone for Inbox<T> {
    fn clone(&self) -> Self {
        Inbox {
            ring: self.ring.clone(),
            overflow: self.overflow.clone(),
            spill: self.spill.clone(),
        }
    }
}

/// A channel's answer to a receive, as a [`Look`].
fn look<T>(received: Result<T, TryRecvError>) -> Look<T> {
    match received {
        Ok(value) => Look::Took(value),
        Err(TryRecvError::Empty) => Look::Empty,
        Err(TryRecvError::Disconnected) => Look::Gone,
    }
}

impl<T> Inbox<T> {
    /// Takes the next envelope without waiting.
    #[inline]
    pub(crate) fn try_recv(&self) -> Look<T> {
        self.spill.take(
            || look(self.ring.try_recv()),
            || look(self.overflow.try_recv()),
        )
    }

    /// Takes the next envelope, waiting for one; `None` once every sender
    /// is gone and nothing is left.
    pub(crate) fn recv(&self) -> Option<T> {
        loop {
            match self.try_recv() {
                Look::Took(value) => return Some(value),
                Look::Gone => return None,
                Look::Empty => {}
            }
            // Either lane: a send to either (or every sender leaving)
            // ends the wait, and the loop looks again in the mailbox's
            // order.
            let mut select = Select::new();
            select.recv(&self.ring);
            select.recv(&self.overflow);
            select.ready();
        }
    }

    /// True if nothing is queued (a reading).
    pub(crate) fn is_empty(&self) -> bool {
        self.ring.is_empty() && self.spill.nothing_pending()
    }

    /// How many envelopes are queued (a reading: an overflow envelope
    /// counted before it is sent counts already).
    pub(crate) fn len(&self) -> usize {
        self.ring.len() + self.spill.pending()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// Rule 3, with the interleaving scripted: the receiver's first look
    /// at the ring comes before the sender's first envelope lands there,
    /// and its look at the overflow after the second went there.
    #[test]
    fn an_overflow_envelope_waits_for_an_older_one_in_the_ring() {
        let spill = Spill::new();
        let ring = RefCell::new(VecDeque::new());
        let overflow = RefCell::new(VecDeque::new());
        let stale = Cell::new(true);
        let send = |value: u8, ring_len: usize| {
            spill.send(
                value,
                |value| {
                    if ring.borrow().len() == ring_len {
                        return Err(Refusal::Full(value));
                    }
                    ring.borrow_mut().push_back(value);
                    Ok(())
                },
                |value| {
                    overflow.borrow_mut().push_back(value);
                    Ok(())
                },
            )
        };
        let pop = |lane: &RefCell<VecDeque<u8>>| match lane.borrow_mut().pop_front() {
            Some(value) => Look::Took(value),
            None => Look::Empty,
        };
        let take = || {
            spill.take(
                || {
                    if stale.replace(false) {
                        Look::Empty
                    } else {
                        pop(&ring)
                    }
                },
                || pop(&overflow),
            )
        };
        let took = |look: Look<u8>| match look {
            Look::Took(value) => Some(value),
            _ => None,
        };

        assert!(send(0, 1).is_ok()); // the ring
        assert!(send(1, 1).is_ok()); // the ring is full: the overflow
        assert!(send(2, 1).is_ok()); // 1 is pending: the overflow too
        assert_eq!(overflow.borrow().len(), 2);
        assert_eq!(took(take()), Some(0), "the ring's older envelope first");
        assert_eq!(took(take()), Some(1), "then the stash");
        assert_eq!(took(take()), Some(2));
        assert_eq!(took(take()), None);
        assert!(spill.nothing_pending());
        assert!(send(3, 1).is_ok());
        assert_eq!(ring.borrow().len(), 1, "nothing pending: the ring again");
    }

    #[test]
    fn a_ring_holds_what_its_shard_may_hold_within_its_bounds() {
        assert_eq!(ring_len(100, 16), 100);
        assert_eq!(ring_len(0, 16), RING_MIN);
        assert_eq!(ring_len(1 << 20, 16), RING_MAX);
        assert_eq!(ring_len(1 << 20, 1024), RING_BYTES / 1024);
    }
}
