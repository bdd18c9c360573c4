//! A proptest model of priority classes (issue 36), driven from one
//! thread.
//!
//! **Admission.** On one shard a class's line is its whole share, so the
//! model predicts every answer: random capacity (1..24), random headroom
//! in twentieths (`SheddablePlus` at or above `Sheddable`), random takes
//! of a class and a size (0..8 units, failing fast or asking to wait in a
//! table without a room), give-backs and resizes. A take of `n ≥ 1` units
//! of class `c` is admitted exactly when `usage + n ≤ share(c)`, refused
//! with `TooLarge` exactly when `n` is above the capacity (the hot path's
//! one unit of the default class answers `Overload` even then, as
//! `try_acquire` does), and with `Overload` otherwise: a class asking for
//! more than its share is shed. On several shards the model checks the
//! bound the lines promise in total: the units of a class and every class
//! below it never exceed its share, through resizes as long as none finds
//! more units held than the share it sets.
//!
//! **The room's order.** One shard, a room of async waiters of random
//! classes, releases and newcomers: after every step, the waiters granted
//! are exactly those the model serves: the most important class first,
//! the oldest first within it, each only while its unit fits under its
//! class's share, and none while a waiter of a class above it that fits
//! waits (no priority inversion). A newcomer takes from the table only if
//! its unit fits, and waits otherwise.
//!
//! **Min shares.** Both one-shard models again with random min shares: a
//! take is admitted exactly when its line or its class's min share (the
//! units the class holds, these counted in, within it; the capacity
//! permitting) allows, and the class's count is what the model holds of
//! it; in the room, a sheddable class under its min share is admitted and
//! served on it first, the order otherwise as without.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;

use crate::engine::ask::Ask;
use crate::engine::class::{Class, HeadroomSettings};
use crate::engine::grant::Grant;
use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::engine::waiters::Policy;
use crate::error::Error;

/// A table of `capacity` over `shards` with the sheddable classes'
/// headroom and min shares in twentieths, and a room of `waiters` (0:
/// none).
fn table(
    capacity: usize,
    shards: usize,
    twentieths: [usize; 2],
    min: [usize; 2],
    waiters: usize,
) -> Table {
    let mut headroom = HeadroomSettings::default();
    for (g, class) in [Class::SheddablePlus, Class::Sheddable]
        .into_iter()
        .enumerate()
    {
        headroom.set(class, twentieths[g] as f64 / 20.0);
        headroom.set_min_share(class, min[g] as f64 / 20.0);
    }
    let policy = Policy {
        max_waiters: waiters,
        max_wait: Duration::from_secs(3600),
        headroom,
        ..Policy::default()
    };
    Table::new(capacity, shards, Probe::Thread)
        .unwrap()
        .with_policy(&policy)
        .unwrap()
}

/// What class `class` may fill of `capacity`: all of it for the top two,
/// `floor(k × C / 20)` for a sheddable class of `k` twentieths (exact
/// integer arithmetic, not the table's).
fn share(class: Class, capacity: usize, twentieths: [usize; 2]) -> usize {
    match class.gate() {
        None => capacity,
        Some(g) => twentieths[g] * capacity / 20,
    }
}

fn class() -> impl Strategy<Value = Class> {
    (0usize..4).prop_map(|rank| Class::from_rank(rank).unwrap())
}

/// `SheddablePlus`'s and `Sheddable`'s twentieths, the second at most the
/// first.
fn twentieths() -> impl Strategy<Value = [usize; 2]> {
    (0usize..=20).prop_flat_map(|plus| (Just(plus), 0usize..=plus).prop_map(|(p, s)| [p, s]))
}

#[derive(Debug, Clone)]
enum Step {
    Take(Class, usize, bool),
    Release(usize),
    Set(usize),
}

fn step(resize: bool) -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (class(), 0usize..8, any::<bool>()).prop_map(|(c, n, f)| Step::Take(c, n, f)),
        4 => any::<usize>().prop_map(Step::Release),
        (if resize { 1 } else { 0 }) => (1usize..30).prop_map(Step::Set),
    ]
}

fn give_back(table: &Table, grant: &Grant) {
    table.release_grant(grant, false);
}

