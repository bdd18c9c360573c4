//! Loom model of the supervisor's registry: a guard dropped on one thread
//! while another reserves and a third lists the children.
//!
//! Checked in every interleaving:
//!
//! * the count never exceeds the capacity, and neither does a listing;
//! * a listing never shows a child twice;
//! * a listing that starts after a guard's drop has returned never shows
//!   that child (unregistration happens before the drop returns);
//! * a listing that starts after a reserve has returned, while its guard is
//!   held, shows it;
//! * at the end, nothing is left and the counters add up.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p
//! loom-tests --release --test loom_supervisor`.
#![cfg(loom)]

use std::collections::HashSet;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use sidejob::{ChildId, Error, Supervisor};

/// The set of ids in a listing, asserting it has no duplicate.
fn unique(listing: &[ChildId]) -> HashSet<ChildId> {
    let set: HashSet<ChildId> = listing.iter().copied().collect();
    assert_eq!(
        set.len(),
        listing.len(),
        "a child listed twice: {listing:?}"
    );
    set
}

fn model(capacity: usize, shards: usize) {
    loom::model(move || {
        let sup = Supervisor::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .unwrap();
        // Fill the supervisor, so the reserver races the drop for the unit.
        let mut held: Vec<_> = (0..capacity).map(|_| sup.reserve().unwrap()).collect();
        let leaving = held.pop().unwrap();
        let leaving_id = leaving.id();
        let dropped = Arc::new(AtomicBool::new(false));
        // The id of the child the reserver holds, published while held
        // (0 = none yet; ids are published as a flag plus a slot).
        let reserved = Arc::new(AtomicUsize::new(0));
        let reserved_id = Arc::new(loom::sync::Mutex::new(None::<ChildId>));

        let dropper = {
            let dropped = Arc::clone(&dropped);
            thread::spawn(move || {
                drop(leaving);
                dropped.store(true, SeqCst);
            })
        };

        let reserver = {
            let (sup, reserved, reserved_id) =
                (sup.clone(), Arc::clone(&reserved), Arc::clone(&reserved_id));
            thread::spawn(move || match sup.reserve() {
                Ok(guard) => {
                    assert!(sup.count() <= capacity);
                    *reserved_id.lock().unwrap() = Some(guard.id());
                    reserved.store(1, SeqCst);
                    // Hold it across the lister's read, then let go.
                    thread::yield_now();
                    reserved.store(2, SeqCst);
                    drop(guard);
                    true
                }
                Err(Error::Overload) => false,
                Err(other) => panic!("{other}"),
            })
        };

        let lister = {
            let (sup, dropped, reserved, reserved_id) = (
                sup.clone(),
                Arc::clone(&dropped),
                Arc::clone(&reserved),
                Arc::clone(&reserved_id),
            );
            thread::spawn(move || {
                let was_dropped = dropped.load(SeqCst);
                let was_reserved = reserved.load(SeqCst) == 1;
                let listing = sup.which_children();
                let still_reserved = reserved.load(SeqCst) == 1;
                let set = unique(&listing);
                assert!(listing.len() <= capacity, "{listing:?}");
                assert!(sup.count() <= capacity);
                if was_dropped {
                    assert!(!set.contains(&leaving_id), "released child listed");
                }
                if was_reserved && still_reserved {
                    let id = reserved_id.lock().unwrap().unwrap();
                    assert!(set.contains(&id), "held child missing");
                }
            })
        };

        dropper.join().unwrap();
        let _admitted = reserver.join().unwrap();
        lister.join().unwrap();
        drop(held);

        assert_eq!(sup.count(), 0);
        assert!(sup.which_children().is_empty());
        let stats = sup.stats();
        assert_eq!(stats.accepted, stats.completed);
        assert_eq!(
            stats.accepted as usize + stats.rejected as usize,
            capacity + 1
        );
    });
}

#[test]
fn drop_reserve_list_one_shard() {
    model(1, 1);
}

#[test]
fn drop_reserve_list_two_shards() {
    model(2, 2);
}
