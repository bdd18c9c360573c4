//! The hot path, op by op: `Limiter::try_acquire` + drop, and a refusal,
//! beside tokio's `Semaphore` and a bare CAS-and-release pair.
//!
//! Two kinds of figure:
//!
//! The limiter with an idle waiting room (`max_waiters`, nobody waiting)
//! is measured too: its release reads the number waiting, before and after.
//!
//! * **Instructions per operation**, exact and repeatable on a busy
//!   machine, under callgrind: `scripts/hot-path-instructions.sh` runs this
//!   binary once per contender and per loop length, with collection on only
//!   inside that contender's `op_*` function, and differences two loop
//!   lengths (so the set-up cancels). What is left is the op itself plus
//!   the call into and return from its `#[inline(never)]` function, which
//!   the script measures too (`op_empty`) and prints as the floor.
//!   This binary does not need valgrind; the script does.
//! * **Time per operation**, ours over the bare pair (admission) and over
//!   tokio (refusal), the best of several interleaved timed loops: what
//!   `cargo bench --bench hot_path` prints.
//!
//! `hot_path <contender> <iterations>` runs one contender's loop and exits
//! (the script's mode); with no such arguments, the timed table.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

mod common;
use common::{best_of, time_loop};
use sidejob::adaptive::{Controller, Guarded};
use sidejob::units::Ask;
use sidejob::{Class, Limiter};
use tokio::sync::Semaphore;

/// Large enough that admission never meets the limit.
const BIG: usize = 1 << 20;

/// The tenant that holds a unit for good in `ours_keyed_busy`.
const BUSY_KEY: u64 = 9;

// ---- the contenders: one call = one operation -----------------------------
//
// Each is `#[inline(never)]` so callgrind can count it alone, and takes its
// subject through `black_box`, so nothing about it is hoisted out of the
// loop: every call pays what a user's call pays.

/// Ours: admission + release (the permit's drop).
#[inline(never)]
fn op_ours_admit(limiter: &Limiter) {
    let permit = black_box(limiter).try_acquire().expect("no overload here");
    black_box(&permit);
}

/// Ours with a waiting room (nobody waiting): admission + release.
#[inline(never)]
fn op_ours_admit_room(limiter: &Limiter) {
    let permit = black_box(limiter).try_acquire().expect("no overload here");
    black_box(&permit);
}

/// Ours with an adaptive controller timing the permit at its default
/// sampling (one in `DEFAULT_SAMPLE_EVERY`): admission, the sampling
/// countdown, release, and for a sampled permit two clock reads and the
/// sample's relaxed adds. (A controller with untimed permits is
/// `op_ours_admit`: the limiter does not know it is there.)
#[inline(never)]
fn op_ours_admit_timed(limiter: &Limiter, controller: &Controller) {
    let permit = controller.timed(black_box(limiter).try_acquire().expect("no overload here"));
    black_box(&permit);
}

/// Ours: admission + release of 4 units at once (`try_acquire_many`), on
/// one shard (the common case of a weighted request).
#[inline(never)]
fn op_ours_admit_many(limiter: &Limiter) {
    let permit = black_box(limiter)
        .try_acquire_many(4)
        .expect("no overload here");
    black_box(&permit);
}

/// Ours: admission + release of one unit through the front door with a
/// fail-fast ask of the default class (`acquire_with`): the plain side of
/// the priority comparison.
#[inline(never)]
fn op_ours_admit_with(limiter: &Limiter) {
    let permit = black_box(limiter)
        .acquire_with(Ask::new().fail_fast())
        .expect("no overload here");
    black_box(&permit);
}

/// Ours: the same of a gated class (`Sheddable`, under its line): the
/// classed take (issue 36).
#[inline(never)]
fn op_ours_admit_classed(limiter: &Limiter) {
    let permit = black_box(limiter)
        .acquire_with(Ask::new().class(Class::Sheddable).fail_fast())
        .expect("no overload here");
    black_box(&permit);
}

/// Ours: the same on a limiter whose `Sheddable` class has a min share,
/// so its units are counted while held (the min share's cost).
#[inline(never)]
fn op_ours_admit_counted(limiter: &Limiter) {
    let permit = black_box(limiter)
        .acquire_with(Ask::new().class(Class::Sheddable).fail_fast())
        .expect("no overload here");
    black_box(&permit);
}

/// Ours: the same ask of the default class with a tenant key (a `u64`,
/// hashed here as a caller's ask is built): its units counted to its key
/// while held, its share checked (issue 37).
#[inline(never)]
fn op_ours_admit_keyed(limiter: &Limiter, key: u64) {
    let permit = black_box(limiter)
        .acquire_with(Ask::new().key(&black_box(key)).fail_fast())
        .expect("no overload here");
    black_box(&permit);
}

