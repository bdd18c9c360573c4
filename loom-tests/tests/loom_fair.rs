//! Loom models of tenant keys (`src/engine/keys/`,
//! `src/engine/table/keyed.rs`, `src/engine/waiters/fair.rs`).
//!
//! What they show, under every interleaving loom explores:
//!
//! * two takes of one key racing for the last unit of its cap: exactly one
//!   gets it, and the count ends at the cap (the count is changed by a
//!   CAS on the key's word, or under its stripe's lock with the word
//!   pinned, so a cap is exact);
//! * a key's last release (which forgets it and takes its weight out of
//!   the active weight) racing its own next take: the key ends with one
//!   count, one entry and its weight counted once;
//! * a share check racing the release of another key's last unit (the
//!   active weight falls under it): never over the capacity, and the
//!   ledger ends equal to what is held;
//! * a keyed waiter racing the release of another key's unit: it is
//!   handed the unit, its key counts it, and it never sleeps through the
//!   release (a lost wake-up leaves the model deadlocked, which loom
//!   reports);
//! * a resident key's release racing a rule set for it (which pins its
//!   word and moves it to the map): its count survives either order
//!   (fails without the pin);
//! * a sweep of an idle word racing the key's return: counted once in
//!   the active weight either way;
//! * two keys of one word (under loom every key shares one) coming and
//!   going at once, through the word, an idle word taken over, and the
//!   map: both admitted, the ledger empty after (fails if a lost claim
//!   does not count its key back out).
//!
//! Under loom a ledger has one stripe and one resident word, so any two
//! keys meet in it.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --release --test loom_fair`
//! (CI uses 2).
#![cfg(loom)]

use std::sync::Arc;

use loom::thread;
use sidejob::loom_api::Table;
use sidejob::Error;

/// Capacity 4 over two shards, every key's cap 1: two takes of key 7
/// from different shards. Exactly one is admitted, the other refused
/// with `KeyBusy`, and the key's count is 1.
#[test]
fn two_takes_of_one_key_never_pass_its_cap() {
    loom::model(|| {
        let table = Arc::new(Table::with_keys(4, 2, Some(1), 1.0, 0));
        let takers: Vec<_> = (0..2)
            .map(|start| {
                let table = Arc::clone(&table);
                thread::spawn(move || table.acquire_keyed(7, start, 1, false))
            })
            .collect();
        let answers: Vec<_> = takers.into_iter().map(|t| t.join().unwrap()).collect();
        let admitted: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        assert_eq!(admitted.len(), 1, "{answers:?}");
        assert!(answers.contains(&Err(Error::KeyBusy)), "{answers:?}");
        assert_eq!((table.key_held(7), table.usage()), (1, 1));
        let (shard, units) = admitted[0][0];
        table.release_keyed(7, shard, units);
        assert_eq!(table.keys_state(), (0, 0));
    });
}

/// Key 3 holds one unit. Its release (which forgets it) races its next
/// take: the take is admitted (capacity 2), and the key ends with one
/// count, one entry and a weight of 1 counted once.
#[test]
fn a_key_forgotten_as_it_comes_back_is_counted_once() {
    loom::model(|| {
        let table = Arc::new(Table::with_keys(2, 1, None, 1.0, 0));
        let first = table.acquire_keyed(3, 0, 1, false).unwrap();
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release_keyed(3, first[0].0, 1))
        };
        let again = table.acquire_keyed(3, 0, 1, false).unwrap();
        releaser.join().unwrap();
        assert_eq!((table.key_held(3), table.keys_state()), (1, (1, 1)));
        table.release_keyed(3, again[0].0, 1);
        assert_eq!((table.usage(), table.keys_state()), (0, (0, 0)));
    });
}

/// Capacity 2 on one shard, a fair line of 1 unit; keys 1 and 2 hold one
/// unit each (the table is full). Key 2's release (the active weight falls
/// from 2 to 1) races key 1's second take, whose share is 1 unit while
/// key 2 holds one and 2 once it does not: admitted only if it read the
/// weight after the release and found the unit back. Never over the
/// capacity; the ledger ends equal to what is held.
#[test]
fn a_share_check_racing_another_keys_release_stays_within_the_capacity() {
    loom::model(|| {
        let table = Arc::new(Table::with_keys(2, 1, None, 0.5, 0));
        let one = table.acquire_keyed(1, 0, 1, false).unwrap();
        let two = table.acquire_keyed(2, 0, 1, false).unwrap();
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release_keyed(2, two[0].0, 1))
        };
        let second = table.acquire_keyed(1, 0, 1, false);
        assert!(table.usage() <= 2);
        releaser.join().unwrap();
        match second {
            Ok(parts) => {
                assert_eq!((table.key_held(1), table.usage()), (2, 2));
                table.release_keyed(1, parts[0].0, 1);
            }
            Err(err) => {
                assert_eq!(err, Error::Overload);
                assert_eq!((table.key_held(1), table.usage()), (1, 1));
            }
        }
        assert_eq!(table.keys_state(), (1, 1));
        table.release_keyed(1, one[0].0, 1);
        assert_eq!((table.usage(), table.keys_state()), (0, (0, 0)));
    });
}

