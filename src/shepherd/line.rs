//! The due line: a lock-free FIFO of the operations due now, and the
//! protocol by which the shepherd's workers sleep while it is empty and are
//! woken, without a lost wake-up, when it is not or when it closes.
//!
//! # Implementation details
//!
//! **Why a line of its own.** An operation due at once (a `submit`, a
//! retry the timer requeues after a late attempt, a delayed one the timer
//! promotes; a worker keeps its own retry without backoff) goes here, not
//! under the shepherd's lock: a submit and the worker's take are each a
//! few atomic operations on the FIFO and on [`Line::state`], and the lock
//! is left to the delay heap and the retry decision. The FIFO is
//! crossbeam-channel's unbounded list (lock-free `send` and `try_recv`);
//! its length needs no bound of its own, because every record on it holds a
//! unit of the admission table's capacity. Under `--cfg loom`, where loom
//! cannot see crossbeam, it is a shim `Mutex<VecDeque>`: linearizable
//! either way, which is all the protocol below asks of it.
//!
//! **The state word.** One word decides both "is anything due" and "is
//! the line closed", so a push racing a close is settled by one RMW:
//!
//! | bits | meaning |
//! |---|---|
//! | bit 0 ([`CLOSED`]) | set by [`close`](Line::close); never cleared |
//! | bits 1.. (units of [`ONE`]) | records reserved and not yet finished: the *open* count |
//!
//! A reservation adds `ONE`; a take changes nothing; the worker that took
//! a record subtracts `ONE` once it is done with it
//! ([`finish`](Line::finish); the shepherd: completed or delayed; a retry
//! its worker keeps stays counted until then). So a submit makes one RMW on one
//! shared cache line, and a worker one, after its caller has heard: none
//! lies between a submit and its attempt. An open count of zero means
//! nothing is due and nothing taken is still in hand
//! ([`is_idle`](Line::is_idle)), the shepherd's idle test.
//!
//! A producer counts its record in ([`reserve`](Line::reserve)) *before*
//! it pushes it ([`publish`](Line::publish)), and its worker counts it out
//! only after popping it and finishing it, so the count never underflows
//! and a non-zero open count means a record is on the line, about to be,
//! or in a worker's hands. Only a count of zero lets a worker sleep
//! without a last look (a record in another worker's hands only costs one
//! more look at the FIFO), and only `CLOSED` with a count of zero lets it
//! leave: a worker counts out everything it finished before it calls
//! [`take`](Line::take), the only take that sleeps or leaves, so its own
//! records never keep it.
//!
//! **Counting out in runs.** A worker that finds another record on the
//! line ([`try_take`](Line::try_take), which never sleeps) may keep the
//! count-outs of the ones it finished and make them in one RMW
//! ([`finish_many`](Line::finish_many)) when the line runs dry or the run
//! reaches its cap. Each count-out is a trip of this word's line between
//! the worker and the submitter, whose reservation writes it next: kept
//! for runs, the throughput bench's shepherd ran about 5 % faster (medians
//! of an interleaved A/B). A kept
//! count-out only makes the count high for a while: a sleeper takes one
//! more look, an idle check waits for the worker to run dry, and a close
//! keeps the workers until it flushes, which it does before it can sleep
//! or leave. The figures subtract what the workers keep (the shepherd's
//! `due`).
//!
//! **Sleeping (Dekker).** A worker that found nothing registers as a
//! sleeper (in `sleepers`, and the count `asleep`, both under the sleepers
//! lock), issues `fence(SeqCst)`, and reads the state word; a producer
//! reserves (an RMW on the state word), pushes, issues `fence(SeqCst)`, and
//! reads `asleep`. With a fence on each side, the two fences are ordered
//! one way or the other: if the producer's comes first, the worker's reads
//! after its own fence see the reservation *and* the push (the worker reads
//! a non-zero count and pops once more, still registered, and finds it);
//! if the worker's comes first, the producer's `asleep` load sees the
//! registration and it wakes a sleeper ([`wake_one`](Line::wake_one),
//! under the sleepers lock, which the worker holds from its registration
//! to its wait, so the notification cannot fall between its check and its
//! sleep). So a worker that sleeps with a record reserved but not yet
//! pushed is woken by that record's producer; one that sleeps while
//! another worker counts its record out needs nothing. A producer
//! that finds nobody asleep touches no lock at all: the common case of
//! busy workers costs two RMWs and a fence. There is no spinning on the
//! state word, so no worker waits for a producer to be scheduled.
//!
//! **Few spinners.** A worker that finds the line empty polls it for the
//! spin budget before it sleeps, but only while fewer than half the
//! workers (at least one) are polling already: tokio's multi-thread
//! scheduler bounds its searching workers the same way
//! (`transition_worker_to_searching`, "at most half"). One poller takes the
//! next record as soon as it lands; more would only burn the cores the
//! submitters and the busy workers need (with a submitter and two workers
//! on two cores, a second poller cost the shepherd a fifth of its
//! throughput). The count is a hint, outside the protocol: a worker that
//! does not poll goes straight to the sleep below, which is exact.
//!
//! **One wake per record.** Each published record wakes at most one
//! sleeper, the most recent (its cache is warmest); a woken worker takes
//! records until the count is zero before it sleeps again, so no record
//! waits while a worker sleeps.
//!
//! **Closing** sets `CLOSED` and then, under the sleepers lock, wakes every
//! sleeper. A sleeper checked the state under that lock, so it either saw
//! `CLOSED` or was already waiting when the notification came. After the
//! close a reservation fails (the submitter is refused), while records
//! already reserved are still published and taken: workers drain the line
//! and leave once the word reads exactly `CLOSED`. A sleeper
//! may be waiting while another worker still runs a record (or for a
//! refused reservation being undone); whoever's decrement leaves the
//! word exactly `CLOSED` wakes every sleeper, so each sees it and leaves.

