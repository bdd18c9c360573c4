//! The queue of waiters under the table's control lock: a doubly linked list through the waiters' keys for each priority class (every way of leaving it is O(1)), the order a grant serves (a sheddable class under its min share first, then the most important class, the room's order within it, or the fair order among tenants once a keyed waiter has come: `fair.rs`), the deadlines the watcher expires, and the wakers it hands back to be woken or dropped after the lock.

use super::fair::{FairOrder, Tenant};
use super::{QueueOrder, Room, State, Ticket, SPARE_TICKETS};
use crate::engine::class::Class;
use crate::engine::foreign::each_then_resume;
use crate::engine::grant::{Grant, Part};
use crate::engine::keys::Ledger;
use crate::sync::{park, Arc, Ordering::Relaxed};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::task::Waker;
use std::time::{Duration, Instant};

impl QueueOrder {
    /// Adaptive LIFO with the figures of "Fail at Scale": a queue that
    /// stands for 100 ms switches to LIFO and a 5 ms wait target.
    pub const fn adaptive_lifo() -> QueueOrder {
        QueueOrder::AdaptiveLifo {
            interval: Duration::from_millis(100),
            target: Duration::from_millis(5),
        }
    }
}

/// The waiting figures kept under the control lock, where the grants that
/// change them already are: plain integers, no locked instruction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueueCounts {
    /// The most that ever waited at once.
    pub(crate) peak: usize,
    /// Waits that ended in an admission.
    pub(crate) waited: u64,
    /// Units granted to waiters, by class rank.
    pub(crate) granted: [u64; Class::COUNT],
    /// How many of each class wait now, by rank.
    pub(crate) waiting: [usize; Class::COUNT],
}

/// How to wake a waiter.
///
/// A task's [`Waker`] is code the crate does not own: its `wake`, `clone`
/// and `drop` may re-enter the table (a waker that owns a permit of it), be
/// slow, or panic. So a `Wake` is only *moved* under the control lock,
/// never woken, cloned or dropped there: the queue hands the ones it lets
/// go of back to the caller ([`Woken`], or an `Option<Wake>` to drop),
/// which lets them go after the lock.
#[derive(Debug)]
pub(crate) enum Wake {
    /// A blocked thread, parked until its ticket changes.
    Thread(park::Thread),
    /// A task.
    Task(Waker),
}

impl Wake {
    fn wake(self) {
        match self {
            Wake::Thread(thread) => thread.unpark(),
            Wake::Task(waker) => waker.wake(),
        }
    }

    /// True if waking `self` wakes the task of `waker`: a comparison of
    /// pointers (std's `will_wake`), no code of the waker's.
    fn will_wake(&self, waker: &Waker) -> bool {
        matches!(self, Wake::Task(stored) if stored.will_wake(waker))
    }
}

/// The waiters to wake once the control lock is let go. A FIFO hand-off
/// wakes exactly one, so the first is kept inline: a release allocates
/// nothing.
#[derive(Debug, Default)]
pub(crate) struct Woken {
    first: Option<Ended>,
    more: Vec<Ended>,
}

/// A wait that ended: how to wake its waiter, and when it arrived if it
/// was granted (its wait's time is added after the wake-up).
#[derive(Debug)]
struct Ended {
    wake: Option<Wake>,
    granted_since: Option<u64>,
}

impl Woken {
    fn push(&mut self, ended: Ended) {
        if self.first.is_none() {
            self.first = Some(ended);
        } else {
            self.more.push(ended);
        }
    }

    /// How many are to be woken.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }

    /// Wakes them all, then adds the granted waits' time to `room`'s
    /// figures: the clock is read here, by the releaser, after the wake-up,
    /// so that a granted waiter runs on without reading it. Never under
    /// the control lock: a waker may take it (module docs, "Foreign code").
    ///
    /// A waker that panics does not stop the others: every one is woken
    /// and every figure added, then the first panic goes on up to the
    /// caller, whose table is consistent by then (nothing of it is left
    /// half-done: the lock is free, the shards un-gated).
    pub(crate) fn wake_all(mut self, room: &Room) {
        let wakes = self
            .first
            .iter_mut()
            .chain(self.more.iter_mut())
            .filter_map(|ended| ended.wake.take());
        // The figures are added before a panic goes on, so a panic in the
        // waking never leaves them short.
        let panicked = catch_unwind(AssertUnwindSafe(|| each_then_resume(wakes, Wake::wake)));
        let mut now = None;
        for ended in self.first.iter().chain(&self.more) {
            if let Some(since) = ended.granted_since {
                let now = *now.get_or_insert_with(|| room.ticks());
                room.add_waited_time(since, now);
            }
        }
        if let Err(payload) = panicked {
            resume_unwind(payload);
        }
    }
}

