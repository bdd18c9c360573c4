//! A min share per sheddable class (issue 36): while the units a class
//! holds stay within it, the class is admitted above its line, and a
//! waiting room serves it ahead of the classes above; its count follows
//! every guard (split, merge, forget); bad settings; and stress tests with
//! a shadow ledger per class, fail-fast and waiting.

use std::sync::Arc;
use std::time::Duration;

use sidejob::units::Ask;
use sidejob::{Class, Error, Limiter, LimiterBuilder, QueueOrder};

use super::classes::{ledger_stress, queue_waiters};
use super::common::until;
use super::LONG;

fn ask(class: Class) -> Ask {
    Ask::new().class(class).fail_fast()
}

/// Units `class` holds, as its figures say.
fn held(limiter: &Limiter, class: Class) -> usize {
    limiter.stats().classes[class.rank()]
        .held
        .expect("a sheddable class is counted")
}

/// A builder of `capacity` over `shards`, `Sheddable` with a headroom of
/// `low` and a min share of `share`.
fn builder(capacity: usize, shards: usize, low: f64, share: f64) -> LimiterBuilder {
    let mut builder = Limiter::builder();
    builder
        .capacity(capacity)
        .shards(shards)
        .headroom(Class::Sheddable, low)
        .min_share(Class::Sheddable, share);
    builder
}

#[test]
fn a_min_share_admits_a_sheddable_class_above_its_line_up_to_the_share() {
    for shards in [1, 2, 4] {
        // Line 5 of 10, min share 2.
        let limiter = builder(10, shards, 0.5, 0.2).build().unwrap();
        let users: Vec<_> = (0..6).map(|_| limiter.try_acquire().unwrap()).collect();
        // 6 held: over the line in total. Two are admitted, one at a time
        // (on one shard, on the min share; on more, a shard still under
        // its own line may admit one), and the class's count says two.
        let first = limiter.acquire_with(ask(Class::Sheddable)).unwrap();
        let second = limiter.acquire_with(ask(Class::Sheddable)).unwrap();
        assert_eq!(held(&limiter, Class::Sheddable), 2, "{shards} shards");
        let third = limiter.acquire_with(ask(Class::Sheddable));
        assert_eq!(third.unwrap_err(), Error::Overload, "share full, 2 free");
        // One back: its place on the share is free again.
        drop(first);
        assert_eq!(held(&limiter, Class::Sheddable), 1);
        let again = limiter.acquire_with(ask(Class::Sheddable)).unwrap();
        // An ask of more than is left of the share is refused whole.
        drop(second);
        let two = limiter.acquire_with(ask(Class::Sheddable).units(2));
        assert_eq!(two.unwrap_err(), Error::Overload);
        assert_eq!(held(&limiter, Class::Sheddable), 1);
        drop((users, again));
        assert_eq!((held(&limiter, Class::Sheddable), limiter.usage()), (0, 0));
        // Units taken under the line count toward the share too: with 5
        // held (its whole line), the share of 2 adds nothing.
        let line: Vec<_> = (0..5)
            .map(|_| limiter.acquire_with(ask(Class::Sheddable)).unwrap())
            .collect();
        assert_eq!(held(&limiter, Class::Sheddable), 5);
        let sixth = limiter.acquire_with(ask(Class::Sheddable));
        assert_eq!(sixth.unwrap_err(), Error::Overload);
        drop(line);
        assert_eq!(held(&limiter, Class::Sheddable), 0);
    }
}

#[test]
fn the_share_follows_the_capacity_in_force() {
    let limiter = builder(20, 1, 0.5, 0.1).build().unwrap();
    let users: Vec<_> = (0..15).map(|_| limiter.try_acquire().unwrap()).collect();
    // 10 % of 20: two.
    let two = limiter
        .acquire_with(ask(Class::Sheddable).units(2))
        .unwrap();
    assert!(limiter.acquire_with(ask(Class::Sheddable)).is_err());
    drop(two);
    // 10 % of 40: four.
    limiter.set_capacity(40).unwrap();
    let four = limiter
        .acquire_with(ask(Class::Sheddable).units(4))
        .unwrap();
    assert_eq!(held(&limiter, Class::Sheddable), 4);
    drop((four, users));
}

#[test]
fn the_count_follows_split_merge_and_forget() {
    let limiter = builder(20, 2, 0.5, 0.1).build().unwrap();
    let mut low = limiter
        .acquire_with(ask(Class::Sheddable).units(3))
        .unwrap();
    let one = low.split(1).unwrap();
    assert_eq!(held(&limiter, Class::Sheddable), 3, "split keeps the class");
    drop(one);
    assert_eq!(held(&limiter, Class::Sheddable), 2);
    // Merged into a default-class permit, its units become that class's.
    let mut user = limiter.try_acquire_many(2).unwrap();
    user.merge(low).unwrap();
    assert_eq!(held(&limiter, Class::Sheddable), 0);
    // And the other way.
    let mut low = limiter.acquire_with(ask(Class::Sheddable)).unwrap();
    low.merge(user).unwrap();
    assert_eq!(held(&limiter, Class::Sheddable), 5);
    drop(low);
    assert_eq!((held(&limiter, Class::Sheddable), limiter.usage()), (0, 0));
    // Forgotten units stay held, in the usage and in the class's count.
    let low = limiter
        .acquire_with(ask(Class::Sheddable).units(2))
        .unwrap();
    low.forget();
    assert_eq!((held(&limiter, Class::Sheddable), limiter.usage()), (2, 2));
}

