//! Loom models of the waiting room (`src/engine/waiters.rs`).
//!
//! What they show, under every interleaving loom explores:
//!
//! * a waiter never sleeps through a release: a blocked `acquire_waiting`
//!   is admitted once a unit comes back, whichever order the waiter's
//!   registration and the release take (a lost wake-up would leave the
//!   model deadlocked, which loom reports);
//! * the hand-off race: a release, a waiter that gives up (its future is
//!   dropped after one poll) and a newcomer's probe; the unit ends with
//!   exactly one owner or back in the table, and nobody is left queued;
//! * growing the capacity wakes a blocked waiter with the new room;
//! * closing the table wakes a blocked waiter with `Shutdown`;
//! * a waiter queued during a shrink's debt is served once releases repay
//!   it.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --release --test loom_waiting`
//! (CI uses 2).
#![cfg(loom)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use loom::thread;
use sidejob::loom_api::Table;
use sidejob::Error;

/// One unit, held; a releaser gives it back while the main thread waits
/// for it. The wait must end with the unit (never a lost wake-up).
#[test]
fn a_waiter_never_sleeps_through_a_release() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(1, 1, 1));
        let held = table.acquire_at(0).expect("the one unit");
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(held))
        };
        let got = table.acquire_waiting().expect("the released unit");
        assert_eq!(table.usage(), 1);
        assert_eq!(table.waiting(), 0);
        // The waiter's own snapshot counts its admission, whether it was
        // handed the unit (counted under the lock), took it on its
        // re-check, or never had to wait.
        let (accepted, waited) = table.accepted_and_waited();
        assert_eq!(accepted, 2);
        assert!(waited <= 1);
        releaser.join().unwrap();
        table.release(got);
        assert_eq!(table.usage(), 0);
    });
}

/// Two shards, both full; both are released while the main thread waits:
/// it gets one of them, and the other is back in the table.
#[test]
fn a_waiter_is_woken_across_shards() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(2, 2, 1));
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(1), Ok(1));
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(1))
        };
        let got = table.acquire_waiting().expect("the released unit");
        assert_eq!(got, 1);
        releaser.join().unwrap();
        table.release(got);
        table.release(0);
        assert_eq!(table.usage(), 0);
    });
}

/// The hand-off race: the unit is released while a waiter registered by
/// one poll gives up (its future dropped) and a newcomer probes. However
/// they interleave, the unit has one owner or is back, and the queue is
/// empty.
#[test]
fn hand_off_against_cancellation_and_a_newcomer() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(1, 1, 1));
        let held = table.acquire_at(0).expect("the one unit");
        let waiter = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                let mut wait = pin!(table.acquire_async());
                let waker = futures_noop_waker();
                let mut cx = Context::from_waker(&waker);
                match wait.as_mut().poll(&mut cx) {
                    // Admitted on the first poll (the release came first):
                    // it owns the unit; give it back.
                    Poll::Ready(Ok(shard)) => table.release(shard),
                    Poll::Ready(Err(err)) => panic!("unexpected {err}"),
                    // Queued: give up. A unit handed over meanwhile goes
                    // back (or to the next waiter).
                    Poll::Pending => {}
                }
            })
        };
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(held))
        };
        let newcomer = table.acquire_at(0).ok();
        waiter.join().unwrap();
        releaser.join().unwrap();
        assert_eq!(table.waiting(), 0, "a waiter left behind");
        assert_eq!(table.usage(), usize::from(newcomer.is_some()));
        if let Some(shard) = newcomer {
            table.release(shard);
        }
        // The unit was not stranded: it can be taken again.
        let again = table.acquire_at(0).expect("the unit is back");
        table.release(again);
    });
}

/// A waiter blocked on a full table is admitted by a grow, with no
/// release.
#[test]
fn a_grow_wakes_a_blocked_waiter() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(1, 2, 1));
        let held = table.acquire_at(0).expect("the one unit");
        let grower = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.set_capacity(2))
        };
        let got = table.acquire_waiting().expect("the grown unit");
        grower.join().unwrap();
        assert_eq!(table.usage(), 2);
        table.release(got);
        table.release(held);
    });
}

/// Closing the table wakes a blocked waiter with `Shutdown`, or it got in
/// before the close (it cannot: the only unit is held).
#[test]
fn close_wakes_a_blocked_waiter() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(1, 1, 1));
        let held = table.acquire_at(0).expect("the one unit");
        let closer = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.close())
        };
        assert_eq!(table.acquire_waiting(), Err(Error::Shutdown));
        closer.join().unwrap();
        assert_eq!(table.waiting(), 0);
        table.release(held);
        assert_eq!(table.usage(), 0);
    });
}

/// A waker that does nothing: the models poll by hand.
fn futures_noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

/// A waiter queued during a shrink's debt is served once releases repay
/// it, with no new admission to settle the debt for it.
#[test]
fn a_waiter_in_a_debt_is_served_once_it_is_repaid() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(2, 1, 1));
        let a = table.acquire_at(0).expect("unit a");
        let b = table.acquire_at(0).expect("unit b");
        table.set_capacity(1); // two held: a debt of one
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                table.release(a);
                table.release(b);
            })
        };
        let got = table
            .acquire_waiting()
            .expect("served once the debt is repaid");
        releaser.join().unwrap();
        assert_eq!(table.usage(), 1);
        assert_eq!(table.acquire_at(0), Err(Error::Overload));
        table.release(got);
    });
}