/// Where [`Queue::serve`] takes units from besides a release's hand: the
/// table, under its control lock.
pub(crate) trait Source {
    /// One unit from any shard, within `class`'s headroom, or `None`.
    fn one(&mut self, class: Class) -> Option<usize>;
    /// `n` units, all or nothing (`n > 1`), within `class`'s headroom.
    fn many(&mut self, n: usize, class: Class) -> Option<Vec<Part>>;
    /// Units the table has admitted so far: a count that only grows.
    fn admitted(&self) -> usize;
    /// How many units may be admitted past a waiting request of many
    /// units before it is reserved.
    fn budget(&self) -> usize;
    /// The capacity in force, or the share of it `class` may fill: a
    /// waiter that needs more is ended.
    fn capacity(&self, class: Class) -> usize;
    /// True if `n` more units of `class` would be within its min share,
    /// as read now: a hint for the order, `claim` decides.
    fn under_share(&self, class: Class, n: usize) -> bool;
    /// Claims `n` units of `class`'s min share in its holdings, all or
    /// nothing.
    fn claim(&mut self, class: Class, n: usize) -> bool;
    /// Counts `n` units out of `class`'s holdings: a claim undone.
    fn unclaim(&mut self, class: Class, n: usize);
    /// Counts `n` units granted to `class` under its line in its
    /// holdings.
    fn hold(&mut self, class: Class, n: usize);
}

/// How many waiters past a head that does not fit [`Queue::serve`] looks
/// at for one that does: a bound on the work of one release under the
/// lock, whatever the queue's length.
const PASS_SCAN: usize = 4;

/// Takes up to `units` units out of `hand`, the last parts first.
fn take_units(hand: &mut Vec<Part>, units: usize) -> Vec<Part> {
    let mut taken = Vec::new();
    let mut want = units;
    while want > 0 {
        let Some(last) = hand.last_mut() else {
            break;
        };
        let k = last.units.min(want);
        taken.push(Part {
            shard: last.shard,
            units: k,
        });
        last.units -= k;
        want -= k;
        if last.units == 0 {
            hand.pop();
        }
    }
    taken
}

/// No node: the end of the waiting list.
pub(super) const NIL: usize = usize::MAX;

#[derive(Debug)]
pub(super) struct Node {
    ticket: Arc<Ticket>,
    pub(super) wake: Option<Wake>,
    since: Instant,
    /// `since` on the room's clock, for `waited_time` (see [`Room::ticks`]).
    since_ticks: u64,
    /// When the deadline watcher expires it: set for async waiters only
    /// (a blocked thread times its own wait). The watcher does not run
    /// under loom (no clock there), hence the allow.
    #[cfg_attr(loom, allow(dead_code))]
    deadline: Option<Instant>,
    /// Its neighbours in the waiting list: the next older and the next
    /// newer waiter's key, or [`NIL`].
    older: usize,
    newer: usize,
    /// How many units it waits for (1 but for `acquire_many`).
    need: usize,
    /// Its class: which list it waits in, and which headroom its units
    /// are taken under.
    class: Class,
    /// The units it holds already: those of its grant, just before the
    /// grant; or, while it is *reserved*, what it has collected so far.
    parts: Vec<Part>,
    /// Units admitted by the table when it came in (`Source::admitted`),
    /// for a waiter of many units: how far later requests have passed it.
    admitted_at: usize,
    /// Freed units are kept for it (see [`Queue::serve`]).
    reserved: bool,
    /// Reserved and of a sheddable class, it collects on the class's min
    /// share (see [`Queue::collect`]): once it has, it claims the share
    /// for all it holds, so no unit taken above the line goes uncounted.
    on_share: bool,
}

