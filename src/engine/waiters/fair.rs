//! Fair order among tenants in the waiting room: start-time fair queuing
//! over the waiters' keys, so a freed unit goes to the tenant that has
//! been served least for its weight, and no tenant wins again and again.
//!
//! # The rule, and why this one
//!
//! Each tenant's waiters (of one class) form a queue of their own, in
//! their arrival order. The first of each queue, its *head*, has a *start
//! tag*: `max(V, F)`, where `V` is the room's virtual clock (the start tag
//! of the last head served) and `F` the tenant's finish tag (`start +
//! units / weight` of its last waiter served). Within a class the head
//! with the smallest start tag is served first (ties: the one that came
//! first); the tenant's next waiter then becomes its head, with its own
//! tag. So among tenants that keep waiting, each is served units in
//! proportion to its weight, round after round: ten equal tenants waiting
//! for two units get a tenth of the grants each in every window
//! (CockroachDB#91533 is what "the tenant holding fewest wins" does
//! instead: it forgets who was served a moment ago, and one tenant wins
//! again and again).
//!
//! Tags are given at the head, not on arrival, so a waiter that leaves
//! without being served (its deadline, a dropped future, a full room
//! shedding it) costs its tenant nothing: only service moves `F`. A
//! tenant whose queue empties keeps its `F` until the clock passes it
//! (forgetting it sooner would give the tenant a turn it was not due each
//! time its queue runs dry), then is forgotten: when it comes back it
//! starts at `V`, with neither credit for the time it was away (which
//! would let it take a burst of everything) nor debt.
//!
//! A full room makes a place for a newcomer by shedding the newest waiter
//! of the tenant with the most waiters, if that tenant has at least two
//! more than the newcomer's (the newcomer counted): the fattest flow
//! gives way, as fair queuing's drop policies do.
//!
//! Start-time fair queuing (Goyal, Vin and Cheng) over deficit round
//! robin: its work per grant is a few ordered-set steps, whatever the
//! number of tenants (DRR walks them), and it needs no quantum to tune.
//! Over decayed usage: nothing here decays on a clock, so a paused or slow
//! room is as fair as a busy one.
//!
//! # In flight
//!
//! Tags share out the grants; what a tenant holds at a moment also
//! depends on how long its work holds each unit. So a grant looks at the
//! first few heads in tag order (eight) and serves the one whose tenant
//! holds the fewest units for its weight now (the units its waiters wait
//! for not counted), the tags breaking ties. With ten equal tenants on two
//! units, eight hold none at every grant: the tags decide, round after
//! round. With a thousand tenants of unequal demand, the in-flight shares
//! of those that wait stay within a few percent of each other's, window
//! after window (`benches/fair.rs`).
//!
//! # When it is on
//!
//! A FIFO room turns it on at the first waiter with a key (the waiters
//! already queued join it in their order), and keeps it on. Unkeyed
//! waiters are one tenant of weight 1 between them, served in their
//! arrival order: a FIFO room that never sees a key serves exactly as it
//! did, and pays nothing for this. A LIFO or adaptive-LIFO room keeps its
//! own order (keys still count against their caps and shares at the
//! table).
//!
//! # Bounded
//!
//! The room keeps a tenant's queue and tags while it has a waiter, and
//! its finish tag a while after: at most `max_waiters` tenants with
//! waiters, and twice that (and 64) in all, the rest swept.

use crate::engine::class::Class;
use crate::engine::keys::Ledger;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// How many heads, in tag order, a grant weighs by what their tenants
/// hold (module docs, "In flight").
const LOOK: usize = 8;

/// The key and weight a waiter is ordered by: a tenant's, or
/// [`Tenant::NONE`] for an unkeyed waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tenant {
    /// The key's id (`engine/keys/`), or 0.
    pub(crate) key: u64,
    /// Its weight (at least 1).
    pub(crate) weight: u32,
}

impl Tenant {
    /// An unkeyed waiter.
    pub(crate) const NONE: Tenant = Tenant { key: 0, weight: 1 };
}

/// One unit of service, in tag units: a weight of `w` advances a tenant's
/// finish tag by `SCALE / w` a unit.
const SCALE: u64 = 1 << 24;

/// A head's place in the order: its start tag, its arrival, its node.
type Place = (u64, u64, usize);

/// One tenant's waiters of one class.
#[derive(Debug, Default)]
struct Line {
    weight: u32,
    /// Its finish tag: that of its last waiter served.
    finish: u64,
    /// Its waiters by arrival: `seq → node`.
    queue: BTreeMap<u64, usize>,
    /// The units they wait for.
    pending: usize,
    /// Its head's place in the order, if it has waiters.
    head: Option<Place>,
}

/// A waiter the order knows: its tenant's line and its arrival.
#[derive(Debug, Clone, Copy)]
struct Member {
    line: (u64, usize),
    seq: u64,
    need: usize,
}

/// The room's fair order (module docs).
#[derive(Debug, Default)]
pub(super) struct FairOrder {
    /// Set at the first keyed waiter of a FIFO room; never cleared.
    pub(super) on: bool,
    /// `V`: the start tag of the last head served.
    clock: u64,
    /// Arrivals so far, to break ties.
    seq: u64,
    /// Each waiting tenant's line, by (key, class rank).
    lines: HashMap<(u64, usize), Line>,
    /// Each waiter the order knows, by node.
    members: HashMap<usize, Member>,
    /// The heads of each class (by rank), in order.
    order: [BTreeSet<Place>; Class::COUNT],
}