#[cfg(loom)]
use std::collections::VecDeque;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::sync::{fence, now, spin_poll, AtomicUsize, Condvar, Mutex, Ordering};

/// The state word's closed bit.
pub(crate) const CLOSED: usize = 1;
/// One record in the state word's open count.
pub(crate) const ONE: usize = 2;

/// How long a sleeper waits in one go: it re-checks after any wake-up, so
/// this only bounds a wait nobody ends (none should).
const LONG: Duration = Duration::from_secs(3600);

/// The due line; see the module docs.
pub(crate) struct Line<T> {
    #[cfg(not(loom))]
    sender: crossbeam_channel::Sender<T>,
    #[cfg(not(loom))]
    receiver: crossbeam_channel::Receiver<T>,
    #[cfg(loom)]
    fifo: Mutex<VecDeque<T>>,
    /// `CLOSED` | open × `ONE` (module docs, "The state word"). On a cache line of its own: the submitter and the workers
    /// write it on every record, and a neighbour read by either side
    /// (`asleep`, the FIFO's handles) would pull it back and forth once
    /// more.
    state: CachePadded<AtomicUsize>,
    /// `sleepers.len()`, readable without the lock; written under it.
    asleep: AtomicUsize,
    /// Workers polling the empty line now (module docs, "Few spinners").
    /// Only workers write it, on every take that finds the line empty: on
    /// a cache line of its own, away from `asleep`, which every publish
    /// reads.
    spinning: CachePadded<AtomicUsize>,
    /// The most that may poll at once: half the workers, at least one.
    max_spinning: usize,
    /// Workers registered as asleep, most recent last.
    sleepers: Mutex<Vec<usize>>,
    /// Worker `i` sleeps on `wake[i]`, so a push wakes one worker, not all
    /// (the shim's condition variable only notifies all).
    wake: Box<[Condvar]>,
}

