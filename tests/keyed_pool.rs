//! Keyed pool requests (`call_keyed`, `cast_keyed`, `call_keyed_async`) in
//! both modes: one key's requests one at a time and in admission order,
//! different keys in parallel, the pinned mode's shard and no-steal rules,
//! the ordered mode's per-key cap, panics, shutdown. The handlers record
//! overlaps and order; threads meet at channels and barriers, never sleeps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Error, KeyedMode, Pool, Worker};

mod common;
use common::{current_thread, GATE_PATIENCE};

/// What a handler does.
#[derive(Debug, Clone)]
enum Op {
    /// Record `(key, thread, seq)` and which worker ran it.
    Record { key: u64, thread: u64, seq: u64 },
    /// Say "started" (with the worker's index), then wait at the gate.
    Block { key: u64 },
    /// Wait at the barrier (with other keys' requests).
    Meet { key: u64, barrier: Arc<Barrier> },
    /// Panic.
    Panic { key: u64 },
    /// Call the own pool for `key` from inside the handler.
    CallSelf { key: u64, inner: u64 },
}

impl Op {
    fn key(&self) -> u64 {
        match self {
            Op::Record { key, .. }
            | Op::Block { key }
            | Op::Meet { key, .. }
            | Op::Panic { key }
            | Op::CallSelf { key, .. } => *key,
        }
    }
}

/// A handled request: `(thread, seq, worker)`.
type Handled = (u64, u64, usize);

/// What every worker of a rig shares.
#[derive(Default)]
struct Shared {
    /// Per key: requests in its handler now.
    active: Mutex<HashMap<u64, usize>>,
    /// Times a key's handler found another of the same key running.
    overlaps: AtomicUsize,
    /// Requests in any handler now, and the most at once.
    running: AtomicUsize,
    peak: AtomicUsize,
    /// Per key, what was handled, in order: `(thread, seq, worker)`.
    log: Mutex<HashMap<u64, Vec<Handled>>>,
    handled: AtomicUsize,
    /// The own pool, for `CallSelf`.
    pool: Mutex<Option<sidejob::WeakPool<Keyer>>>,
    self_calls: Mutex<Vec<Result<usize, Error>>>,
}

struct Keyer {
    index: usize,
    shared: Arc<Shared>,
    gate: Receiver<()>,
    started: Sender<(u64, usize)>,
}

impl Keyer {
    fn run(&mut self, op: Op) -> usize {
        let key = op.key();
        {
            let mut active = self.shared.active.lock().unwrap();
            let n = active.entry(key).or_default();
            if *n != 0 {
                self.shared.overlaps.fetch_add(1, SeqCst);
            }
            *n += 1;
        }
        let now = self.shared.running.fetch_add(1, SeqCst) + 1;
        self.shared.peak.fetch_max(now, SeqCst);
        // Widen the window in which a second request of the key could
        // (wrongly) start.
        thread::yield_now();
        let mut panic = false;
        match op {
            Op::Record { key, thread, seq } => {
                let mut log = self.shared.log.lock().unwrap();
                log.entry(key).or_default().push((thread, seq, self.index));
            }
            Op::Block { key } => {
                self.started.send((key, self.index)).unwrap();
                self.gate
                    .recv_timeout(GATE_PATIENCE)
                    .expect("the gate opens (a test that failed before opening it ends here)");
            }
            Op::Meet { barrier, .. } => {
                barrier.wait();
            }
            Op::Panic { .. } => panic = true,
            Op::CallSelf { inner, .. } => {
                let pool = self.shared.pool.lock().unwrap().clone();
                let pool = pool
                    .and_then(|weak| weak.upgrade())
                    .expect("the pool lives");
                let answer = pool.call_keyed(
                    &inner,
                    Op::Record {
                        key: inner,
                        thread: 99,
                        seq: 0,
                    },
                );
                self.shared.self_calls.lock().unwrap().push(answer);
            }
        }
        self.shared.running.fetch_sub(1, SeqCst);
        *self.shared.active.lock().unwrap().get_mut(&key).unwrap() -= 1;
        self.shared.handled.fetch_add(1, SeqCst);
        if panic {
            panic!("told to panic for key {key}");
        }
        self.index
    }
}

