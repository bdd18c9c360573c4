//! The engine's front door: [`Table::admit`] takes what an [`Ask`]
//! describes and answers with the [`Grant`] of its units, whichever
//! front-end asks (a limiter's permit, a pool's request, a supervisor's
//! child); [`Table::admit_async`] is its twin for a caller that waits
//! without blocking. And the one rule for a caller that is a worker of the
//! very front-end it calls.
//!
//! One unit stays the hot path: `admit` sends an ask of one to
//! [`Table::admit_one`], inlined, whose answer is the shard alone (a grant
//! of one unit is its shard: the front-ends that know they ask for one
//! call `admit_one` and keep the index, with nothing to take apart).
//! Asks of other sizes go out of line to the takes of `many.rs` and the
//! room's scheduler.

use super::{Grant, Table};
use crate::engine::ask::{Ask, How};
use crate::engine::class::Class;
use crate::error::Error;

impl Table {
    /// Takes the units `ask` describes: all of them, or none and an error.
    ///
    /// `Overload` (counted, but for a probe) when they were not seen free
    /// (and, for a waiting ask, the room is full; `Timeout` when its wait
    /// ran out), `TooLarge` at once for more units than the capacity in
    /// force, `Shutdown` once closed. An ask of 0 units gets a grant of
    /// nothing.
    #[inline(always)]
    pub(crate) fn admit(&self, ask: &Ask) -> Result<Grant, Error> {
        if ask.is_one() {
            self.admit_one(ask.how).map(Grant::one)
        } else if ask.key != 0 {
            if ask.units == 1 && ask.class == Class::Critical && matches!(ask.how, How::Try) {
                self.admit_keyed_one(ask.key)
            } else {
                self.admit_keyed(ask)
            }
        } else if ask.class != Class::Critical {
            self.admit_classed(ask)
        } else {
            self.admit_many(ask)
        }
    }

    /// [`admit`](Self::admit) of one unit: the shard it came from.
    #[inline(always)]
    pub(crate) fn admit_one(&self, how: How) -> Result<usize, Error> {
        match how {
            How::Try => self.acquire(),
            How::At(start) => self.acquire_at(self.reduce(start)),
            How::Unbounded => self.acquire_unbounded(),
            How::Wait(deadline) => self.acquire_waiting(deadline),
            How::Probe => self.probe(),
        }
    }

    /// [`admit`](Self::admit) of any number of units but one, of the
    /// default class (the other classes go to `admit_classed`).
    #[cold]
    #[inline(never)]
    fn admit_many(&self, ask: &Ask) -> Result<Grant, Error> {
        let n = ask.units;
        match ask.how {
            _ if n == 0 => self.acquire_many(0),
            // An unbounded take is the pool's, of one unit; asked for
            // more, it is a plain fail-fast take.
            How::Try | How::Unbounded => self.acquire_many_cold(n),
            How::At(start) => self.acquire_many_at(start, n),
            How::Wait(deadline) => self.acquire_waiting_many(n, deadline),
            How::Probe => self.take_many_uncounted(n),
        }
    }

    /// [`admit`](Self::admit) for a caller that waits without blocking
    /// its thread: a waiting ask waits in the room as a future (cancel
    /// safe: what was handed to it goes to the next waiter or back), any
    /// other ask is answered at once.
    pub(crate) async fn admit_async(&self, ask: Ask) -> Result<Grant, Error> {
        match ask.how {
            How::Wait(_) if ask.key != 0 => self.admit_keyed_async(ask).await,
            How::Wait(deadline) if ask.units > 0 => {
                self.acquire_async_many(ask.units, ask.class, deadline)
                    .await
            }
            _ => self.admit(&ask),
        }
    }

    /// [`admit_one`](Self::admit_one) for a caller that is worker `me` of
    /// this table's front-end and will wait for its reply: never on `me`'s
    /// shard, whose queue only `me` serves, and never waiting (a unit
    /// handed over could be `me`'s own). With a single shard only the
    /// caller could serve it: [`Error::CallingSelf`], or `Shutdown` once
    /// shutdown has begun (the answer every other caller gets then).
    #[cold]
    pub(crate) fn admit_from_worker(&self, how: How, me: usize) -> Result<usize, Error> {
        let shards = self.shard_count();
        if shards == 1 {
            return Err(if self.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            });
        }
        match how {
            How::Unbounded => {
                let home = self.home_shard();
                let other = if home == me { (me + 1) % shards } else { home };
                self.acquire_unbounded_on(other)
            }
            How::Try | How::At(_) | How::Wait(_) | How::Probe => self.acquire_except(me),
        }
    }
}
