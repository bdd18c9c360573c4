//! Requests of many units through the pool (issue 35): `call_with` and
//! `cast_with` hold every unit of their `Ask` from admission until the
//! handler has finished, all or nothing; `TooLarge` for 0 units or more
//! than the capacity, `Overload` for a fail-fast ask that does not fit, a
//! waiting ask served from the room (passed by smaller requests as the
//! pass budget says); every unit back after a panic, across shards and a
//! shutdown; and a stress run against a shadow ledger.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{units::Ask, Error, Pool, PoolBuilder, Worker};

use crate::common::{bounded, until, Rng, GATE_PATIENCE};

/// Each handler reports its request's id when it starts, then blocks until
/// the test sends a token on the gate (any worker takes any token); id 0
/// panics once let through.
pub(crate) struct Held {
    started: Sender<u64>,
    gate: Receiver<()>,
}

impl Held {
    fn run(&mut self, id: u64) -> u64 {
        self.started.send(id).unwrap();
        self.gate
            .recv_timeout(GATE_PATIENCE)
            .expect("the gate opens (a test that failed before opening it ends here)");
        assert!(id != 0, "request 0 panics");
        id
    }
}

impl Worker for Held {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    fn handle_call(&mut self, id: u64) -> u64 {
        self.run(id)
    }
    fn handle_cast(&mut self, id: u64) {
        self.run(id);
    }
}

/// A pool of [`Held`] workers built by `configure`; the started channel and
/// the gate.
pub(crate) fn held(
    configure: impl FnOnce(&mut PoolBuilder),
) -> (Pool<Held>, Receiver<u64>, Sender<()>) {
    let (started_tx, started) = unbounded();
    let (open, gate) = unbounded();
    let mut builder = Pool::builder();
    configure(&mut builder);
    let pool = builder
        .build(move |_| Held {
            started: started_tx.clone(),
            gate: gate.clone(),
        })
        .unwrap();
    (pool, started, open)
}

pub(crate) fn next_start(started: &Receiver<u64>) -> u64 {
    started
        .recv_timeout(GATE_PATIENCE)
        .expect("a handler starts")
}

#[test]
fn call_with_holds_every_unit_until_its_handler_has_finished() {
    let (pool, started, open) = held(|b| {
        b.capacity(8).workers(2);
    });
    let caller = {
        let pool = pool.clone();
        thread::spawn(move || pool.call_with(Ask::new().units(5), 7))
    };
    assert_eq!(next_start(&started), 7);
    // Running: all five held, whichever shards they came from.
    assert_eq!((pool.usage(), pool.available()), (5, 3));
    assert_eq!(
        pool.call_with(Ask::new().units(4).fail_fast(), 1),
        Err(Error::Overload)
    );
    assert_eq!(
        pool.cast_with(Ask::new().units(4).fail_fast(), 1),
        Err(Error::Overload)
    );
    open.send(()).unwrap();
    assert_eq!(caller.join().unwrap(), Ok(7));
    // Given back before the reply.
    assert_eq!(pool.usage(), 0);
    let stats = pool.stats();
    assert_eq!((stats.accepted, stats.rejected), (5, 2));
}

#[test]
fn cast_with_holds_every_unit_until_its_handler_has_finished() {
    let (pool, started, open) = held(|b| {
        b.capacity(6).workers(3).steal(false);
    });
    pool.cast_with(Ask::new().units(4), 11).unwrap();
    assert_eq!(next_start(&started), 11);
    assert_eq!(pool.usage(), 4);
    pool.cast_with(Ask::new().units(2).fail_fast(), 12).unwrap();
    assert_eq!(pool.usage(), 6);
    assert_eq!(pool.cast(13), Err(Error::Overload));
    // Shutdown begins while the casts hold units on other workers'
    // shards: those workers wake, find their shards not drained, and wait
    // again. The casts' releases must wake them to leave, or the join
    // hangs.
    let closing = {
        let pool = pool.clone();
        thread::spawn(move || pool.shutdown())
    };
    until(|| pool.is_shutdown());
    open.send(()).unwrap();
    open.send(()).unwrap();
    bounded("shutdown after casts of many units", move || {
        closing.join().unwrap();
        assert_eq!(pool.usage(), 0);
        assert_eq!(pool.stats().completed, 6);
    });
}

