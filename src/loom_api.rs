//! What loom models drive directly (only under `--cfg loom`).
//!
//! Loom cannot see crossbeam-channel or oneshot, so models never run a
//! whole [`Pool`](crate::Pool). They drive the pieces whose correctness
//! rests on atomics: the admission table and the rule a worker uses to
//! decide that its shard is drained. The mailbox around them is modelled by
//! the test with a loom `Mutex<VecDeque>`.

use crate::engine::probe::Probe;
use crate::error::Error;

/// The admission table, as the front-ends use it.
#[derive(Debug)]
pub struct Table(crate::engine::table::Table);

impl Table {
    /// `capacity` units over `shards` shards.
    pub fn new(capacity: usize, shards: usize) -> Table {
        Table(
            crate::engine::table::Table::new(capacity, shards, Probe::Thread)
                .expect("valid model config"),
        )
    }

    /// `capacity` units over `shards` shards, refusing through the count of
    /// marked shards that tables of more than 64 shards use.
    pub fn with_count(capacity: usize, shards: usize) -> Table {
        let mut table = crate::engine::table::Table::new(capacity, shards, Probe::Thread)
            .expect("valid model config");
        table.force_counted();
        Table(table)
    }

    /// `capacity` units over `shards` shards, with a waiting room for
    /// `max_waiters` callers (FIFO, no deadline: loom has no clock).
    pub fn with_waiters(capacity: usize, shards: usize, max_waiters: usize) -> Table {
        let policy = crate::engine::waiters::Policy {
            max_waiters,
            max_wait: std::time::Duration::MAX,
            order: crate::engine::waiters::QueueOrder::Fifo,
            pass_budget: None,
            ..Default::default()
        };
        let table = crate::engine::table::Table::new(capacity, shards, Probe::Thread)
            .and_then(|table| table.with_policy(&policy))
            .expect("valid model config");
        Table(table)
    }

    /// As [`with_waiters`](Self::with_waiters), with a pass budget for
    /// waiters of many units (0: freed units are kept for the first
    /// waiter at once).
    pub fn with_waiters_and_budget(
        capacity: usize,
        shards: usize,
        max_waiters: usize,
        pass_budget: usize,
    ) -> Table {
        let policy = crate::engine::waiters::Policy {
            max_waiters,
            max_wait: std::time::Duration::MAX,
            order: crate::engine::waiters::QueueOrder::Fifo,
            pass_budget: Some(pass_budget),
            ..Default::default()
        };
        let table = crate::engine::table::Table::new(capacity, shards, Probe::Thread)
            .and_then(|table| table.with_policy(&policy))
            .expect("valid model config");
        Table(table)
    }

    /// `capacity` units over `shards` shards, requests of class
    /// `Sheddable` filling at most `sheddable` of it, with a waiting room
    /// for `max_waiters` callers (0: none).
    pub fn with_headroom(
        capacity: usize,
        shards: usize,
        sheddable: f64,
        max_waiters: usize,
    ) -> Table {
        Table::with_min_share(capacity, shards, sheddable, 0.0, max_waiters)
    }

    /// [`with_headroom`](Self::with_headroom), `Sheddable` with a min
    /// share of `min` of the capacity too (0: none).
    pub fn with_min_share(
        capacity: usize,
        shards: usize,
        sheddable: f64,
        min: f64,
        max_waiters: usize,
    ) -> Table {
        let mut policy = crate::engine::waiters::Policy {
            max_waiters,
            max_wait: std::time::Duration::MAX,
            ..Default::default()
        };
        policy.headroom.set(crate::Class::SheddablePlus, sheddable);
        policy.headroom.set(crate::Class::Sheddable, sheddable);
        policy.headroom.set_min_share(crate::Class::Sheddable, min);
        let table = crate::engine::table::Table::new(capacity, shards, Probe::Thread)
            .and_then(|table| table.with_policy(&policy))
            .expect("valid model config");
        Table(table)
    }