/// A step other than a take: gives back the `k`-th grant held (modulo; none
/// if nothing is held), or sets the capacity.
fn release_or_resize(
    table: &Table,
    step: Step,
    held: &mut Vec<(Class, Grant)>,
    capacity: &mut usize,
) {
    match step {
        Step::Release(k) if !held.is_empty() => {
            let (_, grant) = held.swap_remove(k % held.len());
            give_back(table, &grant);
        }
        Step::Set(c) => {
            table.set_capacity(c).unwrap();
            *capacity = c;
        }
        _ => {}
    }
}

/// Headroom in twentieths as [`twentieths`] makes, and min shares each
/// at most its class's headroom, the two adding up to at most 20.
fn with_min() -> impl Strategy<Value = ([usize; 2], [usize; 2])> {
    twentieths().prop_flat_map(|t| {
        (Just(t), 0usize..=t[0], 0usize..=t[1])
            .prop_filter("shares within the whole", |(_, a, b)| a + b <= 20)
            .prop_map(|(t, a, b)| (t, [a, b]))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn one_shard_admits_exactly_what_each_class_share_allows(
        capacity in 1usize..24,
        twentieths in twentieths(),
        steps in proptest::collection::vec(step(true), 1..60),
    ) {
        let table = table(capacity, 1, twentieths, [0, 0], 0);
        let mut capacity = capacity;
        let mut held: Vec<(Class, Grant)> = Vec::new();
        for step in steps {
            let used: usize = held.iter().map(|(_, g)| g.units()).sum();
            match step {
                Step::Take(class, n, fail_fast) => {
                    let line = share(class, capacity, twentieths);
                    let ask = Ask::new().class(class).units(n);
                    let ask = if fail_fast { ask.fail_fast() } else { ask };
                    match table.admit(&ask) {
                        Ok(grant) => {
                            // 0 units: a grant of nothing, whatever is held.
                            prop_assert!(n == 0 || used + n <= line, "{class} took {n} with {used} of {line}");
                            prop_assert_eq!(grant.units(), n);
                            held.push((class, grant));
                        }
                        // Too large for the capacity, whatever the class.
                        Err(Error::TooLarge) => prop_assert!(n > capacity && n > 0, "{class}: {n} of {capacity}"),
                        // Above the class's share (within the capacity) or
                        // its free units; the hot path's one unit even at
                        // capacity 0.
                        Err(Error::Overload) => {
                            let hot = n == 1 && class == Class::Critical;
                            prop_assert!((n <= capacity || hot) && used + n > line, "{class} refused {n} with {used} of {line}");
                        }
                        Err(other) => prop_assert!(false, "unexpected {other}"),
                    }
                }
                other => release_or_resize(&table, other, &mut held, &mut capacity),
            }
            let used: usize = held.iter().map(|(_, g)| g.units()).sum();
            prop_assert_eq!(table.usage(), used);
        }
        for (_, grant) in held.drain(..) {
            give_back(&table, &grant);
        }
        prop_assert_eq!(table.usage(), 0);
    }

    #[test]
    fn on_any_shard_count_no_class_holds_more_than_its_share(
        capacity in 1usize..40,
        shards in 1usize..7,
        twentieths in twentieths(),
        steps in proptest::collection::vec(step(true), 1..80),
    ) {
        let table = table(capacity, shards, twentieths, [0, 0], 0);
        let mut capacity = capacity;
        // Set once a resize finds more held (of every class) than a gated
        // class's new share: no split of the lines can then keep that
        // class within it until the units come back (`class.rs`), and the
        // check stops for the rest of the case.
        let mut loose = false;
        let mut held: Vec<(Class, Grant)> = Vec::new();
        for step in steps {
            match step {
                Step::Take(class, n, _) => {
                    if let Ok(grant) = table.admit(&Ask::new().class(class).units(n).fail_fast()) {
                        held.push((class, grant));
                    }
                }
                other => {
                    if let Step::Set(c) = other {
                        let used: usize = held.iter().map(|(_, g)| g.units()).sum();
                        loose |= used > share(Class::Sheddable, c, twentieths);
                    }
                    release_or_resize(&table, other, &mut held, &mut capacity);
                }
            }
            if loose {
                continue;
            }
            for class in Class::ALL {
                let below: usize = held
                    .iter()
                    .filter(|(c, _)| c.rank() >= class.rank())
                    .map(|(_, g)| g.units())
                    .sum();
                let line = share(class, capacity, twentieths);
                prop_assert!(below <= line, "{class} and below hold {below} > {line}");
            }
        }
        for (_, grant) in held.drain(..) {
            give_back(&table, &grant);
        }
        prop_assert_eq!(table.usage(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// **Min shares.** On one shard, with random min shares: a take of `n`
    /// units of class `c` is admitted exactly when it fits under the
    /// class's line, or, for a sheddable class, when the units the class
    /// holds stay within its min share and the capacity has room; the
    /// class's count (`ClassStats::held`) is what the model holds of it
    /// after every step, through resizes (none without a min share, which
    /// counts nothing).
    #[test]
    fn one_shard_admits_exactly_what_the_line_or_the_min_share_allows(
        capacity in 1usize..24,
        (twentieths, min) in with_min(),
        steps in proptest::collection::vec(step(true), 1..60),
    ) {
        let table = table(capacity, 1, twentieths, min, 0);
        let mut capacity = capacity;
        let mut held: Vec<(Class, Grant)> = Vec::new();
        let holds = |held: &[(Class, Grant)], class: Class| -> usize {
            held.iter().filter(|(c, _)| *c == class).map(|(_, g)| g.units()).sum()
        };
        for step in steps {
            let used: usize = held.iter().map(|(_, g)| g.units()).sum();
            match step {
                Step::Take(class, n, _) => {
                    let line = share(class, capacity, twentieths);
                    let on_share = class.gate().is_some_and(|g| {
                        holds(&held, class) + n <= min[g] * capacity / 20
                            && used + n <= capacity
                    });
                    let admit = n == 0 || used + n <= line || on_share;
                    match table.admit(&Ask::new().class(class).units(n).fail_fast()) {
                        Ok(grant) => {
                            prop_assert!(admit, "{class} took {n} with {used} of {line}");
                            prop_assert_eq!(grant.units(), n);
                            held.push((class, grant));
                        }
                        Err(Error::TooLarge) => prop_assert!(n > capacity && n > 0),
                        Err(Error::Overload) => prop_assert!(!admit, "{class} refused {n} with {used} of {line}"),
                        Err(other) => prop_assert!(false, "unexpected {other}"),
                    }
                }
                other => release_or_resize(&table, other, &mut held, &mut capacity),
            }
            // Counted only when some class has a min share.
            let stats = table.stats();
            let counted = min.iter().any(|&m| m > 0);
            for class in [Class::SheddablePlus, Class::Sheddable] {
                let want = counted.then(|| holds(&held, class));
                prop_assert_eq!(stats.classes[class.rank()].held, want);
            }
        }
        for (_, grant) in held.drain(..) {
            give_back(&table, &grant);
        }
        prop_assert_eq!(table.usage(), 0);
    }
}

// ---- the room's order ---------------------------------------------------------

#[derive(Debug, Clone)]
enum RoomStep {
    /// A newcomer of this class asks to wait for one unit.
    Arrive(Class),
    /// A held unit (the `k`-th, modulo) is given back.
    Release(usize),
}

fn room_step() -> impl Strategy<Value = RoomStep> {
    prop_oneof![
        3 => class().prop_map(RoomStep::Arrive),
        2 => any::<usize>().prop_map(RoomStep::Release),
    ]
}

type Wait<'a> = Pin<Box<dyn Future<Output = Result<Grant, Error>> + 'a>>;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// With random min shares too (none in a third of the cases): a
    /// sheddable class under its min share is admitted and served on it,
    /// ahead of the classes above, and otherwise the order is as without.
    #[test]
    fn the_room_serves_by_class_then_by_arrival_with_no_inversion(
        capacity in 1usize..10,
        (twentieths, min) in with_min(),
        no_min in proptest::bool::weighted(0.33),
        places in 1usize..6,
        steps in proptest::collection::vec(room_step(), 1..60),
    ) {
        let min = if no_min { [0, 0] } else { min };
        let table = table(capacity, 1, twentieths, min, places);
        let mut cx = Context::from_waker(Waker::noop());
        // The model: units held (by class), and the waiters (class,
        // arrival) in arrival order; the table's side: the futures of
        // those waiting.
        let mut held: Vec<(Class, Grant)> = Vec::new();
        let mut waiting: Vec<(Class, usize, Wait<'_>)> = Vec::new();
        let fits = |class: Class, used: usize| used < share(class, capacity, twentieths);
        // One more unit of `class` within its min share, the capacity
        // permitting.
        let on_share = |class: Class, held: &[(Class, Grant)]| {
            class.gate().is_some_and(|g| {
                let of_class = held.iter().filter(|(c, _)| *c == class).count();
                held.len() < capacity && of_class < min[g] * capacity / 20
            })
        };
        for (arrival, step) in steps.into_iter().enumerate() {
            match step {
                RoomStep::Arrive(class) => {
                    let mut wait: Wait<'_> = Box::pin(table.admit_async(Ask::new().class(class)));
                    let used = held.len();
                    let admit = fits(class, used) || on_share(class, &held);
                    match wait.as_mut().poll(&mut cx) {
                        Poll::Ready(Ok(grant)) => {
                            prop_assert!(admit, "{class} admitted at {used}");
                            held.push((class, grant));
                        }
                        Poll::Ready(Err(error)) => {
                            // Shed: a class whose share is nothing (it could
                            // never be served), or a full room with nobody
                            // less important in it.
                            prop_assert_eq!(error, Error::Overload);
                            let nothing = share(class, capacity, twentieths) == 0;
                            let full = waiting.len() == places
                                && waiting.iter().all(|(c, _, _)| c.rank() <= class.rank());
                            prop_assert!(nothing || full, "{class} refused with room");
                        }
                        Poll::Pending => {
                            prop_assert!(!admit, "{class} waits at {used}");
                            if waiting.len() == places {
                                // A full room made way: the newest of the
                                // least important class below it leaves,
                                // refused.
                                let (at, _) = waiting
                                    .iter()
                                    .enumerate()
                                    .filter(|(_, (c, _, _))| c.rank() > class.rank())
                                    .max_by_key(|(_, (c, a, _))| (c.rank(), *a))
                                    .expect("a full room makes way only for a more important class");
                                let (shed, _, mut gone) = waiting.remove(at);
                                let answer = gone.as_mut().poll(&mut cx);
                                prop_assert!(matches!(answer, Poll::Ready(Err(Error::Overload))), "{shed} shed: {answer:?}");
                            }
                            waiting.push((class, arrival, wait));
                        }
                    }
                }
                RoomStep::Release(k) if !held.is_empty() => {
                    let (_, grant) = held.swap_remove(k % held.len());
                    give_back(&table, &grant);
                    // The model's grants, one at a time: the oldest waiter
                    // of the most important sheddable class under its min
                    // share; else the most important class, the oldest
                    // within it, while its unit fits under its line.
                    let mut order: Vec<(usize, usize)> =
                        waiting.iter().map(|(c, a, _)| (c.rank(), *a)).collect();
                    order.sort_unstable();
                    let mut model: Vec<(Class, Grant)> =
                        held.iter().map(|(c, _)| (*c, Grant::on(0, 1))).collect();
                    let mut want = Vec::new();
                    loop {
                        let share_first = order
                            .iter()
                            .position(|&(rank, _)| on_share(Class::from_rank(rank).unwrap(), &model));
                        let pick = share_first.or_else(|| {
                            let &(rank, _) = order.first()?;
                            fits(Class::from_rank(rank).unwrap(), model.len()).then_some(0)
                        });
                        let Some(at) = pick else { break };
                        let (rank, arrival) = order.remove(at);
                        model.push((Class::from_rank(rank).unwrap(), Grant::on(0, 1)));
                        want.push(arrival);
                    }
                    let mut got = Vec::new();
                    let mut still = Vec::new();
                    for (class, arrival, mut wait) in waiting.drain(..) {
                        match wait.as_mut().poll(&mut cx) {
                            Poll::Ready(Ok(grant)) => {
                                got.push(arrival);
                                held.push((class, grant));
                            }
                            Poll::Ready(Err(error)) => prop_assert!(false, "{class}: {error}"),
                            Poll::Pending => still.push((class, arrival, wait)),
                        }
                    }
                    waiting = still;
                    got.sort_unstable();
                    want.sort_unstable();
                    prop_assert_eq!(got, want);
                }
                _ => {}
            }
            prop_assert_eq!(table.usage(), held.len());
            prop_assert_eq!(table.waiting(), waiting.len());
        }
        drop(waiting);
        for (_, grant) in held.drain(..) {
            give_back(&table, &grant);
        }
        prop_assert_eq!(table.usage(), 0);
    }
}