/// The queue of waiters, in the table's control lock. A node lives while
/// its waiter waits: whoever ends the wait (a grant, an expiry, a close, or
/// the waiter giving up through [`Queue::cancel`]) frees it, and the
/// outcome lives on in the waiter's [`Ticket`].
///
/// The waiting nodes of each class form a doubly linked list through their
/// keys, oldest to newest, so a grant at either end and a waiter leaving
/// from anywhere are O(1) under the lock: a room of [`MAX_WAITERS`] whose
/// waiters give up newest first holds the lock no longer per leave than
/// one of ten. A grant serves the most important class that waits, in the
/// room's order within it: no waiter is served while one of a class above
/// it waits that its units would serve.
#[derive(Debug)]
pub(crate) struct Queue {
    nodes: Vec<Option<Node>>,
    pub(super) free: Vec<usize>,
    /// Tickets of ended waits, reused once their waiter has let go of
    /// them ([`Queue::ticket`]): a wait then allocates nothing, and neither
    /// its end nor its waiter frees anything. At most [`SPARE_TICKETS`].
    spare: Vec<Arc<Ticket>>,
    /// The ends of each class's waiting list (by rank), or [`NIL`] when
    /// none of the class waits.
    pub(super) oldest: [usize; Class::COUNT],
    pub(super) newest: [usize; Class::COUNT],
    /// How many nodes the lists hold.
    len: usize,
    /// How many of them the scheduler must serve ([`Queue::serve`]): they
    /// wait for more than one unit, or are of a gated class (whose units
    /// come from the table, under its line). While none is, a grant is the
    /// plain hand-off of one unit ([`Queue::grant`]).
    wide: usize,
    /// Since when the queue has been non-empty without a break.
    pub(super) standing_since: Option<Instant>,
    /// The instant the room is registered with the deadline watcher for
    /// (`alarm.rs`), if any. Invariant: every waiting node's deadline is at
    /// or after it, and a registration at it is pending (or ringing now),
    /// so no node outlives its deadline by more than the watcher's lag.
    armed: Option<Instant>,
    /// The figures kept here, under the lock.
    counts: QueueCounts,
    /// The order among tenants, once a keyed waiter has come (`fair.rs`).
    fair: FairOrder,
    /// The table's tenant ledger, which the fair order reads for what
    /// each tenant holds (none in the unit tests: the tags alone).
    ledger: Option<Arc<Ledger>>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            nodes: Vec::new(),
            free: Vec::new(),
            spare: Vec::new(),
            oldest: [NIL; Class::COUNT],
            newest: [NIL; Class::COUNT],
            len: 0,
            wide: 0,
            standing_since: None,
            armed: None,
            counts: QueueCounts::default(),
            fair: FairOrder::default(),
            ledger: None,
        }
    }
}

