//! The deadline watcher: one process-wide thread that rings each waiting
//! room at the earliest deadline among its async waiters.
//!
//! # Why one watcher, not a timer per wait
//!
//! An async waiter has no thread to sleep on a condition variable with a
//! timeout, so something else must wake it at its deadline. Arming a
//! `futures_timer::Delay` per wait did that, but registering each one with
//! futures-timer's global thread (an allocation, a lock-free list push, an
//! unpark of that thread, and the thread's own heap update) cost more than
//! the whole hand-off it guarded: 2x tokio's semaphore at the median and
//! 46x at p99 (`PERFORMANCE.md`, the waiting bench).
//!
//! Instead each room keeps at most one *armed* instant (in its queue,
//! `Queue::arm`): the earliest deadline among its async waiters. A waiter
//! whose deadline is not earlier than the armed one registers nothing.
//! With FIFO and a fixed `max_wait`, deadlines only grow, so once the first
//! waiter armed the room, no later one registers until the watcher rings:
//! the common path is one comparison under the control lock it already
//! holds. When the watcher rings a room (`Alarm::ring`), the room expires
//! every waiter whose deadline has passed, under its control lock, wakes
//! them (they finish with `Timeout` through `Table::finished`), and
//! answers the next instant to ring at, if any.
//!
//! # Design
//!
//! A binary heap of `(instant, Weak<dyn Alarm>)` under a mutex, and one
//! helper thread that sleeps on a condition variable until the earliest
//! instant (or, with an empty heap, until a registration: an idle process
//! costs no CPU). It is started lazily by the first registration, so a
//! process that never waits asynchronously never starts it. A registration
//! notifies the thread only when its instant becomes the earliest.
//!
//! * **Weak.** The heap holds rooms weakly: a dropped table's entry rings
//!   nobody and is discarded; the watcher never keeps a table alive.
//! * **Lock order.** The watcher rings with the heap unlocked; a room
//!   registers after letting its control lock go. So no thread ever holds
//!   both locks, in any order.
//! * **Duplicates.** A room may have more than one entry pending (it armed
//!   an earlier instant over a later one). Each ring re-derives the room's
//!   state under its lock, so a stale entry only costs one sweep, and each
//!   ring registers at most one entry: the heap never grows by itself.
//!
//! Rejected alternatives: a thread per table (an idle `Limiter` would cost
//! a thread); the runtime's timer (tokio's `sleep` ties the crate to one
//! executor, and `Limiter::acquire_async` works on any); a timer wheel
//! (its ticks wake an idle process; with one entry per room, a heap is
//! small). A process-wide thread is the one piece of hidden global state
//! in the crate, as futures-timer's was: it holds no configuration and no
//! handle, only wake-ups.
//!
//! If the thread cannot be spawned (the OS is out of threads), entries
//! stay in the heap and the next registration tries again; meanwhile async
//! waiters are served, closed or dropped, but do not time out.
//! (futures-timer panicked in that case.)
//!
//! Not under loom: loom has no clock, and models set no deadline.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::time::Instant;

use crate::sync::{now, os_thread, Condvar, Mutex, OnceLock, Weak};

/// What the watcher rings.
pub(crate) trait Alarm: Send + Sync {
    /// Called once the instant it was registered for has passed (`now` is
    /// the watcher's reading); the next instant to ring at, if any.
    fn ring(&self, now: Instant) -> Option<Instant>;
}

/// Registers `alarm` to be rung at `at`; starts the watcher if it is not
/// running yet.
pub(crate) fn arm(at: Instant, alarm: Weak<dyn Alarm>) {
    let watcher = WATCHER.get_or_init(Watcher::default);
    let mut heap = watcher.heap.lock();
    if !heap.started {
        // Started under the heap lock, so two registrations never start
        // two threads; the new thread's first act is to take that lock.
        heap.started = os_thread::Builder::new()
            .name("sidejob-deadlines".into())
            .spawn(move || watcher.run())
            .is_ok();
    }
    let earliest = heap.entries.peek().map_or(true, |first| at < first.at);
    heap.push(at, alarm);
    drop(heap);
    if earliest {
        // The watcher sleeps until the old earliest instant (or forever):
        // it must look again.
        watcher.condvar.notify_all();
    }
}

