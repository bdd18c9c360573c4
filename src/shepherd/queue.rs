//! The operation queue: records ordered by the time they become due, in
//! memory, behind the small [`Store`] seam a persistent store could
//! implement later.
//!
//! The seed models the queue as an actor with three requests: enqueue
//! (with a delay), dequeue (ignoring what is not yet due) and count what is
//! due. [`Store`] is those three plus what shutdown and the timer need.
//! [`InMemory`] keeps operations due at once in a FIFO (`O(1)` each way,
//! the common case) and delayed ones in a binary heap keyed by due time and
//! a sequence number (`O(log n)`, FIFO among equal times); a delayed record
//! moves to the FIFO when its time comes ([`Store::promote`]). The store is
//! only ever touched under the shepherd's lock, so it needs no
//! synchronization of its own.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

/// A due-time-ordered store of records.
pub(crate) trait Store<T> {
    /// Adds a record, due at `due` (at once if `due <= now`).
    fn push(&mut self, record: T, due: Instant, now: Instant);
    /// Moves every record due by `now` to the due line; how many moved.
    fn promote(&mut self, now: Instant) -> usize;
    /// The oldest due record (after [`promote`](Self::promote)).
    fn pop_due(&mut self) -> Option<T>;
    /// When the earliest delayed record becomes due.
    fn next_due(&self) -> Option<Instant>;
    /// Records due now (after [`promote`](Self::promote)).
    fn due(&self) -> usize;
    /// Records not yet due.
    fn delayed(&self) -> usize;
    /// Takes every record not yet due, earliest first.
    fn drain_delayed(&mut self) -> Vec<T>;
}

/// One delayed record in the heap.
struct Delayed<T> {
    due: Instant,
    seq: u64,
    record: T,
}

impl<T> PartialEq for Delayed<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}

impl<T> Eq for Delayed<T> {}

impl<T> PartialOrd for Delayed<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Delayed<T> {
    /// Reversed: `BinaryHeap` is a max-heap, and the earliest must be on
    /// top.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

/// The in-memory [`Store`].
pub(crate) struct InMemory<T> {
    ready: VecDeque<T>,
    delayed: BinaryHeap<Delayed<T>>,
    seq: u64,
}

impl<T> InMemory<T> {
    pub(crate) fn new() -> Self {
        InMemory {
            ready: VecDeque::new(),
            delayed: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<T> Store<T> for InMemory<T> {
    fn push(&mut self, record: T, due: Instant, now: Instant) {
        if due <= now {
            self.ready.push_back(record);
        } else {
            self.seq += 1;
            self.delayed.push(Delayed {
                due,
                seq: self.seq,
                record,
            });
        }
    }

    fn promote(&mut self, now: Instant) -> usize {
        let mut moved = 0;
        while self.delayed.peek().is_some_and(|top| top.due <= now) {
            if let Some(top) = self.delayed.pop() {
                self.ready.push_back(top.record);
                moved += 1;
            }
        }
        moved
    }

    fn pop_due(&mut self) -> Option<T> {
        self.ready.pop_front()
    }

    fn next_due(&self) -> Option<Instant> {
        self.delayed.peek().map(|top| top.due)
    }

    fn due(&self) -> usize {
        self.ready.len()
    }

    fn delayed(&self) -> usize {
        self.delayed.len()
    }

    fn drain_delayed(&mut self) -> Vec<T> {
        let mut taken = Vec::with_capacity(self.delayed.len());
        while let Some(top) = self.delayed.pop() {
            taken.push(top.record);
        }
        taken
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn due_in_order_delayed_by_time_then_arrival() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut q = InMemory::new();
        q.push("now", t0, t0);
        q.push("late", at(30), t0);
        q.push("soon-a", at(10), t0);
        q.push("soon-b", at(10), t0);
        assert_eq!((q.due(), q.delayed(), q.next_due()), (1, 3, Some(at(10))));
        assert_eq!(q.pop_due(), Some("now"));
        assert_eq!(q.pop_due(), None);
        assert_eq!(q.promote(at(9)), 0);
        assert_eq!(q.promote(at(10)), 2);
        assert_eq!(q.pop_due(), Some("soon-a"));
        assert_eq!(q.pop_due(), Some("soon-b"));
        assert_eq!(q.drain_delayed(), vec!["late"]);
        assert_eq!((q.due(), q.delayed(), q.next_due()), (0, 0, None));
    }
}
