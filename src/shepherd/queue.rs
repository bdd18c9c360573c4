//! The delayed operations: records ordered by the time they become due, in
//! memory, behind the small [`Store`] seam a persistent store could
//! implement later.
//!
//! The seed models the queue as an actor with three requests: enqueue
//! (with a delay), dequeue (ignoring what is not yet due) and count what is
//! due. Operations due at once skip this store: they go straight to the
//! lock-free due line (`line.rs`), and a delayed record moves there when
//! its time comes ([`Store::pop_due`], called by the timer). [`InMemory`]
//! keeps the delayed records in a binary heap keyed by due time and a
//! sequence number (`O(log n)`, FIFO among equal times). The store is only
//! ever touched under the shepherd's lock, so it needs no synchronization
//! of its own.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

/// A due-time-ordered store of delayed records.
pub(crate) trait Store<T> {
    /// Adds a record, due at `due`.
    fn push(&mut self, record: T, due: Instant);
    /// The earliest record if it is due by `now`.
    fn pop_due(&mut self, now: Instant) -> Option<T>;
    /// When the earliest record becomes due.
    fn next_due(&self) -> Option<Instant>;
    /// Records held (not yet due, or due and not yet moved out).
    fn delayed(&self) -> usize;
    /// Takes every record, earliest first.
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
    delayed: BinaryHeap<Delayed<T>>,
    seq: u64,
}

impl<T> InMemory<T> {
    pub(crate) fn new() -> Self {
        InMemory {
            delayed: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<T> Store<T> for InMemory<T> {
    fn push(&mut self, record: T, due: Instant) {
        self.seq += 1;
        self.delayed.push(Delayed {
            due,
            seq: self.seq,
            record,
        });
    }

    fn pop_due(&mut self, now: Instant) -> Option<T> {
        if self.delayed.peek().is_some_and(|top| top.due <= now) {
            self.delayed.pop().map(|top| top.record)
        } else {
            None
        }
    }

    fn next_due(&self) -> Option<Instant> {
        self.delayed.peek().map(|top| top.due)
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
    fn due_by_time_then_arrival() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut q = InMemory::new();
        q.push("late", at(30));
        q.push("soon-a", at(10));
        q.push("soon-b", at(10));
        assert_eq!((q.delayed(), q.next_due()), (3, Some(at(10))));
        assert_eq!(q.pop_due(at(9)), None);
        assert_eq!(q.pop_due(at(10)), Some("soon-a"));
        assert_eq!(q.pop_due(at(10)), Some("soon-b"));
        assert_eq!(q.pop_due(at(10)), None);
        assert_eq!(q.drain_delayed(), vec!["late"]);
        assert_eq!((q.delayed(), q.next_due()), (0, None));
    }
}