impl Queue {
    /// An empty queue whose fair order reads `ledger`.
    pub(crate) fn with_ledger(ledger: Arc<Ledger>) -> Queue {
        Queue {
            ledger: Some(ledger),
            ..Queue::default()
        }
    }

    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Queues a waiter, to be expired at `deadline` by the watcher (async
    /// waiters; `None` for a blocked thread, or no deadline); its key, its
    /// ticket and its arrival on the room's clock ([`Room::ticks`]). Call
    /// [`arm`](Self::arm) with the deadline next.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push(
        &mut self,
        room: &Room,
        wake: Wake,
        now: Instant,
        deadline: Option<Instant>,
        need: usize,
        class: Class,
        admitted_at: usize,
        tenant: Tenant,
    ) -> (usize, Arc<Ticket>, u64) {
        let ticket = self.ticket();
        let since_ticks = room.ticks();
        let node = Node {
            ticket: Arc::clone(&ticket),
            wake: Some(wake),
            since: now,
            since_ticks,
            deadline,
            older: self.newest[class.rank()],
            newer: NIL,
            need,
            class,
            parts: Vec::new(),
            admitted_at,
            reserved: false,
            on_share: false,
        };
        if scheduled(need, class) {
            self.wide += 1;
        }
        let key = match self.free.pop() {
            Some(key) => {
                self.nodes[key] = Some(node);
                key
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        let rank = class.rank();
        match self.newest[rank] {
            NIL => self.oldest[rank] = key,
            newest => self.node_mut(newest).newer = key,
        }
        if self.len == 0 {
            self.standing_since = Some(now);
        }
        self.newest[rank] = key;
        if !self.fair.on && tenant.key != 0 && room.policy.order == QueueOrder::Fifo {
            // The first keyed waiter: from now on the fair order serves,
            // and every waiter already queued (unkeyed, all of them) joins
            // it in its order, this one last.
            self.fair.on = true;
            for queued in self.all_keys() {
                let (class, need) = (self.node(queued).class, self.node(queued).need);
                let who = if queued == key { tenant } else { Tenant::NONE };
                self.fair.arrive(queued, who, class.rank(), need);
            }
        } else if self.fair.on {
            self.fair.arrive(key, tenant, rank, need);
        }
        self.len += 1;
        self.counts.waiting[rank] += 1;
        room.set_count(self.len);
        self.counts.peak = self.counts.peak.max(self.len);
        (key, ticket, since_ticks)
    }

    /// Takes the waiting node `key` out of the list (its node stays until
    /// freed), not served.
    fn unlink(&mut self, key: usize) {
        self.unlink_as(key, false);
    }

    /// Takes the waiting node `key` out of the list (its node stays until
    /// freed), `served` (a grant) or not: the fair order moves its
    /// tenant's tag only for a grant.
    fn unlink_as(&mut self, key: usize, served: bool) {
        if self.fair.on {
            self.fair.leave(key, served);
        }
        let node = self.node(key);
        let (older, newer, rank) = (node.older, node.newer, node.class.rank());
        if scheduled(node.need, node.class) {
            self.wide -= 1;
        }
        match older {
            NIL => self.oldest[rank] = newer,
            older => self.node_mut(older).newer = newer,
        }
        match newer {
            NIL => self.newest[rank] = older,
            newer => self.node_mut(newer).older = older,
        }
        self.len -= 1;
        self.counts.waiting[rank] -= 1;
        if self.len == 0 {
            self.standing_since = None;
        }
    }

    /// The rank of the most important class that waits, if any.
    fn top(&self) -> Option<usize> {
        self.oldest.iter().position(|&key| key != NIL)
    }

    /// The first waiter of class `rank` in the room's order when it
    /// serves the oldest first: the fair order's first once it is on,
    /// else the oldest; or [`NIL`].
    fn first_of(&self, rank: usize) -> usize {
        if self.fair.on {
            self.fair.first(rank, self.ledger.as_deref()).unwrap_or(NIL)
        } else {
            self.oldest[rank]
        }
    }

    /// Takes the oldest waiting node (the first in the fair order, once
    /// it is on) of the most important class waiting out of its list;
    /// its key.
    fn pop_oldest(&mut self) -> Option<usize> {
        let key = self.first_of(self.top()?);
        self.unlink_as(key, true);
        Some(key)
    }

    /// Takes the newest waiting node of the most important class waiting
    /// out of its list; its key.
    fn pop_newest(&mut self) -> Option<usize> {
        let key = self.newest[self.top()?];
        self.unlink_as(key, true);
        Some(key)
    }

    /// The waiting keys of every class, the most important first, each
    /// class oldest first: for the linear walks (expiry, a shrink's
    /// `TooLarge`, the tests).
    fn all_keys(&self) -> Vec<usize> {
        let mut keys = Vec::with_capacity(self.len);
        for &oldest in &self.oldest {
            let mut key = oldest;
            while key != NIL {
                keys.push(key);
                key = self.node(key).newer;
            }
        }
        keys
    }

    /// A ticket for a new wait: a spare one whose waiter has let go of it,
    /// or a new one. The oldest spares are tried first (their waiters are
    /// the likeliest to be done), a few at most.
    fn ticket(&mut self) -> Arc<Ticket> {
        for i in 0..self.spare.len().min(4) {
            // `get_mut` answers only if nobody else holds the ticket, and
            // synchronizes with the waiter's drop of its handle (Release
            // there, Acquire here): the waiter's last read of the state
            // came before the reset below.
            if Arc::get_mut(&mut self.spare[i]).is_some() {
                let ticket = self.spare.swap_remove(i);
                // Relaxed: nobody else holds it; its next waiter gets it
                // through the control lock.
                ticket.state.store(State::WAITING, Relaxed);
                debug_assert!(
                    ticket.grant.lock().is_none(),
                    "a reused ticket's units were taken"
                );
                return ticket;
            }
        }
        Arc::new(Ticket::default())
    }

    /// True if the queued task of `key` would be woken through `waker`
    /// already: a re-poll usually brings the same waker, and then nothing
    /// is cloned or swapped. A comparison, no code of the waker's.
    pub(crate) fn will_wake(&self, key: usize, waker: &Waker) -> bool {
        self.node(key)
            .wake
            .as_ref()
            .is_some_and(|w| w.will_wake(waker))
    }

    /// Points the queued waiter of `key` at `wake`; the wake it replaces,
    /// for the caller to drop after letting the lock go (a waker's drop is
    /// code the crate does not own).
    #[must_use = "drop the old wake after the control lock"]
    pub(crate) fn replace_wake(&mut self, key: usize, wake: Wake) -> Option<Wake> {
        self.node_mut(key).wake.replace(wake)
    }

    /// Arms the room for a new waiter's `deadline`: true if the caller must
    /// register it with the deadline watcher (it is earlier than the
    /// instant armed, or none is), after letting the control lock go.
    /// With FIFO and a fixed `max_wait`, deadlines only grow: only the
    /// first waiter after a ring arms.
    pub(crate) fn arm(&mut self, deadline: Instant) -> bool {
        if self.armed.is_some_and(|armed| armed <= deadline) {
            return false;
        }
        self.armed = Some(deadline);
        true
    }

    /// The watcher rang at `now`: expires every waiting node whose deadline
    /// has passed (pushing what to wake onto `woken`; each finishes with
    /// `Timeout` in its own poll), and answers the instant the watcher must
    /// ring again, if it must.
    ///
    /// It must not if no node waits with a deadline, or if a registration
    /// later than `now` (so not the one ringing: the watcher took every
    /// entry up to `now`) is pending at or before the earliest deadline
    /// left: that one will ring in time. Linear in the queue: once per
    /// ring, on the watcher's thread.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn expire(
        &mut self,
        room: &Room,
        now: Instant,
        woken: &mut Woken,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut ended = Vec::new();
        for key in self.all_keys() {
            match self.node(key).deadline {
                Some(deadline) if deadline <= now => {
                    self.unlink(key);
                    ended.push(key);
                }
                Some(deadline) => {
                    next = Some(next.map_or(deadline, |next| next.min(deadline)));
                }
                None => {}
            }
        }
        // The count before the tickets (see `end`).
        room.set_count(self.len);
        for key in ended {
            self.end(key, State::Expired, woken);
        }
        match (self.armed, next) {
            (Some(armed), next) if armed > now && next.map_or(true, |next| armed <= next) => None,
            (_, next) => {
                self.armed = next;
                next
            }
        }
    }

    /// The figures kept under the lock.
    pub(crate) fn counts(&self) -> QueueCounts {
        self.counts
    }

    /// A wait ended in an admission that no grant counted (the waiter took
    /// its own unit), or a granted one that admitted nobody after all (its
    /// future was dropped as the unit came): `waited` moves by one, and
    /// the `units` granted to `class` with it.
    pub(crate) fn count_waited(&mut self, admitted: bool, class: Class, units: usize) {
        let granted = &mut self.counts.granted[class.rank()];
        if admitted {
            self.counts.waited += 1;
            *granted += units as u64;
        } else {
            self.counts.waited -= 1;
            *granted -= units as u64;
        }
    }

    /// The waiter of `key` gives up (its deadline passed, its future was
    /// dropped, or it took a unit from the table itself) and found its
    /// ticket still `Waiting` under the lock: its node goes, in O(1). Its
    /// wake is handed back, to be dropped after the lock.
    #[must_use = "drop the wake after the control lock"]
    pub(crate) fn cancel(&mut self, room: &Room, key: usize) -> Option<Wake> {
        self.unlink(key);
        room.set_count(self.len);
        self.free_node(key).and_then(|node| node.wake)
    }

    /// Hands a unit of `shard` to the next waiter by the room's order,
    /// pushing what to wake once the lock is let go onto `woken` (with the
    /// waiters the adaptive order expired on the way). False if nobody
    /// waits. `now` is read only by the adaptive order (a clock read costs
    /// more than the rest of a FIFO grant). `counted` runs just before the
    /// waiter's ticket says it is granted, so what it counts is seen by the
    /// waiter (through the ticket's Release store) when its wait returns.
    pub(crate) fn grant(
        &mut self,
        room: &Room,
        shard: usize,
        now: impl FnOnce() -> Instant,
        counted: impl FnOnce(),
        woken: &mut Woken,
    ) -> bool {
        let mut expired = Vec::new();
        let key = match room.policy.order {
            QueueOrder::Fifo => self.pop_oldest(),
            QueueOrder::Lifo => self.pop_newest(),
            QueueOrder::AdaptiveLifo { interval, target } => {
                let now = now();
                let standing = self
                    .standing_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= interval);
                if standing {
                    // The newest is served, whatever its wait: the unit is
                    // here for it (timing it out would hand the unit back
                    // to the table the instant it came). Of the others,
                    // those past the target time out, oldest first.
                    let newest = self.pop_newest();
                    for rank in 0..Class::COUNT {
                        while self.oldest[rank] != NIL
                            && now.saturating_duration_since(self.node(self.oldest[rank]).since)
                                >= target
                        {
                            let oldest = self.oldest[rank];
                            self.unlink(oldest);
                            expired.push(oldest);
                        }
                    }
                    newest
                } else {
                    self.pop_oldest()
                }
            }
        };
        // The count before the tickets (see `end`).
        room.set_count(self.len);
        for oldest in expired {
            self.end(oldest, State::Expired, woken);
        }
        let Some(key) = key else {
            return false;
        };
        counted();
        self.end(key, State::Granted(shard), woken);
        true
    }

