//! Stealing (`pool/steal.rs`) with three workers, driven through the real
//! loop over mailboxes loom can see: several requests queued at one
//! worker while it polls its mailbox each find a free worker.
//!
//! Producers that find a mailbox's owner polling ring nobody: they count
//! on the owner, which, when it stops polling with envelopes left, rings
//! the sleepers. It must ring one for each envelope left, not one in all:
//! a sleeper takes one envelope per ring. With one ring for two envelopes
//! left, the second sat in the mailbox while a free worker slept (the
//! ordered keyed pool's model test hung about once in 500 runs, its
//! handlers each blocked until the test let them go).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release
//! --test loom_steal_three` (the preemption bound is 1 here, set in code
//! whatever `LOOM_MAX_PREEMPTIONS` says: at 1 the model
//! passes in about 2.5 minutes on 2 cores, and with the one-ring `took`
//! it reports the deadlock in under 10 seconds; at 2 it ran for more than
//! 5 minutes without an answer).
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::Count;
use sidejob::loom_api::{after_release, next_envelope, Idle, Mailbox, Table};

const WORKERS: usize = 3;

struct Rig {
    table: Table,
    mailboxes: [Mailbox; WORKERS],
    idle: Idle,
    /// Requests whose handler has started.
    started: Count,
    exited: Count,
}

impl Rig {
    fn new() -> Arc<Rig> {
        Arc::new(Rig {
            table: Table::new(WORKERS * WORKERS, WORKERS),
            mailboxes: [Mailbox::new(), Mailbox::new(), Mailbox::new()],
            idle: Idle::new(WORKERS),
            started: Count::default(),
            exited: Count::default(),
        })
    }

    /// A caller: admits one unit on shard `shard`, queues it there, rings.
    fn submit(&self, shard: usize) {
        assert_eq!(self.table.acquire_at(shard), Ok(shard));
        self.mailboxes[shard].push();
        self.idle.work_added(shard, &self.mailboxes[shard]);
    }

    /// A handler, as the model test's gated ones: blocked until every
    /// worker has started one (the test lets them go only then).
    fn handle(&self) {
        self.started.bump();
        self.started.wait_for(WORKERS);
    }

    /// Worker `me`'s loop, as the pool's: take (own or stolen), handle,
    /// release on the admitting shard, say it polls next, reply; until its
    /// own shard is drained.
    fn worker(&self, me: usize) {
        while let Some(from) = next_envelope(me, &self.mailboxes, &self.idle, &self.table) {
            self.handle();
            self.table.release(from);
            // As the pool's worker does before its reply.
            self.idle.polling(me);
            after_release(&self.idle, me, from);
            if self.table.drained(me) {
                self.idle.leave(me);
                break;
            }
        }
        self.exited.bump();
    }
}

/// Worker 0 is polling its mailbox (its flag up, as a worker's is from
/// just before its reply until it takes its next envelope) while three
/// requests land there: their producers ring nobody. Worker 0 then takes
/// one, through the real loop, and leaves two; workers 1 and 2 run the
/// real loop and may be asleep by then (they passed mailbox 0 over while
/// its owner polled it). Each handler blocks until all three have
/// started, so each worker must take one: worker 0 must ring both
/// sleepers. A lost wake-up leaves a worker asleep and the others
/// blocked: a deadlock loom reports.
///
/// The smallest model that shows it: worker 0's part runs on the model's
/// main thread, after the three submits, and starts once workers 1 and 2
/// are counted as sleepers (with all four threads free, the model ran for
/// more than ten minutes without an answer at two preemptions, and at
/// one it never reached the state where both sleep before worker 0
/// stops polling).
#[test]
fn each_envelope_left_at_a_polling_owner_wakes_a_sleeper() {
    let mut builder = loom::model::Builder::new();
    // Always 1, whatever `LOOM_MAX_PREEMPTIONS` says (CI sets 2, under
    // which this model ran for more than ten minutes): the heaviest models
    // are bounded in code, as tokio bounds its own.
    builder.preemption_bound = Some(1);
    builder.check(|| {
        let rig = Rig::new();
        // Worker 0, between its reply and its next poll.
        rig.idle.polling(0);
        for me in 1..WORKERS {
            let rig = rig.clone();
            thread::spawn(move || rig.worker(me));
        }
        // Start from both workers counted as sleepers (whether they have
        // re-checked the mailboxes yet is left to the model).
        while rig.idle.sleepers() < WORKERS - 1 {
            thread::yield_now();
        }
        for _ in 0..WORKERS {
            rig.submit(0);
        }
        // Worker 0 stops polling with its first envelope (and two left).
        assert_eq!(
            next_envelope(0, &rig.mailboxes, &rig.idle, &rig.table),
            Some(0)
        );
        rig.handle();
        rig.table.release(0);
        // Shutdown: workers 1 and 2 drain (their shards are empty) and
        // exit.
        rig.table.close();
        rig.idle.wake_all();
        rig.exited.wait_for(WORKERS - 1);
        assert_eq!(rig.table.usage(), 0, "every unit back on shard 0");
        assert!(rig.mailboxes.iter().all(Mailbox::is_empty));
    });
}
