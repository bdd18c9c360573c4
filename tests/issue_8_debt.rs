//! Issue 8: a waiter queued while a shrink's debt is outstanding must be
//! served once releases repay the debt, without needing a newcomer.
//!
//! `set_capacity(n)` below the held units leaves the table in debt. While
//! it is, `Table::hand_off` and `Table::grant_waiting` refuse to hand units
//! to waiters (correct: that would admit above `n`). But only
//! `Table::acquire_gated` (a *new* caller meeting a gated shard) calls
//! `settle`; a release never does. So when the holders release with only
//! waiters around, the debt is repaid but never settled: the units sit in
//! the table, gated, while the waiters sleep to their `max_wait` and get
//! `Timeout`, with capacity free the whole time. Any newcomer settles it
//! (and the waiters are then served first), so the bug shows only when the
//! waiters are the only callers, which is exactly when a waiting room is
//! meant to help.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sidejob::{Error, Limiter};

/// Long enough that a passing run never reaches it (the waiter is served
/// by the second drop, microseconds later); a failing run takes this long.
const MAX_WAIT: Duration = Duration::from_secs(2);

#[test]
fn a_waiter_is_served_when_releases_repay_a_shrink() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(2)
            .shards(1)
            .max_waiters(1)
            .max_wait(MAX_WAIT)
            .build()
            .unwrap(),
    );
    let a = limiter.try_acquire_owned().unwrap();
    let b = limiter.try_acquire_owned().unwrap();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.acquire().map(drop))
    };
    while limiter.waiting() == 0 {
        thread::yield_now();
    }
    // Two held above a capacity of 1: a debt of one.
    limiter.set_capacity(1).unwrap();
    drop(a); // repaid: 1 held, capacity 1
    drop(b); // 0 held: this unit is free, and someone is waiting for it
    assert_eq!(
        waiter.join().unwrap(),
        Ok(()),
        "the waiter slept through a free unit"
    );
    assert_eq!(limiter.stats().timed_out, 0);
    assert_eq!(limiter.usage(), 0);
    assert!(limiter.try_acquire().is_ok());
}

/// The same after a shrink to 0 and a grow back while still in debt: the
/// grow cannot settle (more is held than the new capacity), and later
/// releases do not either.
#[test]
fn a_waiter_is_served_after_a_debt_survives_a_grow() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(3)
            .shards(2)
            .max_waiters(1)
            .max_wait(MAX_WAIT)
            .build()
            .unwrap(),
    );
    let held: Vec<_> = (0..3)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.acquire().map(drop))
    };
    while limiter.waiting() == 0 {
        thread::yield_now();
    }
    limiter.set_capacity(0).unwrap();
    limiter.set_capacity(1).unwrap(); // 3 held > 1: still in debt
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(()));
    assert_eq!(limiter.usage(), 0);
    let one = limiter.try_acquire().unwrap();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop(one);
}