impl<T> Line<T> {
    /// An empty, open line for `workers` workers (indices `0..workers`).
    pub(crate) fn new(workers: usize) -> Self {
        #[cfg(not(loom))]
        let (sender, receiver) = crossbeam_channel::unbounded();
        Line {
            #[cfg(not(loom))]
            sender,
            #[cfg(not(loom))]
            receiver,
            #[cfg(loom)]
            fifo: Mutex::new(VecDeque::new()),
            state: CachePadded::new(AtomicUsize::new(0)),
            asleep: AtomicUsize::new(0),
            spinning: CachePadded::new(AtomicUsize::new(0)),
            max_spinning: (workers / 2).max(1),
            sleepers: Mutex::new(Vec::with_capacity(workers)),
            wake: (0..workers).map(|_| Condvar::new()).collect(),
        }
    }

    /// Counts one record in, before it is pushed; false (and nothing
    /// counted) once the line is closed.
    #[inline]
    pub(crate) fn reserve(&self) -> bool {
        self.reserve_due().is_some()
    }

    /// [`reserve`](Self::reserve), answering the open count it made (this
    /// record included), or `None` once closed: the submitter's reading of
    /// the count, with no second look at a word a worker may hold by then.
    #[inline]
    pub(crate) fn reserve_due(&self) -> Option<usize> {
        // SeqCst: the producer's write in the sleep Dekker (with the fence
        // in `publish`; the worker's side is in `sleep`), and in the one
        // order of the count's changes with the idle checks (see
        // `is_idle`). One RMW also orders it against `close`'s `fetch_or`.
        let old = self.state.fetch_add(ONE, Ordering::SeqCst);
        if old & CLOSED != 0 {
            // Relaxed: a count only; the closed line admits nothing more,
            // and nothing waits for this record to be finished.
            let old = self.state.fetch_sub(ONE, Ordering::Relaxed);
            self.counted_out(old, 1);
            return None;
        }
        Some((old & !CLOSED) / ONE + 1)
    }

    /// The owner of a taken record is done with it: counts it out, and
    /// if that left the line closed and empty, wakes
    /// every sleeper (one may be waiting for this record; now it must
    /// leave). True if that left nothing open (the line idle).
    #[inline]
    pub(crate) fn finish(&self) -> bool {
        self.finish_many(1)
    }

    /// [`finish`](Self::finish) for `n` records at once (module docs,
    /// "Counting out in runs"), in one RMW. True if that left nothing
    /// open.
    #[inline]
    pub(crate) fn finish_many(&self, n: usize) -> bool {
        debug_assert!(n > 0, "nothing to count out");
        // SeqCst: one order with the idle checks (the shepherd's
        // `wait_idle`: its SeqCst count of waiters, then `is_idle`). Every
        // change of the count is an RMW on this one word, so the decrement
        // that leaves it exactly `CLOSED` is the last.
        let old = self.state.fetch_sub(n * ONE, Ordering::SeqCst);
        self.counted_out(old, n);
        old & !CLOSED == n * ONE
    }

    /// True when nothing is open: nothing due, nothing taken and not
    /// finished.
    #[inline]
    pub(crate) fn is_idle(&self) -> bool {
        // SeqCst: read in one order with the SeqCst changes of the count
        // (`reserve`, `finish`).
        self.state.load(Ordering::SeqCst) & !CLOSED == 0
    }

    /// Pushes a record counted in by [`reserve`](Self::reserve), and wakes
    /// one sleeping worker if there is one.
    #[inline]
    pub(crate) fn publish(&self, record: T) {
        #[cfg(not(loom))]
        {
            // The receiver lives as long as the sender (both are ours), so
            // the send cannot fail.
            let _ = self.sender.send(record);
        }
        #[cfg(loom)]
        self.fifo.lock().push_back(record);
        // SeqCst fence: pairs with the fence in `sleep`; between the
        // reservation and push above and the `asleep` load below (module
        // docs, "Sleeping").
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence; a stale non-zero only costs a
        // look at the sleepers lock.
        if self.asleep.load(Ordering::Relaxed) > 0 {
            self.wake_one();
        }
    }

    /// Reserves and publishes in one step; the record back if the line is
    /// closed. (The shepherd reserves through its own count first.)
    #[cfg_attr(not(any(loom, test)), allow(dead_code))]
    pub(crate) fn push(&self, record: T) -> Result<(), T> {
        if self.reserve() {
            self.publish(record);
            Ok(())
        } else {
            Err(record)
        }
    }