impl Worker for Keyer {
    type Request = Op;
    type Reply = usize;
    type Message = Op;
    fn handle_call(&mut self, op: Op) -> usize {
        self.run(op)
    }
    fn handle_cast(&mut self, op: Op) {
        self.run(op);
    }
}

struct Rig {
    pool: Pool<Keyer>,
    shared: Arc<Shared>,
    gate: Sender<()>,
    started: Receiver<(u64, usize)>,
}

fn rig(mode: KeyedMode, capacity: usize, workers: usize, steal: bool) -> Rig {
    rig_with(mode, capacity, workers, steal, None)
}

fn rig_with(
    mode: KeyedMode,
    capacity: usize,
    workers: usize,
    steal: bool,
    max_queued: Option<usize>,
) -> Rig {
    let shared = Arc::new(Shared::default());
    let (gate, gate_rx) = unbounded();
    let (started_tx, started) = unbounded();
    let mut builder = Pool::builder();
    builder
        .name("keyed")
        .capacity(capacity)
        .workers(workers)
        .steal(steal)
        .keyed(mode);
    if let Some(n) = max_queued {
        builder.max_queued_per_key(n);
    }
    let pool = {
        let shared = shared.clone();
        builder
            .build(move |index| Keyer {
                index,
                shared: shared.clone(),
                gate: gate_rx.clone(),
                started: started_tx.clone(),
            })
            .unwrap()
    };
    *shared.pool.lock().unwrap() = Some(pool.downgrade());
    Rig {
        pool,
        shared,
        gate,
        started,
    }
}

/// The worker a pinned pool runs `key` on (asked once, through the pool).
fn worker_of(pool: &Pool<Keyer>, key: u64) -> usize {
    pool.call_keyed(
        &key,
        Op::Record {
            key,
            thread: 1000,
            seq: key,
        },
    )
    .unwrap()
}

/// Two keys that a pinned pool runs on different workers.
fn keys_on_two_workers(pool: &Pool<Keyer>) -> (u64, u64) {
    let first = 1;
    let home = worker_of(pool, first);
    let other = (2..1000)
        .find(|&k| worker_of(pool, k) != home)
        .expect("keys spread over workers");
    (first, other)
}

const MODES: [(KeyedMode, bool); 4] = [
    (KeyedMode::Pinned, false),
    (KeyedMode::Pinned, true),
    (KeyedMode::Ordered, false),
    (KeyedMode::Ordered, true),
];

