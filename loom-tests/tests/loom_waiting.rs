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
//!   it;
//! * a take undone after a racing shrink (it read the old limit) serves a
//!   waiter that queued while the unit was counted;
//! * code the crate does not own runs after the control lock: a re-poll's
//!   old waker whose drop gives a unit back into the same table, and a
//!   grow's wake-up of a waker that calls back into the table, both finish
//!   (under the lock, both deadlocked).
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

/// A take undone after a racing shrink serves the room. Capacity 2 over
/// one shard, a room of one. X holds a unit, gives it back, shrinks to 1
/// and waits; T takes once (and gives back what it got). T may read the
/// old limit, land its CAS after the shrink's un-gate, and undo itself
/// above the new limit: that unit must reach X, who may have queued while
/// it was counted. With the undo a plain give-back, X sleeps forever
/// (loom reports the deadlock) while the unit is free.
#[test]
fn a_take_undone_after_a_shrink_serves_a_waiter() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(2, 1, 1));
        let x = table.acquire_at(0).expect("X's unit");
        let taker = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                if let Ok(shard) = table.acquire_at(0) {
                    table.release(shard);
                }
            })
        };
        table.release(x);
        table.set_capacity(1);
        let got = table.acquire_waiting().expect("served");
        taker.join().unwrap();
        assert_eq!(table.usage(), 1);
        assert_eq!(table.waiting(), 0);
        table.release(got);
        assert_eq!(table.usage(), 0);
    });
}

/// A waker that owns a unit of the table its future waits on: its last
/// drop gives the unit back (tokio's `release_permits_at_drop`).
struct OwnsUnit {
    table: Arc<Table>,
    shard: usize,
}

impl std::task::Wake for OwnsUnit {
    fn wake(self: Arc<Self>) {}
}

impl Drop for OwnsUnit {
    fn drop(&mut self) {
        self.table.release(self.shard);
    }
}

/// A waker that raises a flag.
struct Flag(loom::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, loom::sync::atomic::Ordering::SeqCst);
    }
}

/// A re-poll swaps the waiter's waker; the old one's drop gives a unit
/// back into this very table while another thread releases a second one.
/// The old waker is dropped after the control lock (dropped under it, the
/// release's hand-off took the lock again: a deadlock). Once both units
/// are back, the waiter holds one (and its new waker was woken if the
/// re-poll left it pending), the other is back, nobody is left queued.
#[test]
fn a_waker_swap_whose_old_waker_gives_a_unit_back() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(2, 1, 1));
        let first = table.acquire_at(0).expect("unit one");
        let second = table.acquire_at(0).expect("unit two");
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(second))
        };
        let mut wait = Box::pin(table.acquire_async());
        let owning = std::task::Waker::from(Arc::new(OwnsUnit {
            table: Arc::clone(&table),
            shard: first,
        }));
        let polled = wait.as_mut().poll(&mut Context::from_waker(&owning));
        // The room's clone (if queued) is now the only one that owns the
        // unit: the swap below drops it.
        drop(owning);
        let got = match polled {
            Poll::Ready(got) => got,
            Poll::Pending => {
                let flag = Arc::new(Flag(loom::sync::atomic::AtomicBool::new(false)));
                let waker = std::task::Waker::from(Arc::clone(&flag));
                let mut cx = Context::from_waker(&waker);
                match wait.as_mut().poll(&mut cx) {
                    Poll::Ready(got) => got,
                    Poll::Pending => {
                        // Both units are back once the releaser is done:
                        // one of them was handed to this waiter, through
                        // the new waker.
                        releaser.join().unwrap();
                        assert!(
                            flag.0.load(loom::sync::atomic::Ordering::SeqCst),
                            "granted, yet the new waker was not woken"
                        );
                        match wait.as_mut().poll(&mut cx) {
                            Poll::Ready(got) => {
                                drop(wait);
                                finish(&table, got.expect("a unit"));
                                return;
                            }
                            Poll::Pending => panic!("both units back, the waiter still queued"),
                        }
                    }
                }
            }
        };
        drop(wait);
        releaser.join().unwrap();
        finish(&table, got.expect("a unit"));
    });

    /// The end state: one unit held (the waiter's), nobody queued; then none.
    fn finish(table: &Table, got: usize) {
        assert_eq!(table.waiting(), 0);
        assert_eq!(table.usage(), 1);
        table.release(got);
        assert_eq!(table.usage(), 0);
    }
}

/// A waker whose `wake` calls back into the table.
struct Reentrant {
    table: Arc<Table>,
    got: loom::sync::Mutex<Vec<Result<usize, Error>>>,
}

impl std::task::Wake for Reentrant {
    fn wake(self: Arc<Self>) {
        let got = self.table.acquire_at(0);
        if let Ok(shard) = got {
            self.table.release(shard);
        }
        self.got.lock().unwrap().push(got);
    }
}

/// A grow hands a new unit to a waiting future whose waker calls
/// `acquire_at` on the same table: woken after the un-gate and the lock,
/// the call answers (woken under the lock, before the un-gate, it found
/// the shard gated and took the lock again). The waiter ends with its
/// unit; the waker saw the table open.
#[test]
fn a_grow_wakes_a_reentrant_waker_after_the_lock() {
    loom::model(|| {
        let table = Arc::new(Table::with_waiters(1, 1, 1));
        let held = table.acquire_at(0).expect("the one unit");
        let reentrant = Arc::new(Reentrant {
            table: Arc::clone(&table),
            got: loom::sync::Mutex::new(Vec::new()),
        });
        let waker = std::task::Waker::from(Arc::clone(&reentrant));
        let mut wait = Box::pin(table.acquire_async());
        assert!(wait
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        let grower = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.set_capacity(3))
        };
        grower.join().unwrap();
        let got = match wait.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(got) => got.expect("the grown unit"),
            Poll::Pending => panic!("the grow served nobody"),
        };
        // Woken once; the third unit was free when it ran.
        let answers = reentrant.got.lock().unwrap().clone();
        assert_eq!(answers, [Ok(0)]);
        table.release(got);
        table.release(held);
        assert_eq!(table.usage(), 0);
    });
}
