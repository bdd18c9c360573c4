//! The waiting room's side of the table: a caller queues when every shard
//! is full, a release hands its unit to the next waiter, a waiter gives up.
//!
//! A table may have a waiting room (`waiters.rs`): its queue lives in the
//! control lock beside the debt, and a release reads one more word, the
//! number waiting, before and after it gives its unit back. The protocol is
//! in `waiters.rs`. The control lock and the room sit behind `Arc`s so
//! that the room's alarm (`RoomAlarm`) can reach them: the process-wide
//! deadline watcher (`alarm.rs`) holds that alarm weakly and rings it to
//! time out async waiters, which therefore arm no timer of their own.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::{Bound, Control, Table, Take, CLOSED, FLAGS};
use crate::engine::class::Class;
use crate::engine::grant::{Grant, Part};
use crate::engine::waiters::{Policy, Room, Source, State, Tenant, Ticket, Wake, Woken};
use crate::error::{ConfigError, Error};
#[cfg(not(loom))]
use crate::sync::Mutex;
use crate::sync::{now, park, Arc, Ordering::Relaxed};

/// The future of [`Table::acquire_async_many`]: the grant of `need`
/// units.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct WaitUnit<'a> {
    table: &'a Table,
    /// How many units it waits for.
    need: usize,
    /// Its class.
    class: Class,
    /// The caller's own deadline, if any; `max_wait` bounds it too.
    deadline: Option<Instant>,
    /// Its tenant, for the room's fair order.
    tenant: Tenant,
    /// The waiter's node and ticket, while it is queued. Its deadline is
    /// the room's watcher's business (`alarm.rs`): the future arms no
    /// timer.
    queued: Option<Queued>,
}

/// A queued waiter's hold on its place: the node's key (valid while the
/// ticket says `Waiting`), the ticket, when it arrived on the room's
/// clock (`Room::ticks`), and how many units it waits for.
#[derive(Debug)]
struct Queued {
    key: usize,
    ticket: Arc<Ticket>,
    since_ticks: u64,
    need: usize,
    class: Class,
}

/// The future of [`Table::acquire_async`]: one unit's shard.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub(crate) struct WaitOne<'a>(WaitUnit<'a>);

impl std::future::Future for WaitOne<'_> {
    type Output = Result<usize, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.get_mut().0)
            .poll(cx)
            .map(|granted| granted.map(|grant| grant.shard))
    }
}

impl WaitUnit<'_> {
    /// The same wait, ordered in the room as `tenant`'s.
    pub(crate) fn for_tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = tenant;
        self
    }
}

impl std::fmt::Debug for WaitUnit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitUnit")
            .field("queued", &self.queued.is_some())
            .finish()
    }
}

impl std::future::Future for WaitUnit<'_> {
    type Output = Result<Grant, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;

        let this = self.get_mut();
        let table = this.table;
        let Some(room) = table.room.as_deref() else {
            // No room: the first take alone.
            let first = table.try_fast(this.need, this.class);
            table.count_first(this.class, &first, true);
            return Poll::Ready(first);
        };
        if let Some(queued) = &this.queued {
            // Granted, closed or expired: read without the lock (the
            // ticket's Acquire load pairs with the Release store of whoever
            // ended the wait, under the lock).
            let state = queued.ticket.state();
            if state != State::Waiting {
                let queued = this.queued.take().expect("just read");
                return Poll::Ready(table.finished(room, state, &queued));
            }
            // Still waiting: point the node at this waker, under the lock
            // that a grant takes, so the grant wakes the right task. A
            // waker is code we do not own (its clone and drop may re-enter
            // this table): it is compared under the lock, cloned and
            // dropped outside it.
            let control = table.control.lock();
            let state = queued.ticket.state();
            if state != State::Waiting {
                drop(control);
                let queued = this.queued.take().expect("just read");
                return Poll::Ready(table.finished(room, state, &queued));
            }
            // Still queued (so its node is its own): the same task, as a
            // re-poll usually brings, needs nothing.
            if control.queue.will_wake(queued.key, cx.waker()) {
                return Poll::Pending;
            }
            drop(control);
            let wake = Wake::Task(cx.waker().clone());
            let mut control = table.control.lock();
            let state = queued.ticket.state();
            if state != State::Waiting {
                // Ended while the waker was cloned: the clone goes unused.
                drop(control);
                drop(wake);
                let queued = this.queued.take().expect("just read");
                return Poll::Ready(table.finished(room, state, &queued));
            }
            let old = control.queue.replace_wake(queued.key, wake);
            drop(control);
            // The old waker's drop may release a unit into this very
            // table, which may hand it to this very waiter: the new waker,
            // now in place, is woken for it.
            drop(old);
            return Poll::Pending;
        }
        // First poll: the first take, then the queue.
        if let Some(answer) = table.first_take(this.need, this.class) {
            return Poll::Ready(answer);
        }
        let now = now();
        let deadline = table.wait_deadline(room, this.deadline, now);
        // Already past (a zero `max_wait`, a caller's deadline gone by):
        // queue without one, re-check once, then time out below, as a timer
        // armed for zero would.
        let overdue = deadline.is_some_and(|deadline| deadline <= now);
        let watched = deadline.filter(|_| !overdue);
        let wake = Wake::Task(cx.waker().clone());
        let entered =
            table.enter_room(room, wake, now, watched, this.need, this.class, this.tenant);
        let (queued, arm) = match entered {
            Ok(entered) => entered,
            Err(err) => return Poll::Ready(Err(err)),
        };
        if arm {
            // Before the re-check, even if it finds a unit: the queue now
            // counts on a registration at this instant (`Queue::arm`'s
            // invariant).
            table.arm(watched);
        }
        if let Some(grant) = table.recheck(room, &queued) {
            return Poll::Ready(grant);
        }
        if overdue {
            return Poll::Ready(table.give_up(room, queued));
        }
        this.queued = Some(queued);
        Poll::Pending
    }
}

