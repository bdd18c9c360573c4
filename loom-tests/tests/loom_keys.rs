//! Loom models of the supervisor's key set (`engine/keys/children/`): a key's
//! entry inserted by one thread while another removes it, and a waiter
//! handed the key by a release.
//!
//! Checked in every interleaving:
//!
//! * two callers admitting the same key (per key 1) are never both live:
//!   a live count kept by the children themselves never reads 2;
//! * a caller admitting a key while its last child leaves (the entry
//!   removed as it is looked up) either gets in or is refused with
//!   `KeyBusy` while the child is still live: never refused by a key
//!   nobody holds (a caller that saw the drop return is admitted);
//! * the key set is empty once every child has ended: the entry is never
//!   left behind by a remove that raced an insert;
//! * a blocked waiter (`reserve_keyed` with a waiting room) is handed the
//!   key when its holder leaves on another thread, and a future waiting
//!   (`reserve_keyed_async` under loom's `block_on`, whose waker is a loom
//!   notify) is too: under loom a condition variable never times out, so
//!   a missed hand-off is a deadlock the model reports;
//! * `close` racing a blocked waiter wakes it with `Shutdown`;
//! * two keys sharing a resident slot (under loom every key shard has
//!   one): the second is filed in the overflow map and pins the slot; a
//!   key held in the map never also moves into the slot its neighbour
//!   emptied; a key's last exit leaves its word idle, which the other key
//!   takes over or the key itself takes back, and a key that saw its own
//!   child end is always admitted again; once both are gone no key
//!   counts as busy.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p
//! loom-tests --release --test loom_keys`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use sidejob::{Error, Supervisor};

fn supervisor(max_waiters: usize) -> Supervisor {
    Supervisor::builder()
        .capacity(2)
        .shards(1)
        .max_waiters(max_waiters)
        .build()
        .unwrap()
}

/// Two threads admit the same key at once; the one that gets in is the
/// only live child of the key until it leaves.
#[test]
fn two_admissions_of_one_key_never_both_live() {
    loom::model(|| {
        let sup = supervisor(0);
        let live = Arc::new(AtomicUsize::new(0));
        let admit = |sup: Supervisor, live: Arc<AtomicUsize>| {
            thread::spawn(move || match sup.try_reserve_keyed("k") {
                Ok(guard) => {
                    assert_eq!(live.fetch_add(1, SeqCst), 0, "two children of one key");
                    live.fetch_sub(1, SeqCst);
                    drop(guard);
                    true
                }
                Err(Error::KeyBusy) => false,
                Err(other) => panic!("{other}"),
            })
        };
        let a = admit(sup.clone(), Arc::clone(&live));
        let b = admit(sup.clone(), Arc::clone(&live));
        let admitted = [a.join().unwrap(), b.join().unwrap()];
        assert!(admitted.iter().any(|&ok| ok), "one of them always gets in");
        assert_eq!((sup.busy_keys(), sup.count()), (0, 0));
    });
}

/// The key's last child leaves (its entry removed) while another caller
/// admits the key (its entry inserted).
#[test]
fn insert_racing_the_remove_of_a_key() {
    loom::model(|| {
        let sup = supervisor(0);
        let holder = sup.try_reserve_keyed("k").unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        let leaver = {
            let dropped = Arc::clone(&dropped);
            thread::spawn(move || {
                drop(holder);
                dropped.store(true, SeqCst);
            })
        };
        let admitter = {
            let (sup, dropped) = (sup.clone(), Arc::clone(&dropped));
            thread::spawn(move || {
                let saw_drop = dropped.load(SeqCst);
                match sup.try_reserve_keyed("k") {
                    Ok(guard) => {
                        assert!(sup.busy_keys() == 1);
                        drop(guard);
                    }
                    Err(Error::KeyBusy) => {
                        assert!(!saw_drop, "refused by a key nobody holds")
                    }
                    Err(other) => panic!("{other}"),
                }
            })
        };
        leaver.join().unwrap();
        admitter.join().unwrap();
        assert_eq!((sup.busy_keys(), sup.count()), (0, 0));
        // The key is free again.
        drop(sup.try_reserve_keyed("k").unwrap());
        assert_eq!(sup.busy_keys(), 0);
    });
}