/// Ours: the same take for a tenant that already holds a unit (a busy
/// tenant: its word is counted up and down, it stays active).
#[inline(never)]
fn op_ours_admit_keyed_busy(limiter: &Limiter, key: u64) {
    let permit = black_box(limiter)
        .acquire_with(Ask::new().key(&black_box(key)).fail_fast())
        .expect("no overload here");
    black_box(&permit);
}

/// Ours: a refusal, counted (every shard full).
#[inline(never)]
fn op_ours_refuse(limiter: &Limiter) {
    assert!(black_box(limiter).try_acquire().is_err());
}

/// tokio: `try_acquire` + drop.
#[inline(never)]
fn op_tokio_admit(semaphore: &Semaphore) {
    let permit = black_box(semaphore)
        .try_acquire()
        .expect("no overload here");
    black_box(&permit);
}

/// tokio: a refusal (no permits).
#[inline(never)]
fn op_tokio_refuse(semaphore: &Semaphore) {
    assert!(black_box(semaphore).try_acquire().is_err());
}

/// The bare pair: a CAS-increment under a limit and a `fetch_sub`, with the
/// orderings a limiter needs (Acquire to take, Release to give back).
#[inline(never)]
fn op_bare_admit(counter: &AtomicUsize) {
    let counter = black_box(counter);
    let mut current = counter.load(Ordering::Relaxed);
    loop {
        assert!(current < BIG);
        match counter.compare_exchange_weak(
            current,
            current + 1,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(actual) => current = actual,
        }
    }
    counter.fetch_sub(1, Ordering::Release);
}

/// The bare pair's refusal: one load and a compare.
#[inline(never)]
fn op_bare_refuse(counter: &AtomicUsize) {
    assert!(black_box(counter).load(Ordering::Relaxed) >= BIG);
}

/// Nothing: the call, the argument and the return, the floor under every
/// figure above.
#[inline(never)]
fn op_empty(x: &AtomicUsize) {
    black_box(x);
}

/// As `op_ours_admit_timed`, the controller timing every permit
/// (`sample_every(1)`).
#[inline(never)]
fn op_ours_admit_timed_every(limiter: &Limiter, controller: &Controller) {
    let permit = controller.timed(black_box(limiter).try_acquire().expect("no overload here"));
    black_box(&permit);
}

/// As `op_ours_admit_timed`, no permit sampled (`sample_every` of 2^30):
/// what each unsampled permit pays, the countdown and the wrapper.
#[inline(never)]
fn op_ours_admit_timed_unsampled(limiter: &Limiter, controller: &Controller) {
    let permit = controller.timed(black_box(limiter).try_acquire().expect("no overload here"));
    black_box(&permit);
}

// ---- the subjects ----------------------------------------------------------

struct Subjects {
    ours: Limiter,
    /// A limiter under a controller, and the controller.
    timed: Arc<Limiter>,
    controller: Controller,
    /// The same, timing every permit.
    controller_every: Controller,
    /// The same, timing (almost) none.
    controller_none: Controller,
    ours_room: Limiter,
    /// A limiter whose `Sheddable` class has a min share: its units are
    /// counted while held.
    ours_min_share: Limiter,
    ours_full: Limiter,
    /// A limiter where tenant `BUSY_KEY` holds a unit for good.
    ours_keyed_busy: Limiter,
    tokio: Semaphore,
    tokio_empty: Semaphore,
    bare: AtomicUsize,
    bare_full: AtomicUsize,
}

fn subjects() -> Subjects {
    let ours = Limiter::new(BIG).expect("valid bench configuration");
    let ours_full = Limiter::new(num_cpus()).expect("valid bench configuration");
    for _ in 0..ours_full.capacity() {
        std::mem::forget(ours_full.try_acquire().expect("room while filling"));
    }
    let ours_keyed_busy = Limiter::new(BIG).expect("valid bench configuration");
    std::mem::forget(
        ours_keyed_busy
            .acquire_with(Ask::new().key(&BUSY_KEY).fail_fast())
            .expect("room for the busy tenant"),
    );
    let ours_min_share = Limiter::builder()
        .capacity(BIG)
        .min_share(Class::Sheddable, 0.05)
        .build()
        .expect("valid bench configuration");
    let ours_room = Limiter::builder()
        .capacity(BIG)
        .max_waiters(64)
        .build()
        .expect("valid bench configuration");
    let timed = Arc::new(Limiter::new(BIG).expect("valid bench configuration"));
    // A ceiling of BIG and a long interval: the samples never tick, so the
    // op measured is the hot path's, not the controller's.
    let controller = Controller::builder()
        .ceiling(BIG)
        .interval(std::time::Duration::from_secs(3600))
        .build(Arc::clone(&timed), Guarded::default())
        .expect("valid bench configuration");
    let controller_every = Controller::builder()
        .ceiling(BIG)
        .interval(std::time::Duration::from_secs(3600))
        .sample_every(1)
        .build(Arc::clone(&timed), Guarded::default())
        .expect("valid bench configuration");
    let controller_none = Controller::builder()
        .ceiling(BIG)
        .interval(std::time::Duration::from_secs(3600))
        .sample_every(1 << 30)
        .build(Arc::clone(&timed), Guarded::default())
        .expect("valid bench configuration");
    // Warm them: the thread's index, the full set, the lines.
    drop(ours.try_acquire());
    drop(ours_room.try_acquire());
    assert!(ours_full.try_acquire().is_err());
    Subjects {
        ours,
        timed,
        controller,
        controller_every,
        controller_none,
        ours_room,
        ours_min_share,
        ours_full,
        ours_keyed_busy,
        tokio: Semaphore::new(BIG),
        tokio_empty: Semaphore::new(0),
        bare: AtomicUsize::new(0),
        bare_full: AtomicUsize::new(BIG),
    }
}