    /// How many wait for more than one unit, or in a gated class: the
    /// waiters only the scheduler ([`serve`](Self::serve)) serves.
    pub(crate) fn wide(&self) -> usize {
        self.wide
    }

    /// The units the waiting node `key` has collected (a reserved waiter of
    /// many units), taken out of it: for a waiter that leaves, to serve the
    /// others with in the same critical section.
    pub(crate) fn take_parts(&mut self, key: usize) -> Vec<Part> {
        std::mem::take(&mut self.node_mut(key).parts)
    }

    /// The scheduler of a room where some waiter waits for many units:
    /// hands out the units in `hand` (taken already, by a release) and
    /// units from the table (`source`) to the waiters, pushing what to
    /// wake onto `woken`. What is left in `hand` goes back to the table,
    /// by the caller, after the lock.
    ///
    /// The rule, a bounded middle between FIFO and first fit:
    ///
    /// * The waiter the room's order names first (the *head*) is served as
    ///   soon as its units are there, all at once.
    /// * While it does not fit, a later waiter that fits may pass it (the
    ///   first of the next [`PASS_SCAN`] that does), until later requests
    ///   have taken the room's *pass budget* of units past it (counted as
    ///   units the table admitted since it came in: `Source::admitted`;
    ///   by default the capacity in force, one turnover of the whole
    ///   table, about one mean service time under load).
    /// * From then on it is *reserved*: every unit that comes (a release's,
    ///   or free in the table) is collected on it, and nobody passes it,
    ///   until it holds all it needs. If it leaves first, its units serve
    ///   the next waiters in the same critical section (`Table::withdraw`).
    /// * A head that needs more than the capacity in force (a shrink came
    ///   after it) is ended with `TooLarge`, never left to wait for room
    ///   that cannot come.
    /// * Before all that, a sheddable class's first waiter whose units
    ///   would stay within the class's min share (`Source::under_share`)
    ///   is served on it, if its units are there (from the hand, or the
    ///   table under its limits), ahead of every other class: the floor a
    ///   min share promises (`engine/class.rs`). A reserved waiter of such
    ///   a class collects on its share the same way (`collect`).
    ///
    /// The room's order picks the head (FIFO: the oldest; LIFO and a
    /// standing adaptive LIFO: the newest); adaptive LIFO's target
    /// timeouts apply to rooms of one-unit waiters only.
    pub(crate) fn serve(
        &mut self,
        room: &Room,
        hand: &mut Vec<Part>,
        source: &mut dyn Source,
        now: Instant,
        woken: &mut Woken,
    ) {
        loop {
            // A sheddable class under its min share is served first, on
            // that share, if its units are there (`fill`'s `on_share`).
            if let Some(key) = self.share_head(room, now, source) {
                if self.fill(key, hand, source, true) {
                    self.grant_node(room, key, woken);
                    continue;
                }
            }
            let Some(head) = self.head(room, now) else {
                break;
            };
            let (need, class) = (self.node(head).need, self.node(head).class);
            if need > source.capacity(class) {
                // A shrink made it impossible: it could never be served.
                // What it collected goes back with its outcome.
                self.unlink(head);
                room.set_count(self.len);
                self.end(head, State::TooLarge, woken);
                continue;
            }
            if self.node(head).reserved {
                if !self.collect(head, hand, source) {
                    break;
                }
                self.grant_node(room, head, woken);
                continue;
            }
            if self.fill(head, hand, source, false) {
                self.grant_node(room, head, woken);
                continue;
            }
            let node = self.node(head);
            if node.need > 1 && source.admitted().wrapping_sub(node.admitted_at) >= source.budget()
            {
                self.node_mut(head).reserved = true;
                continue;
            }
            let mut passer = None;
            let mut key = self.after(room, head, now);
            for _ in 0..PASS_SCAN {
                if key == NIL {
                    break;
                }
                if self.fill(key, hand, source, false) {
                    passer = Some(key);
                    break;
                }
                key = self.after(room, key, now);
            }
            match passer {
                Some(key) => self.grant_node(room, key, woken),
                None => break,
            }
        }
    }