    /// `capacity` units over `shards` shards with tenant keys: every key's
    /// cap `per_key_cap`, the fair line at `fair_line`, and a FIFO waiting
    /// room for `max_waiters` callers (0: none).
    pub fn with_keys(
        capacity: usize,
        shards: usize,
        per_key_cap: Option<usize>,
        fair_line: f64,
        max_waiters: usize,
    ) -> Table {
        let policy = crate::engine::waiters::Policy {
            max_waiters,
            max_wait: std::time::Duration::MAX,
            ..Default::default()
        };
        let keys = crate::engine::keys::KeySettings {
            per_key_cap,
            fair_line: Some(fair_line),
            rules: Vec::new(),
        };
        let table = crate::engine::table::Table::new(capacity, shards, Probe::Thread)
            .and_then(|table| table.with_policy(&policy))
            .and_then(|table| table.with_keys(&keys))
            .expect("valid model config");
        Table(table)
    }

    /// Takes `n` units for tenant `key` (any number but 0), failing fast
    /// from shard `start` unless `wait` (then from the home shard, waiting
    /// in the room, blocking the model thread): each shard it took from,
    /// with how many. Give them back with [`release_keyed`](Self::release_keyed).
    pub fn acquire_keyed(
        &self,
        key: u64,
        start: usize,
        n: usize,
        wait: bool,
    ) -> Result<Vec<(usize, usize)>, Error> {
        let ask = crate::units::Ask::new().key(&key).units(n);
        let ask = if wait {
            ask
        } else {
            crate::units::Ask {
                how: crate::engine::ask::How::At(start),
                ..ask
            }
        };
        let grant = self.0.admit(&ask)?;
        let parts = grant.parts().iter().map(|p| (p.shard, p.units)).collect();
        // The caller gives the units back with `release_keyed`.
        std::mem::forget(grant);
        Ok(parts)
    }

    /// One unit for tenant `key`, failing fast from the caller's home
    /// shard: the keyed take's own short path (`admit_keyed_one`). The
    /// shard it came from; give it back with
    /// [`release_keyed`](Self::release_keyed).
    pub fn try_keyed(&self, key: u64) -> Result<usize, Error> {
        let grant = self
            .0
            .admit(&crate::units::Ask::new().key(&key).fail_fast())?;
        let shard = grant.shard;
        // The caller gives the unit back with `release_keyed`.
        std::mem::forget(grant);
        Ok(shard)
    }

    /// Sets tenant `key`'s weight, as `set_key_weight` does.
    pub fn set_key_weight(&self, key: u64, weight: u32) {
        self.0
            .set_key_rule(&key, crate::engine::keys::Rule::Weight(weight))
            .expect("a weight above 0");
    }

    /// Empties the ledger's idle words, as a share about to refuse does.
    pub fn sweep_keys(&self) {
        self.0.keys().sweep();
    }

    /// Gives back tenant `key`'s `units` on `shard`, as its guard does:
    /// out of the key's count first, then to the table.
    pub fn release_keyed(&self, key: u64, shard: usize, units: usize) {
        self.0.release_key(crate::engine::keys::id_of(&key), units);
        self.0.release_units(shard, units, false);
    }

    /// The units tenant `key` holds, by its count.
    pub fn key_held(&self, key: u64) -> usize {
        self.0.keys().held(crate::engine::keys::id_of(&key))
    }

    /// The weight of the keys holding units, and how many keys the
    /// ledger keeps.
    pub fn keys_state(&self) -> (u64, usize) {
        (self.0.keys().active_weight(), self.0.keys().entries())
    }

    /// Gives back `units` units of `class` on `shard`, as a guard of that
    /// class does: out of the class's holdings first, then to the table.
    pub fn release_class(&self, class: crate::Class, shard: usize, units: usize) {
        self.0.release_class(class, units);
        self.0.release_units(shard, units, false);
    }

    /// Units `class` holds, as its count says (`None` for a top class).
    pub fn class_held(&self, class: crate::Class) -> Option<usize> {
        self.0.stats().classes[class.rank()].held
    }