#[test]
fn zero_units_and_more_than_the_capacity_in_force_are_too_large() {
    let (pool, _started, _open) = held(|b| {
        b.capacity(8).workers(2);
    });
    assert_eq!(pool.call_with(Ask::new().units(0), 1), Err(Error::TooLarge));
    assert_eq!(pool.cast_with(Ask::new().units(0), 1), Err(Error::TooLarge));
    assert_eq!(pool.call_with(Ask::new().units(9), 1), Err(Error::TooLarge));
    assert_eq!(
        pool.cast_with(Ask::new().units(9).fail_fast(), 1),
        Err(Error::TooLarge)
    );
    pool.set_capacity(4).unwrap();
    assert_eq!(pool.cast_with(Ask::new().units(5), 1), Err(Error::TooLarge));
    assert_eq!(pool.usage(), 0);
    pool.shutdown();
    assert_eq!(pool.cast_with(Ask::new().units(2), 1), Err(Error::Shutdown));
}

#[test]
fn a_waiting_ask_is_served_once_its_units_free() {
    let (pool, started, open) = held(|b| {
        b.capacity(4).workers(1).max_waiters(4);
    });
    pool.cast_with(Ask::new().units(3), 1).unwrap();
    assert_eq!(next_start(&started), 1);
    let waiter = {
        let pool = pool.clone();
        thread::spawn(move || pool.call_with(Ask::new().units(2), 2))
    };
    until(|| pool.waiting() == 1);
    assert_eq!(pool.usage(), 3);
    // A fail-fast ask never waits, even with room in the queue.
    assert_eq!(
        pool.call_with(Ask::new().units(2).fail_fast(), 3),
        Err(Error::Overload)
    );
    open.send(()).unwrap(); // the cast ends: its three units go to the waiter
    assert_eq!(next_start(&started), 2);
    assert_eq!((pool.usage(), pool.waiting()), (2, 0));
    open.send(()).unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(2));
    assert_eq!(pool.usage(), 0);
    assert_eq!(pool.stats().waited, 1);
}

#[test]
fn a_waiting_ask_gives_up_at_its_own_deadline() {
    let (pool, started, open) = held(|b| {
        b.capacity(2)
            .workers(1)
            .max_waiters(4)
            .max_wait(Duration::from_secs(600));
    });
    pool.cast_with(Ask::new().units(2), 1).unwrap();
    assert_eq!(next_start(&started), 1);
    let soon = Instant::now() + Duration::from_millis(5);
    assert_eq!(
        pool.call_with(Ask::new().units(2).wait_until(soon), 2),
        Err(Error::Timeout)
    );
    assert_eq!((pool.usage(), pool.waiting()), (2, 0));
    open.send(()).unwrap();
    pool.shutdown();
    assert_eq!(pool.usage(), 0);
}

/// A waiting call of two units, a waiting call of one behind it, and one
/// unit freed: with the default pass budget the small request passes the
/// large one; with a budget of 0 (strict FIFO) the unit is kept for the
/// large one and the small one waits.
#[test]
fn the_pass_budget_decides_whether_a_small_request_passes_a_large_one() {
    for (budget, passes) in [(None, true), (Some(0), false)] {
        let (pool, started, open) = held(|b| {
            b.capacity(4).workers(1).max_waiters(4);
            if let Some(budget) = budget {
                b.pass_budget(budget);
            }
        });
        for id in 1..=4 {
            pool.cast(id).unwrap(); // every unit, the first at the gate
        }
        assert_eq!(next_start(&started), 1);
        let large = {
            let pool = pool.clone();
            thread::spawn(move || pool.call_with(Ask::new().units(2), 20))
        };
        until(|| pool.waiting() == 1);
        let small = {
            let pool = pool.clone();
            thread::spawn(move || pool.call(10))
        };
        until(|| pool.waiting() == 2);
        open.send(()).unwrap(); // cast 1 ends: one unit back
                                // Cast 2 starts only after cast 1's unit went back, and the room
                                // hands a unit on within that release.
        assert_eq!(next_start(&started), 2);
        assert_eq!(
            pool.waiting(),
            if passes { 1 } else { 2 },
            "budget {budget:?}"
        );
        for _ in 0..5 {
            open.send(()).unwrap(); // casts 2-4 and both calls
        }
        assert_eq!(large.join().unwrap(), Ok(20), "budget {budget:?}");
        assert_eq!(small.join().unwrap(), Ok(10), "budget {budget:?}");
        // Both calls ran (in either order: their callers post them
        // once woken, and either may post first).
        let mut rest: Vec<u64> = (0..4).map(|_| next_start(&started)).collect();
        rest.sort_unstable();
        assert_eq!(rest, [3, 4, 10, 20], "budget {budget:?}");
        assert_eq!(pool.usage(), 0);
    }
}