    /// The oldest record, if one is on the line now. It stays counted
    /// until [`finish`](Self::finish); the record itself comes through the
    /// FIFO's own synchronization. It never spins or sleeps, so a worker
    /// may call it with count-outs kept (module docs, "Counting out in
    /// runs").
    #[inline]
    pub(crate) fn try_take(&self) -> Option<T> {
        #[cfg(not(loom))]
        let record = self.receiver.try_recv().ok();
        #[cfg(loom)]
        let record = self.fifo.lock().pop_front();
        record
    }

    /// After a decrement of the count by `n` from `old`: if that left the
    /// line closed and empty, wakes every sleeper (one may be waiting for
    /// the records just counted out; now it must leave).
    fn counted_out(&self, old: usize, n: usize) {
        if old == CLOSED + n * ONE {
            self.wake_all();
        }
    }

    /// Records reserved and not yet finished: the open count (due, or in
    /// a worker's hands).
    pub(crate) fn open(&self) -> usize {
        // Relaxed: a reading for figures; decisions read the word in
        // `sleep`.
        (self.state.load(Ordering::Relaxed) & !CLOSED) / ONE
    }

    /// The next record for worker `index`: taken at once if there is one,
    /// else polled for up to `spin`, else slept for (woken by a publish or
    /// the close). `None` once the line is closed and empty: the worker
    /// should leave. The worker must have counted out every record it
    /// finished (module docs).
    pub(crate) fn take(&self, index: usize, spin: Duration) -> Option<T> {
        if let Some(record) = self.try_take() {
            return Some(record);
        }
        // Once closed, what is left is drained and nothing more comes: no
        // reason to spin.
        if !spin.is_zero() && !self.is_closed() && self.start_spinning() {
            // Relaxed: a hint; `try_take` is the real look.
            let polled = spin_poll(spin, || {
                if self.state.load(Ordering::Relaxed) >= ONE {
                    self.try_take()
                } else {
                    None
                }
            });
            // Relaxed: a hint (module docs, "Few spinners").
            self.spinning.fetch_sub(1, Ordering::Relaxed);
            if polled.is_some() {
                return polled;
            }
        }
        loop {
            if let Some(record) = self.try_take() {
                return Some(record);
            }
            match self.sleep(index) {
                Woke::Took(record) => return Some(record),
                Woke::Look => {}
                Woke::Closed => return None,
            }
        }
    }