fn num_cpus() -> usize {
    Limiter::new(BIG).expect("valid").shards()
}

/// Runs `name`'s op `iters` times.
fn run(s: &Subjects, name: &str, iters: u64) {
    match name {
        "ours_admit" => (0..iters).for_each(|_| op_ours_admit(&s.ours)),
        "ours_admit_room" => (0..iters).for_each(|_| op_ours_admit_room(&s.ours_room)),
        "ours_admit_timed" => (0..iters).for_each(|_| op_ours_admit_timed(&s.timed, &s.controller)),
        "ours_admit_timed_every" => (0..iters).for_each(|_| {
            op_ours_admit_timed_every(&s.timed, &s.controller_every);
        }),
        "ours_admit_timed_unsampled" => {
            // The countdown is the thread's, shared by every controller: a
            // first permit (sampled: the countdown starts at 1) sets it to
            // a gap of about 2^30, here only, not to starve the others.
            drop(
                s.controller_none
                    .timed(s.timed.try_acquire().expect("room")),
            );
            (0..iters).for_each(|_| op_ours_admit_timed_unsampled(&s.timed, &s.controller_none));
        }
        "ours_refuse" => (0..iters).for_each(|_| op_ours_refuse(&s.ours_full)),
        // The refusal as a caller's own loop meets it, inlined where it
        // can be (ours is; tokio's `try_acquire` is a call): the script
        // counts these over the whole program, loop included, the way an
        // independent harness counted them (hardening 3, item 12).
        "loop_ours_refuse" => {
            for _ in 0..iters {
                black_box(s.ours_full.try_acquire().is_err());
            }
        }
        // The same loop as a standalone program has it: the harness's
        // limiter (capacity 2 over 2 shards, both units held) in the
        // loop's own frame, not behind a reference.
        "loop_ours_refuse_local" => {
            let l = Limiter::builder()
                .capacity(2)
                .shards(2)
                .build()
                .expect("valid bench configuration");
            let held = (
                l.try_acquire().expect("room"),
                l.try_acquire().expect("room"),
            );
            assert!(l.try_acquire().is_err(), "both units are held");
            for _ in 0..iters {
                black_box(l.try_acquire().is_err());
            }
            drop(held);
        }
        "loop_tokio_refuse" => {
            for _ in 0..iters {
                black_box(s.tokio_empty.try_acquire().is_err());
            }
        }
        "ours_admit_many" => (0..iters).for_each(|_| op_ours_admit_many(&s.ours)),
        "ours_admit_with" => (0..iters).for_each(|_| op_ours_admit_with(&s.ours)),
        "ours_admit_classed" => (0..iters).for_each(|_| op_ours_admit_classed(&s.ours)),
        "ours_admit_keyed" => (0..iters).for_each(|_| op_ours_admit_keyed(&s.ours, 7)),
        "ours_admit_keyed_busy" => {
            (0..iters).for_each(|_| op_ours_admit_keyed_busy(&s.ours_keyed_busy, BUSY_KEY))
        }
        // The same on a limiter with a min share (its units counted).
        "ours_admit_counted" => (0..iters).for_each(|_| op_ours_admit_counted(&s.ours_min_share)),
        "tokio_admit" => (0..iters).for_each(|_| op_tokio_admit(&s.tokio)),
        "tokio_refuse" => (0..iters).for_each(|_| op_tokio_refuse(&s.tokio_empty)),
        "bare_admit" => (0..iters).for_each(|_| op_bare_admit(&s.bare)),
        "bare_refuse" => (0..iters).for_each(|_| op_bare_refuse(&s.bare_full)),
        "empty" => (0..iters).for_each(|_| op_empty(&s.bare)),
        other => panic!("unknown contender {other}"),
    }
}

