//! Priority classes (issue 36) on the `Limiter`: each gated class stops at
//! its share of the capacity in force, whatever the shard count; the
//! shares follow a resize; the waiting room serves the most important
//! class first and a gated waiter only under its line; per-class figures;
//! bad headroom; and a stress test with a shadow ledger per class.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;

use sidejob::units::Ask;
use sidejob::{Class, Error, Limiter, Permit, QueueOrder};

use super::common::until;
use super::{room, LONG};

fn ask(class: Class) -> Ask {
    Ask::new().class(class).fail_fast()
}

/// A fail-fast limiter of `capacity` over `shards`, with the sheddable
/// classes' headroom.
fn classed(capacity: usize, shards: usize, plus: f64, low: f64) -> Limiter {
    Limiter::builder()
        .capacity(capacity)
        .shards(shards)
        .headroom(Class::SheddablePlus, plus)
        .headroom(Class::Sheddable, low)
        .build()
        .unwrap()
}

/// Takes units of `class` one at a time until refused: how many.
fn fill<'a>(
    limiter: &'a Limiter,
    class: Class,
    held: &mut Vec<Permit<'a, sidejob::units::Many>>,
) -> usize {
    let mut taken = 0;
    loop {
        match limiter.acquire_with(ask(class)) {
            Ok(permit) => {
                held.push(permit);
                taken += 1;
            }
            Err(Error::Overload) => return taken,
            Err(other) => panic!("{other:?}"),
        }
    }
}

#[test]
fn each_class_stops_at_its_share_of_the_capacity_on_any_shard_count() {
    for shards in [1, 2, 3, 7, 64, 100] {
        let limiter = classed(100, shards, 0.6, 0.3);
        let mut held = Vec::new();
        assert_eq!(
            fill(&limiter, Class::Sheddable, &mut held),
            30,
            "{shards} shards"
        );
        assert_eq!(
            fill(&limiter, Class::SheddablePlus, &mut held),
            30,
            "{shards} shards"
        );
        assert_eq!(
            fill(&limiter, Class::Critical, &mut held),
            40,
            "{shards} shards"
        );
        assert_eq!(limiter.usage(), 100);
        assert_eq!(fill(&limiter, Class::CriticalPlus, &mut held), 0);
        // A unit back: the sheddable classes are still over their lines,
        // the top ones take it.
        held.pop();
        assert_eq!(fill(&limiter, Class::Sheddable, &mut held), 0);
        assert_eq!(fill(&limiter, Class::SheddablePlus, &mut held), 0);
        assert_eq!(fill(&limiter, Class::CriticalPlus, &mut held), 1);
    }
}

#[test]
fn a_class_may_fill_its_share_with_units_from_several_shards() {
    // 4 shards of 16: a Sheddable request of 30 (its share of 64 at 0.5 is
    // 32) fits on no single shard's line (8 each) and is taken across.
    let limiter = classed(64, 4, 0.75, 0.5);
    let big = limiter
        .acquire_with(ask(Class::Sheddable).units(30))
        .unwrap();
    assert_eq!(big.units(), 30);
    let more = limiter.acquire_with(ask(Class::Sheddable).units(3));
    assert_eq!(more.unwrap_err(), Error::Overload);
    let last_two = limiter
        .acquire_with(ask(Class::Sheddable).units(2))
        .unwrap();
    // More than the class's whole share: never, so `Overload` at once (the
    // class is shed), not a wait; more than the capacity is `TooLarge`.
    let never = limiter.acquire_with(Ask::new().class(Class::Sheddable).units(33));
    assert_eq!(never.unwrap_err(), Error::Overload);
    let too_big = limiter.acquire_with(Ask::new().class(Class::Sheddable).units(65));
    assert_eq!(too_big.unwrap_err(), Error::TooLarge);
    drop((big, last_two));
    assert_eq!(limiter.usage(), 0);
}

