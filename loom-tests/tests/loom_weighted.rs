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
