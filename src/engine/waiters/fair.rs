//! Fair order among tenants in the waiting room: start-time fair queuing
//! over the waiters' keys, so a freed unit goes to the tenant that has
//! been served least for its weight, and no tenant wins again and again.
//!
//! # The rule, and why this one
//!
//! Each waiter gets a *start tag* when it queues: `max(V, F(key))`, where
//! `V` is the room's virtual clock (the start tag of the last waiter
//! served) and `F(key)` the finish tag of its key's previous waiter; its
//! key's finish tag becomes `start + units / weight`. Within a class, the
//! waiter with the smallest start tag is served first (ties: the one that
//! came first). So among keys that keep waiting, each is served units in
//! proportion to its weight, round after round: ten equal keys waiting for
//! two units get a tenth of the grants each in every window
//! (CockroachDB#91533 is what "the key holding fewest wins" does instead:
//! it forgets who was served a moment ago, and one key wins again and
//! again). A key that stops waiting is forgotten: when it comes back it
//! starts at `V`, with neither credit for the time it was away (which
//! would let it take a burst of everything) nor debt.
//!
//! Start-time fair queuing (Goyal, Vin and Cheng) over deficit round
//! robin: its work per grant is one ordered-set step, whatever the number
//! of keys (DRR walks the keys), and it needs no quantum to tune. Over
//! decayed usage: nothing here decays on a clock, so a paused or slow room
//! is as fair as a busy one.
//!
//! # When it is on
//!
//! A FIFO room turns it on at the first waiter with a key (the waiters
//! already queued get tags in their order), and keeps it on. Unkeyed
//! waiters are one key of weight 1 between them, whose tags grow in their
//! arrival order: a FIFO room that never sees a key serves exactly as it
//! did. A LIFO or adaptive-LIFO room keeps its own order (keys still
//! count against their caps and shares at the table).
//!
//! # Bounded
//!
//! The room keeps a key's finish tag while the key has a waiter: at most
//! `max_waiters` keys.

use crate::engine::class::Class;
use std::collections::{BTreeSet, HashMap};

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

/// One unit of service, in tag units: a weight of `w` advances a key's
/// finish tag by `SCALE / w` a unit.
const SCALE: u64 = 1 << 24;

/// Where a waiter stands in the fair order: its start tag, then its
/// arrival, then its node (unique).
pub(super) type Place = (u64, u64, usize);

/// The room's fair order (module docs).
#[derive(Debug, Default)]
pub(super) struct FairOrder {
    /// Set at the first keyed waiter of a FIFO room; never cleared.
    pub(super) on: bool,
    /// `V`: the start tag of the last waiter served.
    clock: u64,
    /// Arrivals so far, to break ties.
    seq: u64,
    /// The unkeyed waiters' finish tag.
    unkeyed: u64,
    /// Each waiting key's finish tag, and how many of its waiters wait.
    keys: HashMap<u64, (u64, usize)>,
    /// While `on`: every waiting node of each class (by rank), in order.
    pub(super) order: [BTreeSet<Place>; Class::COUNT],
}

impl FairOrder {
    /// Tags a waiter of `tenant` for `need` units: its start tag and
    /// arrival.
    pub(super) fn tag(&mut self, tenant: Tenant, need: usize) -> (u64, u64) {
        let cost = (need.max(1) as u64)
            .saturating_mul(SCALE)
            .checked_div(u64::from(tenant.weight.max(1)))
            .unwrap_or(u64::MAX)
            .max(1);
        let finish = if tenant.key == 0 {
            &mut self.unkeyed
        } else {
            let entry = self.keys.entry(tenant.key).or_insert((0, 0));
            entry.1 += 1;
            &mut entry.0
        };
        let start = (*finish).max(self.clock);
        *finish = start.saturating_add(cost);
        self.seq += 1;
        (start, self.seq)
    }

    /// The start tag a waiter of `tenant` would get now (a newcomer to a
    /// full room, before it has a place).
    pub(super) fn start_of(&self, tenant: Tenant) -> u64 {
        let finish = if tenant.key == 0 {
            self.unkeyed
        } else {
            self.keys.get(&tenant.key).map_or(0, |k| k.0)
        };
        finish.max(self.clock)
    }

    /// A waiter of `key` with `place` in class `rank` left the queue.
    pub(super) fn left(&mut self, key: u64, rank: usize, place: Place) {
        if self.on {
            self.order[rank].remove(&place);
        }
        if key != 0 {
            if let Some(entry) = self.keys.get_mut(&key) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    self.keys.remove(&key);
                }
            }
        }
    }

    /// A waiter whose start tag is `start` was served: the clock moves
    /// up to it.
    pub(super) fn served(&mut self, start: u64) {
        self.clock = self.clock.max(start);
    }

    /// The first waiter of class `rank` in the fair order, if any.
    pub(super) fn first(&self, rank: usize) -> Option<usize> {
        self.order[rank].first().map(|place| place.2)
    }

    /// The waiter after `place` in class `rank`, if any.
    pub(super) fn after(&self, rank: usize, place: Place) -> Option<usize> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.order[rank]
            .range((Excluded(place), Unbounded))
            .next()
            .map(|place| place.2)
    }

    /// The waiter of class `rank` that the fair order serves last, if
    /// any: the one a full room sheds for a newcomer ahead of it.
    pub(super) fn last(&self, rank: usize) -> Option<Place> {
        self.order[rank].last().copied()
    }

    /// How many keys it keeps a tag for (its memory, in keys).
    #[cfg(test)]
    pub(super) fn keys(&self) -> usize {
        self.keys.len()
    }
}