    /// Takes `n` units of `class` at once, failing fast, starting at shard
    /// `start` (`Limiter::acquire_with` of a fail-fast ask): each shard it
    /// took from, with how many.
    pub fn acquire_class_at(
        &self,
        class: crate::Class,
        start: usize,
        n: usize,
    ) -> Result<Vec<(usize, usize)>, Error> {
        let ask = crate::units::Ask {
            how: crate::engine::ask::How::At(start),
            ..crate::units::Ask::new().class(class).units(n)
        };
        let grant = self.0.admit(&ask)?;
        let parts = grant.parts().iter().map(|p| (p.shard, p.units)).collect();
        // The caller gives the units back part by part.
        std::mem::forget(grant);
        Ok(parts)
    }

    /// Waits (blocking the model thread) for one unit of `class`: the
    /// shard it came from.
    pub fn acquire_class_waiting(&self, class: crate::Class) -> Result<usize, Error> {
        let grant = self.0.admit(&crate::units::Ask::new().class(class))?;
        let shard = grant.shard;
        std::mem::forget(grant);
        Ok(shard)
    }

    /// Sets the capacity, answering the units held when the resize read
    /// them with its shards gated: a take counted there landed before the
    /// gate, one not counted after it.
    pub fn set_capacity_reading(&self, capacity: usize) -> usize {
        self.0.set_capacity_reading(capacity)
    }

    /// Waits for `n` units at once as a future (`Limiter::acquire_many_async`):
    /// each shard it got units of, with how many.
    pub fn acquire_many_async(
        &self,
        n: usize,
    ) -> impl std::future::Future<Output = Result<Vec<(usize, usize)>, Error>> + '_ {
        let wait = self.0.acquire_async_many(n, crate::Class::Critical, None);
        async move {
            let grant = wait.await?;
            let parts = grant.parts().iter().map(|p| (p.shard, p.units)).collect();
            // The caller gives the units back part by part.
            std::mem::forget(grant);
            Ok(parts)
        }
    }

    /// Admits one unit from the caller's home shard, waiting in the room
    /// (blocking the model thread) when every shard is full.
    pub fn acquire_waiting(&self) -> Result<usize, Error> {
        self.0.acquire_waiting(None)
    }

    /// [`acquire_waiting`](Self::acquire_waiting) as a future.
    pub fn acquire_async(&self) -> impl std::future::Future<Output = Result<usize, Error>> + '_ {
        self.0.acquire_async(None)
    }

    /// How many callers wait now.
    pub fn waiting(&self) -> usize {
        self.0.waiting()
    }

    /// The `accepted` and `waited` counts of a stats snapshot.
    pub fn accepted_and_waited(&self) -> (u64, u64) {
        let stats = self.0.stats();
        (stats.accepted, stats.waited)
    }

    /// Admits one unit trying shard `start` first; the shard it came from.
    pub fn acquire_at(&self, start: usize) -> Result<usize, Error> {
        self.0.acquire_at(start)
    }

    /// Takes `n` units at once starting at shard `start` (the caller's
    /// home shard in `Limiter::try_acquire_many`), all or nothing: each
    /// shard it took from, with how many.
    pub fn acquire_many_at(&self, start: usize, n: usize) -> Result<Vec<(usize, usize)>, Error> {
        let grant = self.0.acquire_many_at(start, n)?;
        let parts = grant.parts().iter().map(|p| (p.shard, p.units)).collect();
        // The caller gives the units back part by part (`release_units`).
        std::mem::forget(grant);
        Ok(parts)
    }

    /// Gives back `units` units of shard `shard` at once.
    pub fn release_units(&self, shard: usize, units: usize) {
        self.0.release_units(shard, units, false)
    }

    /// Raises the capacity by `units` (see `Limiter::add_capacity`).
    pub fn add_capacity(&self, units: usize) {
        self.0.add_capacity(units).expect("a valid capacity");
    }

    /// Lowers the capacity by `units` (see `Limiter::remove_capacity`).
    pub fn remove_capacity(&self, units: usize) {
        self.0.remove_capacity(units);
    }

    /// Gives back one unit of shard `shard`.
    pub fn release(&self, shard: usize) {
        self.0.release(shard, false)
    }

    /// Gives back `units` units of shard `shard` in one release (a plain
    /// pool worker's run of finished casts).
    pub fn release_many(&self, shard: usize, units: usize) {
        self.0.release_many(shard, units, 0)
    }

    /// Admits one unit on shard `shard` only (a pinned keyed request).
    pub fn acquire_only(&self, shard: usize) -> Result<usize, Error> {
        self.0.acquire_only(shard)
    }

    /// Gives back a unit that was admitted but never used (a keyed request
    /// refused `KeyBusy`).
    pub fn refund(&self, shard: usize) {
        self.0.return_unused(shard)
    }

    /// Sets the capacity (see `Limiter::set_capacity`).
    pub fn set_capacity(&self, capacity: usize) {
        self.0.set_capacity(capacity).expect("a valid capacity")
    }

    /// The capacity in force.
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// The bound a resize keeps: unless the table is in debt, every
    /// shard's limit is at least what it holds and the limits add up to the
    /// capacity, so `sum(max(held, limit)) <= capacity` and nothing can be
    /// admitted while `capacity` or more units are held. Read it when no
    /// resize runs.
    pub fn bound_holds(&self) -> bool {
        let table = &self.0;
        if table.in_debt() {
            return true;
        }
        let covered: usize = (0..table.shard_count())
            .map(|i| {
                let shard = table.shard(i);
                shard.usage().max(shard.limit())
            })
            .sum();
        covered <= table.capacity()
    }

    /// Begins shutdown: refuses all later admissions.
    pub fn close(&self) {
        self.0.close()
    }

    /// True once the close has closed every shard (what the front-ends'
    /// `is_shutdown` and `is_closed` answer).
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// The worker's exit rule for shard `shard` (see `worker::drained`).
    pub fn drained(&self, shard: usize) -> bool {
        crate::pool::worker_loop::drained(self.0.shard(shard))
    }

    /// Units held now.
    pub fn usage(&self) -> usize {
        self.0.usage()
    }
}

