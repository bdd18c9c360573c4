//! Stealing in the async pool (`pool/async_idle.rs`), driven through the
//! real take loop over mailboxes loom can see, each worker a future under
//! loom's `block_on` (whose waker unparks a loom thread, so a waker nobody
//! wakes is a deadlock loom reports): a free worker is woken for work
//! queued at a busy one (no lost wake-up), each envelope is taken once, by
//! its owner or a thief, and its unit goes back to the shard that admitted
//! it; a shutdown racing a stolen request still lets every worker drain
//! and end.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release --test loom_async_steal`.
//! The two models with both workers running are heavy (every sleep is a
//! lock, a fence, a `block_on` park and a wake): they run at one
//! preemption unless `SIDEJOB_LOOM_FULL=1` is set, and then at
//! `LOOM_MAX_PREEMPTIONS`. The stuck-owner model needs two preemptions to
//! reach the interleaving `AsyncIdle::took` guards (the owner interrupted
//! between "looking" and its take while two requests arrive), so `.ci/run`
//! sets `SIDEJOB_LOOM_FULL=1` (the three models pass at 2 in 333 s on an
//! idle 2-core machine); leave it unset for a quick look while editing.
#![cfg(loom)]

use loom::future::block_on;
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use sidejob::loom_api::{after_release_async, next_envelope_async, AsyncIdle, Mailbox, Table};

/// Runs a heavy model: at most one preemption unless `SIDEJOB_LOOM_FULL`
/// is set (tokio's heavy models set their bound the same way).
fn heavy_model(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("SIDEJOB_LOOM_FULL").is_none() {
        builder.preemption_bound = Some(builder.preemption_bound.map_or(1, |bound| bound.min(1)));
    }
    builder.check(model);
}

/// A count threads can wait on.
#[derive(Default)]
struct Count {
    value: Mutex<usize>,
    changed: Condvar,
}

impl Count {
    fn bump(&self) {
        *self.value.lock().unwrap() += 1;
        self.changed.notify_all();
    }

    fn get(&self) -> usize {
        *self.value.lock().unwrap()
    }

    /// Blocks until the count is at least `n`: a wake-up that never comes
    /// is a deadlock loom reports.
    fn wait_for(&self, n: usize) {
        let mut value = self.value.lock().unwrap();
        while *value < n {
            value = self.changed.wait(value).unwrap();
        }
    }
}

struct Rig {
    table: Table,
    mailboxes: [Mailbox; 2],
    idle: AsyncIdle,
    handled: Count,
}

impl Rig {
    fn new(capacity: usize) -> Arc<Rig> {
        Arc::new(Rig {
            table: Table::new(capacity, 2),
            mailboxes: [Mailbox::new(), Mailbox::new()],
            idle: AsyncIdle::new(2),
            handled: Count::default(),
        })
    }

    /// A caller: admits one unit on shard `shard`, queues it there, rings.
    fn submit(&self, shard: usize) {
        assert_eq!(self.table.acquire_at(shard), Ok(shard));
        self.mailboxes[shard].push();
        self.idle.work_added(shard);
    }

    /// Worker `me`'s task: take (own or stolen), run `handle`, release on
    /// the admitting shard; until its own shard is drained. The thread
    /// ends with the task (joined: a task that never ends is a deadlock).
    fn worker(rig: &Arc<Rig>, me: usize, handle: impl Fn() + 'static) -> thread::JoinHandle<()> {
        let rig = Arc::clone(rig);
        thread::spawn(move || {
            block_on(async {
                while let Some(from) =
                    next_envelope_async(me, &rig.mailboxes, &rig.idle, &rig.table).await
                {
                    handle();
                    rig.table.release(from);
                    after_release_async(&rig.idle, me, from);
                    rig.handled.bump();
                }
            })
        })
    }

    /// Shutdown: close, wake, join the workers; then every request was
    /// handled once and every unit is back.
    fn shut_down(&self, workers: Vec<thread::JoinHandle<()>>, handled: usize) {
        self.table.close();
        self.idle.wake_all();
        for worker in workers {
            worker.join().unwrap();
        }
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
        let thief = Rig::worker(&rig, 1, || {});
        rig.submit(0);
        rig.handled.wait_for(1);
        rig.shut_down(vec![thief], 1);
    });
}

/// Both workers run; two requests are queued at worker 0 and shutdown
/// begins at once. Each is handled once, by its owner or by the thief,
/// every unit goes back to shard 0, and both workers drain and end (a
/// thief's release on the closed shard wakes an owner asleep waiting for
/// it).
#[test]
fn owner_and_thief_take_each_request_once_across_shutdown() {
    heavy_model(|| {
        let rig = Rig::new(4);
        let workers = (0..2).map(|me| Rig::worker(&rig, me, || {})).collect();
        rig.submit(0);
        rig.submit(0);
        rig.shut_down(workers, 2);
    });
}

/// Worker 1 sleeps; then worker 0 starts, and two requests are queued at
/// it; worker 0 takes one and is stuck in it until worker 1 has handled a
/// request. Worker 1 must be woken for the other, even when worker 0 was
/// looking at its mailbox as both arrived (the producers then count on
/// worker 0 and wake nobody: worker 0 must wake a sleeper itself when it
/// takes one and leaves one queued). Removing that wake-up from
/// `AsyncIdle::took` makes this model deadlock.
#[test]
fn a_request_queued_behind_a_stuck_owner_wakes_the_free_worker() {
    heavy_model(|| {
        let rig = Rig::new(4);
        let thief = Arc::new(Count::default());
        let thief_worker = {
            let thief = thief.clone();
            Rig::worker(&rig, 1, move || thief.bump())
        };
        while rig.idle.sleepers() == 0 {
            thread::yield_now();
        }
        let owner = {
            let thief = thief.clone();
            Rig::worker(&rig, 0, move || thief.wait_for(1))
        };
        rig.submit(0);
        rig.submit(0);
        rig.handled.wait_for(2);
        rig.shut_down(vec![owner, thief_worker], 2);
    });
}
