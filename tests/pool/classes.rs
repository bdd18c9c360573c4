//! Priority classes through the pool (issue 36): `call_with` and
//! `cast_with` take an `Ask` of any class; a gated class stops at its share
//! while the default class fills the rest; a waiting request of the most
//! important class is handed the next freed unit; per-class figures.

use std::thread;

use sidejob::{units::Ask, Class, Error};

use super::weighted::{held, next_start};
use crate::common::until;

#[test]
fn a_sheddable_call_stops_at_its_share_and_the_default_class_fills_the_rest() {
    let (pool, started, open) = held(|b| {
        b.capacity(4).workers(2).headroom(Class::Sheddable, 0.5);
    });
    let sheddable = Ask::new().class(Class::Sheddable).fail_fast();
    for id in [1, 2] {
        pool.cast_with(sheddable, id).unwrap();
    }
    assert_eq!(pool.cast_with(sheddable, 3), Err(Error::Overload));
    for id in [4, 5] {
        pool.cast(id).unwrap();
    }
    assert_eq!(pool.cast(6), Err(Error::Overload));
    assert_eq!(pool.usage(), 4);
    // More than the class's whole share is never served: shed at once.
    assert_eq!(pool.call_with(sheddable.units(3), 7), Err(Error::Overload));
    for _ in 0..4 {
        open.send(()).unwrap();
    }
    let mut ran: Vec<u64> = (0..4).map(|_| next_start(&started)).collect();
    ran.sort_unstable();
    assert_eq!(ran, [1, 2, 4, 5]);
    until(|| pool.usage() == 0);
    let stats = pool.stats();
    let sheddable = &stats.classes[Class::Sheddable.rank()];
    assert_eq!((sheddable.accepted, sheddable.rejected), (2, 2));
    let critical = &stats.classes[Class::Critical.rank()];
    assert_eq!((critical.accepted, critical.rejected), (2, 1));
}

#[test]
fn a_waiting_critical_plus_call_is_served_before_older_default_calls() {
    let (pool, started, open) = held(|b| {
        b.capacity(1).workers(1).max_waiters(4);
    });
    pool.cast(1).unwrap();
    assert_eq!(next_start(&started), 1);
    let callers: Vec<_> = [(2, Class::Critical), (3, Class::CriticalPlus)]
        .into_iter()
        .enumerate()
        .map(|(n, (id, class))| {
            let caller = {
                let pool = pool.clone();
                thread::spawn(move || pool.call_with(Ask::new().class(class), id))
            };
            until(|| pool.waiting() == n + 1);
            caller
        })
        .collect();
    open.send(()).unwrap();
    assert_eq!(next_start(&started), 3, "CriticalPlus first");
    open.send(()).unwrap();
    assert_eq!(next_start(&started), 2);
    open.send(()).unwrap();
    for caller in callers {
        assert!(caller.join().unwrap().is_ok());
    }
    assert_eq!(pool.stats().classes[Class::CriticalPlus.rank()].accepted, 1);
}

/// A min share through the pool: a sheddable call is admitted above its
/// line while within the share, and its units are counted out of the class
/// once handled, for calls and casts alike.
#[test]
fn a_min_share_admits_sheddable_work_above_the_line_and_counts_it_out() {
    let (pool, started, open) = held(|b| {
        b.capacity(10)
            .workers(2)
            .headroom(Class::Sheddable, 0.5)
            .min_share(Class::Sheddable, 0.2);
    });
    let held_now = || pool.stats().classes[Class::Sheddable.rank()].held;
    for id in 1..=6 {
        pool.cast(id).unwrap();
    }
    // Over the line of 5: the share of 2 admits two casts, then no more.
    let sheddable = Ask::new().class(Class::Sheddable).fail_fast();
    pool.cast_with(sheddable, 7).unwrap();
    pool.cast_with(sheddable, 8).unwrap();
    assert_eq!(held_now(), Some(2));
    assert_eq!(pool.cast_with(sheddable, 9), Err(Error::Overload));
    for _ in 0..8 {
        open.send(()).unwrap();
    }
    let mut ran: Vec<u64> = (0..8).map(|_| next_start(&started)).collect();
    ran.sort_unstable();
    assert_eq!(ran, [1, 2, 3, 4, 5, 6, 7, 8]);
    until(|| pool.usage() == 0);
    assert_eq!(held_now(), Some(0));
}
