//! The ordered keyed mode's hand-over (`pool/key_queue.rs`, as
//! `pool/worker.rs` and `pool/ordered.rs` drive it): a key's request
//! finishing (unit given back, then its turn passed on) while a new request
//! of the same key is admitted and shutdown begins.
//!
//! Checked in every interleaving:
//!
//! * never two requests of the key running at once (an `active` count kept
//!   by the running requests never reads 2);
//! * each admitted request runs exactly once, in admission order, whichever
//!   side of the finish it was admitted on: queued behind the running one
//!   (the finish hands it out) or after the key was forgotten (it runs at
//!   once); none is stranded in a queue nobody will hand out;
//! * a request refused by shutdown never touches the key; one refused
//!   `KeyBusy` gives its unit back;
//! * afterwards the key is forgotten and every unit is back;
//! * a turn the worker leaves to its blocking caller (nobody queued, by
//!   the stripe's hint) is passed on by that caller, and a request queued
//!   meanwhile still runs once, after the first;
//! * a key kept idle in a slot, taken back by its own admission without
//!   the lock while a new key takes that slot under it, runs each request
//!   once and never two at once (the key queues' words are the engine's,
//!   `engine/keys/words.rs`; under loom a stripe has one slot, so every
//!   key shares it).
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p
//! loom-tests --release --test loom_key_queue`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::sync::{Arc, Mutex};
use loom::thread;
use sidejob::loom_api::{KeyAdmit, KeyQueues, Table};
use sidejob::Error;

const KEY: u64 = 0xABCD_0000_0000_0001;