/// 8 threads cast to 4 shared keys; per key, each thread's requests are
/// handled in the order it sent them, never two of a key at once, each
/// exactly once.
#[test]
fn same_key_in_admission_order_never_two_at_once() {
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 300;
    const KEYS: u64 = 4;
    for (mode, steal) in MODES {
        let rig = rig(mode, 4096, 3, steal);
        let start = Arc::new(Barrier::new(THREADS as usize));
        thread::scope(|scope| {
            for thread in 0..THREADS {
                let (pool, start) = (&rig.pool, start.clone());
                scope.spawn(move || {
                    start.wait();
                    for seq in 0..PER_THREAD {
                        let key = (seq + thread) % KEYS;
                        let op = Op::Record { key, thread, seq };
                        // Calls and casts alike keep the order.
                        // (A full pinned shard refuses: try again.)
                        loop {
                            let sent = if seq % 5 == 0 {
                                pool.call_keyed(&key, op.clone()).map(drop)
                            } else {
                                pool.cast_keyed(&key, op.clone())
                            };
                            match sent {
                                Ok(()) => break,
                                Err(e) => assert_eq!(e, Error::Overload, "{mode:?}"),
                            }
                            thread::yield_now();
                        }
                    }
                });
            }
        });
        rig.pool.shutdown();
        let shared = &rig.shared;
        assert_eq!(shared.overlaps.load(SeqCst), 0, "{mode:?} steal {steal}");
        assert_eq!(shared.handled.load(SeqCst) as u64, THREADS * PER_THREAD);
        let log = shared.log.lock().unwrap();
        for key in 0..KEYS {
            let mut last: HashMap<u64, u64> = HashMap::new();
            for &(thread, seq, _) in &log[&key] {
                if let Some(&before) = last.get(&thread) {
                    assert!(
                        seq > before,
                        "{mode:?}: key {key}, thread {thread}: {seq} after {before}"
                    );
                }
                last.insert(thread, seq);
            }
            let count = log[&key].len() as u64;
            assert_eq!(count, THREADS * PER_THREAD / KEYS, "{mode:?}: key {key}");
        }
        if mode == KeyedMode::Pinned {
            // Every request of a key ran on one worker.
            for key in 0..KEYS {
                let first = log[&key][0].2;
                assert!(
                    log[&key].iter().all(|&(_, _, w)| w == first),
                    "key {key} moved"
                );
            }
        }
        assert_eq!(rig.pool.usage(), 0);
        assert_eq!(rig.pool.busy_keys(), 0);
        assert!(shared.peak.load(SeqCst) <= rig.pool.capacity());
    }
}

/// Requests of two keys are in their handlers at once (they meet at a
/// barrier that only lets both through together).
#[test]
fn different_keys_run_in_parallel() {
    for (mode, steal) in MODES {
        let rig = rig(mode, 64, 2, steal);
        let (a, b) = match mode {
            KeyedMode::Pinned => keys_on_two_workers(&rig.pool),
            _ => (1, 2),
        };
        let before = rig.pool.stats().completed;
        let barrier = Arc::new(Barrier::new(2));
        for key in [a, b] {
            rig.pool
                .cast_keyed(
                    &key,
                    Op::Meet {
                        key,
                        barrier: barrier.clone(),
                    },
                )
                .unwrap();
        }
        // Shutdown drains both: it returns only if they met.
        rig.pool.shutdown();
        assert_eq!(rig.shared.peak.load(SeqCst), 2, "{mode:?}");
        assert_eq!(rig.pool.stats().completed, before + 2);
    }
}

/// Pinned: a key's full shard refuses it while other shards have room.
#[test]
fn pinned_full_shard_is_overload_while_others_have_room() {
    let rig = rig(KeyedMode::Pinned, 4, 2, false); // 2 units per shard
    let (a, b) = keys_on_two_workers(&rig.pool);
    let worker_a = worker_of(&rig.pool, a);
    rig.pool.cast_keyed(&a, Op::Block { key: a }).unwrap();
    assert_eq!(rig.started.recv().unwrap(), (a, worker_a));
    rig.pool
        .cast_keyed(
            &a,
            Op::Record {
                key: a,
                thread: 0,
                seq: 1,
            },
        )
        .unwrap();
    let before = rig.pool.stats().rejected;
    assert_eq!(
        rig.pool.cast_keyed(
            &a,
            Op::Record {
                key: a,
                thread: 0,
                seq: 2
            }
        ),
        Err(Error::Overload)
    );
    assert_eq!(rig.pool.stats().rejected, before + 1);
    assert_eq!(rig.pool.available(), 2);
    // Another key, on the other worker, is admitted and served.
    assert_ne!(worker_of(&rig.pool, b), worker_a);
    rig.gate.send(()).unwrap();
    rig.pool.shutdown();
    assert_eq!(rig.pool.usage(), 0);
}