/// A thread blocked waiting for the key is handed it when the holder
/// leaves on another thread.
#[test]
fn a_blocked_waiter_is_handed_the_key() {
    loom::model(|| {
        let sup = supervisor(1);
        let holder = sup.try_reserve_keyed("k").unwrap();
        let waiter = {
            let sup = sup.clone();
            thread::spawn(move || {
                let guard = sup.reserve_keyed("k").unwrap();
                assert_eq!(sup.try_reserve_keyed("k").unwrap_err(), Error::KeyBusy);
                drop(guard);
            })
        };
        let leaver = thread::spawn(move || drop(holder));
        leaver.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(
            (sup.busy_keys(), sup.count(), sup.waiting_for_keys()),
            (0, 0, 0)
        );
    });
}

/// The same with a future under loom's `block_on`.
#[test]
fn a_waiting_future_is_handed_the_key() {
    loom::model(|| {
        let sup = supervisor(1);
        let holder = sup.try_reserve_keyed("k").unwrap();
        let leaver = thread::spawn(move || drop(holder));
        let guard = loom::future::block_on(sup.reserve_keyed_async("k")).unwrap();
        assert_eq!(sup.busy_keys(), 1);
        drop(guard);
        leaver.join().unwrap();
        assert_eq!(
            (sup.busy_keys(), sup.count(), sup.waiting_for_keys()),
            (0, 0, 0)
        );
    });
}

/// `close` racing a thread about to wait for a busy key: it is woken
/// with `Shutdown`, never left asleep.
#[test]
fn close_wakes_a_blocked_key_waiter() {
    loom::model(|| {
        let sup = supervisor(1);
        let holder = sup.try_reserve_keyed("k").unwrap();
        let waiter = {
            let sup = sup.clone();
            thread::spawn(move || sup.reserve_keyed("k").map(drop))
        };
        let closer = {
            let sup = sup.clone();
            thread::spawn(move || sup.close())
        };
        closer.join().unwrap();
        assert_eq!(waiter.join().unwrap(), Err(Error::Shutdown));
        drop(holder);
        assert_eq!(
            (sup.busy_keys(), sup.count(), sup.waiting_for_keys()),
            (0, 0, 0)
        );
    });
}

/// Under loom a key shard has one resident slot, so "a" and "b" share it:
/// the second is filed in the map and pins the slot. While "b" is held
/// there, the slot emptied by "a" must never let another "b" move in.
#[test]
fn a_key_in_the_map_never_also_claims_the_emptied_slot() {
    loom::model(|| {
        let sup = supervisor(0);
        let a = sup.try_reserve_keyed("a").unwrap();
        let b = sup.try_reserve_keyed("b").unwrap();
        let leaver = thread::spawn(move || drop(a));
        let admitter = {
            let sup = sup.clone();
            thread::spawn(move || {
                assert_eq!(sup.try_reserve_keyed("b").unwrap_err(), Error::KeyBusy);
            })
        };
        leaver.join().unwrap();
        admitter.join().unwrap();
        assert_eq!(sup.busy_keys(), 1);
        drop(b);
        assert_eq!((sup.busy_keys(), sup.count()), (0, 0));
        // Both keys free again (the slot unpinned and empty).
        drop(sup.try_reserve_keyed("b").unwrap());
        drop(sup.try_reserve_keyed("a").unwrap());
        assert_eq!(sup.busy_keys(), 0);
    });
}

/// Two keys sharing the slot come and go on two threads: each key's own
/// live count never reads 2, and nothing is left behind.
#[test]
fn two_keys_sharing_a_slot_come_and_go() {
    loom::model(|| {
        let sup = supervisor(0);
        let a = sup.try_reserve_keyed("a").unwrap();
        let live_b = Arc::new(AtomicUsize::new(0));
        let other = {
            let (sup, live_b) = (sup.clone(), Arc::clone(&live_b));
            thread::spawn(move || {
                if let Ok(guard) = sup.try_reserve_keyed("b") {
                    assert_eq!(live_b.fetch_add(1, SeqCst), 0);
                    live_b.fetch_sub(1, SeqCst);
                    drop(guard);
                }
            })
        };
        let again = {
            let sup = sup.clone();
            thread::spawn(move || {
                drop(a);
                match sup.try_reserve_keyed("a") {
                    Ok(guard) => drop(guard),
                    Err(err) => panic!("a was free: {err}"),
                }
            })
        };
        other.join().unwrap();
        again.join().unwrap();
        assert_eq!((sup.busy_keys(), sup.count()), (0, 0));
        drop(sup.try_reserve_keyed("b").unwrap());
    });
}
