//! Resizing a `Limiter` at run time (`set_capacity`, issue 8): a grow hands
//! the new units to waiters without a release, a shrink never admits above
//! the new capacity whatever was held before, `available()` follows, and a
//! shrink's debt, once repaid by releases, serves the waiters (issue 8).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Limiter, QueueOrder};

use crate::common::until;
use crate::{every_unit_is_there, fill, room, LONG};

/// Issue 8: growing the capacity admits waiters with no release, the
/// oldest first, before `set_capacity` returns.
#[test]
fn growing_the_capacity_admits_waiters_without_a_release() {
    for shards in [1, 2, 4] {
        let limiter = room(1, shards, 4, LONG, QueueOrder::Fifo);
        let held = fill(&limiter);
        let (admitted_tx, admitted_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let waiters: Vec<_> = (0..2)
            .map(|k| {
                let shared = Arc::clone(&limiter);
                let admitted = admitted_tx.clone();
                let release = Arc::clone(&release_rx);
                let handle = thread::spawn(move || {
                    let permit = shared.acquire().expect("admitted by the resize");
                    admitted.send(k).unwrap();
                    release.lock().unwrap().recv().unwrap();
                    drop(permit);
                });
                until(|| limiter.waiting() == k + 1);
                handle
            })
            .collect();
        // One more unit: the oldest waiter has it when `set_capacity`
        // returns (granted before the shards are un-gated).
        limiter.set_capacity(2).unwrap();
        assert_eq!(limiter.waiting(), 1);
        assert_eq!(limiter.usage(), 2);
        assert_eq!(admitted_rx.recv().unwrap(), 0);
        assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
        limiter.set_capacity(3).unwrap();
        assert_eq!(admitted_rx.recv().unwrap(), 1);
        assert_eq!((limiter.waiting(), limiter.usage()), (0, 3));
        assert_eq!(limiter.available(), 0);
        for _ in 0..2 {
            release_tx.send(()).unwrap();
        }
        for waiter in waiters {
            waiter.join().unwrap();
        }
        drop(held);
        let stats = limiter.stats();
        assert_eq!((stats.waited, stats.timed_out, stats.accepted), (2, 0, 3));
        every_unit_is_there(&limiter);
    }
}

/// Issue 8: growing from a capacity of 0 admits a waiter.
#[test]
fn growing_from_zero_admits_a_waiter() {
    let limiter = room(2, 2, 1, LONG, QueueOrder::Fifo);
    limiter.set_capacity(0).unwrap();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    let waiter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.acquire().map(drop))
    };
    until(|| limiter.waiting() == 1);
    limiter.set_capacity(1).unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(()));
    every_unit_is_there(&limiter);
}

/// Churners admit through `acquire` while the main thread resizes through
/// `SIZES`; each admission checks that the permits held (an `active`
/// counter, bumped while a permit is held, never above the usage) are
/// within the capacity in force. A resize is bracketed by a generation
/// counter (odd while it runs); an admission whose call began and whose
/// check ran in one even generation was made under that generation's
/// capacity, and `set_capacity`'s promise (once it has returned, nothing is
/// admitted while `n` or more are held) bounds `active` by it, whatever
/// was held before the shrink.
#[test]
fn shrinking_under_churn_never_admits_above_the_new_capacity() {
    const START: usize = 6;
    const SIZES: [usize; 8] = [2, 5, 1, 0, 3, 6, 1, 4];
    const THREADS: usize = 6;
    // Each resize waits for this many more finished attempts.
    const STEP: usize = 300;
    let limiter = room(
        START,
        2,
        THREADS,
        Duration::from_millis(5),
        QueueOrder::Fifo,
    );
    let generation = Arc::new(AtomicUsize::new(0));
    let capacity_in_force = Arc::new(AtomicUsize::new(START));
    let active = Arc::new(AtomicUsize::new(0));
    let attempts = Arc::new(AtomicUsize::new(0));
    let checked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..THREADS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            let generation = Arc::clone(&generation);
            let capacity_in_force = Arc::clone(&capacity_in_force);
            let active = Arc::clone(&active);
            let attempts = Arc::clone(&attempts);
            let checked = Arc::clone(&checked);
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let mut outcomes = [0u64; 3]; // admitted, overload, timeout
                while !stop.load(SeqCst) {
                    let before = generation.load(SeqCst);
                    let capacity = capacity_in_force.load(SeqCst);
                    match limiter.acquire() {
                        Ok(permit) => {
                            let now = active.fetch_add(1, SeqCst) + 1;
                            if before % 2 == 0 && generation.load(SeqCst) == before {
                                assert!(now <= capacity, "{now} held under capacity {capacity}");
                                checked.fetch_add(1, SeqCst);
                            }
                            thread::yield_now();
                            active.fetch_sub(1, SeqCst);
                            drop(permit);
                            outcomes[0] += 1;
                        }
                        Err(Error::Overload) => outcomes[1] += 1,
                        Err(Error::Timeout) => outcomes[2] += 1,
                        Err(other) => panic!("{other}"),
                    }
                    attempts.fetch_add(1, SeqCst);
                }
                outcomes
            })
        })
        .collect();
    for &size in &SIZES {
        let target = attempts.load(SeqCst) + STEP;
        until(|| attempts.load(SeqCst) >= target);
        generation.fetch_add(1, SeqCst);
        limiter.set_capacity(size).unwrap();
        capacity_in_force.store(size, SeqCst);
        generation.fetch_add(1, SeqCst);
        assert_eq!(limiter.capacity(), size);
    }
    let target = attempts.load(SeqCst) + STEP;
    until(|| attempts.load(SeqCst) >= target);
    stop.store(true, SeqCst);
    let mut totals = [0u64; 3];
    for churner in churners {
        for (total, n) in totals.iter_mut().zip(churner.join().unwrap()) {
            *total += n;
        }
    }
    assert!(checked.load(SeqCst) > 0, "no admission was checked");
    let stats = limiter.stats();
    assert_eq!(stats.rejected, totals[1]);
    assert_eq!(stats.timed_out, totals[2]);
    assert_eq!(
        totals.iter().sum::<u64>(),
        attempts.load(SeqCst) as u64,
        "every attempt resolved"
    );
    assert!(stats.accepted >= totals[0]);
    assert_eq!(stats.completed, stats.accepted);
    every_unit_is_there(&limiter);
}