    /// Makes room in a full room for a newcomer of `class`: the newest
    /// waiter of the least important class below it, if any, gives up its
    /// place and is ended with [`State::Shed`] (its waiter answers
    /// `Overload`), pushed onto `woken`. True if a place was freed.
    ///
    /// So a full room never turns away a request while one less important
    /// than it waits: the lowest class waits only while there is room for
    /// it, as it is refused first at the table.
    ///
    /// In the fair order, a newcomer whose tenant has fewer waiters of its
    /// class than another tenant (by two, the newcomer counted) takes the
    /// place of that tenant's newest waiter (`fair.rs`): a tenant that
    /// floods the room is the one shed, never a light one.
    pub(crate) fn shed_for(
        &mut self,
        room: &Room,
        class: Class,
        tenant: Tenant,
        woken: &mut Woken,
    ) -> bool {
        let lower = (class.rank() + 1..Class::COUNT)
            .rev()
            .map(|rank| self.newest[rank])
            .find(|&key| key != NIL);
        let fair = || {
            self.fair
                .on
                .then(|| self.fair.shed_for(tenant, class.rank()))
                .flatten()
        };
        let Some(key) = lower.or_else(fair) else {
            return false;
        };
        self.unlink(key);
        // The count before the ticket (see `end`).
        room.set_count(self.len);
        self.end(key, State::Shed, woken);
        true
    }

