//! Loom models of requests of many units (`engine/table/many.rs`).
//!
//! What they show, under every interleaving loom explores:
//!
//! * a take across shards that fails never makes a one-unit caller that
//!   would fit see `Overload`: of a wide request and a one-unit request
//!   that cannot both fit, one is always admitted (the wide take gates the
//!   shards it reads, and takes nothing until all its units are there);
//! * a take across shards racing a release and a shrink never admits
//!   above the capacity in force once the shrink is done, and loses no
//!   unit;
//! * two relative resizes racing each other both land, and a wide take
//!   racing them admits only within what is there.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --release --test loom_weighted`
//! (CI uses 2).
#![cfg(loom)]

use std::future::Future;
use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::thread;
use sidejob::loom_api::Table;
use sidejob::Error;

fn release_all(table: &Table, parts: &[(usize, usize)]) {
    for &(shard, units) in parts {
        table.release_units(shard, units);
    }
}

/// Capacity 3 over 3 shards, one unit held on shard 0: a wide request of
/// 2 (one free unit on each of shards 1 and 2, so it must go across) and a
/// one-unit request starting on shard 1 cannot both fit. Whatever the
/// interleaving, exactly one of them is admitted: the wide one's failure
/// never leaves the one-unit caller refused too.
#[test]
fn a_failed_wide_take_never_refuses_a_one_unit_caller_that_fits() {
    loom::model(|| {
        let table = Arc::new(Table::new(3, 3));
        assert_eq!(table.acquire_at(0), Ok(0));
        let wide = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.acquire_many_at(1, 2))
        };
        let one = table.acquire_at(1);
        let wide = wide.join().unwrap();
        match (&wide, &one) {
            (Ok(parts), Err(Error::Overload)) => {
                assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), 2);
            }
            (Err(Error::Overload), Ok(_)) => {}
            other => panic!("exactly one must be admitted: {other:?}"),
        }
        assert!(table.usage() <= 3);
        if let Ok(parts) = &wide {
            release_all(&table, parts);
        }
        if let Ok(shard) = one {
            table.release(shard);
        }
        table.release(0);
        assert_eq!(table.usage(), 0);
    });
}

/// Capacity 4 over 2 shards (2 each), one unit held on each. A releaser
/// gives back shard 0's unit while a resizer shrinks to 3 and a wide
/// request of 3 (1 free on shard 1, 2 on shard 0 once released: across
/// shards) races both. Once the shrink is seen, nothing more may enter
/// while 3 are held; at the end the bound the resize keeps holds, and
/// every unit comes back.
#[test]
fn a_wide_take_racing_a_release_and_a_shrink_stays_within_the_capacity() {
    let mut builder = loom::model::Builder::new();
    // Four threads: bounded, as tokio bounds its heaviest models.
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let table = Arc::new(Table::new(4, 2));
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(1), Ok(1));
        let shrunk = Arc::new(AtomicBool::new(false));
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(0))
        };
        let resizer = {
            let (table, shrunk) = (Arc::clone(&table), Arc::clone(&shrunk));
            thread::spawn(move || {
                table.set_capacity(3);
                // SeqCst: the flag only orders the model's own check below.
                shrunk.store(true, SeqCst);
            })
        };
        let wide = table.acquire_many_at(1, 3);
        if shrunk.load(SeqCst) {
            // The shrink is done: at capacity 3, with shard 1's unit still
            // held (and the wide take's, if any), one more is too many
            // unless fewer than 3 are held.
            let held = table.usage();
            if held >= 3 {
                assert_eq!(table.acquire_at(0), Err(Error::Overload), "held {held}");
            }
        }
        releaser.join().unwrap();
        resizer.join().unwrap();
        assert!(table.bound_holds(), "a unit held above its shard's limit");
        if let Ok(parts) = &wide {
            assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), 3);
            release_all(&table, parts);
        }
        table.release(1);
        assert_eq!(table.usage(), 0);
        // Capacity 3, nothing held: all three are there, no more.
        let all = table
            .acquire_many_at(0, 3)
            .expect("capacity 3, nothing held");
        assert_eq!(table.acquire_at(0), Err(Error::Overload));
        release_all(&table, &all);
        assert_eq!(table.usage(), 0);
    });
}

