//! A proptest model of requests of many units, driven from one thread.
//!
//! Random capacity (1..24) and shard count (1..6), and random sequences of:
//! take `n` units (0..30) from the table (by `acquire_many` or through the
//! front door, `admit(&Ask)`, failing fast or asking to wait), give back a held grant, split one
//! (any number of units, past what it holds included), merge two, forget
//! one, and resize (absolute, and relative both ways). The model is a
//! ledger: the capacity in force and the units of each grant held.
//!
//! Properties, after every step:
//!
//! * a take of `n` is admitted exactly when the model has `n` free (from
//!   one thread every read is exact, so "fewer than `n` seen free" is
//!   "fewer than `n` free"), refused with `TooLarge` exactly when `n > 1`
//!   is above the capacity in force, with `Overload` otherwise (one unit
//!   is `try_acquire`'s take, `Overload` even at capacity 0);
//! * the table's usage is the ledger's (grants held plus units forgotten),
//!   and no shard holds more than its limit unless the table is in debt;
//! * split, merge and forget move units and never make or lose one;
//! * at the end, with everything given back, every unit of the capacity
//!   (less the forgotten ones) can be taken at once.

use proptest::prelude::*;

use crate::engine::ask::Ask;
use crate::engine::grant::Grant;
use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::error::Error;

#[derive(Debug, Clone)]
enum Step {
    /// Take `n` units: through `acquire_many` (door 0), or the front
    /// door with a fail-fast ask (1) or a waiting one, which a table
    /// without a room answers at once (2).
    Take(usize, u8),
    Release(usize),
    Split(usize, usize),
    Merge(usize, usize),
    Forget(usize),
    Set(usize),
    Add(usize),
    Remove(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => ((0usize..30), 0u8..3).prop_map(|(n, door)| Step::Take(n, door)),
        4 => any::<usize>().prop_map(Step::Release),
        2 => (any::<usize>(), 0usize..12).prop_map(|(k, n)| Step::Split(k, n)),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Step::Merge(a, b)),
        1 => any::<usize>().prop_map(Step::Forget),
        1 => (0usize..30).prop_map(Step::Set),
        1 => (0usize..10).prop_map(Step::Add),
        1 => (0usize..10).prop_map(Step::Remove),
    ]
}

/// Every shard holds at most its limit, unless the table is in debt.
fn within_limits(table: &Table) -> bool {
    table.in_debt()
        || (0..table.shard_count()).all(|i| {
            let shard = table.shard(i);
            shard.usage() <= shard.limit()
        })
}

fn give_back(table: &Table, grant: Grant) {
    for part in grant.parts() {
        table.release_units(part.shard, part.units, false);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn weighted_takes_match_a_ledger(
        capacity in 1usize..24,
        shards in 1usize..6,
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let table = Table::new(capacity, shards, Probe::Thread).unwrap();
        let mut capacity = capacity;
        let mut held: Vec<Grant> = Vec::new();
        let mut forgotten = 0usize;
        for step in steps {
            let used: usize = held.iter().map(Grant::units).sum::<usize>() + forgotten;
            match step {
                Step::Take(n, door) => {
                    let free = capacity.saturating_sub(used);
                    let taken = match door {
                        0 => table.acquire_many(n),
                        1 => table.admit(&Ask::new().units(n).fail_fast()),
                        _ => table.admit(&Ask::new().units(n)),
                    };
                    match taken {
                        Ok(grant) => {
                            prop_assert!(n <= free, "took {n} with {free} free");
                            prop_assert_eq!(grant.units(), n);
                            held.push(grant);
                        }
                        // One unit is the hot path's take: `Overload` even
                        // at capacity 0, as `try_acquire` answers.
                        Err(Error::TooLarge) => prop_assert!(n > capacity && n > 1),
                        Err(Error::Overload) => {
                            prop_assert!((n <= capacity || n == 1) && n > free, "refused {n} with {free} free of {capacity}");
                        }
                        Err(other) => prop_assert!(false, "unexpected {other}"),
                    }
                }
                Step::Release(k) if !held.is_empty() => {
                    let grant = held.swap_remove(k % held.len());
                    give_back(&table, grant);
                }
                Step::Split(k, n) if !held.is_empty() => {
                    let k = k % held.len();
                    let before = held[k].units();
                    match held[k].split(n) {
                        Some(part) => {
                            prop_assert!(n <= before);
                            prop_assert_eq!(part.units() + held[k].units(), before);
                            held.push(part);
                        }
                        None => {
                            prop_assert!(n > before);
                            prop_assert_eq!(held[k].units(), before);
                        }
                    }
                }
                Step::Merge(a, b) if held.len() >= 2 => {
                    let a = a % held.len();
                    let mut b = b % held.len();
                    if a == b {
                        b = (b + 1) % held.len();
                    }
                    let total = held[a].units() + held[b].units();
                    let other = held.remove(b);
                    let a = if b < a { a - 1 } else { a };
                    held[a].merge(other);
                    prop_assert_eq!(held[a].units(), total);
                }
                Step::Forget(k) if !held.is_empty() => {
                    let grant = held.swap_remove(k % held.len());
                    forgotten += grant.units();
                    table.forget_grant(grant);
                }
                Step::Set(c) => {
                    table.set_capacity(c).unwrap();
                    capacity = c;
                }
                Step::Add(c) => {
                    capacity = table.add_capacity(c).unwrap();
                }
                Step::Remove(c) => {
                    capacity = table.remove_capacity(c);
                }
                _ => {}
            }
            let used: usize = held.iter().map(Grant::units).sum::<usize>() + forgotten;
            prop_assert_eq!(table.usage(), used);
            prop_assert_eq!(table.capacity(), capacity);
            prop_assert!(within_limits(&table));
        }
        for grant in held.drain(..) {
            give_back(&table, grant);
        }
        prop_assert_eq!(table.usage(), forgotten);
        let rest = capacity.saturating_sub(forgotten);
        if rest > 0 {
            let all = table.acquire_many(rest);
            prop_assert!(all.is_ok(), "{rest} free at the end: {all:?}");
            prop_assert_eq!(table.acquire_many(1).unwrap_err(), Error::Overload);
        }
    }
}
