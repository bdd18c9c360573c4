//! Loom models of the `Limiter`'s admission table, through the public API.
//!
//! What they show, under every interleaving loom explores:
//!
//! * racing threads never hold more than `capacity` permits, across shards;
//! * when more threads try than there are units and nobody releases,
//!   exactly `capacity` win and the rest are refused (and counted);
//! * a release makes room again: a `try_acquire` that happens-after a drop
//!   is admitted (one shard, and two shards where it must walk);
//! * the full-set bitmap never *stays* set on a shard with room: once a
//!   filler racing a releaser has returned, a free unit is found; the same
//!   when the releaser gives back a run of units in one RMW (a plain pool
//!   worker's finished casts, `Table::release_many`).
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --release`
//! (CI uses 2).
#![cfg(loom)]

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;
use sidejob::loom_api::Table;
use sidejob::{Error, Limiter, OwnedPermit};

fn limiter(capacity: usize, shards: usize) -> Arc<Limiter> {
    let limiter = Limiter::builder()
        .capacity(capacity)
        .shards(shards)
        .build()
        .expect("a valid configuration");
    Arc::new(limiter)
}

/// Takes a permit; while it is held, bumps `active` and checks the bound.
/// Returns whether it was admitted.
fn try_work(limiter: &Limiter, active: &AtomicUsize) -> bool {
    match limiter.try_acquire() {
        Ok(_permit) => {
            // Relaxed: RMWs on this one word keep the count exact, and a
            // stronger ordering would add happens-before edges between
            // holders that the table itself must provide (and could hide a
            // missing one from the model).
            let now = active.fetch_add(1, Ordering::Relaxed) + 1;
            assert!(
                now <= limiter.capacity(),
                "{now} permits held at once, capacity {}",
                limiter.capacity()
            );
            active.fetch_sub(1, Ordering::Relaxed);
            true
        }
        Err(Error::Overload) => false,
        Err(other) => panic!("unexpected error {other}"),
    }
}

/// (a) Threads racing to acquire and release never exceed capacity, and
/// the accounting adds up afterwards.
fn racing_never_exceeds(threads: usize, capacity: usize, attempts_each: usize) {
    let mut builder = loom::model::Builder::new();
    if threads > 2 {
        // Heavy: three threads each take a thread index (a loom Mutex),
        // probe, walk and release through the full-bit steps; at 2
        // preemptions these two models ran for more than 10 minutes on 2
        // cores once a take and a release had a few more atomic steps
        // (the limit load, the release's pre-read). Cap at 1, as tokio's
        // `batch` models do; the two-thread churn model below runs at the
        // full bound, and the specific races (marks, releases, resizes,
        // waiters) have two-thread models of their own.
        builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(1).min(1));
    }
    builder.check(move || {
        let limiter = limiter(capacity, 2);
        let active = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                let active = Arc::clone(&active);
                thread::spawn(move || {
                    (0..attempts_each)
                        .filter(|_| try_work(&limiter, &active))
                        .count()
                })
            })
            .collect();
        let won: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(won >= 1, "the first attempt of all always finds room");
        assert_eq!(limiter.usage(), 0);
        let stats = limiter.stats();
        assert_eq!(stats.accepted, won as u64);
        assert_eq!(
            stats.accepted + stats.rejected,
            (threads * attempts_each) as u64
        );
        assert_eq!(stats.completed, stats.accepted);
        assert!(stats.peak_usage <= capacity);
    });
}

#[test]
fn racing_threads_never_exceed_capacity_1() {
    racing_never_exceeds(3, 1, 1);
}

#[test]
fn racing_threads_never_exceed_capacity_2_over_2_shards() {
    racing_never_exceeds(3, 2, 1);
}

#[test]
fn churning_threads_never_exceed_capacity_2_over_2_shards() {
    racing_never_exceeds(2, 2, 2);
}

/// (b) `threads` try once and keep what they get: exactly `capacity` win.
fn exactly_capacity_won(threads: usize, capacity: usize) {
    loom::model(move || {
        let limiter = limiter(capacity, 2);
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || match limiter.try_acquire_owned() {
                    Ok(permit) => Some(permit),
                    Err(Error::Overload) => None,
                    Err(other) => panic!("unexpected error {other}"),
                })
            })
            .collect();
        let held: Vec<OwnedPermit> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        assert_eq!(held.len(), capacity, "exactly capacity permits are won");
        assert_eq!(limiter.usage(), capacity);
        let stats = limiter.stats();
        assert_eq!(stats.accepted, capacity as u64);
        assert_eq!(stats.rejected, (threads - capacity) as u64);
        // Still full once every racer has returned.
        assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
        drop(held);
        assert_eq!(limiter.usage(), 0);
        // And every unit comes back.
        let again: Vec<_> = (0..capacity)
            .map(|_| limiter.try_acquire().unwrap())
            .collect();
        assert_eq!(again.len(), capacity);
    });
}

#[test]
fn exactly_capacity_won_1_of_2() {
    exactly_capacity_won(2, 1);
}

#[test]
fn exactly_capacity_won_2_of_3_over_2_shards() {
    exactly_capacity_won(3, 2);
}

/// (c) Thread A drops a permit and then sets a flag; thread B, if it sees
/// the flag, must be admitted. `capacity` permits are taken up front, so
/// the only room B can find is the one A gave back.
fn release_makes_room(capacity: usize) {
    loom::model(move || {
        let limiter = limiter(capacity, 2);
        let mut held: Vec<OwnedPermit> = (0..capacity)
            .map(|_| limiter.try_acquire_owned().unwrap())
            .collect();
        assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
        let released = held.pop().unwrap();
        let flag = Arc::new(AtomicBool::new(false));

        let a = {
            let flag = Arc::clone(&flag);
            thread::spawn(move || {
                drop(released);
                // Release: pairs with B's Acquire load; A's drop
                // happens-before B's try_acquire.
                flag.store(true, Ordering::Release);
            })
        };
        let b = {
            let limiter = Arc::clone(&limiter);
            let flag = Arc::clone(&flag);
            thread::spawn(move || {
                if flag.load(Ordering::Acquire) {
                    let permit = limiter.try_acquire();
                    assert!(permit.is_ok(), "refused after a release: {permit:?}");
                    true
                } else {
                    // Too early: either answer is allowed, but never more
                    // than capacity.
                    limiter.try_acquire().is_ok()
                }
            })
        };
        a.join().unwrap();
        let b_won = b.join().unwrap();
        drop(held);
        assert_eq!(limiter.usage(), 0);
        let stats = limiter.stats();
        assert_eq!(stats.accepted, capacity as u64 + u64::from(b_won));
        assert_eq!(stats.rejected, 1 + u64::from(!b_won));
        assert_eq!(stats.completed, stats.accepted);
    });
}

#[test]
fn release_makes_room_capacity_1() {
    release_makes_room(1);
}

#[test]
fn release_makes_room_capacity_2_over_2_shards() {
    release_makes_room(2);
}

/// (d) The full-set bit never stays set on a shard with room.
///
/// `prefill` permits are taken up front (with `prefill == capacity` the
/// table starts full, its bits set). A releaser drops one of them while
/// fillers each try to take one (marking the shard full if they fill it or
/// find no room) and keep what they get. After all have returned, a
/// `try_acquire` must succeed whenever usage is below capacity.
///
/// With `prefill < capacity` on one shard the filler marks the shard while
/// the releaser, who did not mark it, gives back: the releaser must see the
/// filler's bit (the Acquire half of `give_back`'s AcqRel), or the bit stays
/// set over a free unit.
fn bit_never_stays_set(capacity: usize, shards: usize, prefill: usize, fillers: usize) {
    loom::model(move || {
        let limiter = limiter(capacity, shards);
        let held: Vec<OwnedPermit> = (0..prefill)
            .map(|_| limiter.try_acquire_owned().unwrap())
            .collect();
        let mut handles = Vec::new();
        // The releaser gives back one unit (on the shard of its permit).
        let mut held = held.into_iter();
        let released = held.next().unwrap();
        handles.push(thread::spawn(move || {
            drop(released);
            None
        }));
        for _ in 0..fillers {
            let limiter = Arc::clone(&limiter);
            handles.push(thread::spawn(move || limiter.try_acquire_owned().ok()));
        }
        let kept: Vec<OwnedPermit> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        let usage = limiter.usage();
        assert_eq!(usage, prefill - 1 + kept.len());
        if usage < capacity {
            let permit = limiter.try_acquire();
            assert!(
                permit.is_ok(),
                "usage {usage} < capacity {capacity}, yet refused: a full bit stayed set"
            );
        } else {
            assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
        }
        drop(kept);
        drop(held);
        assert_eq!(limiter.usage(), 0);
    });
}

#[test]
fn full_bit_never_stays_set_capacity_1() {
    bit_never_stays_set(1, 2, 1, 1);
}

#[test]
fn full_bit_never_stays_set_capacity_1_two_fillers() {
    bit_never_stays_set(1, 2, 1, 2);
}

#[test]
fn full_bit_never_stays_set_capacity_2_over_2_shards() {
    bit_never_stays_set(2, 2, 2, 1);
}

#[test]
fn full_bit_never_stays_set_filler_marks_releaser_gives_back() {
    bit_never_stays_set(2, 1, 1, 1);
}

#[test]
fn full_bit_never_stays_set_filler_marks_releaser_gives_back_2_shards() {
    // Limits 2 and 1: shard 0 is filled by the filler or found by a walk.
    bit_never_stays_set(3, 2, 2, 1);
}

/// (d, a run) Shard 0 (limit 2) is filled and marked; shard 1 (limit 1)
/// is held. Shard 0 gets both its units back in one `release_many` while a
/// filler tries to take one there, marking the shard if it finds it full.
/// After both return, a caller starting at the full shard 1 must reach
/// shard 0 whenever it has room: a caller is never refused by its own
/// shard's bit, so only a walk shows a bit left set. The run is one
/// release to the full-set protocol.
#[test]
fn full_bit_never_stays_set_after_a_run_is_given_back() {
    loom::model(|| {
        let table = Arc::new(Table::new(3, 2));
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(1), Ok(1));
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release_many(0, 2))
        };
        let filler = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.acquire_at(0).is_ok())
        };
        releaser.join().unwrap();
        let kept = usize::from(filler.join().unwrap());
        assert_eq!(table.usage(), 1 + kept);
        assert_eq!(
            table.acquire_at(1),
            Ok(0),
            "shard 0 has room, yet a walk skipped it: a full bit stayed set"
        );
        assert!(table.bound_holds());
    });
}

/// (d, second form) The filler is also the releaser: thread A takes a unit
/// (filling its shard and marking it) and drops it, while thread B tries
/// once and keeps what it gets. B may find the shard full before A has
/// marked it and mark it itself, racing A's release. After both return, a
/// `try_acquire` must succeed whenever usage is below capacity.
fn bit_never_stays_set_after_churn(capacity: usize, shards: usize) {
    loom::model(move || {
        let limiter = limiter(capacity, shards);
        // Fill all but one unit up front, so A's take fills the table.
        let held: Vec<OwnedPermit> = (0..capacity - 1)
            .map(|_| limiter.try_acquire_owned().unwrap())
            .collect();
        let a = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || drop(limiter.try_acquire()))
        };
        let b = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.try_acquire_owned().ok())
        };
        a.join().unwrap();
        let kept = b.join().unwrap();
        let usage = limiter.usage();
        assert_eq!(usage, capacity - 1 + usize::from(kept.is_some()));
        if usage < capacity {
            let permit = limiter.try_acquire();
            assert!(
                permit.is_ok(),
                "usage {usage} < capacity {capacity}, yet refused: a full bit stayed set"
            );
        }
        drop(kept);
        drop(held);
        assert_eq!(limiter.usage(), 0);
    });
}

#[test]
fn full_bit_never_stays_set_after_churn_capacity_1() {
    bit_never_stays_set_after_churn(1, 2);
}

#[test]
fn full_bit_never_stays_set_after_churn_capacity_2_over_2_shards() {
    bit_never_stays_set_after_churn(2, 2);
}

#[test]
fn full_bit_never_stays_set_after_churn_capacity_2_over_1_shard() {
    bit_never_stays_set_after_churn(2, 1);
}

/// (e) No false `Overload` from the counters. One thread takes and gives
/// back a unit twice while another tries once, capacity 2 on one shard. The
/// single try must succeed: when it runs, at most one unit is held by the
/// other thread. (The churner itself may be refused: if the try fills the
/// shard, its full bit can still be set when the churner probes, the
/// documented window while a marker is in flight.)
///
/// Regressions: `try_take` read `taken`, lost the CPU while the other
/// thread took and gave back, then read `given` past it (a wrapped, huge
/// usage); and a plain load of `given` lagging releases that came before
/// the `taken` it was read with (now confirmed by an RMW before `Full`).
fn never_refused_by_the_counters(shards: usize) {
    loom::model(move || {
        let limiter = limiter(2, shards);
        let churner = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let mut admitted = 0;
                for _ in 0..2 {
                    if let Ok(permit) = limiter.try_acquire() {
                        admitted += 1;
                        drop(permit);
                    }
                }
                admitted
            })
        };
        let held = limiter.try_acquire();
        assert!(held.is_ok(), "refused with room: {held:?}");
        drop(held);
        let churned = churner.join().unwrap();
        assert_eq!(limiter.usage(), 0);
        let stats = limiter.stats();
        assert_eq!(stats.accepted, 1 + churned);
        assert_eq!(stats.accepted + stats.rejected, 3);
    });
}

#[test]
fn never_refused_by_the_counters_1_shard() {
    never_refused_by_the_counters(1);
}

#[test]
fn never_refused_by_the_counters_2_shards() {
    never_refused_by_the_counters(2);
}

/// (f) A release that a caller has seen never lets a mark refuse it.
///
/// Both shards of a capacity-2 table are full and marked. A releaser gives
/// back shard 0's unit while the main thread, whose own shard (1) is full,
/// reads the usage and, if it sees the unit back, probes. It must be
/// admitted on shard 0: the releaser clears the mark *before* its unit
/// comes back, so whoever sees the unit sees the clear. (Before, the
/// release gave the unit back, then cleared the bit: a releaser
/// descheduled between the two kept a free shard looking full to every
/// caller whose own shard was full, for as long as it stayed off the CPU.)
///
/// `counted` runs the same race against the count of marked shards that
/// tables of more than 64 shards refuse by.
fn seen_release_is_never_refused(counted: bool) {
    use sidejob::loom_api::Table;

    loom::model(move || {
        let table = Arc::new(if counted {
            Table::with_count(2, 2)
        } else {
            Table::new(2, 2)
        });
        assert_eq!(table.acquire_at(0), Ok(0));
        assert_eq!(table.acquire_at(1), Ok(1));
        let releaser = {
            let table = Arc::clone(&table);
            thread::spawn(move || table.release(0))
        };
        if table.usage() < 2 {
            assert_eq!(
                table.acquire_at(1),
                Ok(0),
                "the release was seen, yet its shard still looked full"
            );
            table.release(0);
        }
        releaser.join().unwrap();
        table.release(1);
        assert_eq!(table.usage(), 0);
    });
}

#[test]
fn seen_release_is_never_refused_by_the_bitmap() {
    seen_release_is_never_refused(false);
}

#[test]
fn seen_release_is_never_refused_by_the_count() {
    seen_release_is_never_refused(true);
}

/// (g) The count of marked shards never stays at "all full" over a free
/// unit: the races of (d) on the counted table, each ending with a probe
/// from a shard that is still full (its own-shard check cannot help), which
/// must find room whenever there is room.
///
/// * `churn == false`: both shards start full; a releaser gives back shard
///   0's unit while the main thread probes from its full shard 1.
/// * `churn == true`: shard 0 starts full; a churner takes shard 1's unit
///   (filling and marking it) and gives it back, while the main thread
///   probes from shard 1 and may find it full and mark it, racing the
///   release (the case step 3 exists for).
fn count_never_stays_full(churn: bool) {
    use sidejob::loom_api::Table;

    loom::model(move || {
        let table = Arc::new(Table::with_count(2, 2));
        assert_eq!(table.acquire_at(0), Ok(0));
        if !churn {
            assert_eq!(table.acquire_at(1), Ok(1));
        }
        let other = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                if churn {
                    if let Ok(shard) = table.acquire_at(1) {
                        table.release(shard);
                    }
                } else {
                    table.release(0);
                }
            })
        };
        let kept = table.acquire_at(1).ok();
        other.join().unwrap();
        // Held now: the prefill still held, plus what the main thread kept.
        let still_full = if churn { 0 } else { 1 };
        let held = 1 + usize::from(kept.is_some());
        assert_eq!(table.usage(), held);
        if held < 2 {
            let again = table.acquire_at(still_full);
            assert!(again.is_ok(), "usage {held} < 2, yet refused: {again:?}");
            table.release(again.unwrap());
        }
        if let Some(shard) = kept {
            table.release(shard);
        }
        table.release(still_full);
        assert_eq!(table.usage(), 0);
    });
}

#[test]
fn count_never_stays_full_after_a_release() {
    count_never_stays_full(false);
}

#[test]
fn count_never_stays_full_after_churn() {
    count_never_stays_full(true);
}

/// (h) `usage()` never reads above the capacity. A churner takes and gives
/// back the only unit twice while the main thread reads the usage. Under
/// loom the exact read is tried once before the fallback, so the fallback
/// (`taken` read before `given`) is explored. The old fallback returned the
/// last `taken - given` pair with `given` read before `taken`, which could
/// count a unit taken after a release it missed: 2 units on a capacity 1.
#[test]
fn usage_never_reads_above_capacity() {
    loom::model(|| {
        let limiter = limiter(1, 1);
        let churner = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                for _ in 0..2 {
                    drop(limiter.try_acquire());
                }
            })
        };
        // The reader takes and gives back a unit first, as callers do. Loom
        // explored a single execution of a model whose main thread only
        // loaded (its loads were never tried against the churner's writes);
        // with this access first, it explores them, and the old fallback
        // fails here.
        drop(limiter.try_acquire());
        let usage = limiter.usage();
        assert!(usage <= 1, "usage {usage} read above capacity 1");
        churner.join().unwrap();
        assert_eq!(limiter.usage(), 0);
    });
}
