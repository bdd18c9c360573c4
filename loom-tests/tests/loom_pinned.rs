//! Pinned keyed requests in a stealing pool (`pool/steal.rs`, private
//! mailboxes), driven through the real worker loop over mailboxes loom can
//! see: a request queued in a worker's private mailbox is taken by that
//! worker only, and wakes it even while another worker sleeps in the same
//! room (a condition variable's `notify_one` could wake the wrong one:
//! `Idle::private_added` wakes every sleeper); shutdown still drains it.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p
//! loom-tests --release --test loom_pinned`.
#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_tests::Count;
use sidejob::loom_api::{after_release, next_envelope_with_private, Idle, Mailbox, Table};

struct Rig {
    table: Table,
    mailboxes: [Mailbox; 2],
    private: [Mailbox; 2],
    idle: Idle,
    /// Per worker, the requests of shard 0 it ran.
    ran_on_0: [Mutex<usize>; 2],
    handled: Count,
    exited: Count,
}

impl Rig {
    fn worker(&self, me: usize) {
        while let Some(from) = next_envelope_with_private(
            me,
            &self.mailboxes,
            Some(&self.private[me]),
            &self.idle,
            &self.table,
        ) {
            if from == 0 {
                *self.ran_on_0[me].lock().unwrap() += 1;
            }
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
}

/// Both workers run (and may both be asleep); a pinned request for worker
/// 0 arrives, then shutdown once it is handled. It runs on worker 0, and
/// both workers exit.
#[test]
fn a_pinned_request_wakes_its_own_worker_and_is_never_stolen() {
    loom::model(|| {
        let rig = Arc::new(Rig {
            table: Table::new(2, 2),
            mailboxes: [Mailbox::new(), Mailbox::new()],
            private: [Mailbox::new(), Mailbox::new()],
            idle: Idle::new(2),
            ran_on_0: [Mutex::new(0), Mutex::new(0)],
            handled: Count::default(),
            exited: Count::default(),
        });
        for me in 0..2 {
            let rig = rig.clone();
            thread::spawn(move || rig.worker(me));
        }
        assert_eq!(rig.table.acquire_only(0), Ok(0));
        rig.private[0].push();
        rig.idle.private_added(0);
        rig.handled.wait_for(1);
        rig.table.close();
        rig.idle.wake_all();
        rig.exited.wait_for(2);
        assert_eq!(*rig.ran_on_0[0].lock().unwrap(), 1, "run by its own worker");
        assert_eq!(*rig.ran_on_0[1].lock().unwrap(), 0, "never stolen");
        assert_eq!(rig.table.usage(), 0);
        assert!(rig.private[0].is_empty());
    });
}
