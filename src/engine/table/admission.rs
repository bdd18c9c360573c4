//! How a front-end asks the table for a unit: one [`Admission`] for every
//! front-end (the pools' requests, the supervisor's children), and the one
//! rule for a caller that is a worker of the very front-end it calls.

use std::time::Instant;

use super::Table;
use crate::error::Error;

/// How a caller takes its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// From the caller's home shard, never waiting; an `Overload` is
    /// counted.
    Try,
    /// From shard `start` (taken modulo the shard count), never waiting:
    /// the model tests' seam for a caller on a chosen shard.
    #[cfg_attr(not(test), allow(dead_code))]
    At(usize),
    /// The caller's home shard, whatever its limit (the pool's
    /// `*_unbounded` requests); refused only once closed.
    Unbounded,
    /// From the caller's home shard, then waiting in the waiting room (if
    /// the front-end has one) until `deadline` (if any; `max_wait` bounds
    /// it too). Blocks the thread.
    Wait(Option<Instant>),
    /// As `Try`, but an `Overload` is not counted: the caller waits next
    /// (in an async wait, which counts its own outcome).
    Probe,
}

impl Table {
    /// Takes a unit as `admission` says; the shard it came from.
    ///
    /// `Overload` (counted, but for `Probe`) when every shard was seen
    /// full (and, for `Wait`, the room is full or the wait ran out:
    /// `Timeout`), `Shutdown` once closed.
    #[inline(always)]
    pub(crate) fn admit(&self, admission: Admission) -> Result<usize, Error> {
        match admission {
            Admission::Try => self.acquire(),
            Admission::At(start) => self.acquire_at(self.reduce(start)),
            Admission::Unbounded => self.acquire_unbounded(),
            Admission::Wait(deadline) => self.acquire_waiting(deadline),
            Admission::Probe => self.probe(),
        }
    }

    /// [`admit`](Self::admit) for a caller that is worker `me` of this
    /// table's front-end and will wait for its reply: never on `me`'s
    /// shard, whose queue only `me` serves, and never waiting (a unit
    /// handed over could be `me`'s own). With a single shard only the
    /// caller could serve it: [`Error::CallingSelf`], or `Shutdown` once
    /// shutdown has begun (the answer every other caller gets then).
    #[cold]
    pub(crate) fn admit_from_worker(
        &self,
        admission: Admission,
        me: usize,
    ) -> Result<usize, Error> {
        let shards = self.shard_count();
        if shards == 1 {
            return Err(if self.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            });
        }
        match admission {
            Admission::Unbounded => {
                let home = self.home_shard();
                let other = if home == me { (me + 1) % shards } else { home };
                self.acquire_unbounded_on(other)
            }
            Admission::Try | Admission::At(_) | Admission::Wait(_) | Admission::Probe => {
                self.acquire_except(me)
            }
        }
    }
}