static WATCHER: OnceLock<Watcher> = OnceLock::new();

#[derive(Default)]
struct Watcher {
    heap: Mutex<Heap>,
    condvar: Condvar,
}

#[derive(Default)]
struct Heap {
    entries: BinaryHeap<Entry>,
    /// Breaks ties between equal instants (and keeps them in order).
    seq: u64,
    /// The thread runs (or was started and runs soon).
    started: bool,
}

impl Heap {
    fn push(&mut self, at: Instant, alarm: Weak<dyn Alarm>) {
        self.seq = self.seq.wrapping_add(1);
        self.entries.push(Entry {
            at,
            seq: self.seq,
            alarm,
        });
    }
}

struct Entry {
    at: Instant,
    seq: u64,
    alarm: Weak<dyn Alarm>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap, the earliest instant is wanted.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl Watcher {
    /// The watcher thread: ring what is due, sleep until the next instant.
    fn run(&self) {
        let mut due = Vec::new();
        let mut again = Vec::new();
        let mut heap = self.heap.lock();
        loop {
            let Some(at) = heap.entries.peek().map(|first| first.at) else {
                // Nothing armed: sleep until a registration, at no CPU cost.
                heap = self.condvar.wait(heap);
                continue;
            };
            let now = now();
            if at > now {
                // Wakes early on a notification (an earlier registration)
                // or spuriously: either way, look again.
                (heap, _) = self.condvar.wait_until(heap, at);
                continue;
            }
            while heap.entries.peek().is_some_and(|first| first.at <= now) {
                if let Some(entry) = heap.entries.pop() {
                    due.push(entry.alarm);
                }
            }
            drop(heap);
            for weak in due.drain(..) {
                // A dropped room rings nobody.
                if let Some(alarm) = weak.upgrade() {
                    if let Some(next) = alarm.ring(now) {
                        again.push((next, weak));
                    }
                }
            }
            heap = self.heap.lock();
            for (at, alarm) in again.drain(..) {
                heap.push(at, alarm);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{Arc, AtomicUsize, Ordering::Relaxed};
    use std::time::Duration;

    struct Counter {
        rung: AtomicUsize,
        done: Mutex<bool>,
        condvar: Condvar,
        then: Option<Duration>,
    }

    impl Alarm for Counter {
        fn ring(&self, now: Instant) -> Option<Instant> {
            // Relaxed: a count; the test reads it after the condvar hand-off.
            let rung = self.rung.fetch_add(1, Relaxed) + 1;
            if rung == 2 || self.then.is_none() {
                *self.done.lock() = true;
                self.condvar.notify_all();
                return None;
            }
            self.then.map(|then| now + then)
        }
    }

    fn wait_done(counter: &Counter) {
        let mut done = counter.done.lock();
        while !*done {
            done = counter.condvar.wait(done);
        }
    }

    #[test]
    fn rings_at_the_instant_and_again_when_asked() {
        let counter = Arc::new(Counter {
            rung: AtomicUsize::new(0),
            done: Mutex::new(false),
            condvar: Condvar::new(),
            then: Some(Duration::from_millis(1)),
        });
        let weak: Weak<dyn Alarm> = Arc::downgrade(&counter) as Weak<dyn Alarm>;
        let at = now() + Duration::from_millis(2);
        arm(at, weak);
        wait_done(&counter);
        assert!(now() >= at);
        assert_eq!(counter.rung.load(Relaxed), 2);
    }

    #[test]
    fn a_dropped_alarm_rings_nobody_and_others_still_ring() {
        let dropped = Arc::new(Counter {
            rung: AtomicUsize::new(0),
            done: Mutex::new(false),
            condvar: Condvar::new(),
            then: None,
        });
        let kept = Arc::new(Counter {
            rung: AtomicUsize::new(0),
            done: Mutex::new(false),
            condvar: Condvar::new(),
            then: None,
        });
        let at = now() + Duration::from_millis(1);
        arm(at, Arc::downgrade(&dropped) as Weak<dyn Alarm>);
        drop(dropped);
        arm(at, Arc::downgrade(&kept) as Weak<dyn Alarm>);
        wait_done(&kept);
        assert_eq!(kept.rung.load(Relaxed), 1);
    }
}