/// Pinned in a stealing pool: with the key's worker stuck, the free worker
/// steals nothing of that key's; every one runs on the key's worker.
#[test]
fn pinned_requests_are_never_stolen() {
    let rig = rig(KeyedMode::Pinned, 64, 2, true);
    let (a, _) = keys_on_two_workers(&rig.pool);
    let worker_a = worker_of(&rig.pool, a);
    rig.pool.cast_keyed(&a, Op::Block { key: a }).unwrap();
    assert_eq!(rig.started.recv().unwrap(), (a, worker_a));
    for seq in 0..20 {
        rig.pool
            .cast_keyed(
                &a,
                Op::Record {
                    key: a,
                    thread: 0,
                    seq,
                },
            )
            .unwrap();
    }
    // The free worker serves plain calls meanwhile (it is awake and
    // stealing), yet the pinned requests wait for their worker.
    for _ in 0..20 {
        assert_ne!(
            rig.pool
                .call(Op::Record {
                    key: 500,
                    thread: 0,
                    seq: 0
                })
                .unwrap(),
            worker_a
        );
    }
    assert_eq!(rig.pool.usage(), 21);
    rig.gate.send(()).unwrap();
    rig.pool.shutdown();
    let log = rig.shared.log.lock().unwrap();
    let ran: Vec<_> = log[&a].iter().filter(|e| e.0 == 0).collect();
    assert_eq!(ran.len(), 20);
    assert!(ran.iter().all(|&&(_, _, w)| w == worker_a), "{ran:?}");
    assert!(ran.windows(2).all(|w| w[0].1 < w[1].1));
}

/// Ordered: a key over its cap is refused `KeyBusy`, its unit given back
/// and uncounted, while other keys are admitted.
#[test]
fn ordered_key_over_its_cap_is_key_busy() {
    let rig = rig_with(KeyedMode::Ordered, 64, 2, false, Some(3));
    rig.pool.cast_keyed(&7_u64, Op::Block { key: 7 }).unwrap();
    assert_eq!(rig.started.recv().unwrap().0, 7);
    for seq in 0..2 {
        rig.pool
            .cast_keyed(
                &7_u64,
                Op::Record {
                    key: 7,
                    thread: 0,
                    seq,
                },
            )
            .unwrap();
    }
    let accepted = rig.pool.stats().accepted;
    assert_eq!(
        rig.pool.call_keyed(
            &7_u64,
            Op::Record {
                key: 7,
                thread: 0,
                seq: 9
            }
        ),
        Err(Error::KeyBusy)
    );
    assert_eq!(
        rig.pool.cast_keyed(
            &7_u64,
            Op::Record {
                key: 7,
                thread: 0,
                seq: 9
            }
        ),
        Err(Error::KeyBusy)
    );
    let stats = rig.pool.stats();
    assert_eq!(
        (stats.accepted, stats.rejected, stats.usage),
        (accepted, 0, 3)
    );
    // Other keys run now, beside the stuck one.
    for key in 100..110_u64 {
        rig.pool
            .call_keyed(
                &key,
                Op::Record {
                    key,
                    thread: 0,
                    seq: 0,
                },
            )
            .unwrap();
    }
    assert_eq!(rig.pool.busy_keys(), 1);
    rig.gate.send(()).unwrap();
    rig.pool.shutdown();
    assert_eq!(rig.shared.log.lock().unwrap()[&7].len(), 2);
    assert_eq!(rig.pool.busy_keys(), 0);
    assert_eq!(rig.pool.stats().completed, 13);
}