/// Runs `f` on a new thread with its own handle on `rig`.
fn spawn<T, R>(rig: &Arc<T>, f: impl FnOnce(&T) -> R + Send + 'static) -> thread::JoinHandle<R>
where
    T: Send + Sync + 'static,
    R: Send + 'static,
{
    let rig = Arc::clone(rig);
    thread::spawn(move || f(&rig))
}

struct Rig {
    table: Table,
    keys: KeyQueues,
    active: AtomicUsize,
    ran: Mutex<Vec<u32>>,
}

impl Rig {
    fn new(cap: usize) -> Arc<Rig> {
        Arc::new(Rig {
            table: Table::new(2, 1),
            keys: KeyQueues::new(1, cap),
            active: AtomicUsize::new(0),
            ran: Mutex::new(Vec::new()),
        })
    }

    /// A rig whose request 1 holds a unit and is out for the key (its
    /// worker about to run it).
    fn with_request_one(cap: usize) -> Arc<Rig> {
        let rig = Rig::new(cap);
        assert_eq!(rig.table.acquire_at(0), Ok(0));
        assert_eq!(rig.keys.admit(KEY, 1), KeyAdmit::Run(1));
        rig
    }

    /// A worker that took request `n`: runs it, gives its unit back, then
    /// passes the key's turn on, running whatever the finish hands out
    /// (in the pool another worker may take it; who runs it does not
    /// matter to the protocol).
    fn run_from(&self, n: u32) {
        self.run_one(n);
        self.pass_turn();
    }

    /// Runs request `n` and gives its unit back; its turn is still held.
    fn run_one(&self, n: u32) {
        assert_eq!(
            self.active.fetch_add(1, SeqCst),
            0,
            "two of one key at once"
        );
        self.ran.lock().unwrap().push(n);
        self.active.fetch_sub(1, SeqCst);
        self.table.release(0);
    }

    /// Passes the key's turn on, running whatever the finish hands out.
    fn pass_turn(&self) {
        while let Some(next) = self.keys.finish(KEY) {
            self.run_one(next);
        }
    }

    /// A caller's keyed submit: unit, then the key. True if admitted.
    fn submit(&self, n: u32) -> bool {
        match self.table.acquire_at(0) {
            Ok(shard) => match self.keys.admit(KEY, n) {
                KeyAdmit::Run(n) => {
                    self.run_from(n);
                    true
                }
                KeyAdmit::Queued => true,
                KeyAdmit::Busy(_) => {
                    self.table.refund(shard);
                    false
                }
            },
            Err(Error::Shutdown) => false,
            Err(other) => panic!("unexpected {other}"),
        }
    }
}

/// Request 1 is running; request 2 of the same key is admitted while 1
/// finishes and while shutdown begins.
#[test]
fn hand_over_races_a_new_request_and_shutdown() {
    loom::model(|| {
        let rig = Rig::with_request_one(2);
        let worker = spawn(&rig, |rig| rig.run_from(1));
        let caller = spawn(&rig, |rig| rig.submit(2));
        rig.table.close();
        worker.join().unwrap();
        let admitted = caller.join().unwrap();
        let ran = rig.ran.lock().unwrap().clone();
        if admitted {
            assert_eq!(ran, vec![1, 2], "each admitted request once, in order");
        } else {
            assert_eq!(ran, vec![1]);
        }
        assert_eq!(rig.keys.keys(), 0, "the key is forgotten");
        assert_eq!(rig.table.usage(), 0, "every unit is back");
    });
}

/// With one request per key, a request of the busy key is refused
/// `KeyBusy` (its unit refunded) or, once the key is forgotten, runs: never
/// queued, never stranded.
#[test]
fn a_busy_key_refuses_and_refunds_while_its_request_finishes() {
    loom::model(|| {
        let rig = Rig::with_request_one(1);
        let worker = spawn(&rig, |rig| rig.run_from(1));
        let admitted = rig.submit(2);
        worker.join().unwrap();
        let ran = rig.ran.lock().unwrap().clone();
        assert_eq!(ran, if admitted { vec![1, 2] } else { vec![1] });
        assert_eq!(rig.keys.keys(), 0);
        assert_eq!(rig.table.usage(), 0);
    });
}

/// Request 1 is a blocking `call_keyed`: its worker reads the stripe's
/// hint and, with nobody queued, leaves the key's turn to the caller, which
/// passes it on once it has the reply (the worker's join here). Request 2
/// of the same key is admitted meanwhile, before or after the look.
#[test]
fn a_turn_left_to_the_caller_races_a_new_request() {
    loom::model(|| {
        let rig = Rig::with_request_one(2);
        let worker = spawn(&rig, |rig| {
            rig.run_one(1);
            if rig.keys.anyone_queued(KEY) {
                rig.pass_turn();
                false
            } else {
                true // left to the caller, with the reply
            }
        });
        let other = spawn(&rig, |rig| rig.submit(2));
        if worker.join().unwrap() {
            rig.pass_turn();
        }
        assert!(other.join().unwrap(), "no shutdown, cap 2: admitted");
        assert_eq!(*rig.ran.lock().unwrap(), vec![1, 2], "once each, in order");
        assert_eq!(rig.keys.keys(), 0, "the key is forgotten");
        assert_eq!(rig.table.usage(), 0, "every unit is back");
    });
}

/// Three keys of one stripe, whose one slot (under loom) they share: `A`
/// kept idle there, then `B` taking `A`'s idle word and kept idle in
/// turn; then `A` admitted twice (once on each side of its own finish,
/// or queued) while `C` takes the idle word, which `A`'s admission takes
/// at the same moment without the lock: the loser goes to the spill
/// table.
#[test]
fn a_slot_taken_from_an_idle_key_races_its_admission() {
    const IDS: [u64; 3] = [
        0xABCD_0000_0010_0000, // A (an id is a hash's bits 20 and up)
        0xABCD_0000_0020_0000, // B
        0xABCD_0000_0030_0000, // C
    ];
    struct Keys {
        keys: KeyQueues,
        active: [AtomicUsize; 3],
        ran: Mutex<Vec<(usize, u32)>>,
    }
    impl Keys {
        fn run_from(&self, key: usize, mut n: u32) {
            loop {
                assert_eq!(self.active[key].fetch_add(1, SeqCst), 0, "two of key {key}");
                self.ran.lock().unwrap().push((key, n));
                self.active[key].fetch_sub(1, SeqCst);
                match self.keys.finish(IDS[key]) {
                    Some(next) => n = next,
                    None => return,
                }
            }
        }
        fn submit(&self, key: usize, n: u32) {
            match self.keys.admit(IDS[key], n) {
                KeyAdmit::Run(n) => self.run_from(key, n),
                KeyAdmit::Queued => {}
                KeyAdmit::Busy(_) => panic!("cap 2 holds two"),
            }
        }
    }
    loom::model(|| {
        let rig = Arc::new(Keys {
            keys: KeyQueues::new(1, 2),
            active: Default::default(),
            ran: Mutex::new(Vec::new()),
        });
        for (key, id) in IDS.iter().enumerate().take(2) {
            assert_eq!(rig.keys.admit(*id, 0), KeyAdmit::Run(0));
            assert_eq!(rig.keys.finish(*id), None, "key {key} kept idle");
        }
        let a = spawn(&rig, |rig| rig.submit(0, 1));
        let c = spawn(&rig, |rig| rig.submit(2, 2));
        rig.submit(0, 3);
        a.join().unwrap();
        c.join().unwrap();
        let mut ran = rig.ran.lock().unwrap().clone();
        ran.sort_unstable();
        assert_eq!(ran, vec![(0, 1), (0, 3), (2, 2)], "each request once");
        assert_eq!(rig.keys.keys(), 0, "every key forgotten");
        // Both keys still work: a fresh request of each runs at once.
        for id in IDS {
            assert_eq!(rig.keys.admit(id, 9), KeyAdmit::Run(9));
        }
    });
}