/// The shepherd's due line (`shepherd/line.rs`): the lock-free FIFO of
/// operations due now and the workers' sleep/wake protocol, carrying
/// `usize` stand-ins for records. A submit and the timer's promotion of a
/// delayed operation both reach the workers through [`push`](Self::push).
pub struct DueLine(crate::shepherd::line::Line<usize>);

impl std::fmt::Debug for DueLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DueLine")
            .field("open", &self.open())
            .finish()
    }
}

impl DueLine {
    /// An empty, open line for `workers` workers.
    pub fn new(workers: usize) -> DueLine {
        DueLine(crate::shepherd::line::Line::new(workers))
    }

    /// A submit or a promotion: reserve, then publish; false (nothing
    /// queued) once closed.
    pub fn push(&self, record: usize) -> bool {
        self.0.push(record).is_ok()
    }

    /// The first half of a submit: counts a record in; false once closed.
    pub fn reserve(&self) -> bool {
        self.0.reserve()
    }

    /// The second half: queues the reserved record and wakes a sleeper.
    pub fn publish(&self, record: usize) {
        self.0.publish(record)
    }

    /// A worker's take: polls once, yields, polls again (the spin under
    /// loom), then sleeps until a push or the close. `None` once closed
    /// and empty. The record stays open until [`finish`](Self::finish)
    /// (or [`finish_many`](Self::finish_many)), which a worker calls
    /// before its next `take` (it may [`try_take`](Self::try_take) first).
    pub fn take(&self, worker: usize) -> Option<usize> {
        self.0.take(worker, std::time::Duration::from_nanos(1))
    }

    /// Shutdown: later pushes fail, every sleeper wakes.
    pub fn close(&self) {
        self.0.close()
    }

    /// Records reserved and not yet finished (due, or taken and still in
    /// a worker's hands).
    pub fn open(&self) -> usize {
        self.0.open()
    }

    /// A worker is done with a record it took: counts it out, waking every
    /// sleeper if that left the line closed and empty; true if nothing is
    /// open any more.
    pub fn finish(&self) -> bool {
        self.0.finish()
    }

    /// [`finish`](Self::finish) for `n > 0` records at once: a worker's
    /// run of count-outs, made before its next [`take`](Self::take).
    pub fn finish_many(&self, n: usize) -> bool {
        self.0.finish_many(n)
    }

