//! Stress: 6 threads send random keyed and plain requests (calls and
//! casts, 12 keys) to small pools of every keyed mode, with and without
//! stealing, so that `Overload` and `KeyBusy` are common. Checked: the
//! usage never above the capacity, every admitted request handled exactly
//! once, each thread's requests of a key handled in its order and never
//! two of a key at once, nothing left after shutdown.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use sidejob::{Error, KeyedMode, Pool, Worker};

mod common;
use common::Rng;

const THREADS: u64 = 6;
const PER_THREAD: u64 = 2_000;
const KEYS: u64 = 12;
const CAPACITY: usize = 12;

/// `(id, key, thread, seq)`; key `u64::MAX` marks a plain request.
type Req = (u64, u64, u64, u64);

#[derive(Default)]
struct Shared {
    active: Mutex<HashMap<u64, usize>>,
    overlaps: AtomicUsize,
    handled: Mutex<Vec<Req>>,
}

struct Recorder(Arc<Shared>);

impl Recorder {
    fn run(&mut self, req: Req) {
        let key = req.1;
        let keyed = key != u64::MAX;
        if keyed {
            let mut active = self.0.active.lock().unwrap();
            let n = active.entry(key).or_default();
            if *n != 0 {
                self.0.overlaps.fetch_add(1, SeqCst);
            }
            *n += 1;
        }
        if req.0 % 7 == 0 {
            thread::yield_now(); // a slower one now and then
        }
        self.0.handled.lock().unwrap().push(req);
        if keyed {
            *self.0.active.lock().unwrap().get_mut(&key).unwrap() -= 1;
        }
    }
}

impl Worker for Recorder {
    type Request = Req;
    type Reply = ();
    type Message = Req;
    fn handle_call(&mut self, req: Req) {
        self.run(req)
    }
    fn handle_cast(&mut self, req: Req) {
        self.run(req)
    }
}

#[test]
fn random_keyed_traffic_keeps_every_promise() {
    for mode in [KeyedMode::Pinned, KeyedMode::Ordered] {
        for steal in [false, true] {
            run(mode, steal);
        }
    }
}

fn run(mode: KeyedMode, steal: bool) {
    let shared = Arc::new(Shared::default());
    let pool = {
        let shared = shared.clone();
        Pool::builder()
            .capacity(CAPACITY)
            .workers(3)
            .steal(steal)
            .keyed(mode)
            .max_queued_per_key(3)
            .build(move |_| Recorder(shared.clone()))
            .unwrap()
    };
    let start = Barrier::new(THREADS as usize);
    let admitted: Vec<Vec<Req>> = thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (pool, start) = (&pool, &start);
                scope.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (thread + 1));
                    let mut admitted = Vec::new();
                    start.wait();
                    for seq in 0..PER_THREAD {
                        let draw = rng.next();
                        let id = thread * PER_THREAD + seq;
                        let key = if draw % 5 == 0 { u64::MAX } else { draw % KEYS };
                        let req = (id, key, thread, seq);
                        let call = (draw >> 8) % 3 == 0;
                        let result = match (key == u64::MAX, call) {
                            (true, true) => pool.call(req),
                            (true, false) => pool.cast(req),
                            (false, true) => pool.call_keyed(&key, req),
                            (false, false) => pool.cast_keyed(&key, req),
                        };
                        match result {
                            Ok(()) => admitted.push(req),
                            Err(Error::Overload) => {}
                            Err(Error::KeyBusy) => {
                                assert_eq!(mode, KeyedMode::Ordered, "KeyBusy from {mode:?}");
                            }
                            Err(other) => panic!("{mode:?}: unexpected {other}"),
                        }
                        assert!(pool.usage() <= CAPACITY, "{mode:?}: over capacity");
                    }
                    admitted
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    pool.shutdown();

    let handled = shared.handled.lock().unwrap();
    let admitted: Vec<Req> = admitted.into_iter().flatten().collect();
    // How many get in depends on the scheduler (a loaded machine refuses
    // more); both kinds must have been admitted for the checks to mean
    // anything.
    assert!(
        admitted.iter().any(|r| r.1 == u64::MAX),
        "{mode:?}: no plain request admitted"
    );
    assert!(admitted.iter().filter(|r| r.1 != u64::MAX).count() >= KEYS as usize);
    let ids: HashSet<u64> = handled.iter().map(|r| r.0).collect();
    assert_eq!(
        ids.len(),
        handled.len(),
        "{mode:?} steal {steal}: a request handled twice"
    );
    assert_eq!(
        ids,
        admitted.iter().map(|r| r.0).collect::<HashSet<_>>(),
        "{mode:?} steal {steal}: handled is not what was admitted"
    );
    assert_eq!(shared.overlaps.load(SeqCst), 0, "{mode:?} steal {steal}");
    // Per key and thread, in the thread's order.
    let mut last: HashMap<(u64, u64), u64> = HashMap::new();
    for &(_, key, thread, seq) in handled.iter().filter(|r| r.1 != u64::MAX) {
        if let Some(before) = last.insert((key, thread), seq) {
            assert!(
                seq > before,
                "{mode:?} steal {steal}: key {key} thread {thread}"
            );
        }
    }
    let stats = pool.stats();
    assert_eq!(stats.accepted as usize, admitted.len());
    assert_eq!(stats.completed as usize, admitted.len());
    assert_eq!((stats.usage, pool.busy_keys()), (0, 0));
    assert!(stats.peak_usage <= CAPACITY);
}