#[test]
fn the_shares_follow_the_capacity_in_force() {
    // One shard: its line is the class's whole share, so the figures are
    // exact whatever a resize leaves where.
    let limiter = classed(100, 1, 0.6, 0.3);
    limiter.set_capacity(50).unwrap();
    let mut held = Vec::new();
    assert_eq!(fill(&limiter, Class::Sheddable, &mut held), 15);
    // Lowered under what the class holds: it gets nothing more until its
    // units come back below the new line.
    limiter.set_capacity(20).unwrap();
    assert_eq!(fill(&limiter, Class::Sheddable, &mut held), 0);
    held.truncate(5);
    assert_eq!(
        fill(&limiter, Class::Sheddable, &mut held),
        1,
        "6 of 20 at 0.3"
    );
    limiter.set_capacity(200).unwrap();
    assert_eq!(fill(&limiter, Class::Sheddable, &mut held), 54, "60 of 200");
}

#[test]
fn the_default_class_and_the_top_class_fill_the_whole_capacity() {
    let limiter = classed(10, 2, 0.0, 0.0);
    // A share of nothing: every request of the class is shed, waiting or
    // not.
    for class in [Class::Sheddable, Class::SheddablePlus] {
        assert_eq!(
            limiter.acquire_with(ask(class)).unwrap_err(),
            Error::Overload
        );
        let waiting = limiter.acquire_with(Ask::new().class(class));
        assert_eq!(waiting.unwrap_err(), Error::Overload);
    }
    let mut held = Vec::new();
    assert_eq!(fill(&limiter, Class::CriticalPlus, &mut held), 10);
    drop(held);
    let plain: Vec<_> = (0..10).map(|_| limiter.try_acquire().unwrap()).collect();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop(plain);
}

#[test]
fn bad_headroom_is_a_config_error_naming_the_field() {
    let cases: [(Class, f64); 4] = [
        (Class::Sheddable, 1.01),
        (Class::SheddablePlus, -0.5),
        (Class::Sheddable, f64::INFINITY),
        (Class::Critical, 0.9),
    ];
    for (class, fraction) in cases {
        let error = Limiter::builder()
            .capacity(10)
            .headroom(class, fraction)
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("headroom"), "{error}");
    }
    let rising = Limiter::builder()
        .capacity(10)
        .headroom(Class::SheddablePlus, 0.4)
        .headroom(Class::Sheddable, 0.5)
        .build()
        .unwrap_err();
    assert!(rising.to_string().contains("headroom"), "{rising}");
}

#[test]
fn the_room_serves_the_most_important_class_first() {
    let limiter = room(2, 1, 8, LONG, QueueOrder::Fifo);
    let held: Vec<_> = (0..2)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    // Queued in the order Critical, CriticalPlus, Critical: the second
    // is served first.
    let (order, waiters) = queue_waiters(
        &limiter,
        &[Class::Critical, Class::CriticalPlus, Class::Critical],
    );
    let mut held = held.into_iter();
    drop(held.next());
    assert_eq!(order.recv().unwrap(), 1, "CriticalPlus first");
    drop(held.next());
    assert_eq!(order.recv().unwrap(), 0, "then the oldest Critical");
    // The last one is served by a release of theirs.
    waiters[1].0.send(()).unwrap();
    assert_eq!(order.recv().unwrap(), 2);
    for (go, waiter) in waiters {
        let _ = go.send(());
        waiter.join().unwrap();
    }
    assert_eq!((limiter.waiting(), limiter.usage()), (0, 0));
}

/// A queued waiter's thread: the sender that tells it to let its permit
/// go, and its handle.
pub(super) type Waiter = (mpsc::Sender<()>, thread::JoinHandle<()>);

/// A waiting thread for each of `classes`, queued one after another in
/// that order: what each sends (its place in `classes`) once served, and
/// for each, the sender that tells it to let its permit go, and its
/// handle.
pub(super) fn queue_waiters(
    limiter: &Arc<Limiter>,
    classes: &[Class],
) -> (mpsc::Receiver<usize>, Vec<Waiter>) {
    let (served, order) = mpsc::channel();
    let mut waiters = Vec::new();
    for (n, &class) in classes.iter().enumerate() {
        let (go, hold) = mpsc::channel::<()>();
        let (limiter2, served) = (Arc::clone(limiter), served.clone());
        let waiter = thread::spawn(move || {
            let permit = limiter2.acquire_with(Ask::new().class(class)).unwrap();
            served.send(n).unwrap();
            hold.recv().unwrap();
            drop(permit);
        });
        waiters.push((go, waiter));
        until(|| limiter.waiting() == n + 1);
    }
    (order, waiters)
}