/// A blocking `call_keyed`'s turn passes on both ways (`ordered.rs`, "Who
/// passes the turn"): left to the caller when nobody queued (the key is
/// forgotten by the time the call returns), and passed by the worker to
/// the requests queued behind the call, in order.
#[test]
fn a_blocking_calls_turn_passes_on_either_way() {
    for steal in [false, true] {
        let rig = rig(KeyedMode::Ordered, 64, 2, steal);
        let record = |seq| Op::Record {
            key: 5,
            thread: 0,
            seq,
        };
        // Nobody queued: the caller passes the turn before it returns.
        for seq in 0..3 {
            rig.pool.call_keyed(&5_u64, record(seq)).unwrap();
            assert_eq!(rig.pool.busy_keys(), 0, "steal {steal}: seq {seq}");
        }
        // Two queued behind a call: its worker hands them out.
        thread::scope(|scope| {
            let call = scope.spawn(|| rig.pool.call_keyed(&5_u64, Op::Block { key: 5 }));
            assert_eq!(rig.started.recv().unwrap().0, 5);
            rig.pool.cast_keyed(&5_u64, record(3)).unwrap();
            rig.pool.cast_keyed(&5_u64, record(4)).unwrap();
            assert_eq!(rig.pool.busy_keys(), 1);
            rig.gate.send(()).unwrap();
            call.join().unwrap().unwrap();
        });
        // And the key's next call, once they ran, runs after them.
        rig.pool.call_keyed(&5_u64, record(5)).unwrap();
        assert_eq!(rig.pool.busy_keys(), 0, "steal {steal}");
        let seqs: Vec<u64> = rig.shared.log.lock().unwrap()[&5]
            .iter()
            .map(|&(_, seq, _)| seq)
            .collect();
        assert_eq!(seqs, vec![0, 1, 2, 3, 4, 5], "steal {steal}");
        rig.pool.shutdown();
        assert_eq!(rig.pool.stats().completed, 7);
    }
}

/// A panic fails its own request only; the key's next requests (queued
/// behind it) still run, on a rebuilt worker.
#[test]
fn a_panicking_keyed_request() {
    for (mode, steal) in MODES {
        let rig = rig(mode, 64, 2, steal);
        rig.pool.cast_keyed(&3_u64, Op::Block { key: 3 }).unwrap();
        rig.started.recv().unwrap();
        let answer = thread::scope(|scope| {
            let panicking = scope.spawn(|| rig.pool.call_keyed(&3_u64, Op::Panic { key: 3 }));
            // Queued behind the block (and, once it is admitted, the panic).
            while rig.pool.usage() < 2 {
                thread::yield_now();
            }
            for seq in 0..5 {
                rig.pool
                    .cast_keyed(
                        &3_u64,
                        Op::Record {
                            key: 3,
                            thread: 0,
                            seq,
                        },
                    )
                    .unwrap();
            }
            rig.gate.send(()).unwrap();
            panicking.join().unwrap()
        });
        assert_eq!(answer, Err(Error::WorkerPanicked), "{mode:?}");
        rig.pool.shutdown();
        assert_eq!(rig.shared.log.lock().unwrap()[&3].len(), 5, "{mode:?}");
        let stats = rig.pool.stats();
        assert_eq!((stats.panicked, stats.completed, stats.usage), (1, 6, 0));
        assert_eq!(rig.shared.overlaps.load(SeqCst), 0);
    }
}

/// Shutdown with keyed requests queued behind a stuck one: each is handled
/// exactly once before `shutdown` returns, and later ones are refused.
#[test]
fn shutdown_handles_every_queued_keyed_request_once() {
    for (mode, steal) in MODES {
        let rig = rig(mode, 256, 3, steal);
        rig.pool.cast_keyed(&1_u64, Op::Block { key: 1 }).unwrap();
        rig.started.recv().unwrap();
        let mut sent = 0;
        for seq in 0..40 {
            for key in [1_u64, 2, 3] {
                if rig
                    .pool
                    .cast_keyed(
                        &key,
                        Op::Record {
                            key,
                            thread: 0,
                            seq,
                        },
                    )
                    .is_ok()
                {
                    sent += 1;
                }
            }
        }
        thread::scope(|scope| {
            let down = scope.spawn(|| rig.pool.shutdown());
            while !rig.pool.is_shutdown() {
                thread::yield_now();
            }
            let late = rig.pool.cast_keyed(
                &1_u64,
                Op::Record {
                    key: 1,
                    thread: 0,
                    seq: 99,
                },
            );
            // The gate first: a failed assertion must fail the test, not
            // leave the blocked worker (and the shutdown) waiting forever.
            rig.gate.send(()).unwrap();
            down.join().unwrap();
            assert_eq!(late, Err(Error::Shutdown), "{mode:?}, steal {steal}");
        });
        let log = rig.shared.log.lock().unwrap();
        let handled: usize = log.values().map(Vec::len).sum();
        assert_eq!(handled, sent, "{mode:?}");
        for entries in log.values() {
            assert!(
                entries.windows(2).all(|w| w[0].1 < w[1].1),
                "{mode:?}: order"
            );
        }
        assert_eq!((rig.pool.usage(), rig.pool.busy_keys()), (0, 0));
        assert_eq!(rig.pool.stats().completed as usize, sent + 1);
    }
}