    /// Counts this worker among the pollers if fewer than `max_spinning`
    /// are; false (not counted) if that many already poll.
    fn start_spinning(&self) -> bool {
        // Relaxed: a hint, never a decision about a record (module docs,
        // "Few spinners"); the RMW only keeps the count exact.
        self.spinning
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_spinning).then_some(n + 1)
            })
            .is_ok()
    }

    /// Registers worker `index` as asleep and sleeps, unless the line is
    /// closed and empty, or a record turns up once it is registered.
    #[cold]
    fn sleep(&self, index: usize) -> Woke<T> {
        let mut sleepers = self.sleepers.lock();
        sleepers.push(index);
        // Relaxed: written under the sleepers lock; the fence below orders
        // it before the reads that follow (module docs, "Sleeping").
        self.asleep.store(sleepers.len(), Ordering::Relaxed);
        // SeqCst fence: pairs with the fence in `publish`.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence; `CLOSED` is ordered by the lock
        // (`close` sets it before taking the lock). An RMW rather than a
        // load: it reads the latest value in the word's modification
        // order (a cold path; the locked add costs nothing that matters).
        let state = self.state.fetch_add(0, Ordering::Relaxed);
        if state == CLOSED {
            self.unregister(&mut sleepers, index);
            return Woke::Closed;
        }
        if state != 0 {
            // A record is on the line, being pushed, or in a worker's
            // hands. Look once more, registered: if it is not there yet,
            // its producer's fence comes after ours, so its `asleep` load
            // sees this registration and it wakes a sleeper (module docs).
            if let Some(record) = self.try_take() {
                self.unregister(&mut sleepers, index);
                return Woke::Took(record);
            }
        }
        (sleepers, _) = self.wake[index].wait_until(sleepers, now() + LONG);
        // Woken by a publish or the close (and so already unregistered),
        // or spuriously (still listed).
        self.unregister(&mut sleepers, index);
        Woke::Look
    }

    /// Takes `index` off the sleepers, if it is there. Under the sleepers
    /// lock.
    fn unregister(&self, sleepers: &mut Vec<usize>, index: usize) {
        if let Some(at) = sleepers.iter().position(|&i| i == index) {
            sleepers.remove(at);
            // Relaxed: under the sleepers lock; a producer reading a stale
            // larger count only looks at the lock for nothing.
            self.asleep.store(sleepers.len(), Ordering::Relaxed);
        }
    }

    /// Wakes the most recent sleeper, if any is still listed.
    #[cold]
    fn wake_one(&self) {
        let mut sleepers = self.sleepers.lock();
        if let Some(index) = sleepers.pop() {
            // Relaxed: under the sleepers lock (see `unregister`).
            self.asleep.store(sleepers.len(), Ordering::Relaxed);
            self.wake[index].notify_all();
        }
    }

    /// Wakes every sleeper.
    #[cold]
    fn wake_all(&self) {
        let mut sleepers = self.sleepers.lock();
        for index in sleepers.drain(..) {
            self.wake[index].notify_all();
        }
        // Relaxed: under the sleepers lock.
        self.asleep.store(0, Ordering::Relaxed);
    }

    /// Closes the line: later reservations fail, and every sleeper wakes
    /// (to drain what is left, then leave). Idempotent.
    pub(crate) fn close(&self) {
        // Relaxed: the sleepers lock taken next orders the bit before any
        // sleeper's check under that lock (module docs, "Closing"); a
        // racing `reserve` meets it in this word's modification order.
        self.state.fetch_or(CLOSED, Ordering::Relaxed);
        self.wake_all();
    }

    /// Whether [`close`](Self::close) has been called.
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        // Relaxed: a reading; nothing is published through it.
        self.state.load(Ordering::Relaxed) & CLOSED != 0
    }
}

/// Why [`Line::sleep`] returned.
enum Woke<T> {
    /// A record turned up after registering.
    Took(T),
    /// Woken (or spuriously): look at the line again.
    Look,
    /// Closed and empty: leave.
    Closed,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fifo_counts_and_close() {
        let line = Line::new(1);
        assert!(line.push(1).is_ok());
        assert!(line.reserve());
        assert_eq!(line.open(), 2);
        line.publish(2);
        assert_eq!(line.try_take(), Some(1));
        assert_eq!(line.open(), 2, "taken, not finished");
        assert!(!line.finish(), "one more is open");
        line.close();
        assert!(line.is_closed());
        assert_eq!(line.push(3), Err(3));
        // Closed, but what was reserved before is still taken.
        assert_eq!(line.take(0, Duration::ZERO), Some(2));
        assert!(!line.is_idle());
        assert!(line.finish(), "the last one");
        assert_eq!(line.open(), 0);
        assert!(line.is_idle());
        assert_eq!(line.take(0, Duration::ZERO), None);
    }

    #[test]
    fn a_sleeper_is_woken_by_a_push_and_by_the_close() {
        let line = std::sync::Arc::new(Line::new(2));
        let (ready, seen) = std::sync::mpsc::channel();
        let (took, first) = std::sync::mpsc::channel();
        let sleeper = {
            let line = std::sync::Arc::clone(&line);
            std::thread::spawn(move || {
                ready.send(()).unwrap();
                took.send(line.take(0, Duration::ZERO)).unwrap();
                line.finish();
                line.take(0, Duration::ZERO)
            })
        };
        seen.recv().unwrap();
        line.push(7).unwrap();
        // Only the push can end the first take (the close comes after it).
        assert_eq!(first.recv().unwrap(), Some(7));
        line.close();
        assert_eq!(sleeper.join().unwrap(), None);
    }
}
