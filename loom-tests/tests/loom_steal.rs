//! Stealing (`pool/steal.rs`), driven through the real loop over mailboxes
//! loom can see: a free worker is woken for work queued at a busy one (no
//! lost wake-up), each envelope is taken once, by its owner or a thief, and
//! its unit goes back to the shard that admitted it; a shutdown racing a
//! stolen request still lets every worker drain and exit.
//!
//! Threads wait for each other on a [`Count`] (a loom mutex and condition
//! variable), never with `park`: loom does not allow an `unpark` to reach
//! a thread blocked on a lock, which a worker in the idle room may be.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::Count;
use sidejob::loom_api::{after_release, next_envelope, Idle, Mailbox, Table};

struct Rig {
    table: Table,
    mailboxes: [Mailbox; 2],
    idle: Idle,
    handled: Count,
    exited: Count,
}

impl Rig {
    fn new(capacity: usize) -> Arc<Rig> {
        Arc::new(Rig {
            table: Table::new(capacity, 2),
            mailboxes: [Mailbox::new(), Mailbox::new()],
            idle: Idle::new(2),
            handled: Count::default(),
            exited: Count::default(),
        })
    }

    /// A caller: admits one unit on shard `shard`, queues it there, rings.
    fn submit(&self, shard: usize) {
        assert_eq!(self.table.acquire_at(shard), Ok(shard));
        self.mailboxes[shard].push();
        self.idle.work_added(shard, &self.mailboxes[shard]);
    }

    /// Worker `me`'s loop, as the pool's: take (own or stolen), run
    /// `handle`, release on the admitting shard, say it polls next, reply;
    /// until its own shard is drained.
    fn worker(&self, me: usize, handle: impl Fn()) {
        while let Some(from) = next_envelope(me, &self.mailboxes, &self.idle, &self.table) {
            handle();
            self.table.release(from);
            // As the pool's worker does before its reply.
            self.idle.polling(me);
            self.handled.bump();
            after_release(&self.idle, me, from);
            if self.table.drained(me) {
                self.idle.leave(me);
                break;
            }
        }
        self.exited.bump();
    }

    /// Shutdown, once `handled` requests are done: close, wake, wait for
    /// both workers (or the one) to exit.
    fn shut_down_after(&self, handled: usize, workers: usize) {
        self.handled.wait_for(handled);
        self.table.close();
        self.idle.wake_all();
        self.exited.wait_for(workers);
        assert_eq!(self.handled.get(), handled, "each request handled once");
        assert_eq!(self.table.usage(), 0, "every unit back on its shard");
        assert!(self.mailboxes.iter().all(Mailbox::is_empty));
    }
}

/// Worker 0 is busy elsewhere (absent); worker 1 is free. A request queued
/// at worker 0 must wake worker 1: the caller waits for it with no other
/// wake-up in play, so a lost one is a deadlock loom reports.
#[test]
fn a_free_worker_is_woken_for_work_queued_at_a_busy_one() {
    loom::model(|| {
        let rig = Rig::new(2);
        {
            let rig = rig.clone();
            thread::spawn(move || rig.worker(1, || {}));
        }
        rig.submit(0);
        rig.shut_down_after(1, 1);
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
        for me in 0..2 {
            let rig = rig.clone();
            thread::spawn(move || rig.worker(me, || {}));
        }
        rig.submit(0);
        rig.submit(0);
        rig.table.close();
        rig.idle.wake_all();
        rig.exited.wait_for(2);
        assert_eq!(rig.handled.get(), 2, "each request handled once");
        assert_eq!(rig.table.usage(), 0, "every unit back on shard 0");
        assert!(rig.mailboxes.iter().all(Mailbox::is_empty));
    });
}

/// Two requests queued at worker 0; worker 0 takes one and is stuck in it
/// until worker 1 has handled a request. Worker 1 must be woken for the
/// other, even when worker 0 was spinning on its mailbox as both arrived
/// (the producers then count on worker 0 and ring nobody: worker 0 must
/// wake a sleeper itself when it takes one and leaves one queued).
#[test]
fn a_request_queued_behind_a_stuck_owner_wakes_the_free_worker() {
    loom::model(|| {
        let rig = Rig::new(4);
        let thief = Arc::new(Count::default());
        {
            let (rig, thief) = (rig.clone(), thief.clone());
            thread::spawn(move || rig.worker(0, || thief.wait_for(1)));
        }
        {
            let (rig, thief) = (rig.clone(), thief.clone());
            thread::spawn(move || rig.worker(1, || thief.bump()));
        }
        rig.submit(0);
        rig.submit(0);
        rig.shut_down_after(2, 2);
    });
}