    /// A worker's look at the line that never sleeps: the oldest record,
    /// if one is there now. A worker may call it while it keeps
    /// count-outs (`line.rs`, "Counting out in runs").
    pub fn try_take(&self) -> Option<usize> {
        self.0.try_take()
    }

    /// True when nothing is open: nothing due, every taken record finished.
    pub fn is_idle(&self) -> bool {
        self.0.is_idle()
    }
}

/// The room where a stealing pool's free workers sleep (`pool/steal.rs`).
#[derive(Debug)]
pub struct Idle(crate::pool::steal::Idle);

impl Idle {
    /// An empty room for `workers` workers. The workers' polling flags
    /// live on the shards of a table of their own here (in a pool, on the
    /// pool's table, which only matters to the caches).
    pub fn new(workers: usize) -> Idle {
        let table = crate::engine::table::Table::new(workers, workers, Probe::Thread)
            .expect("valid model config");
        Idle(crate::pool::steal::Idle::new(crate::sync::Arc::new(table)))
    }

    /// What a producer does right after it queued an envelope at `to`,
    /// whose mailbox is `mailbox`.
    pub fn work_added(&self, to: usize, mailbox: &Mailbox) {
        self.0.work_added(to, || !mailbox.is_empty())
    }

    /// Workers counted as about to sleep or asleep (a reading): lets a
    /// model start from a state where they sleep.
    pub fn sleepers(&self) -> usize {
        self.0.sleepers()
    }

    /// What shutdown does after closing the table.
    pub fn wake_all(&self) {
        self.0.wake_all()
    }

    /// What worker `me` does once it gave back the unit of what it handled,
    /// before it replies: says it polls its mailbox next.
    pub fn polling(&self, me: usize) {
        self.0.polling(me)
    }

    /// What worker `me` does when it leaves its loop because its shard is
    /// drained.
    pub fn leave(&self, me: usize) {
        self.0.leave(me)
    }

    /// What a producer does right after it queued an envelope in worker
    /// `to`'s private mailbox (a pinned keyed request).
    pub fn private_added(&self, to: usize) {
        self.0.private_added(to)
    }
}

/// The ordered keyed mode's per-key queues (`pool/key_queue.rs`), holding
/// request numbers.
pub struct KeyQueues(crate::pool::key_queue::KeyQueues<u32>);

impl std::fmt::Debug for KeyQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyQueues").finish_non_exhaustive()
    }
}

/// What [`KeyQueues::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyAdmit {
    /// The key was idle: run this request now.
    Run(u32),
    /// Queued behind the key's earlier requests.
    Queued,
    /// The key has its limit of requests: refused, handed back.
    Busy(u32),
}

impl KeyQueues {
    /// Queues for `workers` workers, at most `cap` requests per key.
    pub fn new(workers: usize, cap: usize) -> KeyQueues {
        KeyQueues(crate::pool::key_queue::KeyQueues::new(workers, cap))
    }

    /// Admits request `item` for key `id` (its unit already taken).
    pub fn admit(&self, id: u64, item: u32) -> KeyAdmit {
        match self.0.admit(id, item) {
            crate::pool::key_queue::Admit::Run(item) => KeyAdmit::Run(item),
            crate::pool::key_queue::Admit::Queued => KeyAdmit::Queued,
            crate::pool::key_queue::Admit::Busy(item) => KeyAdmit::Busy(item),
        }
    }

    /// Key `id`'s request that was out has finished (its unit given
    /// back): the key's next request, now out, or `None`.
    pub fn finish(&self, id: u64) -> Option<u32> {
        self.0.finish(id)
    }

    /// Whether a request waits on key `id`'s stripe: the hint by which a
    /// worker leaves a blocking call's turn to its caller.
    pub fn anyone_queued(&self, id: u64) -> bool {
        self.0.anyone_queued(id)
    }

    /// Keys present.
    pub fn keys(&self) -> usize {
        self.0.keys()
    }
}