#[test]
fn a_gated_waiter_is_served_only_under_its_line() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(10)
            .shards(1)
            .max_waiters(4)
            .max_wait(LONG)
            .headroom(Class::Sheddable, 0.5)
            .build()
            .unwrap(),
    );
    let mut held: Vec<_> = (0..10)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    let served = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (limiter, served) = (Arc::clone(&limiter), Arc::clone(&served));
        thread::spawn(move || {
            let permit = limiter
                .acquire_with(Ask::new().class(Class::Sheddable))
                .unwrap();
            served.store(true, SeqCst);
            let usage = limiter.usage();
            drop(permit);
            usage
        })
    };
    until(|| limiter.waiting() == 1);
    // Down to 5 held: still at the Sheddable line of 5, so it waits.
    for _ in 0..5 {
        held.pop();
        assert_eq!(limiter.waiting(), 1);
        assert!(!served.load(SeqCst));
    }
    // One more back (4 held): now its unit fits under the line.
    held.pop();
    until(|| served.load(SeqCst));
    assert!(waiter.join().unwrap() <= 5, "admitted over its line");
    assert_eq!(limiter.waiting(), 0);
}

#[test]
fn per_class_figures_add_up_to_the_totals() {
    let limiter = room(4, 2, 0, LONG, QueueOrder::Fifo);
    let mut held = Vec::new();
    let sheddable = fill(&limiter, Class::Sheddable, &mut held); // 3 of 4 at 0.8
    let plus = fill(&limiter, Class::CriticalPlus, &mut held); // the last one
    assert_eq!((sheddable, plus), (3, 1));
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    let stats = limiter.stats();
    let by = |class: Class| stats.classes[class.rank()].clone();
    assert_eq!(stats.classes.len(), 4);
    assert_eq!(
        (by(Class::Sheddable).accepted, by(Class::Sheddable).rejected),
        (3, 1)
    );
    assert_eq!(
        (
            by(Class::CriticalPlus).accepted,
            by(Class::CriticalPlus).rejected
        ),
        (1, 1)
    );
    assert_eq!(
        (by(Class::Critical).accepted, by(Class::Critical).rejected),
        (0, 1)
    );
    let accepted: u64 = stats.classes.iter().map(|c| c.accepted).sum();
    let rejected: u64 = stats.classes.iter().map(|c| c.rejected).sum();
    assert_eq!((accepted, rejected), (stats.accepted, stats.rejected));
}

#[test]
fn waiting_classes_time_out_and_are_counted_by_class() {
    let limiter = room(1, 1, 4, super::SHORT, QueueOrder::Fifo);
    let _held = limiter.try_acquire().unwrap();
    let late = limiter.acquire_with(Ask::new().class(Class::CriticalPlus));
    assert_eq!(late.unwrap_err(), Error::Timeout);
    let stats = limiter.stats();
    assert_eq!(stats.classes[Class::CriticalPlus.rank()].timed_out, 1);
    assert_eq!(stats.classes[Class::Critical.rank()].timed_out, 0);
    assert_eq!(stats.timed_out, 1);
}

/// Threads take and give back fail-fast asks of random classes and sizes;
/// a ledger per class, raised after each admission and lowered before
/// each release, must never show a class and those below it holding more
/// than their share, nor all of them more than the capacity.
#[test]
fn stress_no_class_ever_holds_more_than_its_share() {
    const C: usize = 48;
    let limiter = Arc::new(classed(C, 3, 0.75, 0.5));
    let admitted = ledger_stress(&limiter, [C, C, C * 3 / 4, C / 2], false, 20_000);
    assert!(admitted > 0);
    assert_eq!(limiter.usage(), 0, "every unit back");
    let stats = limiter.stats();
    let rejected: u64 = stats.classes.iter().map(|c| c.rejected).sum();
    assert_eq!(rejected, stats.rejected);
}

