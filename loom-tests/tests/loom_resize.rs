//! Loom models of runtime resize against admission.
//!
//! What they show, under every interleaving loom explores:
//!
//! * once `set_capacity(n)` has returned, nothing is admitted while `n` or
//!   more units are held, including by a taker that read the old limit
//!   before the resize gated its shard and made its CAS after the shard was
//!   un-gated again (the word back to the very value it expected): the take
//!   reads the limit again after its CAS and undoes itself above it (this
//!   model fails without that second read, and with the CAS's Acquire
//!   weakened);
//! * a shrink below what is held leaves a debt: nothing is admitted until
//!   enough units are back, then admission resumes, and no unit is lost;
//! * a grow makes its new room available to a taker that happens-after it.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --release --test loom_resize`
//! (CI uses 2).
#![cfg(loom)]

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::thread;
use sidejob::loom_api::Table;
use sidejob::Error;

/// A shrink races a taker that may have read the old limit. Capacity 2 over
/// 2 shards, one unit held on shard 0. The resizer shrinks to 1 and says so;
/// the racing taker tries shard 1 and keeps what it gets. After the resize
/// is seen, a second taker must be refused: 1 or more units are held.
#[test]
fn no_admission_at_the_new_capacity_after_a_shrink() {
    loom::model(|| {
        let table = Arc::new(Table::new(2, 2));
        assert_eq!(table.acquire_at(0), Ok(0));
        let resized = Arc::new(AtomicBool::new(false));
        let resizer = {
            let (table, resized) = (Arc::clone(&table), Arc::clone(&resized));
            thread::spawn(move || {
                table.set_capacity(1);
                // SeqCst: the flag only orders the model's own check below.
                resized.store(true, SeqCst);
            })
        };
        let racer = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.acquire_at(1).ok())
        };
        let raced = racer.join().unwrap();
        if resized.load(SeqCst) {
            // Held: shard 0's unit, and the racer's if it won before the
            // resize. Either way at least the new capacity.
            assert_eq!(
                table.acquire_at(1),
                Err(Error::Overload),
                "admitted at the new capacity"
            );
        }
        resizer.join().unwrap();
        assert_eq!(table.capacity(), 1);
        // The racer's unit, if it won, was taken before the gate (and is in
        // the holdings the split covered, or in the debt): a take that read
        // the old limit cannot land after the un-gate.
        assert!(table.bound_holds(), "a unit held above its shard's limit");
        // Drain; then exactly one unit is there to take.
        if let Some(shard) = raced {
            table.release(shard);
        }
        table.release(0);
        assert_eq!(table.usage(), 0);
        let one = table.acquire_at(1).expect("the unit of capacity 1");
        assert_eq!(table.acquire_at(0), Err(Error::Overload));
        table.release(one);
    });
}

/// A shrink to below what is held (a debt) races a release: whatever the
/// order, nothing is admitted while as many units as the new capacity are
/// held, and once all are back the new capacity is there in full.
#[test]
fn a_debt_is_repaid_by_releases_and_loses_nothing() {
    loom::model(|| {
        let table = Arc::new(Table::new(2, 2));
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(1), Ok(1));
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(1))
        };
        table.set_capacity(1);
        // Shard 0's unit is still held: at capacity 1 nothing may enter.
        assert_eq!(table.acquire_at(1), Err(Error::Overload));
        releaser.join().unwrap();
        assert_eq!(table.acquire_at(0), Err(Error::Overload));
        table.release(0);
        let one = table.acquire_at(1).expect("capacity 1, nothing held");
        assert_eq!(table.acquire_at(0), Err(Error::Overload));
        table.release(one);
        assert_eq!(table.usage(), 0);
    });
}

/// A grow from a full table races a taker; a taker that sees the grow done
/// is admitted, and the capacity is never exceeded.
#[test]
fn a_grow_makes_room_for_a_taker_that_sees_it() {
    loom::model(|| {
        let table = Arc::new(Table::new(1, 2));
        let held = table.acquire_at(0).expect("the one unit");
        let grown = Arc::new(AtomicBool::new(false));
        let resizer = {
            let (table, grown) = (Arc::clone(&table), Arc::clone(&grown));
            thread::spawn(move || {
                table.set_capacity(2);
                grown.store(true, SeqCst);
            })
        };
        let got = table.acquire_at(1);
        let mut taken: Vec<usize> = got.iter().copied().collect();
        if grown.load(SeqCst) && got.is_err() {
            // Refused before the grow was seen; after it, room is there.
            taken.push(table.acquire_at(1).expect("the grown unit"));
        }
        resizer.join().unwrap();
        assert!(table.usage() <= 2);
        assert!(table.bound_holds());
        for shard in taken {
            table.release(shard);
        }
        table.release(held);
        assert_eq!(table.usage(), 0);
    });
}