impl FairOrder {
    /// Waiter `node` of `tenant`, class `rank`, for `need` units, joins
    /// its tenant's line (at its head if the line was empty).
    pub(super) fn arrive(&mut self, node: usize, tenant: Tenant, rank: usize, need: usize) {
        self.seq += 1;
        let seq = self.seq;
        let key = (tenant.key, rank);
        let line = self.lines.entry(key).or_default();
        // Its weight as of now (a run-time change counts from here).
        line.weight = tenant.weight.max(1);
        line.queue.insert(seq, node);
        line.pending += need;
        self.members.insert(
            node,
            Member {
                line: key,
                seq,
                need,
            },
        );
        if line.head.is_none() {
            let place = (line.finish.max(self.clock), seq, node);
            line.head = Some(place);
            self.order[rank].insert(place);
        }
    }

    /// Waiter `node` left, served (a grant) or not; its line's next waiter
    /// becomes the head if it was the head, and a line left empty is
    /// forgotten.
    pub(super) fn leave(&mut self, node: usize, served: bool) {
        let Some(member) = self.members.remove(&node) else {
            return;
        };
        let (_, rank) = member.line;
        let Some(line) = self.lines.get_mut(&member.line) else {
            return;
        };
        line.queue.remove(&member.seq);
        line.pending -= member.need;
        if line.head.is_some_and(|head| head.2 == node) {
            let head = line.head.take().expect("checked");
            self.order[rank].remove(&head);
            if served {
                let cost = (member.need.max(1) as u64)
                    .saturating_mul(SCALE)
                    .checked_div(u64::from(line.weight))
                    .unwrap_or(u64::MAX)
                    .max(1);
                line.finish = head.0.saturating_add(cost);
                self.clock = self.clock.max(head.0);
            }
            if let Some((&seq, &next)) = line.queue.iter().next() {
                let place = (line.finish.max(self.clock), seq, next);
                line.head = Some(place);
                self.order[rank].insert(place);
            }
        }
        if line.queue.is_empty() && line.finish <= self.clock {
            self.lines.remove(&member.line);
        }
        self.sweep();
    }

    /// Drops the lines left empty whose finish tag the clock has passed:
    /// their tenant would start at the clock anyway. Their number is kept
    /// within twice the lines with waiters (and 64 more): a sweep runs
    /// only past that, so its cost spreads over as many leaves.
    fn sweep(&mut self) {
        if self.lines.len() <= 2 * self.members.len() + 64 {
            return;
        }
        let clock = self.clock;
        self.lines
            .retain(|_, line| !line.queue.is_empty() || line.finish > clock);
    }

    /// The waiter of class `rank` the fair order serves next, if any:
    /// of the first [`LOOK`] heads in tag order (up to the first unkeyed
    /// one), the one whose tenant holds the fewest units for its weight
    /// (the ties, and without a ledger all, in tag order).
    pub(super) fn first(&self, rank: usize, ledger: Option<&Ledger>) -> Option<usize> {
        let mut heads = self.order[rank].iter();
        let first = heads.next()?.2;
        let Some(ledger) = ledger else {
            return Some(first);
        };
        // (units held now, not counting those its waiters wait for;
        // weight; node)
        let weigh = |node: usize| -> Option<(usize, u32, usize)> {
            let member = self.members.get(&node)?;
            let line = self.lines.get(&member.line)?;
            if member.line.0 == 0 {
                return None;
            }
            let held = ledger.held(member.line.0).saturating_sub(line.pending);
            Some((held, line.weight, node))
        };
        let Some(mut best) = weigh(first) else {
            return Some(first);
        };
        for place in heads.take(LOOK - 1) {
            let Some(next) = weigh(place.2) else {
                break;
            };
            // next.held / next.weight < best.held / best.weight
            if (next.0 as u128) * u128::from(best.1) < (best.0 as u128) * u128::from(next.1) {
                best = next;
            }
        }
        Some(best.2)
    }

    /// The head after waiter `node`'s tenant's head in class `rank`, if
    /// any.
    pub(super) fn after(&self, rank: usize, node: usize) -> Option<usize> {
        use std::ops::Bound::{Excluded, Unbounded};
        let member = self.members.get(&node)?;
        let head = self.lines.get(&member.line)?.head?;
        self.order[rank]
            .range((Excluded(head), Unbounded))
            .next()
            .map(|place| place.2)
    }

    /// The waiter a full room sheds for a newcomer of `tenant` in class
    /// `rank`, if any: the newest waiter of the tenant with the most
    /// waiters in the class, if that is at least two more than the
    /// newcomer's tenant has (counting the newcomer). A flood gives up
    /// its places to light tenants, never the other way round.
    pub(super) fn shed_for(&self, tenant: Tenant, rank: usize) -> Option<usize> {
        let mine = self
            .lines
            .get(&(tenant.key, rank))
            .map_or(0, |line| line.queue.len());
        let longest = self
            .lines
            .iter()
            .filter(|((key, r), _)| *r == rank && *key != tenant.key)
            .max_by_key(|(_, line)| line.queue.len())?
            .1;
        if longest.queue.len() < mine + 2 {
            return None;
        }
        longest.queue.values().next_back().copied()
    }

    /// How many tenants it keeps a line for (its memory, in tenants),
    /// and how many of them have waiters.
    #[cfg(test)]
    pub(super) fn keys(&self) -> (usize, usize) {
        let waiting = self.lines.values().filter(|l| !l.queue.is_empty()).count();
        (self.lines.len(), waiting)
    }
}