impl Drop for WaitUnit<'_> {
    fn drop(&mut self) {
        let Some(queued) = self.queued.take() else {
            return;
        };
        self.table.abandon(queued);
    }
}

/// What [`Table::take_any`] found.
enum Found {
    /// A unit of this shard, taken.
    Unit(usize),
    /// No room on an open shard, but a gated one was passed over.
    Gated,
    /// No room, or the table is closed.
    Nothing,
}

/// What the deadline watcher rings (`alarm.rs`): a table's control lock and
/// room, shared with the table. The watcher holds it weakly, and the table
/// holds the only strong handle, so a dropped table is never rung.
#[cfg(not(loom))]
#[derive(Debug)]
pub(super) struct RoomAlarm {
    control: Arc<Mutex<Control>>,
    room: Arc<Room>,
}

#[cfg(not(loom))]
impl crate::engine::alarm::Alarm for RoomAlarm {
    /// Expires the waiters whose deadline passed, under the control lock,
    /// and wakes them after it: each then finishes with `Timeout` (counted)
    /// in its poll. A grant and an expiry of one node are both under the
    /// lock, so a waiter is either handed a unit or timed out, never both.
    fn ring(&self, now: Instant) -> Option<Instant> {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let next = control.queue.expire(&self.room, now, &mut woken);
        drop(control);
        // On the watcher's own thread, a waker's panic has no caller to go
        // to: the panic hook has reported it, every other waiter was woken
        // (`Woken::wake_all`), and the watcher must go on ringing.
        crate::engine::foreign::quietly(|| woken.wake_all(&self.room));
        next
    }
}

/// The table as the room's scheduler sees it (`Queue::serve`): units
/// taken under the control lock, with no debt, so no shard is gated but by
/// a resize that holds the lock (which `CLOSED` alone ignores).
struct TableSource<'a> {
    table: &'a Table,
    /// Units the room handed out from releases, as of this call.
    handed: usize,
    budget: usize,
}

impl Source for TableSource<'_> {
    fn one(&mut self, class: Class) -> Option<usize> {
        match self.table.take_any(CLOSED, Bound::of(class)) {
            Found::Unit(shard) => Some(shard),
            Found::Gated | Found::Nothing => None,
        }
    }

    fn many(&mut self, n: usize, class: Class) -> Option<Vec<Part>> {
        let start = self.table.home_shard();
        self.table
            .take_across_locked(start, n, Bound::of(class))
            .ok()
            .map(|grant| grant.parts())
    }

    fn admitted(&self) -> usize {
        self.table.admitted_total().wrapping_add(self.handed)
    }

    fn budget(&self) -> usize {
        self.budget
    }

    fn capacity(&self, class: Class) -> usize {
        self.table.units_within(Bound::of(class))
    }

    fn under_share(&self, class: Class, n: usize) -> bool {
        self.table.under_share(class, n)
    }

    fn claim(&mut self, class: Class, n: usize) -> bool {
        self.table.claim_share(class, n)
    }

    fn unclaim(&mut self, class: Class, n: usize) {
        self.table.release_class(class, n);
    }

    fn hold(&mut self, class: Class, n: usize) {
        self.table.hold_class(class, n);
    }
}

