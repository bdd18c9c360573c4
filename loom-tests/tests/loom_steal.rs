//! Stealing (`pool/steal.rs`), driven through the real loop over mailboxes
//! loom can see: a free worker is woken for work queued at a busy one (no
//! lost wake-up), each envelope is taken once, by its owner or a thief, and
//! its unit goes back to the shard that admitted it; a shutdown racing a
//! stolen request still lets every worker drain and exit.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use sidejob::loom_api::{after_release, next_envelope, Idle, Mailbox, Table};

struct Rig {
    table: Table,
    mailboxes: [Mailbox; 2],
    idle: Idle,
    handled: AtomicUsize,
}

impl Rig {
    fn new(capacity: usize) -> Arc<Rig> {
        Arc::new(Rig {
            table: Table::new(capacity, 2),
            mailboxes: [Mailbox::new(), Mailbox::new()],
            idle: Idle::new(),
            handled: AtomicUsize::new(0),
        })
    }

    /// A caller: admits one unit on shard `shard`, queues it there, rings.
    fn submit(&self, shard: usize) {
        assert_eq!(self.table.acquire_at(shard), Ok(shard));
        self.mailboxes[shard].push();
        self.idle.work_added();
    }

    /// Worker `me`'s loop: take (own or stolen), release on the admitting
    /// shard, tell `waiter` (if any); until its own shard is drained.
    ///
    /// (A model that joins its workers passes no waiter: loom does not
    /// allow unparking a thread blocked in `join`.)
    fn worker(&self, me: usize, waiter: Option<&thread::Thread>) {
        while let Some(from) = next_envelope(me, &self.mailboxes, &self.idle, &self.table) {
            self.handled.fetch_add(1, SeqCst);
            self.table.release(from);
            after_release(&self.idle, me, from);
            if let Some(waiter) = waiter {
                waiter.unpark();
            }
        }
    }
}

/// Worker 0 is busy elsewhere (absent); worker 1 is free. A request queued
/// at worker 0 must wake worker 1: the caller then waits for it with no
/// other wake-up in play, so a lost one is a deadlock loom reports.
#[test]
fn a_free_worker_is_woken_for_work_queued_at_a_busy_one() {
    loom::model(|| {
        let rig = Rig::new(2);
        let main = thread::current();
        let exited = Arc::new(AtomicUsize::new(0));
        {
            let (rig, exited) = (rig.clone(), exited.clone());
            thread::spawn(move || {
                rig.worker(1, Some(&main));
                exited.store(1, SeqCst);
                main.unpark();
            });
        }
        rig.submit(0);
        while rig.handled.load(SeqCst) == 0 {
            thread::park();
        }
        rig.table.close();
        rig.idle.wake_all();
        // Not `join`: loom does not allow an unpark (the worker's, above)
        // to reach a thread blocked in `join`.
        while exited.load(SeqCst) == 0 {
            thread::park();
        }
        assert_eq!(rig.handled.load(SeqCst), 1);
        assert_eq!(rig.table.usage(), 0, "released on shard 0");
        assert!(rig.mailboxes.iter().all(Mailbox::is_empty));
    });
}

/// Both workers run; two requests are queued at worker 0 and shutdown
/// begins at once. Each is handled once, by its owner or by the thief,
/// every unit goes back to shard 0, and both workers drain and exit (a
/// thief's release on the closed shard wakes an owner asleep waiting for
/// it).
#[test]
fn owner_and_thief_take_each_request_once_across_shutdown() {
    loom::model(|| {
        let rig = Rig::new(4);
        let workers: Vec<_> = (0..2)
            .map(|me| {
                let rig = rig.clone();
                thread::spawn(move || rig.worker(me, None))
            })
            .collect();
        rig.submit(0);
        rig.submit(0);
        rig.table.close();
        rig.idle.wake_all();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(rig.handled.load(SeqCst), 2, "each request handled once");
        assert_eq!(rig.table.usage(), 0);
        assert!(rig.mailboxes.iter().all(Mailbox::is_empty));
    });
}