#[test]
fn a_panicking_handler_gives_every_unit_back() {
    let (pool, started, open) = held(|b| {
        b.capacity(6).workers(2);
    });
    let caller = {
        let pool = pool.clone();
        thread::spawn(move || pool.call_with(Ask::new().units(4), 0))
    };
    assert_eq!(next_start(&started), 0);
    assert_eq!(pool.usage(), 4);
    open.send(()).unwrap();
    assert_eq!(caller.join().unwrap(), Err(Error::WorkerPanicked));
    assert_eq!(pool.usage(), 0);
    // A cast that panics: its units come back too, and the rebuilt worker
    // serves the next request of many units.
    pool.cast_with(Ask::new().units(5), 0).unwrap();
    assert_eq!(next_start(&started), 0);
    assert_eq!(pool.usage(), 5);
    open.send(()).unwrap();
    until(|| pool.usage() == 0);
    open.send(()).unwrap();
    assert_eq!(pool.call_with(Ask::new().units(6), 3), Ok(3));
    assert_eq!(pool.usage(), 0);
    assert!(pool.stats().panicked >= 2);
}

/// A worker that, asked for `n > 0`, calls its own pool with a request of
/// `units` units (which answers 40); the pool it calls is in the slot.
struct Relay {
    slot: Arc<Mutex<Option<Pool<Relay>>>>,
    units: usize,
}

impl Worker for Relay {
    type Request = u64;
    type Reply = Result<u64, Error>;
    type Message = ();
    fn handle_call(&mut self, n: u64) -> Result<u64, Error> {
        if n == 0 {
            return Ok(40);
        }
        let pool = self.slot.lock().unwrap().clone().unwrap();
        pool.call_with(Ask::new().units(self.units), 0)?
    }
    fn handle_cast(&mut self, (): ()) {}
}

#[test]
fn a_worker_calling_its_own_single_worker_pool_is_refused() {
    let slot = Arc::new(Mutex::new(None));
    let pool = {
        let slot = Arc::clone(&slot);
        Pool::builder()
            .capacity(4)
            .workers(1)
            .build(move |_| Relay {
                slot: Arc::clone(&slot),
                units: 2,
            })
            .unwrap()
    };
    *slot.lock().unwrap() = Some(pool.clone());
    let answer = bounded("a worker's call_with to its own pool", {
        let pool = pool.clone();
        move || pool.call(1)
    });
    assert_eq!(answer, Ok(Err(Error::CallingSelf)));
    assert_eq!(pool.usage(), 0);
    slot.lock().unwrap().take(); // no cycle left: the pool can shut down
}

/// A worker of a pool of several calls it with many units: the request
/// goes to another worker (never queued behind the caller), and is served.
#[test]
fn a_worker_calling_its_own_pool_of_several_workers_is_served_elsewhere() {
    let slot = Arc::new(Mutex::new(None));
    let pool = {
        let slot = Arc::clone(&slot);
        Pool::builder()
            .capacity(12)
            .workers(3)
            .steal(false)
            .build(move |_| Relay {
                slot: Arc::clone(&slot),
                units: 3,
            })
            .unwrap()
    };
    *slot.lock().unwrap() = Some(pool.clone());
    for _ in 0..20 {
        let answer = bounded("a worker's call_with to its own pool", {
            let pool = pool.clone();
            move || pool.call(1)
        });
        assert_eq!(answer, Ok(Ok(40)));
    }
    assert_eq!(pool.usage(), 0);
    slot.lock().unwrap().take();
}