/// Four threads take and give back `rounds` asks each of random classes
/// and sizes (1-3 units), failing fast or, if `wait`, waiting as the
/// limiter's room says; a ledger of every class in one word (16 bits a
/// class, so that one load reads them all at one instant), raised after
/// each admission and lowered before each release, must never show the
/// classes from rank `r` down holding more than `bounds[r]`. How many
/// asks were admitted.
pub(super) fn ledger_stress(
    limiter: &Arc<Limiter>,
    bounds: [usize; 4],
    wait: bool,
    rounds: usize,
) -> usize {
    const THREADS: usize = 4;
    let ledger = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (limiter, ledger, barrier) = (
                Arc::clone(limiter),
                Arc::clone(&ledger),
                Arc::clone(&barrier),
            );
            thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ t as u64;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut admitted = 0;
                barrier.wait();
                for _ in 0..rounds {
                    let class = Class::ALL[(next() % 4) as usize];
                    let units = 1 + (next() % 3) as usize;
                    let ask = Ask::new().class(class).units(units);
                    let ask = if wait { ask } else { ask.fail_fast() };
                    let Ok(permit) = limiter.acquire_with(ask) else {
                        continue;
                    };
                    admitted += 1;
                    let lane = (units as u64) << (16 * class.rank());
                    let now = ledger.fetch_add(lane, SeqCst) + lane;
                    // Every class from each rank down, against its bound.
                    let mut below = 0;
                    for rank in (0..4).rev() {
                        below += ((now >> (16 * rank)) & 0xFFFF) as usize;
                        assert!(
                            below <= bounds[rank],
                            "ranks {rank}.. hold {below} > {}",
                            bounds[rank]
                        );
                    }
                    if next() % 4 == 0 {
                        thread::yield_now();
                    }
                    ledger.fetch_sub(lane, SeqCst);
                    drop(permit);
                }
                admitted
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).sum()
}

/// After a shrink, the lines are split over what each shard holds: a class
/// that holds its whole new share on one shard gets nothing more on the
/// other (split by the limits alone, the other shard's line would have let
/// one more in, 9 against a share of 8).
#[test]
fn after_a_shrink_the_lines_cover_what_each_shard_holds() {
    let limiter = Limiter::builder().capacity(20).shards(2).build().unwrap();
    let eight = limiter
        .acquire_with(ask(Class::Sheddable).units(8))
        .unwrap();
    limiter.set_capacity(10).unwrap();
    // The share of Sheddable is now floor(0.8 x 10) = 8, all held.
    assert_eq!(
        limiter.acquire_with(ask(Class::Sheddable)).unwrap_err(),
        Error::Overload
    );
    // SheddablePlus may fill 9: one more.
    let plus = limiter.acquire_with(ask(Class::SheddablePlus)).unwrap();
    assert_eq!(
        limiter.acquire_with(ask(Class::SheddablePlus)).unwrap_err(),
        Error::Overload
    );
    let last = limiter.try_acquire().unwrap();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop((eight, plus, last));
    assert_eq!(limiter.usage(), 0);
}

/// A full room makes way for a more important newcomer: the newest waiter
/// of the least important class below it gives up its place with
/// `Overload`, counted for its class.
#[test]
fn a_full_room_makes_way_for_a_more_important_class() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(2)
            .shards(1)
            .max_waiters(1)
            .max_wait(LONG)
            .headroom(Class::Sheddable, 1.0)
            .headroom(Class::SheddablePlus, 1.0)
            .build()
            .unwrap(),
    );
    let mut held: Vec<_> = (0..2)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    let low = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || {
            limiter
                .acquire_with(Ask::new().class(Class::Sheddable))
                .map(drop)
        })
    };
    until(|| limiter.waiting() == 1);
    // A waiter of the same class is refused: the room is full.
    assert_eq!(
        limiter
            .acquire_with(Ask::new().class(Class::Sheddable))
            .unwrap_err(),
        Error::Overload
    );
    let high = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || {
            limiter
                .acquire_with(Ask::new().class(Class::CriticalPlus))
                .map(drop)
        })
    };
    assert_eq!(low.join().unwrap(), Err(Error::Overload), "made way");
    until(|| limiter.waiting() == 1);
    held.pop();
    assert_eq!(high.join().unwrap(), Ok(()));
    let stats = limiter.stats();
    assert_eq!(stats.classes[Class::Sheddable.rank()].rejected, 2);
    assert_eq!(stats.classes[Class::CriticalPlus.rank()].accepted, 1);
}