/// `available()` follows the usage and the capacity, and is 0 while a
/// shrink's debt is outstanding.
#[test]
fn available_follows_usage_and_capacity() {
    let limiter = room(5, 2, 1, LONG, QueueOrder::Fifo);
    assert_eq!(limiter.available(), 5);
    let mut held: Vec<_> = (0..3)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    assert_eq!(limiter.available(), 2);
    limiter.set_capacity(10).unwrap();
    assert_eq!(limiter.available(), 7);
    // Three held above a capacity of 2: nothing available until repaid.
    limiter.set_capacity(2).unwrap();
    assert_eq!((limiter.capacity(), limiter.available()), (2, 0));
    drop(held.pop());
    assert_eq!(limiter.available(), 0);
    drop(held.pop());
    assert_eq!(limiter.available(), 1);
    limiter.set_capacity(0).unwrap();
    assert_eq!(limiter.available(), 0);
    drop(held.pop());
    assert_eq!((limiter.usage(), limiter.available()), (0, 0));
    limiter.set_capacity(4).unwrap();
    assert_eq!(limiter.available(), 4);
    let one = limiter.try_acquire().unwrap();
    assert_eq!(limiter.available(), 3);
    drop(one);
    every_unit_is_there(&limiter);
}

/// Long enough that a passing run never reaches it (the waiter is served
/// by the second drop, microseconds later); a failing run takes this long.
const MAX_WAIT: Duration = Duration::from_secs(2);

/// Issue 8: a waiter queued while a shrink's debt is outstanding must be
/// served once releases repay the debt, without needing a newcomer.
///
/// `set_capacity(n)` below the held units leaves the table in debt. While
/// it is, `Table::hand_off` and `Table::grant_waiting` refuse to hand units
/// to waiters (correct: that would admit above `n`). But only
/// `Table::acquire_gated` (a *new* caller meeting a gated shard) called
/// `settle`; a release never did. So when the holders released with only
/// waiters around, the debt was repaid but never settled: the units sat in
/// the table, gated, while the waiters slept to their `max_wait` and got
/// `Timeout`, with capacity free the whole time. Any newcomer settled it
/// (and the waiters were then served first), so the bug showed only when
/// the waiters were the only callers, which is exactly when a waiting room
/// is meant to help.
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
    until(|| limiter.waiting() > 0);
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

/// Issue 8: the same after a shrink to 0 and a grow back while still in
/// debt: the grow cannot settle (more is held than the new capacity), and
/// later releases do not either.
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
    until(|| limiter.waiting() > 0);
    limiter.set_capacity(0).unwrap();
    limiter.set_capacity(1).unwrap(); // 3 held > 1: still in debt
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(()));
    assert_eq!(limiter.usage(), 0);
    let one = limiter.try_acquire().unwrap();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop(one);
}