impl Table {
    /// Gives the table the waiting room `policy` asks for (none when its
    /// `max_waiters` is 0).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `max_waiters` or `queue_order`.
    pub(crate) fn with_policy(mut self, policy: &Policy) -> Result<Self, ConfigError> {
        self.set_headroom(policy.headroom.check()?);
        self.room = policy.room()?;
        #[cfg(not(loom))]
        {
            self.alarm = self.room.as_ref().map(|room| {
                Arc::new(RoomAlarm {
                    control: Arc::clone(&self.control),
                    room: Arc::clone(room),
                })
            });
        }
        Ok(self)
    }

    /// True if the table has a waiting room.
    pub(crate) fn has_room(&self) -> bool {
        self.room.is_some()
    }

    /// One attempt from the caller's home shard that does not count an
    /// `Overload`: for a caller that will wait next.
    pub(crate) fn probe(&self) -> Result<usize, Error> {
        self.try_at::<false>(self.home_shard())
    }

    /// How many wait for a unit now.
    pub(crate) fn waiting(&self) -> usize {
        self.room.as_ref().map_or(0, |room| room.waiting())
    }

    /// Admits one unit from the caller's home shard, waiting in the room
    /// (if any) when every shard is full, until `deadline` at the latest
    /// (`None`: `max_wait` alone bounds it). Blocks the thread.
    ///
    /// `Overload` (counted) when there is no room or it is full,
    /// `Timeout` when the wait ran out, `Shutdown` once closed.
    // inline(always): `Supervisor::reserve`, `Pool::call` and `cast` come
    // here on every admission; out of line it cost the supervisor's
    // reserve + drop a third (benches/supervisor.rs).
    #[inline(always)]
    pub(crate) fn acquire_waiting(&self, deadline: Option<Instant>) -> Result<usize, Error> {
        match self.try_at::<false>(self.home_shard()) {
            Err(Error::Overload) => self.acquire_or_wait(deadline),
            other => other,
        }
    }

    /// Every shard was full: wait in the room, or `Overload` (counted).
    #[cold]
    fn acquire_or_wait(&self, deadline: Option<Instant>) -> Result<usize, Error> {
        match &self.room {
            Some(room) => self
                .wait_blocking(room, deadline, 1, Class::Critical, Tenant::NONE)
                .map(|grant| grant.shard),
            None => {
                self.count_refusal();
                Err(Error::Overload)
            }
        }
    }