/// What the stress run's handlers record: units running now, the most
/// ever, and how often each request was handled.
#[derive(Default)]
struct Ledger {
    running: usize,
    peak: usize,
    handled: HashMap<u64, usize>,
}

/// A worker that books each request's units in the ledger while it runs.
struct Booked(Arc<Mutex<Ledger>>);

impl Booked {
    fn run(&mut self, (id, units): (u64, usize)) {
        {
            let mut ledger = self.0.lock().unwrap();
            ledger.running += units;
            ledger.peak = ledger.peak.max(ledger.running);
            *ledger.handled.entry(id).or_default() += 1;
        }
        thread::yield_now();
        self.0.lock().unwrap().running -= units;
    }
}

impl Worker for Booked {
    type Request = (u64, usize);
    type Reply = u64;
    type Message = (u64, usize);
    fn handle_call(&mut self, request: (u64, usize)) -> u64 {
        self.run(request);
        request.0
    }
    fn handle_cast(&mut self, message: (u64, usize)) {
        self.run(message);
    }
}

/// Four threads send calls and casts of 1 to 5 units, failing fast or
/// waiting, to pools that steal and pools that do not: the units running
/// never exceed the capacity, every admitted request is handled exactly
/// once, every refused one never, and every unit comes back.
#[test]
fn stress_many_sizes_against_a_shadow_ledger() {
    for steal in [true, false] {
        const CAPACITY: usize = 12;
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let pool = {
            let ledger = Arc::clone(&ledger);
            Pool::builder()
                .capacity(CAPACITY)
                .workers(3)
                .steal(steal)
                .max_waiters(8)
                .build(move |_| Booked(Arc::clone(&ledger)))
                .unwrap()
        };
        let senders: Vec<_> = (0..4u64)
            .map(|t| {
                let pool = pool.clone();
                thread::spawn(move || {
                    let mut rng = Rng(0x9E37_79B9 + t);
                    let mut admitted = Vec::new();
                    let mut refused = 0usize;
                    for k in 0..300u64 {
                        let id = t * 1_000 + k;
                        let units = 1 + rng.below(5) as usize;
                        let mut ask = Ask::new().units(units);
                        if rng.below(2) == 0 {
                            ask = ask.fail_fast();
                        }
                        let outcome = if rng.below(2) == 0 {
                            pool.call_with(ask, (id, units)).map(|reply| {
                                assert_eq!(reply, id);
                            })
                        } else {
                            pool.cast_with(ask, (id, units))
                        };
                        match outcome {
                            Ok(()) => admitted.push(id),
                            Err(Error::Overload | Error::Timeout) => refused += 1,
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    (admitted, refused)
                })
            })
            .collect();
        let mut admitted = Vec::new();
        let mut refused = 0;
        for sender in senders {
            let (mine, theirs) = sender.join().unwrap();
            admitted.extend(mine);
            refused += theirs;
        }
        bounded("the stress pool's shutdown", {
            let pool = pool.clone();
            move || pool.shutdown()
        });
        let ledger = ledger.lock().unwrap();
        assert_eq!(admitted.len() + refused, 4 * 300, "steal {steal}");
        assert_eq!(ledger.handled.len(), admitted.len(), "steal {steal}");
        for id in &admitted {
            assert_eq!(ledger.handled.get(id), Some(&1), "request {id}");
        }
        assert!(
            ledger.peak <= CAPACITY,
            "peak {} (steal {steal})",
            ledger.peak
        );
        assert_eq!(ledger.running, 0);
        assert_eq!(pool.usage(), 0, "steal {steal}");
        assert!(!admitted.is_empty());
    }
}