/// Two relative resizes race (+2 and -1 from capacity 2 over 2 shards)
/// while a wide request of 3 tries: both resizes land (capacity 3 after),
/// and the wide request is admitted only if 3 were there for it.
#[test]
fn relative_resizes_compose_and_a_wide_take_fits_within_them() {
    loom::model(|| {
        let table = Arc::new(Table::new(2, 2));
        let adder = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.add_capacity(2))
        };
        let remover = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.remove_capacity(1))
        };
        let wide = table.acquire_many_at(0, 3);
        adder.join().unwrap();
        remover.join().unwrap();
        assert_eq!(table.capacity(), 3, "both relative resizes landed");
        assert!(table.bound_holds());
        if let Ok(parts) = &wide {
            release_all(&table, parts);
        }
        assert_eq!(table.usage(), 0);
        let all = table
            .acquire_many_at(1, 3)
            .expect("capacity 3, nothing held");
        assert_eq!(table.acquire_at(1), Err(Error::Overload));
        release_all(&table, &all);
    });
}

/// A waker that does nothing: the models poll by hand.
fn noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

/// A waiter of 2 units (capacity 2 over 2 shards, both held, pass budget
/// 0) is queued; a release hands it one unit (collected: it is reserved)
/// while it gives up (its future dropped) and the other unit is released.
/// However they interleave, no unit is stranded on the waiter that left:
/// both units are back, nobody is queued, and 2 can be taken again.
#[test]
fn a_partial_grant_racing_a_cancel_strands_nothing() {
    use std::pin::pin;
    use std::task::{Context, Poll};
    loom::model(|| {
        let table = Arc::new(Table::with_waiters_and_budget(2, 2, 2, 0));
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(1), Ok(1));
        let waiter = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                let mut wait = pin!(table.acquire_many_async(2));
                let waker = noop_waker();
                let mut cx = Context::from_waker(&waker);
                match wait.as_mut().poll(&mut cx) {
                    // Both released before it looked: it holds them.
                    Poll::Ready(Ok(parts)) => release_all(&table, &parts[..]),
                    Poll::Ready(Err(err)) => panic!("unexpected {err}"),
                    // Queued (maybe with a unit collected): give up.
                    Poll::Pending => {}
                }
            })
        };
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(0))
        };
        table.release(1);
        waiter.join().unwrap();
        releaser.join().unwrap();
        assert_eq!(table.waiting(), 0, "a waiter left behind");
        assert_eq!(table.usage(), 0, "a unit stranded on the waiter that left");
        let both = table.acquire_many_at(0, 2).expect("both units are back");
        release_all(&table, &both);
    });
}

/// The reserved head: a waiter of 2 (pass budget 0) is queued ahead of a
/// waiter of 1, on a full table of 2. Two releases race: whatever the
/// order, the first waiter gets both units (freed units are kept for it;
/// the one-unit waiter never passes it), and the second is still queued.
#[test]
fn freed_units_go_to_the_reserved_head_not_past_it() {
    use std::pin::pin;
    use std::task::{Context, Poll};
    loom::model(|| {
        let table = Arc::new(Table::with_waiters_and_budget(2, 2, 2, 0));
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(1), Ok(1));
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut big = pin!(table.acquire_many_async(2));
        assert!(big.as_mut().poll(&mut cx).is_pending());
        let mut small = pin!(table.acquire_async());
        assert!(small.as_mut().poll(&mut cx).is_pending());
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(0))
        };
        table.release(1);
        releaser.join().unwrap();
        let Poll::Ready(Ok(parts)) = big.as_mut().poll(&mut cx) else {
            panic!("both units were kept for the head");
        };
        assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), 2);
        assert!(
            small.as_mut().poll(&mut cx).is_pending(),
            "passed a reserved head"
        );
        release_all(&table, &parts);
        let Poll::Ready(Ok(shard)) = small.as_mut().poll(&mut cx) else {
            panic!("then the one-unit waiter");
        };
        table.release(shard);
        assert_eq!((table.waiting(), table.usage()), (0, 0));
    });
}