#[test]
fn bad_min_share_is_a_config_error_naming_the_field() {
    let cases: [(Class, f64); 5] = [
        (Class::Sheddable, -0.1),
        (Class::Sheddable, 1.5),
        (Class::Sheddable, f64::NAN),
        (Class::Critical, 0.1),
        // Above Sheddable's headroom (0.8 by default).
        (Class::Sheddable, 0.9),
    ];
    for (class, share) in cases {
        let error = Limiter::builder()
            .capacity(10)
            .min_share(class, share)
            .build()
            .unwrap_err();
        assert!(
            error.to_string().contains("min_share"),
            "{class} {share}: {error}"
        );
    }
    // Shares that add up to more than the whole capacity.
    let error = Limiter::builder()
        .capacity(10)
        .min_share(Class::SheddablePlus, 0.6)
        .min_share(Class::Sheddable, 0.5)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("min_share"), "{error}");
    // A top class's share of 0 is what it has anyway.
    assert!(Limiter::builder()
        .capacity(10)
        .min_share(Class::CriticalPlus, 0.0)
        .build()
        .is_ok());
}

#[test]
fn the_room_serves_a_class_under_its_min_share_before_the_classes_above() {
    // Line 5 of 10, min share 2; every unit held by the default class.
    let limiter = Arc::new(
        builder(10, 1, 0.5, 0.2)
            .max_waiters(8)
            .max_wait(LONG)
            .queue_order(QueueOrder::Fifo)
            .build()
            .unwrap(),
    );
    let mut held_units: Vec<_> = (0..10)
        .map(|_| Arc::clone(&limiter).try_acquire_owned().unwrap())
        .collect();
    // A default-class waiter first, then three sheddable ones.
    let (order, waiters) = queue_waiters(
        &limiter,
        &[
            Class::Critical,
            Class::Sheddable,
            Class::Sheddable,
            Class::Sheddable,
        ],
    );
    // The first two releases go to the sheddable class, under its share,
    // though the default class waited longer: the share is kept for it.
    held_units.pop();
    assert_eq!(order.recv().unwrap(), 1);
    held_units.pop();
    assert_eq!(order.recv().unwrap(), 2);
    assert_eq!(held(&limiter, Class::Sheddable), 2);
    // Its share is full (and it is far over its line): the next release
    // goes to the default class.
    held_units.pop();
    assert_eq!(order.recv().unwrap(), 0);
    // With nobody else waiting, a release leaves the last sheddable one
    // waiting: over its line, its share full.
    held_units.pop();
    until(|| limiter.usage() == 9);
    assert_eq!(limiter.waiting(), 1);
    // One of its own class lets go: its place on the share is the last
    // one's.
    waiters[1].0.send(()).unwrap();
    assert_eq!(order.recv().unwrap(), 3);
    for (go, waiter) in waiters {
        let _ = go.send(());
        waiter.join().unwrap();
    }
    drop(held_units);
    assert_eq!((limiter.usage(), held(&limiter, Class::Sheddable)), (0, 0));
}

/// Threads take and give back asks of random classes and sizes, fail-fast
/// (`room == false`) or waiting (`classes.rs`' `ledger_stress`): a ledger
/// per class must never show all classes over the capacity, nor a
/// sheddable class and those below it over their lines plus their min
/// shares. And every class's count is back to 0 at the end.
fn stress(room: bool) {
    const C: usize = 48;
    let mut builder = Limiter::builder();
    builder
        .capacity(C)
        .shards(3)
        .headroom(Class::SheddablePlus, 0.75)
        .headroom(Class::Sheddable, 0.5)
        .min_share(Class::SheddablePlus, 0.1)
        .min_share(Class::Sheddable, 0.1);
    if room {
        builder.max_waiters(64).max_wait(Duration::from_millis(20));
    }
    let limiter = Arc::new(builder.build().unwrap());
    // Lines 36 and 24, min shares 4 and 4.
    let admitted = ledger_stress(&limiter, [C, C, 36 + 4 + 4, 24 + 4], room, 40_000);
    assert!(admitted > 0);
    assert_eq!(limiter.usage(), 0, "every unit back");
    for class in [Class::SheddablePlus, Class::Sheddable] {
        assert_eq!(held(&limiter, class), 0, "{class}: every unit counted out");
    }
}

#[test]
fn stress_fail_fast_never_over_a_line_plus_the_min_shares() {
    stress(false);
}

#[test]
fn stress_waiting_never_over_a_line_plus_the_min_shares() {
    stress(true);
}