/// A handler calling its own pool: refused `CallingSelf` where it would
/// wait for itself, served where it would not.
#[test]
fn calling_self_with_a_key() {
    // Ordered: the same key would queue behind the caller; another key
    // runs on the other worker.
    let ordered = rig(KeyedMode::Ordered, 16, 2, false);
    let rig_ = &ordered;
    rig_.pool
        .call_keyed(&5_u64, Op::CallSelf { key: 5, inner: 5 })
        .unwrap();
    rig_.pool
        .call_keyed(&5_u64, Op::CallSelf { key: 5, inner: 6 })
        .unwrap();
    let calls = rig_.shared.self_calls.lock().unwrap().clone();
    assert_eq!(calls[0], Err(Error::CallingSelf));
    assert!(calls[1].is_ok());
    drop(ordered);

    // Pinned: a key whose worker is the caller.
    let pinned = rig(KeyedMode::Pinned, 16, 2, false);
    let rig = &pinned;
    let (a, b) = keys_on_two_workers(&rig.pool);
    rig.pool
        .call_keyed(&a, Op::CallSelf { key: a, inner: a })
        .unwrap();
    rig.pool
        .call_keyed(&a, Op::CallSelf { key: a, inner: b })
        .unwrap();
    let calls = rig.shared.self_calls.lock().unwrap().clone();
    assert_eq!(calls[0], Err(Error::CallingSelf));
    assert_eq!(calls[1], Ok(worker_of(&rig.pool, b)));
}

/// `call_keyed_async` keeps one key's order from a tokio runtime, and a
/// timed call times out behind a stuck key.
#[test]
fn async_and_timed_keyed_calls() {
    for (mode, steal) in MODES {
        let rig = rig(mode, 64, 2, steal);
        let runtime = current_thread();
        runtime.block_on(async {
            let calls: Vec<_> = (0..16)
                .map(|seq| {
                    rig.pool.call_keyed_async(
                        &9_u64,
                        Op::Record {
                            key: 9,
                            thread: 0,
                            seq,
                        },
                    )
                })
                .collect();
            for call in calls {
                call.await.unwrap();
            }
        });
        let seqs: Vec<u64> = rig.shared.log.lock().unwrap()[&9]
            .iter()
            .map(|e| e.1)
            .collect();
        assert_eq!(seqs, (0..16).collect::<Vec<_>>(), "{mode:?}");

        rig.pool.cast_keyed(&9_u64, Op::Block { key: 9 }).unwrap();
        rig.started.recv().unwrap();
        let timed = rig.pool.call_keyed_timeout(
            &9_u64,
            Op::Record {
                key: 9,
                thread: 1,
                seq: 0,
            },
            Duration::from_millis(1),
        );
        assert_eq!(timed, Err(Error::Timeout));
        rig.gate.send(()).unwrap();
        rig.pool.shutdown();
        // The timed-out request still ran, in its turn.
        assert_eq!(rig.shared.log.lock().unwrap()[&9].len(), 17);
    }
}