/// Capacity 1 with a room; key 1 holds the unit. Key 2 waits for one;
/// key 1's release races it. The waiter is granted (handed the unit, or
/// taking it from the table), key 2's count is 1 and key 1's 0, and it
/// never sleeps through the release.
#[test]
fn a_keyed_waiter_is_handed_the_unit_another_key_gives_back() {
    loom::model(|| {
        let table = Arc::new(Table::with_keys(1, 1, None, 1.0, 2));
        let held = table.acquire_keyed(1, 0, 1, false).unwrap();
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release_keyed(1, held[0].0, 1))
        };
        let granted = table.acquire_keyed(2, 0, 1, true).unwrap();
        releaser.join().unwrap();
        assert_eq!(
            (table.key_held(1), table.key_held(2), table.usage()),
            (0, 1, 1)
        );
        table.release_keyed(2, granted[0].0, 1);
        assert_eq!((table.usage(), table.keys_state()), (0, (0, 0)));
    });
}

/// Under loom every key shares one resident word. Key 1 holds 2 units in
/// it; its release of one (a CAS on the word) races a weight set for it
/// (under the lock: the word pinned, the key moved to the map with its
/// count). Either order, the key ends with 1 unit, in the map, weighed 3.
#[test]
fn a_rule_set_as_a_resident_key_leaves_keeps_its_count() {
    loom::model(|| {
        let table = Arc::new(Table::with_keys(4, 1, None, 1.0, 0));
        let shard = table.acquire_keyed(1, 0, 2, false).unwrap()[0].0;
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release_keyed(1, shard, 1))
        };
        table.set_key_weight(1, 3);
        releaser.join().unwrap();
        assert_eq!((table.key_held(1), table.keys_state()), (1, (3, 1)));
        table.release_keyed(1, shard, 1);
        assert_eq!((table.usage(), table.keys_state()), (0, (0, 1)));
    });
}

/// Key 1 took a unit and gave it back: its word is idle, still counted
/// in the active weight. A sweep (emptying it, counting it out) races the
/// key's return through its short path (taking the idle word back, or
/// claiming the emptied one). Either way the key holds 1 unit, counted
/// once, and nothing is left after it goes.
#[test]
fn a_sweep_racing_an_idle_keys_return_counts_it_once() {
    loom::model(|| {
        let table = Arc::new(Table::with_keys(2, 1, None, 1.0, 0));
        let first = table.try_keyed(1).unwrap();
        table.release_keyed(1, first, 1);
        let sweeper = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.sweep_keys())
        };
        let again = table.try_keyed(1).unwrap();
        sweeper.join().unwrap();
        assert_eq!((table.key_held(1), table.keys_state()), (1, (1, 1)));
        table.release_keyed(1, again, 1);
        assert_eq!((table.usage(), table.keys_state()), (0, (0, 0)));
    });
}

/// Two keys of one word, each cap 1, each taking a unit through the
/// short path and giving it back, at once: one lives in the word (or
/// takes the other's idle word over), the other in the map under the
/// lock, and a key may move between them as the other comes and goes.
/// Both are admitted (capacity 2), neither is counted twice, and the
/// ledger ends empty.
#[test]
fn two_keys_of_one_word_come_and_go_together() {
    loom::model(|| {
        let table = Arc::new(Table::with_keys(2, 1, Some(1), 1.0, 0));
        let other = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                let shard = table.try_keyed(2).unwrap();
                assert_eq!(table.key_held(2), 1);
                table.release_keyed(2, shard, 1);
            })
        };
        let shard = table.try_keyed(1).unwrap();
        assert_eq!(table.key_held(1), 1);
        table.release_keyed(1, shard, 1);
        other.join().unwrap();
        assert_eq!((table.usage(), table.keys_state()), (0, (0, 0)));
    });
}