/// A worker's mailbox as a queue loom can see (the pool's are crossbeam
/// channels). Every envelope in mailbox `i` holds a unit of shard `i`, so
/// the model keeps only how many are queued, in one atomic: lock-free like
/// crossbeam's queue, so the model sees the weak-memory race the `SeqCst`
/// fences of the idle room are for (a queue behind a lock would hide it).
#[derive(Debug, Default)]
pub struct Mailbox(crate::sync::AtomicUsize);

impl Mailbox {
    /// An empty mailbox.
    pub fn new() -> Mailbox {
        Mailbox::default()
    }

    /// Queues one envelope.
    pub fn push(&self) {
        // Release: pairs with the Acquire of a take, as a channel's send
        // does with its receive.
        self.0.fetch_add(1, crate::sync::Ordering::Release);
    }

    /// Envelopes queued now.
    pub fn len(&self) -> usize {
        self.0.load(crate::sync::Ordering::Acquire)
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl crate::pool::steal::Queue for Mailbox {
    type Item = ();
    fn try_take(&self) -> Option<()> {
        use crate::sync::Ordering::{AcqRel, Acquire};
        // AcqRel/Acquire: one take per envelope, as a channel's receive.
        self.0
            .fetch_update(AcqRel, Acquire, |queued| queued.checked_sub(1))
            .ok()
            .map(|_| ())
    }
    fn is_empty(&self) -> bool {
        Mailbox::is_empty(self)
    }
    fn len(&self) -> usize {
        Mailbox::len(self)
    }
}

/// A stealing worker's next envelope (`steal::next`, the real loop): from
/// its own mailbox or another's, sleeping in `idle` while there is none;
/// the mailbox it took one from. `None` once worker `me`'s shard is drained.
pub fn next_envelope(
    me: usize,
    mailboxes: &[Mailbox],
    idle: &Idle,
    table: &Table,
) -> Option<usize> {
    next_envelope_with_private(me, mailboxes, None, idle, table)
}

/// [`next_envelope`] for a worker that also has a private mailbox (pinned
/// keyed requests, which no other worker takes); an envelope from it is
/// reported as from `me`.
pub fn next_envelope_with_private(
    me: usize,
    mailboxes: &[Mailbox],
    private: Option<&Mailbox>,
    idle: &Idle,
    table: &Table,
) -> Option<usize> {
    crate::pool::steal::next(
        me,
        mailboxes,
        private,
        &idle.0,
        std::time::Duration::ZERO,
        false,
        || table.drained(me),
    )
    .map(|(from, ())| from)
}

/// What a stealing worker does after it gave back a unit of shard `from`
/// (`steal::after_release`).
pub fn after_release(idle: &Idle, me: usize, from: usize) {
    crate::pool::steal::after_release(&idle.0, me, from)
}

/// The async pool's queues (`pool/async_idle.rs`): one per worker and a
/// common one, which every worker takes from, and where free workers
/// sleep. Its items stand for
/// envelopes: each is the shard whose unit it holds.
#[derive(Debug)]
pub struct SharedQueue(crate::pool::async_idle::SharedQueue<()>);

impl SharedQueue {
    /// An empty queue for `workers` workers, who yield once before they
    /// sleep (as on a multi-thread runtime, the async pool's usual case:
    /// after its yield a worker sleeps as it would at once otherwise).
    pub fn new(workers: usize) -> SharedQueue {
        SharedQueue(crate::pool::async_idle::SharedQueue::new(workers, 4, true))
    }

    /// As on a current-thread runtime: every push to the common queue,
    /// and a worker sleeps at once when it finds it empty.
    pub fn current_thread(workers: usize) -> SharedQueue {
        SharedQueue(crate::pool::async_idle::SharedQueue::new(workers, 4, false))
    }

    /// What a delivery does: queues an envelope holding a unit of shard
    /// `shard` and wakes a sleeper. False if no worker will take it.
    pub fn push(&self, shard: usize) -> bool {
        self.0.push(shard, ()).is_ok()
    }

    /// What shutdown does after closing the table.
    pub fn wake_all(&self) {
        self.0.wake_all()
    }

    /// What worker `me` does when its handler first returns `Pending`
    /// (`SharedQueue::away`).
    pub fn away(&self, me: usize) {
        self.0.away(me)
    }

    /// How many workers sleep now.
    pub fn sleepers(&self) -> usize {
        self.0.sleepers()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One async worker's side of the shared queues: its index, its spare
/// waker, whether it sleeps on the queue's stack.
#[derive(Debug)]
pub struct SharedWorker {
    me: usize,
    waker: Option<std::task::Waker>,
    sleep: crate::pool::async_idle::Sleep,
}

impl SharedWorker {
    /// Worker `me`, awake.
    pub fn new(me: usize) -> SharedWorker {
        SharedWorker {
            me,
            waker: None,
            sleep: Default::default(),
        }
    }

    /// The worker's next envelope (`SharedQueue::poll_next`, the real
    /// poll): the shard whose unit it holds, awaiting while the queue is
    /// empty; `None` once the pool whose table is `table` is closed and
    /// drained.
    pub async fn next(&mut self, queue: &SharedQueue, table: &Table) -> Option<usize> {
        let SharedWorker { me, waker, sleep } = self;
        std::future::poll_fn(|cx| {
            queue.0.poll_next(cx, *me, waker, sleep, || {
                crate::pool::worker_loop::pool_drained(&table.0)
            })
        })
        .await
        .map(|(shard, ())| shard)
    }

    /// What dropping the worker's loop does while it sleeps
    /// (`SharedQueue::leave`).
    pub fn leave(&mut self, queue: &SharedQueue) {
        queue.0.leave(self.me, &mut self.sleep)
    }
}

/// A thread pool's mailbox (`pool/mailbox.rs`) over lanes loom can see: a
/// ring of `ring` envelopes and an unbounded overflow, each a loom
/// `Mutex<VecDeque>`, kept in one order per sender by the real protocol.
pub struct SpillMailbox {
    spill: crate::pool::mailbox::Spill<(u8, u8)>,
    ring: crate::sync::Mutex<std::collections::VecDeque<(u8, u8)>>,
    ring_len: usize,
    overflow: crate::sync::Mutex<std::collections::VecDeque<(u8, u8)>>,
}

impl std::fmt::Debug for SpillMailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillMailbox")
            .field("ring_len", &self.ring_len)
            .finish_non_exhaustive()
    }
}

impl SpillMailbox {
    /// An empty mailbox whose ring holds `ring` envelopes.
    pub fn new(ring: usize) -> SpillMailbox {
        SpillMailbox {
            spill: crate::pool::mailbox::Spill::new(),
            ring: crate::sync::Mutex::new(std::collections::VecDeque::new()),
            ring_len: ring,
            overflow: crate::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// Sends `(sender, sequence)`.
    pub fn send(&self, envelope: (u8, u8)) {
        use crate::pool::mailbox::Refusal;
        let sent = self.spill.send(
            envelope,
            |envelope| {
                let mut ring = self.ring.lock();
                if ring.len() == self.ring_len {
                    return Err(Refusal::Full(envelope));
                }
                ring.push_back(envelope);
                Ok(())
            },
            |envelope| {
                self.overflow.lock().push_back(envelope);
                Ok(())
            },
        );
        assert!(sent.is_ok(), "the model's receivers never leave");
    }

    /// Takes the next envelope, if one is there to take.
    pub fn take(&self) -> Option<(u8, u8)> {
        use crate::pool::mailbox::Look;
        let look = |lane: &crate::sync::Mutex<std::collections::VecDeque<(u8, u8)>>| match lane
            .lock()
            .pop_front()
        {
            Some(envelope) => Look::Took(envelope),
            None => Look::Empty,
        };
        match self
            .spill
            .take(|| look(&self.ring), || look(&self.overflow))
        {
            Look::Took(envelope) => Some(envelope),
            Look::Empty => None,
            Look::Gone => unreachable!("the model's senders never leave"),
        }
    }

    /// True if nothing is queued, as a stealing worker's sleep check reads it.
    pub fn is_empty(&self) -> bool {
        self.ring.lock().is_empty() && self.spill.nothing_pending()
    }
}
