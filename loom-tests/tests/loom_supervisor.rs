//! Loom model of the supervisor's registry: a guard dropped on one thread
//! while another reserves and a third lists the children.
//!
//! Checked in every interleaving:
//!
//! * the count never exceeds the capacity, and neither does a listing;
//! * a listing never shows a child twice;
//! * a listing that starts after a guard's drop has returned never shows
//!   that child (unregistration happens before the drop returns);
//! * a listing that does not show a departed child sees what that child
//!   wrote before its exit (the exit synchronizes with the listing);
//! * a listing that starts after a reserve has returned, while its guard is
//!   held, shows it;
//! * ids are unique among live children, and a slot taken again gets a new
//!   id (the reserver, which can only win the departed child's unit, never
//!   gets the departed child's id);
//! * two reservers racing for the slots of one shard never share a slot,
//!   and never both win when one unit is free;
//! * `wait_idle` returns `true` once the last guard is dropped, without a
//!   timeout: under loom the condition variable never times out, so a
//!   missed wake-up is a deadlock the model reports. The waiter scans the
//!   shards outside the idle lock and sleeps only while the idle epoch it
//!   read before the scan is unchanged: the models check that a leave
//!   racing with the scan still wakes it;
//! * `wait_idle_async`, driven by loom's `block_on` (whose waker is a loom
//!   notify, so a waker nobody wakes is a deadlock), resolves once the last
//!   guard is dropped, alone or next to a blocking waiter; a future polled
//!   once and dropped while the last child leaves does not keep a later
//!   waiter from being woken;
//! * at the end, nothing is left and the counters add up.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p
//! loom-tests --release --test loom_supervisor`.
#![cfg(loom)]

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use loom::sync::atomic::{
    AtomicBool, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};
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

/// A model of the slot races: three threads (drop, reserve, list) over the
/// slot words, each reservation a take, a slot claim and a clock read.
/// These do not finish at 3 preemptions within a CI budget (a 15-minute
/// local run did not complete), so they are capped at 2 whatever
/// `LOOM_MAX_PREEMPTIONS` asks, as tokio caps its heaviest models; the
/// smaller supervisor models run at the full bound.
fn slot_race_builder() -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(2).min(2));
    builder
}

