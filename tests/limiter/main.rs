//! The `Limiter`'s public behaviour, one sub-feature a file:
//!
//! * `permits.rs`: limits and their split over the shards, overload,
//!   owned permits, stats, panics, configuration, auto traits, `close`
//!   and `forget` (issue 7);
//! * `waiting.rs`: the waiting room (issue 8): waiters served, timed out,
//!   refused when the room is full; the queue orders; cancel safety;
//!   `close`; `try_acquire` never waits;
//! * `resize.rs`: `set_capacity` at run time (issue 8): hands room to
//!   waiters, never admits above the capacity in force, `available()`,
//!   a shrink's debt.
//! * `classes.rs`: priority classes (issue 36): each class's share of
//!   the capacity, on any shard count and through a resize; the room's
//!   class order; per-class figures; bad headroom; a stress test with a
//!   ledger per class.
//! * `fair.rs`: fair shares across tenant keys (issue 37): the fair
//!   line, the room's fair order, caps, weights, every guard carrying its
//!   key, bad settings, bounded memory, a stress test with a ledger per
//!   key.
//! * `weighted.rs`: requests of many units (issue 35): tokio's weighted
//!   semaphore tests translated, takes across shards, `split`, `merge`,
//!   `forget`, relative resizes, bad input, a stress test with a ledger.
//!
//! The tower layer over a limiter is in `tests/tower.rs`, the waiting room
//! under load in `tests/stress_waiting.rs`.
//!
//! No sleeps and no timed assertions: waiters are lined up by polling
//! `waiting()` ([`common::until`]), admissions are reported over channels,
//! and the only deadlines are `max_wait`s that either never run out in a
//! passing test ([`LONG`]) or must run out ([`SHORT`], where only the error
//! is checked).

#[path = "../common/mod.rs"]
mod common;

mod classes;
mod fair;
mod min_share;
mod permits;
mod resize;
mod waiting;
mod weighted;

use std::sync::Arc;
use std::time::Duration;

use sidejob::{Error, Limiter, OwnedPermit, QueueOrder};

/// A `max_wait` that a passing test never reaches: a waiter that sees it
/// run out fails its assertion (with `Timeout`) instead of hanging.
pub const LONG: Duration = Duration::from_secs(30);
/// A `max_wait` that must run out: only the error is checked, never the time.
pub const SHORT: Duration = Duration::from_millis(20);

/// A fail-fast limiter of `capacity` over `shards`.
pub fn limiter(capacity: usize, shards: usize) -> Limiter {
    Limiter::builder()
        .capacity(capacity)
        .shards(shards)
        .build()
        .unwrap()
}

/// A limiter with a waiting room.
pub fn room(
    capacity: usize,
    shards: usize,
    waiters: usize,
    wait: Duration,
    order: QueueOrder,
) -> Arc<Limiter> {
    Arc::new(
        Limiter::builder()
            .capacity(capacity)
            .shards(shards)
            .max_waiters(waiters)
            .max_wait(wait)
            .queue_order(order)
            .build()
            .unwrap(),
    )
}

/// Takes every unit, so the next caller must wait (no refusal counted).
pub fn fill(limiter: &Arc<Limiter>) -> Vec<OwnedPermit> {
    let held: Vec<_> = (0..limiter.capacity())
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    assert_eq!(limiter.available(), 0);
    held
}

/// Takes every unit with `try_acquire`, then checks the next is refused:
/// no unit was lost or duplicated.
pub fn every_unit_is_there(limiter: &Limiter) {
    assert_eq!(limiter.usage(), 0);
    assert_eq!(limiter.waiting(), 0);
    let all: Vec<_> = (0..limiter.capacity())
        .map(|_| limiter.try_acquire().expect("every unit back"))
        .collect();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop(all);
    assert_eq!(limiter.usage(), 0);
}
