//! The thread `Pool`'s public behaviour, one sub-feature a file:
//!
//! * `config.rs`: building a pool: configuration errors, thread names, the
//!   worker count, auto traits;
//! * `calls.rs`: the request forms (`call`, `cast`, `call_timeout`,
//!   `*_unbounded`, `call_async`, `try_call`, `try_cast`): exact capacity,
//!   the unit back before the reply, refusals that hand the request back,
//!   a worker calling its own pool (`CallingSelf`), one sender's order;
//! * `panics.rs`: panics in handlers and factories, and in the drops of
//!   replies, requests and panic payloads;
//! * `shutdown.rs`: shutdown, the last handle, weak handles;
//! * `waiting.rs`: the waiting room through the pool;
//! * `weighted.rs`: requests of many units, `call_with` and `cast_with`.
//!
//! The async pool is in `tests/async_pool.rs`, what both kinds share in
//! `tests/pool_kinds.rs`, stealing in `tests/steal.rs`, keyed requests in
//! `tests/keyed_pool.rs`.
//!
//! Checked with barriers and channels, never sleeps. A test whose bug was
//! a hang runs the call on its own thread under a bound
//! ([`common::bounded`]): a guard against hanging, not a sleep.

#[path = "../common/mod.rs"]
mod common;

mod calls;
mod classes;
mod config;
mod panics;
mod shutdown;
mod tenants;
mod waiting;
mod weighted;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Pool, Worker};

use common::GATE_PATIENCE;

/// What a gated job does once the test lets it go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Go {
    Finish,
    Panic,
}

/// A worker whose handlers block until the test says `Go`, so the test
/// decides exactly when each job finishes. Every handled job id is recorded.
pub struct Gated {
    gate: Receiver<Go>,
    handled: Arc<Mutex<Vec<u64>>>,
    /// Jobs whose handler has started, in order: a test that needs a job
    /// to be in its worker's hands (not merely admitted: admission comes
    /// before the mailbox send) waits on this.
    started: Arc<Mutex<Vec<u64>>>,
    terminated: Arc<AtomicUsize>,
}

impl Gated {
    fn run(&mut self, id: u64) -> u64 {
        self.started.lock().unwrap().push(id);
        let go = self
            .gate
            .recv_timeout(GATE_PATIENCE)
            .expect("the gate opens (a test that failed before opening it ends here)");
        if go == Go::Panic {
            panic!("job {id} told to panic");
        }
        self.handled.lock().unwrap().push(id);
        id
    }
}

impl Worker for Gated {
    type Request = u64;
    type Reply = u64;
    type Message = u64;

    fn handle_call(&mut self, id: u64) -> u64 {
        self.run(id)
    }

    fn handle_cast(&mut self, id: u64) {
        self.run(id);
    }

    fn terminate(&mut self) {
        self.terminated.fetch_add(1, SeqCst);
    }
}

/// A pool of [`Gated`] workers, a gate each, and what they did.
pub struct GatedPool {
    pub pool: Pool<Gated>,
    pub gates: Vec<Sender<Go>>,
    pub handled: Arc<Mutex<Vec<u64>>>,
    pub started: Arc<Mutex<Vec<u64>>>,
    pub terminated: Arc<AtomicUsize>,
    pub builds: Arc<AtomicUsize>,
}

pub fn gated(capacity: usize, workers: usize) -> GatedPool {
    let (gates, receivers): (Vec<_>, Vec<_>) = (0..workers).map(|_| unbounded()).unzip();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(Mutex::new(Vec::new()));
    let terminated = Arc::new(AtomicUsize::new(0));
    let builds = Arc::new(AtomicUsize::new(0));
    let pool = {
        let (handled, started, terminated, builds) = (
            handled.clone(),
            started.clone(),
            terminated.clone(),
            builds.clone(),
        );
        Pool::builder()
            .name("gated")
            .capacity(capacity)
            .workers(workers)
            .build(move |index| {
                builds.fetch_add(1, SeqCst);
                Gated {
                    gate: receivers[index].clone(),
                    handled: handled.clone(),
                    started: started.clone(),
                    terminated: terminated.clone(),
                }
            })
            .unwrap()
    };
    GatedPool {
        pool,
        gates,
        handled,
        started,
        terminated,
        builds,
    }
}

impl GatedPool {
    pub fn open_all(&self, per_worker: usize) {
        for gate in &self.gates {
            for _ in 0..per_worker {
                gate.send(Go::Finish).unwrap();
            }
        }
    }

    pub fn handled_sorted(&self) -> Vec<u64> {
        let mut handled = self.handled.lock().unwrap().clone();
        handled.sort_unstable();
        handled
    }
}

/// A worker that answers at once.
pub struct Echo;

impl Worker for Echo {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    fn handle_call(&mut self, n: u64) -> u64 {
        n
    }
    fn handle_cast(&mut self, _: u64) {}
}