// ---- the timed table -------------------------------------------------------

fn timed_table(s: &Subjects) {
    const ITERS: u64 = 2_000_000;
    const ROUNDS: usize = 11;
    let ns = best_of(
        ROUNDS,
        &mut [
            &mut || time_loop(ITERS, || op_ours_admit(&s.ours)),
            &mut || time_loop(ITERS, || op_ours_admit_room(&s.ours_room)),
            &mut || time_loop(ITERS, || op_bare_admit(&s.bare)),
            &mut || time_loop(ITERS, || op_tokio_admit(&s.tokio)),
            &mut || time_loop(ITERS, || op_ours_refuse(&s.ours_full)),
            &mut || time_loop(ITERS, || op_bare_refuse(&s.bare_full)),
            &mut || time_loop(ITERS, || op_tokio_refuse(&s.tokio_empty)),
            &mut || time_loop(ITERS, || op_empty(&s.bare)),
            &mut || time_loop(ITERS, || op_ours_admit_timed(&s.timed, &s.controller)),
            &mut || {
                time_loop(ITERS, || {
                    op_ours_admit_timed_every(&s.timed, &s.controller_every);
                })
            },
            &mut || time_loop(ITERS, || op_ours_admit_many(&s.ours)),
            &mut || time_loop(ITERS, || op_ours_admit_with(&s.ours)),
            &mut || time_loop(ITERS, || op_ours_admit_keyed(&s.ours, 7)),
            &mut || {
                time_loop(ITERS, || {
                    op_ours_admit_keyed_busy(&s.ours_keyed_busy, BUSY_KEY);
                })
            },
        ],
    );
    let [ours_a, room_a, bare_a, tokio_a, ours_r, bare_r, tokio_r, empty, timed_a, every_a, many_a, with_a, keyed_a, busy_a] =
        ns[..]
    else {
        unreachable!()
    };
    println!("== hot path, 1 thread, ns per op (best of {ROUNDS} interleaved loops of {ITERS}) ==");
    println!(
        "admission + release: sidejob {ours_a:.2}, bare pair {bare_a:.2}, tokio {tokio_a:.2} (empty call {empty:.2}); sidejob with an idle waiting room {room_a:.2}"
    );
    println!("refusal:             sidejob {ours_r:.2}, bare load {bare_r:.2}, tokio {tokio_r:.2}");
    println!(
        "ratio admission sidejob/bare pair = {:.2}   (target <= 1.20)",
        ours_a / bare_a
    );
    println!(
        "ratio admission sidejob/tokio     = {:.2}",
        ours_a / tokio_a
    );
    println!(
        "ratio refusal   sidejob/tokio     = {:.2}",
        ours_r / tokio_r
    );
    println!(
        "ratio admission room/no room      = {:.2}   (benches/waiting.rs section 1: <= 1.05)",
        room_a / ours_a
    );
    println!(
        "ratio admission timed/untimed     = {:.2}   (an adaptive controller, default sampling; every permit timed: {:.2}; untimed: 1.00 by construction)",
        timed_a / ours_a,
        every_a / ours_a
    );
    println!(
        "ratio try_acquire_many(4)/one   = {:.2}   (admission + release of 4 units at once over one unit's; target <= 1.20)",
        many_a / ours_a
    );
    println!(
        "ratio keyed/unkeyed acquire_with  = {:.2}   (one unit of a tenant key over the same take without one; a busy tenant's: {:.2}; target <= 1.50)",
        keyed_a / with_a,
        busy_a / with_a
    );
    assert_eq!(s.ours.usage(), 0);
    assert_eq!(s.ours_keyed_busy.usage(), 1);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let s = subjects();
    // The script's mode: `hot_path <contender> <iterations>`.
    if let [name, iters] = &args[..] {
        if let Ok(iters) = iters.parse::<u64>() {
            run(&s, name, iters);
            return;
        }
    }
    // `cargo test --benches` runs each bench once as a smoke test, without
    // `--bench`: one short pass of every contender, no timing.
    if !args.iter().any(|arg| arg == "--bench") {
        for name in [
            "ours_admit",
            "ours_admit_room",
            "ours_admit_timed",
            "ours_admit_timed_every",
            "ours_admit_timed_unsampled",
            "ours_refuse",
            "loop_ours_refuse",
            "loop_ours_refuse_local",
            "loop_tokio_refuse",
            "ours_admit_many",
            "ours_admit_with",
            "ours_admit_classed",
            "ours_admit_keyed",
            "ours_admit_keyed_busy",
            "ours_admit_counted",
            "tokio_admit",
            "tokio_refuse",
            "bare_admit",
            "bare_refuse",
            "empty",
        ] {
            run(&s, name, 1000);
        }
        return;
    }
    timed_table(&s);
}