    /// The earlier of `deadline` and the room's `max_wait` from now.
    fn wait_deadline(
        &self,
        room: &Room,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Option<Instant> {
        let own = now.checked_add(room.policy.max_wait);
        match (own, deadline) {
            (Some(own), Some(deadline)) => Some(own.min(deadline)),
            (own, deadline) => own.or(deadline),
        }
    }

    /// Queues the caller, if the room has space and the table is open: its
    /// hold on its place, and whether it must [`arm`](Self::arm) the
    /// watcher for `deadline` next. `deadline` is an async waiter's (the
    /// watcher expires it); a blocked thread passes `None` and times
    /// itself. `Overload` (counted) when the room is full.
    // The waiter's own fields, as `Queue::push` takes them.
    #[allow(clippy::too_many_arguments)]
    fn enter_room(
        &self,
        room: &Room,
        wake: Wake,
        now: Instant,
        deadline: Option<Instant>,
        need: usize,
        class: Class,
        tenant: Tenant,
    ) -> Result<(Queued, bool), Error> {
        let mut shed = Woken::default();
        let mut control = self.control.lock();
        if self.is_closing() {
            drop(control);
            // A waker is dropped outside the lock (`waiters.rs`, "Foreign
            // code").
            drop(wake);
            return Err(Error::Shutdown);
        }
        if control.queue.len() >= room.policy.max_waiters
            && !control.queue.shed_for(room, class, tenant, &mut shed)
        {
            drop(control);
            drop(wake);
            self.count_refusal();
            if class != Class::Critical {
                self.count_class_refusal(class);
            }
            return Err(Error::Overload);
        }
        // The pass budget counts from here, for a waiter of many units:
        // units taken from the table, and handed from releases.
        let admitted_at = if need > 1 {
            self.admitted_total().wrapping_add(control.handed_total())
        } else {
            0
        };
        let (key, ticket, since_ticks) =
            control
                .queue
                .push(room, wake, now, deadline, need, class, admitted_at, tenant);
        let arm = deadline.is_some_and(|deadline| control.queue.arm(deadline));
        let queued = Queued {
            key,
            ticket,
            since_ticks,
            need,
            class,
        };
        drop(control);
        // The waiter that gave up its place, woken after the lock.
        self.wake(shed);
        Ok((queued, arm))
    }

    /// Registers the room with the deadline watcher for `deadline` (which
    /// `enter_room` armed). Never under the control lock (`alarm.rs`, "Lock
    /// order"). Under loom, nothing: there is no watcher, and models set no
    /// deadline.
    fn arm(&self, deadline: Option<Instant>) {
        #[cfg(not(loom))]
        if let (Some(deadline), Some(alarm)) = (deadline, &self.alarm) {
            crate::engine::alarm::arm(deadline, Arc::downgrade(alarm) as _);
        }
        #[cfg(loom)]
        let _ = deadline;
    }

    /// Takes a waiter's node out of the queue if its wait has not ended
    /// yet; the state its ticket had under the lock (`Waiting` if the node
    /// was taken out here, else the outcome someone else gave it).
    /// `took_own`: the waiter took a unit from the table itself, an
    /// admission after waiting that no grant counted: counted here.
    ///
    /// With `Waiting`, the waiter's own waker comes back too: the caller
    /// drops it once its own bookkeeping is done (`waiters.rs`, "Foreign
    /// code"), since its drop may panic.
    ///
    /// A waiter of many units that was collecting them (reserved) leaves
    /// them to the next waiters in the same critical section; what they
    /// cannot use is given back here, after the lock.
    fn withdraw(&self, room: &Room, queued: &Queued, took_own: bool) -> (State, Option<Wake>) {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        // Under the lock, the state is settled: only a holder of the lock
        // ends a wait.
        let state = queued.ticket.state();
        let mut wake = None;
        let mut hand = Vec::new();
        if state == State::Waiting {
            hand = control.queue.take_parts(queued.key);
            wake = control.queue.cancel(room, queued.key);
            if took_own {
                control.queue.count_waited(true, queued.class, queued.need);
            }
            if !hand.is_empty() && !control.debt {
                self.serve(room, &mut control, &mut hand, &mut woken);
            }
        }
        drop(control);
        self.return_parts(hand);
        self.wake(woken);
        (state, wake)
    }

    /// Runs the room's scheduler (`Queue::serve`) over `hand` and the
    /// table. Under the control lock, with no debt.
    fn serve(&self, room: &Room, control: &mut Control, hand: &mut Vec<Part>, woken: &mut Woken) {
        let mut source = TableSource {
            table: self,
            // Units handed from a release straight to a waiter are
            // admissions too, without a take: under a standing queue they
            // are nearly all of them.
            handed: control.handed_total(),
            budget: room.policy.pass_budget.unwrap_or_else(|| self.capacity()),
        };
        control.queue.serve(room, hand, &mut source, now(), woken);
    }

    /// Gives back units that were taken and never used (collected by a
    /// waiter that left, or left over from a hand-off), as
    /// [`return_unused`](Self::return_unused) does for one.
    fn return_parts(&self, parts: Vec<Part>) {
        for part in parts {
            self.release_units(part.shard, part.units, false);
            // Relaxed: a count for `stats`.
            self.shards[part.shard]
                .phantom
                .fetch_add(part.units, Relaxed);
        }
    }

    /// [`return_parts`](Self::return_parts) of a grant's units, counted
    /// out of its class's holdings first (a grant the room gave and its
    /// waiter did not keep).
    fn return_grant(&self, grant: Grant) {
        self.release_class(grant.class, grant.units());
        self.return_parts(grant.parts());
    }

    /// After queuing, the caller took `shard` from the table itself (its
    /// re-check): leave the queue, and give back a second unit if one was
    /// handed over meanwhile.
    fn leave_with(&self, room: &Room, queued: &Queued, grant: Grant) -> Grant {
        let (state, wake) = self.withdraw(room, queued, true);
        match state {
            // A second grant, handed over meanwhile: it counted this wait;
            // its units go to the next waiter, or back to the table.
            State::Granted(second) => {
                let second = self.granted(queued, second);
                self.return_grant(second);
            }
            other => {
                // Units collected before a close or an expiry go back too.
                if other != State::Waiting {
                    if let Some(left) = queued.ticket.take_grant() {
                        self.return_grant(left);
                    }
                }
                room.add_waited_time(queued.since_ticks, room.ticks());
            }
        }
        // The waiter's waker, last. If its drop panics, the units taken
        // go back before the panic goes on: nobody holds them.
        match catch_unwind(AssertUnwindSafe(move || drop(wake))) {
            Ok(()) => grant,
            Err(panic) => {
                self.return_grant(grant);
                resume_unwind(panic);
            }
        }
    }

    /// The grant a waiter's ticket says it was given: one unit of `shard`,
    /// or, for a waiter of many, the units left in the ticket.
    fn granted(&self, queued: &Queued, shard: usize) -> Grant {
        // Of its class: the room counted a gated class's units in its
        // holdings when it granted them (`Queue::serve`).
        if queued.need == 1 {
            return self.stamped(Grant::one(shard), queued.class);
        }
        let grant = queued
            .ticket
            .take_grant()
            .expect("a grant of many units leaves them in the ticket");
        self.stamped(grant, queued.class)
    }

    /// Gives back a unit that was admitted but never used: a waiter was
    /// handed it and gave up (or took another itself), or a keyed request
    /// took it and was refused by its key. Released as usual, so the next
    /// waiter gets it, and counted as a phantom, so that its admission,
    /// which nobody used, is not counted in `accepted` (nor its return in
    /// `completed`).
    pub(crate) fn return_unused(&self, shard: usize) {
        self.release(shard, false);
        // Relaxed: a count for `stats`.
        self.shards[shard].phantom.fetch_add(1, Relaxed);
    }

    /// The result of a wait that ended in `state` (read from its ticket),
    /// with its figures: the time waited, or a timeout.
    fn finished(&self, room: &Room, state: State, queued: &Queued) -> Result<Grant, Error> {
        if let State::Granted(shard) = state {
            // Counted by the grant (`Queue::end`), and its time by the
            // releaser after the wake-up, so this waiter does not read
            // the clock.
            return Ok(self.granted(queued, shard));
        }
        // Units a waiter of many had collected before its wait ended go
        // back (the ticket holds them).
        if queued.need > 1 {
            if let Some(left) = queued.ticket.take_grant() {
                self.return_grant(left);
            }
        }
        match state {
            State::Closed => Err(Error::Shutdown),
            State::TooLarge => Err(Error::TooLarge),
            State::Shed => {
                // Refused after all: counted as a refusal of its class.
                self.count_refusal();
                if queued.class != Class::Critical {
                    self.count_class_refusal(queued.class);
                }
                Err(Error::Overload)
            }
            _ => {
                room.record_timeout(queued.class);
                Err(Error::Timeout)
            }
        }
    }

    /// The waiter's own deadline passed: `Timeout`, unless its wait ended
    /// meanwhile (then that outcome: a unit handed over just now is kept).
    fn give_up(&self, room: &Room, queued: Queued) -> Result<Grant, Error> {
        let (state, wake) = self.withdraw(room, &queued, false);
        let result = self.finished(room, state, &queued);
        // Some only if the wait had not ended: nothing was handed over, so
        // nothing is lost if the waker's drop panics.
        drop(wake);
        result
    }

    /// A queued future was dropped: out of the queue, and a unit handed to
    /// it meanwhile goes to the next waiter or back to the table. Never
    /// stranded.
    fn abandon(&self, queued: Queued) {
        let Some(room) = self.room.as_deref() else {
            return;
        };
        let mut state = queued.ticket.state();
        let mut wake = None;
        if state == State::Waiting {
            (state, wake) = self.withdraw(room, &queued, false);
        }
        match state {
            State::Granted(shard) => {
                // The grant counted a wait that admitted nobody.
                self.control
                    .lock()
                    .queue
                    .count_waited(false, queued.class, queued.need);
                let grant = self.granted(&queued, shard);
                self.return_grant(grant);
            }
            // Units collected before a close or an expiry go back.
            State::Closed | State::Expired | State::TooLarge | State::Shed if queued.need > 1 => {
                if let Some(left) = queued.ticket.take_grant() {
                    self.return_grant(left);
                }
            }
            _ => {}
        }
        // Last, after the lock: the waiter's own waker, if it was still
        // queued (then nothing was handed to it).
        drop(wake);
    }

    #[cold]
    pub(super) fn wait_blocking(
        &self,
        room: &Room,
        deadline: Option<Instant>,
        need: usize,
        class: Class,
        tenant: Tenant,
    ) -> Result<Grant, Error> {
        let start = now();
        let deadline = self.wait_deadline(room, deadline, start);
        // No deadline in the node: this thread times its own wait below.
        let wake = Wake::Thread(park::current());
        let (queued, _) = self.enter_room(room, wake, start, None, need, class, tenant)?;
        if let Some(grant) = self.recheck(room, &queued) {
            return grant;
        }
        loop {
            // Acquire (in `state`): pairs with the Release store of whoever
            // ended the wait; the unpark follows that store.
            let state = queued.ticket.state();
            if state != State::Waiting {
                return self.finished(room, state, &queued);
            }
            if deadline.is_some_and(|deadline| now() >= deadline) {
                return self.give_up(room, queued);
            }
            // An unpark that came before this park is not lost (std's park
            // keeps a token); an early return only re-checks.
            park::park_until(deadline);
        }
    }

    /// [`acquire_waiting`](Self::acquire_waiting) as a future: never blocks
    /// the executor's thread. Cancel safe: dropping it leaves nothing
    /// queued and strands no unit (one handed over meanwhile goes to the
    /// next waiter or back to the table).
    pub(crate) fn acquire_async(&self, deadline: Option<Instant>) -> WaitOne<'_> {
        WaitOne(self.acquire_async_many(1, Class::Critical, deadline))
    }