    /// Ends with `TooLarge` every waiter that needs more than `capacity`
    /// (a shrink made it impossible), pushing what to wake onto `woken`.
    /// Linear in the queue: once per resize, under its lock.
    pub(crate) fn end_too_large(
        &mut self,
        room: &Room,
        capacity: impl Fn(Class) -> usize,
        woken: &mut Woken,
    ) {
        if self.wide == 0 {
            return;
        }
        let mut ended = Vec::new();
        for key in self.all_keys() {
            let node = self.node(key);
            if node.need > capacity(node.class) {
                self.unlink(key);
                ended.push(key);
            }
        }
        // The count before the tickets (see `end`).
        room.set_count(self.len);
        for key in ended {
            self.end(key, State::TooLarge, woken);
        }
    }

    /// The first waiter, in the room's order, of the most important
    /// sheddable class whose units it needs would stay within the class's
    /// min share, if any; never one that is collecting units (reserved:
    /// [`collect`](Self::collect) serves it on its share).
    fn share_head(&self, room: &Room, now: Instant, source: &dyn Source) -> Option<usize> {
        let newest_first = self.newest_first(room, now);
        Class::ALL.into_iter().find_map(|class| {
            class.gate()?;
            let rank = class.rank();
            let key = if newest_first {
                self.newest[rank]
            } else {
                self.first_of(rank)
            };
            let node = self.nodes.get(key)?.as_ref()?;
            (!node.reserved && source.under_share(class, node.need)).then_some(key)
        })
    }

    /// The waiter the room's order serves first, if any.
    fn head(&self, room: &Room, now: Instant) -> Option<usize> {
        let first = self.first_from(0, self.newest_first(room, now));
        (first != NIL).then_some(first)
    }

    /// The first waiter in the room's order of the most important class
    /// from rank `rank` down that waits, or [`NIL`].
    fn first_from(&self, rank: usize, newest_first: bool) -> usize {
        (rank.min(Class::COUNT)..Class::COUNT)
            .map(|rank| {
                if newest_first {
                    self.newest[rank]
                } else {
                    self.first_of(rank)
                }
            })
            .find(|&key| key != NIL)
            .unwrap_or(NIL)
    }

    /// The waiter after `key` in the room's order (its class's next, then
    /// the next class's first), or [`NIL`].
    fn after(&self, room: &Room, key: usize, now: Instant) -> usize {
        let node = self.node(key);
        let newest_first = self.newest_first(room, now);
        let next = if newest_first {
            node.older
        } else if self.fair.on {
            self.fair.after(node.class.rank(), key).unwrap_or(NIL)
        } else {
            node.newer
        };
        if next != NIL {
            return next;
        }
        self.first_from(node.class.rank() + 1, newest_first)
    }

    /// True if the order serves the newest first now.
    fn newest_first(&self, room: &Room, now: Instant) -> bool {
        match room.policy.order {
            QueueOrder::Fifo => false,
            QueueOrder::Lifo => true,
            QueueOrder::AdaptiveLifo { interval, .. } => self
                .standing_since
                .is_some_and(|since| now.saturating_duration_since(since) >= interval),
        }
    }

    /// Gives the waiter of `key` all its units at once, from `hand` first,
    /// then from the table; false (nothing moves) if they are not all
    /// there. A gated class's units are counted in its holdings: `on_share`,
    /// claimed on its min share first (and taken as any class's: from the
    /// hand, or the table under its limits), else taken under its line.
    fn fill(
        &mut self,
        key: usize,
        hand: &mut Vec<Part>,
        source: &mut dyn Source,
        on_share: bool,
    ) -> bool {
        let (need, class) = (self.node(key).need, self.node(key).class);
        if on_share && !source.claim(class, need) {
            return false;
        }
        let gated = class.gate().is_some() && !on_share;
        // A gated class's units come from the table alone, taken under its
        // line: a released unit in hand was counted at a usage the class
        // may be over. On its min share, its line does not apply.
        let mut no_hand = Vec::new();
        let hand = if gated { &mut no_hand } else { hand };
        let take_as = if on_share { Class::Critical } else { class };
        let in_hand: usize = hand.iter().map(|p| p.units).sum();
        let parts = if need <= in_hand {
            take_units(hand, need)
        } else {
            let rest = need - in_hand;
            let from_table = if rest == 1 {
                source
                    .one(take_as)
                    .map(|shard| vec![Part { shard, units: 1 }])
            } else {
                source.many(rest, take_as)
            };
            let Some(mut from_table) = from_table else {
                if on_share {
                    source.unclaim(class, need);
                }
                return false;
            };
            let mut parts = std::mem::take(hand);
            parts.append(&mut from_table);
            parts
        };
        if gated {
            source.hold(class, need);
        }
        self.node_mut(key).parts = parts;
        true
    }