fn model(capacity: usize, shards: usize) {
    slot_race_builder().check(move || {
        let sup = Supervisor::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .unwrap();
        // Fill the supervisor, so the reserver races the drop for the unit.
        let mut held: Vec<_> = (0..capacity).map(|_| sup.reserve().unwrap()).collect();
        let leaving = held.pop().unwrap();
        let held_ids: Vec<ChildId> = held.iter().map(|guard| guard.id()).collect();
        let leaving_id = leaving.id();
        let dropped = Arc::new(AtomicBool::new(false));
        // Written (Relaxed) by the leaving child before its exit: a listing
        // that no longer shows the child must see it.
        let work = Arc::new(AtomicUsize::new(0));
        // The id of the child the reserver holds, published while held
        // (0 = none yet; ids are published as a flag plus a slot).
        let reserved = Arc::new(AtomicUsize::new(0));
        let reserved_id = Arc::new(loom::sync::Mutex::new(None::<ChildId>));

        let dropper = {
            let (dropped, work) = (Arc::clone(&dropped), Arc::clone(&work));
            thread::spawn(move || {
                work.store(1, Relaxed);
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
                    // It could only win the departed child's unit (and, on
                    // one shard, its slot): never its id, nor a held one.
                    assert_ne!(guard.id(), leaving_id);
                    assert!(!held_ids.contains(&guard.id()));
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
            let (sup, dropped, reserved, reserved_id, work) = (
                sup.clone(),
                Arc::clone(&dropped),
                Arc::clone(&reserved),
                Arc::clone(&reserved_id),
                Arc::clone(&work),
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
                if !set.contains(&leaving_id) {
                    assert_eq!(work.load(Relaxed), 1, "exit not ordered before listing");
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

#[test]
fn drop_reserve_list_two_slots_one_shard() {
    // Both children on one registry shard: the reserver walks its slots
    // while the dropper frees one and the lister reads both.
    model(2, 1);
}

/// Two reservers race for one shard's slots while a third thread drops the
/// child that holds one of them.
#[test]
fn two_reservers_one_shard() {
    slot_race_builder().check(|| {
        let sup = Supervisor::builder().capacity(2).shards(1).build().unwrap();
        let first = sup.reserve().unwrap();
        let first_id = first.id();
        let dropper = thread::spawn(move || drop(first));
        let reservers: Vec<_> = (0..2)
            .map(|_| {
                let sup = sup.clone();
                thread::spawn(move || match sup.reserve() {
                    Ok(guard) => {
                        assert_ne!(guard.id(), first_id);
                        let listing = sup.which_children();
                        unique(&listing);
                        assert!(listing.len() <= 2, "{listing:?}");
                        assert!(listing.contains(&guard.id()), "own child missing");
                        Some(guard)
                    }
                    Err(Error::Overload) => None,
                    Err(other) => panic!("{other}"),
                })
            })
            .collect();
        dropper.join().unwrap();
        let won: Vec<_> = reservers
            .into_iter()
            .filter_map(|r| r.join().unwrap())
            .collect();
        // With the dropper done, every winner is live and listed once.
        let listing = unique(&sup.which_children());
        assert_eq!(listing.len(), won.len());
        assert!(won.iter().all(|guard| listing.contains(&guard.id())));
        assert_eq!(sup.count(), won.len());
        drop(won);
        assert!(sup.which_children().is_empty());
        assert!(sup.wait_idle(Duration::ZERO));
    });
}

/// `wait_idle` from one thread while each of `capacity` guards is dropped
/// on a thread of its own: it must return `true`. Loom's condition variable
/// never times out (and the timeout here is an hour), so a leave that
/// misses the waiter leaves it asleep, and loom reports the deadlock.
fn wait_idle_model(capacity: usize, shards: usize) {
    loom::model(move || {
        let sup = Supervisor::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .unwrap();
        let guards: Vec<_> = (0..capacity).map(|_| sup.reserve().unwrap()).collect();
        let waiter = {
            let sup = sup.clone();
            thread::spawn(move || sup.wait_idle(Duration::from_secs(3600)))
        };
        let droppers: Vec<_> = guards
            .into_iter()
            .map(|guard| thread::spawn(move || drop(guard)))
            .collect();
        for dropper in droppers {
            dropper.join().unwrap();
        }
        assert!(waiter.join().unwrap(), "wait_idle gave up");
        assert_eq!(sup.count(), 0);
        assert!(sup.which_children().is_empty());
    });
}

/// `wait_idle_async` on one thread (loom's `block_on`), optionally a
/// blocking `wait_idle` on another, while each of `capacity` guards is
/// dropped on a thread of its own: both must finish.
fn wait_idle_async_model(capacity: usize, shards: usize, with_blocking_waiter: bool) {
    loom::model(move || {
        let sup = Supervisor::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .unwrap();
        let guards: Vec<_> = (0..capacity).map(|_| sup.reserve().unwrap()).collect();
        let async_waiter = {
            let sup = sup.clone();
            thread::spawn(move || {
                loom::future::block_on(sup.wait_idle_async());
                // Resolved: every child had left.
                assert_eq!(sup.count(), 0);
            })
        };
        let blocking_waiter = with_blocking_waiter.then(|| {
            let sup = sup.clone();
            thread::spawn(move || sup.wait_idle(Duration::from_secs(3600)))
        });
        let droppers: Vec<_> = guards
            .into_iter()
            .map(|guard| thread::spawn(move || drop(guard)))
            .collect();
        for dropper in droppers {
            dropper.join().unwrap();
        }
        async_waiter.join().unwrap();
        if let Some(waiter) = blocking_waiter {
            assert!(waiter.join().unwrap(), "wait_idle gave up");
        }
        assert_eq!(sup.count(), 0);
    });
}

#[test]
fn wait_idle_async_wakes_on_the_last_leave() {
    wait_idle_async_model(1, 1, false);
}

#[test]
fn wait_idle_async_wakes_across_shards() {
    wait_idle_async_model(2, 2, false);
}

#[test]
fn wait_idle_async_and_blocking_waiter_both_wake() {
    wait_idle_async_model(1, 1, true);
}

/// A waker that does nothing: the cancelled future below is never woken.
struct NoopWaker;

impl std::task::Wake for NoopWaker {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// A `wait_idle_async` future is polled once (it registers), then dropped
/// while the last child leaves on another thread; a later
/// `wait_idle_async` and `wait_idle` must still finish, and the dropped
/// future must not have taken the wake-up with it.
#[test]
fn cancelled_wait_idle_async_loses_no_wake_up() {
    loom::model(|| {
        let sup = Supervisor::builder().capacity(1).shards(1).build().unwrap();
        let guard = sup.reserve().unwrap();
        let canceller = {
            let sup = sup.clone();
            thread::spawn(move || {
                let waker = std::task::Waker::from(std::sync::Arc::new(NoopWaker));
                let mut cx = std::task::Context::from_waker(&waker);
                let mut future = Box::pin(sup.wait_idle_async());
                let _ = future.as_mut().poll(&mut cx);
                drop(future);
            })
        };
        let waiter = {
            let sup = sup.clone();
            thread::spawn(move || loom::future::block_on(sup.wait_idle_async()))
        };
        let dropper = thread::spawn(move || drop(guard));
        canceller.join().unwrap();
        dropper.join().unwrap();
        waiter.join().unwrap();
        assert!(sup.wait_idle(Duration::from_secs(3600)));
        assert_eq!(sup.count(), 0);
    });
}

#[test]
fn wait_idle_wakes_on_the_last_leave() {
    wait_idle_model(1, 1);
}

#[test]
fn wait_idle_wakes_across_shards() {
    // Two leaves on two shards: the one that empties its shard last must
    // wake the waiter, whichever shard the waiter found busy.
    wait_idle_model(2, 2);
}

/// Never `Overload` below capacity: one thread reserves and drops while
/// another reserves, on one shard with room for both. (A reserve used to
/// read the shard's `taken`, then its `given`; a take and a give in between
/// made the gap negative, which read as "full": a spurious `Overload` with
/// 1 of 1024 units held, found by a 2-thread benchmark.)
#[test]
fn no_overload_below_capacity() {
    loom::model(|| {
        let sup = Supervisor::builder().capacity(2).shards(1).build().unwrap();
        let churner = {
            let sup = sup.clone();
            thread::spawn(move || drop(sup.reserve().expect("room for both")))
        };
        let guard = sup.reserve().expect("room for both");
        churner.join().unwrap();
        drop(guard);
        assert_eq!(sup.count(), 0);
        assert_eq!(sup.stats().rejected, 0);
    });
}