    /// [`acquire_waiting_many`](Self::acquire_waiting_many) as a future:
    /// cancel safe as [`acquire_async`](Self::acquire_async) is (units
    /// handed to it or collected by it go to the next waiter or back to
    /// the table).
    pub(crate) fn acquire_async_many(
        &self,
        need: usize,
        class: Class,
        deadline: Option<Instant>,
    ) -> WaitUnit<'_> {
        WaitUnit {
            table: self,
            need,
            class,
            deadline,
            tenant: Tenant::NONE,
            queued: None,
        }
    }

    /// Admits `need` units at once, from the table if they are there, else
    /// waiting in the room (if any) until `deadline` at the latest; blocks
    /// the thread. The room's scheduler (`Queue::serve`) decides who of
    /// the waiters gets freed units. `TooLarge` at once for more than the
    /// capacity in force; otherwise as [`acquire_waiting`](Self::acquire_waiting).
    pub(crate) fn acquire_waiting_many(
        &self,
        need: usize,
        deadline: Option<Instant>,
    ) -> Result<Grant, Error> {
        match self.try_fast(need, Class::Critical) {
            Err(Error::Overload) => match &self.room {
                Some(room) => {
                    self.wait_blocking(room, deadline, need, Class::Critical, Tenant::NONE)
                }
                None => {
                    self.count_refusal();
                    Err(Error::Overload)
                }
            },
            other => other,
        }
    }

    /// One attempt at `need` units from the table, uncounted: the first
    /// step of every wait.
    fn try_fast(&self, need: usize, class: Class) -> Result<Grant, Error> {
        match (need, class) {
            (1, Class::Critical) => self.try_at::<false>(self.home_shard()).map(Grant::one),
            (_, Class::Critical) => self.take_many_uncounted(need),
            _ => self.take_class(self.home_shard(), need, class),
        }
    }

    /// The first step of a wait in a table with a room: `None` if the
    /// ask is to queue (its units are not free now, but a release may free
    /// them), else its answer, counted: admitted; refused at once because
    /// it asks more than its class's whole share (within the capacity:
    /// no release brings that, so it never queues); or the table's
    /// `TooLarge` or `Shutdown`. The one place both a blocking and an
    /// async wait decide whether to queue.
    pub(super) fn first_take(&self, need: usize, class: Class) -> Option<Result<Grant, Error>> {
        let first = self.try_fast(need, class);
        let refused = first == Err(Error::Overload);
        let never = refused && need > self.units_within(Bound::of(class));
        if refused && !never {
            return None;
        }
        self.count_first(class, &first, never);
        Some(first)
    }

    /// Counts what a wait's first take found, for a class's figures: its
    /// units if admitted (the default class's come from the totals), and,
    /// if `refused` counts, an `Overload` (in the table's total too).
    fn count_first(&self, class: Class, first: &Result<Grant, Error>, refused: bool) {
        if class != Class::Critical {
            self.count_class(class, first, refused);
        } else if refused && *first == Err(Error::Overload) {
            self.count_refusal();
        }
    }

    /// A release in a table with a waiting room: one more word read before
    /// the give-back and after it (`waiters.rs`, "Hand-off" and "Wake-up").
    /// Relaxed loads: the first only picks the path (the hand-off re-checks
    /// under the lock); the second is ordered after a waiter's count store
    /// by the RMW on `given` in `give_back_many` (see there). The fast
    /// path (`release_shard`) makes the same two reads inline, and comes
    /// here (through `release_general`) when the first finds a waiter, the
    /// shard marked, or a table of more than 64 shards.
    pub(super) fn release_to_room(&self, room: &Room, i: usize, panicked: bool) {
        if room.count.load(Relaxed) > 0 && self.hand_off(room, i, panicked) {
            return;
        }
        self.give_back(i, panicked);
        if room.count.load(Relaxed) > 0 {
            self.grant_from_table();
        }
    }

    /// Hands a released unit of shard `i` straight to the next waiter;
    /// false if there is none (or the table is in debt, when a hand-off
    /// would admit above the capacity).
    #[cold]
    fn hand_off(&self, room: &Room, i: usize, panicked: bool) -> bool {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        if control.debt {
            return false;
        }
        let shards = self.shards.len();
        // Under the lock, which `stats` takes: a waiter's own `stats()`
        // after its wait returns includes this hand-off. Run just before
        // the waiter's ticket says it is granted (`Queue::grant`), so the
        // panic count, Relaxed, reaches the waiter through the ticket's
        // Release store too.
        let count = |handed: &mut Vec<usize>| {
            if handed.is_empty() {
                handed.resize(shards, 0);
            }
            handed[i] += 1;
            if panicked {
                // Relaxed: a count for `stats` (see above).
                self.shards[i].panicked.fetch_add(1, Relaxed);
            }
        };
        let handed = if control.queue.wide() == 0 {
            let Control { queue, handed, .. } = &mut *control;
            queue.grant(room, i, now, || count(handed), &mut woken)
        } else {
            // A waiter of many units waits: the scheduler decides. Its
            // grant may wait for more units, so the count follows it,
            // still under the lock.
            let mut hand = vec![Part { shard: i, units: 1 }];
            self.serve(room, &mut control, &mut hand, &mut woken);
            let used = hand.is_empty();
            if used {
                count(&mut control.handed);
            }
            used
        };
        drop(control);
        woken.wake_all(room);
        handed
    }

    /// A waiter came in while this release gave its unit back: take units
    /// from the table for the waiters while there are any (`waiters.rs`,
    /// "Wake-up").
    #[cold]
    pub(super) fn grant_from_table(&self) {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        self.grant_waiting(&mut control, &mut woken);
        drop(control);
        self.wake(woken);
    }

    /// Takes units from the table for waiters, in the room's order, while
    /// there are both; what to wake. Under the control lock, so no resize
    /// is half-way: the shards are gated only by the resize that holds the
    /// lock and calls this before un-gating (its new room goes to waiters
    /// first), or by a debt, when nothing is granted.
    pub(super) fn grant_waiting(&self, control: &mut Control, woken: &mut Woken) {
        let Some(room) = self.room.as_deref() else {
            return;
        };
        // In a debt, the waiters' only hope is that the releases repaid it:
        // settle it here (a release with waiters comes here), or they would
        // sleep to their deadline with room free, since only an admission
        // settles a debt otherwise. Settling un-gates and grants the
        // waiters itself (`apply`).
        if control.debt {
            self.settle(control, woken);
            return;
        }
        if control.queue.wide() > 0 {
            // A waiter of many units waits: the scheduler decides.
            let mut hand = Vec::new();
            self.serve(room, control, &mut hand, woken);
            return;
        }
        while control.queue.len() > 0 && !control.debt {
            // Under the lock, with no debt: nothing is gated but by the
            // resize calling this, whose gate `CLOSED` alone ignores.
            let Found::Unit(shard) = self.take_any(CLOSED, Bound::Limit) else {
                break;
            };
            // The unit's take was counted by `take_any`.
            if !control.queue.grant(room, shard, now, || {}, woken) {
                // The adaptive order expired the last waiters: nobody took
                // it. Not an admission: give it back unseen (nobody waits
                // now, and a newcomer re-checks the table).
                self.give_back_unseen(shard);
                break;
            }
        }
    }

    /// One unit from any shard that has room, read through an RMW on each
    /// shard's `given` (so a release ordered before it is seen), stopping
    /// at the flags in `stop`.
    fn take_any(&self, stop: usize, bound: Bound) -> Found {
        let start = self.home_shard();
        let count = self.shards.len();
        let mut found = Found::Nothing;
        for step in 0..count {
            let i = (start + step) % count;
            let shard = &self.shards[i];
            if shard.usage_synced() >= shard.bound(bound) {
                continue;
            }
            match shard.try_take_n(1, stop, bound) {
                Take::Taken { now_full } => {
                    if now_full {
                        self.mark_full(i);
                    }
                    return Found::Unit(i);
                }
                Take::Full if bound == Bound::Limit => self.mark_full(i),
                Take::Full => {}
                Take::Over => self.undo(i),
                Take::Closed => return Found::Nothing,
                Take::Gated => found = Found::Gated,
            }
        }
        found
    }

    /// A new waiter's re-check, after its count is out (`waiters.rs`,
    /// "Wake-up"): a unit from the table (leaving the queue), or nothing.
    /// A gated shard is a resize (which grants the waiters itself before
    /// it un-gates) or a debt, which nobody else may come to settle if the
    /// releases that repaid it came before this waiter was counted: so the
    /// waiter settles it, and is granted with the others, under the lock.
    ///
    /// A waiter of many units re-checks through the scheduler itself,
    /// under the lock (`grant_from_table`): its units may be spread over
    /// shards, and the take across them reads each through an RMW on its
    /// `given` (`usage_synced`), as this protocol needs. Then its ticket
    /// says whether it was served.
    fn recheck(&self, room: &Room, queued: &Queued) -> Option<Result<Grant, Error>> {
        if queued.need > 1 || queued.class.gate().is_some() {
            self.grant_from_table();
            let state = queued.ticket.state();
            return (state != State::Waiting).then(|| self.finished(room, state, queued));
        }
        match self.take_any(FLAGS, Bound::Limit) {
            Found::Unit(shard) => Some(Ok(self.leave_with(room, queued, Grant::one(shard)))),
            Found::Gated => {
                self.grant_from_table();
                None
            }
            Found::Nothing => None,
        }
    }

    /// Gives back a take above a limit that a racing resize lowered under
    /// it (`Take::Over`): nobody held it, so it is left out of the stats,
    /// and like every unit that comes back it serves the room: a waiter
    /// may have queued while the unit was counted (it saw the shard full)
    /// and re-checked before it came back. The hand-off is not used (the
    /// unit is over its shard's limit, so nobody may hold it): the unit
    /// goes back, then units are taken for waiters under the limits, as a
    /// release that found a waiter on its way out does (`waiters.rs`,
    /// "Wake-up").
    ///
    /// Never under the control lock: a take made under it cannot land
    /// over its limit, since limits change only under that lock, so both
    /// its reads of the limit see the same value.
    #[cold]
    pub(super) fn undo(&self, i: usize) {
        self.give_back_unseen(i);
        if let Some(room) = self.room.as_deref() {
            // Relaxed: ordered after a waiter's count store by the RMW on
            // `given` just made, as in `release_to_room`.
            if room.count.load(Relaxed) > 0 {
                self.grant_from_table();
            }
        }
    }

    /// Gives back a unit nobody held (an over-take, or a unit taken for a
    /// waiter that left before it got it), left out of the stats. The
    /// shard is full (or near it) after an over-take, so it is marked as a
    /// filler would.
    fn give_back_unseen(&self, i: usize) {
        self.give_back(i, false);
        // Relaxed: a count, read by `stats` only.
        self.shards[i].phantom.fetch_add(1, Relaxed);
        self.mark_full(i);
    }

    /// Wakes the waiters in `woken`, after the control lock (`waiters.rs`,
    /// "Foreign code"). A waker's panic goes on up to the caller.
    pub(super) fn wake(&self, woken: Woken) {
        if let Some(room) = self.room.as_deref() {
            woken.wake_all(room);
        }
    }

    /// [`wake`](Self::wake) for a caller that has just taken a unit of
    /// shard `taken` and not yet handed it to anyone: if a waker panics,
    /// the unit goes back to the table before the panic goes on, so the
    /// panic strands nothing.
    pub(super) fn wake_keeping(&self, woken: Woken, taken: Option<usize>) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.wake(woken))) {
            if let Some(shard) = taken {
                self.return_unused(shard);
            }
            resume_unwind(panic);
        }
    }
}