    /// Collects on the reserved waiter of `key` every unit in `hand` it can
    /// use, then units from the table one at a time; true once it holds
    /// all it needs.
    fn collect(&mut self, key: usize, hand: &mut Vec<Part>, source: &mut dyn Source) -> bool {
        let node = self.node(key);
        let (class, have) = (
            node.class,
            node.parts.iter().map(|p| p.units).sum::<usize>(),
        );
        let need = node.need;
        let mut want = need - have;
        // A gated class collects from the table alone, under its line (see
        // `fill`); under its min share, as any class, and it claims its
        // share once it has all it needs.
        let gated = class.gate().is_some();
        let on_share = gated && (node.on_share || source.under_share(class, need));
        self.node_mut(key).on_share = on_share;
        let take_as = if on_share { Class::Critical } else { class };
        let mut got = if gated && !on_share {
            Vec::new()
        } else {
            take_units(hand, want)
        };
        want -= got.iter().map(|p| p.units).sum::<usize>();
        while want > 0 {
            let Some(shard) = source.one(take_as) else {
                break;
            };
            got.push(Part { shard, units: 1 });
            want -= 1;
        }
        self.node_mut(key).parts.append(&mut got);
        if want > 0 || !gated {
            return want == 0;
        }
        // Complete. Units collected under the line are counted in the
        // class's holdings; on its share, claimed (a claim that lost a race
        // keeps its units on the node, collected, and waits on).
        if on_share {
            source.claim(class, need)
        } else {
            source.hold(class, need);
            true
        }
    }

    /// Ends the wait of `key`, whose units are in its node: granted.
    fn grant_node(&mut self, room: &Room, key: usize, woken: &mut Woken) {
        let first = self.node(key).parts.first().map_or(0, |p| p.shard);
        self.unlink_as(key, true);
        // The count before the ticket (see `end`).
        room.set_count(self.len);
        self.end(key, State::Granted(first), woken);
    }

    /// Wakes every waiter with `Closed`.
    pub(crate) fn close_all(&mut self, room: &Room, woken: &mut Woken) {
        let mut closed = Vec::with_capacity(self.len);
        while let Some(key) = self.pop_oldest() {
            closed.push(key);
        }
        // The count before the tickets (see `end`).
        room.set_count(0);
        for key in closed {
            self.end(key, State::Closed, woken);
        }
    }

    /// Ends the wait of `key` (already out of the list, and the count the
    /// releases read already published without it) with `state`: the
    /// ticket says so, the node goes, and its waiter is to be woken.
    ///
    /// The count first: a waiter that reads its outcome (Acquire) then
    /// sees a count that no longer includes it, as `waiting()` after an
    /// admission should.
    fn end(&mut self, key: usize, state: State, woken: &mut Woken) {
        let Some(node) = self.free_node(key) else {
            debug_assert!(false, "an ended key has a node");
            return;
        };
        let granted = matches!(state, State::Granted(_));
        // Units it holds go with its outcome: a grant of many units, or
        // what a waiter timed out or closed had collected (it gives them
        // back). A grant of one unit is its state alone.
        if node.need > 1 || !granted {
            if let Some(first) = node.parts.first().map(|p| p.shard) {
                node.ticket.put_grant(Grant::from_parts(first, node.parts));
            }
        }
        if granted {
            // Counted before the lock is let go, so that the waiter's
            // `stats()` (which takes the lock) includes its own wait; its
            // time follows the wake-up (`Woken::wake_all`).
            self.counts.waited += 1;
            self.counts.granted[node.class.rank()] += node.need as u64;
        }
        node.ticket.end(state);
        if self.spare.len() < SPARE_TICKETS {
            self.spare.push(node.ticket);
        }
        woken.push(Ended {
            wake: node.wake,
            granted_since: granted.then_some(node.since_ticks),
        });
    }

    fn free_node(&mut self, key: usize) -> Option<Node> {
        let node = self.nodes[key].take();
        if node.is_some() {
            self.free.push(key);
        }
        node
    }

    pub(super) fn node(&self, key: usize) -> &Node {
        self.nodes[key].as_ref().expect("a waiting key has a node")
    }

    fn node_mut(&mut self, key: usize) -> &mut Node {
        self.nodes[key].as_mut().expect("a waiting key has a node")
    }

    /// How many tenants the fair order keeps a tag for, and how many of
    /// them wait (for the tests).
    #[cfg(test)]
    pub(super) fn fair_keys(&self) -> (usize, usize) {
        self.fair.keys()
    }

    /// The keys of the waiting nodes, oldest first (for the tests).
    #[cfg(test)]
    pub(super) fn keys(&self) -> Vec<usize> {
        self.all_keys()
    }
}

/// True if a waiter of `need` units of `class` is the scheduler's to
/// serve, not a plain hand-off's: it waits for many units, or its units
/// must be taken under its class's line.
fn scheduled(need: usize, class: Class) -> bool {
    need > 1 || class.gate().is_some()
}
