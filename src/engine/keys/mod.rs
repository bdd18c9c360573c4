//! The key ledger: how many units each tenant key holds, its weight and
//! its cap, and the total weight of the keys that hold units now (the
//! *active* keys); what a keyed ask's fair share and its cap are checked
//! against.
//!
//! Beside it, `children/`: the supervisor's key set, which bounds the live
//! children of one key (`per_key`, one workflow's tasks one at a time)
//! with a resident word per key entered and left with one CAS. The two
//! count different things today (a tenant's units; a key's children);
//! the ledger is to move onto the key set's words, which would make a
//! keyed take as cheap as a keyed child (PERFORMANCE.md, "Fair shares").
//!
//! # Fair shares
//!
//! While the capacity `C` binds, an active key of weight `w` is entitled
//! to `C × w / W` units, `W` the weight of every active key (itself
//! included): weighted max-min fairness over the keys that hold units.
//! The ledger answers the one question the table asks of a keyed take,
//! *would this key be within its share once it holds these units*
//! ([`Entered::within_share`]); the table decides what that means (a key
//! over its share takes only below the fair line, `table/keyed.rs`, and
//! waits behind the keys under it, `waiters/fair.rs`).
//!
//! # Exact caps, approximate shares
//!
//! A key's count is changed under its stripe's lock only, so a cap is
//! exact: no key ever holds more units than its cap, whatever races. `W`
//! is one counter changed under those same locks when a key becomes
//! active or idle (or its weight changes) and read without one: a share
//! is computed from a reading that another key's start or end may move a
//! moment later. Shares are a policy, the capacity and the caps are the
//! bounds: a stale `W` can let a key one take past its share, never a
//! unit past the capacity or its cap.
//!
//! # Bounded state
//!
//! A key is *tracked* while it holds units, or while a rule (a weight or
//! a cap of its own) is set for it: at most as many keys as units are
//! held, plus the rules the user set, however many distinct keys come and
//! go. A key that has given every unit back and has no rule is forgotten
//! lazily: its entry stays, idle, until its stripe needs the room, so a
//! tenant that asks again and again costs no insertion and no removal
//! each time. A stripe reaching its budget of entries drops its idle
//! ones; the budget (64 to start) doubles while more than half of them
//! are tracked. So a stripe holds at most twice the most keys it ever
//! tracked at once, and 64 at least.
//!
//! # Identity
//!
//! A key is hashed once, when the ask is built (foldhash, seeded per
//! process, as hashbrown's maps are), and known by that 64-bit *id*. Two
//! keys with the same id (for a million live keys, about one chance in
//! 2·10^7; the seed keeps an adversary from choosing them) are one key:
//! they share a count, a weight and a cap. That is safe, it only shares
//! more. Hashing costs what the key's `Hash` costs: a long key (a 1 MB
//! string) is read once, by the caller, and nothing of it is kept.

use crate::error::{ConfigError, Error};
use crate::sync::{AtomicU64, AtomicUsize, Mutex, Ordering::Relaxed};
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use std::hash::{BuildHasher, Hash};

mod api;
pub(crate) mod children;
#[cfg(all(test, not(loom)))]
mod tests;

pub(crate) use api::{key_readings, key_settings};

/// The hasher keys go through: foldhash with a per-process random seed
/// normally; a fixed one under loom, whose models must replay the same
/// choices on every run.
#[cfg(not(loom))]
fn hasher() -> &'static hashbrown::DefaultHashBuilder {
    static HASHER: std::sync::OnceLock<hashbrown::DefaultHashBuilder> = std::sync::OnceLock::new();
    HASHER.get_or_init(Default::default)
}

#[cfg(loom)]
fn hasher() -> std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher> {
    Default::default()
}

/// The id of `key`: its hash, never 0 (0 is "no key" in an ask).
pub(crate) fn id_of<K: Hash + ?Sized>(key: &K) -> u64 {
    hasher().hash_one(key) | 1
}

/// The entries a stripe starts with room for, idle ones included.
const IDLE_BUDGET: usize = 64;

/// The most stripes: beyond this, more stripes only cost memory.
const MAX_STRIPES: usize = 1024;

/// A key's weight when it has none of its own.
pub(crate) const DEFAULT_WEIGHT: u32 = 1;

/// A builder's key settings: the default cap, the fair line, and each
/// key's own weight and cap, in the order set (a later one wins).
#[derive(Debug, Clone, Default)]
pub(crate) struct KeySettings {
    pub(crate) per_key_cap: Option<usize>,
    pub(crate) fair_line: Option<f64>,
    pub(crate) rules: Vec<(u64, Rule)>,
}

/// One setting of one key's rule.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rule {
    Weight(u32),
    Cap(usize),
}

impl Rule {
    /// A `ConfigError` naming `key_weight` or `key_cap` for a 0: at build
    /// and at run time alike.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        match self {
            Rule::Weight(0) => Err(ConfigError::zero("key_weight")),
            Rule::Cap(0) => Err(ConfigError::zero("key_cap")),
            _ => Ok(()),
        }
    }
}

impl KeySettings {
    /// Checks every value: a `ConfigError` naming `per_key_cap`,
    /// `key_weight` or `key_cap` for a 0, `fair_line` for a fraction
    /// outside (0, 1].
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.per_key_cap == Some(0) {
            return Err(ConfigError::zero("per_key_cap"));
        }
        for (_, rule) in &self.rules {
            rule.check()?;
        }
        if let Some(line) = self.fair_line {
            if !(line > 0.0 && line <= 1.0) {
                return Err(ConfigError::out_of_range(
                    "fair_line",
                    "a fraction of the capacity above 0 and at most 1",
                ));
            }
        }
        Ok(())
    }

    /// Puts the rules and the default cap into `ledger` (checked first).
    pub(crate) fn apply(&self, ledger: &Ledger) {
        ledger.set_per_key_cap(self.per_key_cap.unwrap_or(usize::MAX));
        for &(id, rule) in &self.rules {
            ledger.update_rule(id, rule);
        }
    }
}

/// The tenants of one table: their counts, weights and caps.
pub(crate) struct Ledger {
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    /// `stripes.len() - 1`; the count is a power of two.
    mask: usize,
    /// The weight of the active keys: changed under a stripe's lock,
    /// read without one (module docs, "Exact caps, approximate shares").
    active: CachePadded<AtomicU64>,
    /// How many keys are active now.
    keys: AtomicUsize,
    /// The cap of a key with none of its own (`usize::MAX`: none).
    per_key_cap: AtomicUsize,
}

struct Stripe {
    map: HashTable<Entry>,
    /// The entries it may hold before it drops its idle ones (module
    /// docs, "Bounded state").
    budget: usize,
}

impl Default for Stripe {
    fn default() -> Self {
        Stripe {
            map: HashTable::new(),
            budget: IDLE_BUDGET,
        }
    }
}

impl Stripe {
    /// Key `id`'s entry, a new one if it has none: first dropping the
    /// idle entries if the stripe is at its budget.
    fn entry(&mut self, id: u64) -> &mut Entry {
        // One probe when the stripe is under its budget (the common case);
        // a look first only when it is at it.
        if self.map.len() >= self.budget && self.map.find(id, |e| e.id == id).is_none() {
            self.map.retain(|e| !e.is_spent());
            if self.map.len() * 2 > self.budget {
                self.budget *= 2;
            }
        }
        match self.map.entry(id, |e| e.id == id, |e| e.id) {
            hashbrown::hash_table::Entry::Occupied(found) => found.into_mut(),
            hashbrown::hash_table::Entry::Vacant(vacant) => vacant
                .insert(Entry {
                    id,
                    held: 0,
                    weight: None,
                    cap: None,
                })
                .into_mut(),
        }
    }
}

/// A key the ledger knows: one that holds units, or has a rule.
struct Entry {
    id: u64,
    held: usize,
    /// Its own weight, if it has one.
    weight: Option<u32>,
    /// Its own cap, if it has one.
    cap: Option<usize>,
}

impl Entry {
    fn weight(&self) -> u32 {
        self.weight.unwrap_or(DEFAULT_WEIGHT)
    }

    /// Nothing left to keep: no units held and no rule.
    fn is_spent(&self) -> bool {
        self.held == 0 && self.weight.is_none() && self.cap.is_none()
    }
}

/// What a keyed take found once its units were counted to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entered {
    /// The units the key holds now, these included.
    pub(crate) held: usize,
    /// Its weight.
    pub(crate) weight: u32,
    /// The weight of the active keys, as read just after (this key's
    /// included).
    pub(crate) active: u64,
}

impl Entered {
    /// How the waiting room orders the key `key` that entered: its id and
    /// weight.
    pub(crate) fn tenant(&self, key: u64) -> crate::engine::waiters::Tenant {
        crate::engine::waiters::Tenant {
            key,
            weight: self.weight,
        }
    }

    /// True if `held` is within the key's share of `capacity`:
    /// `held ≤ capacity × weight / active`, in integers.
    pub(crate) fn within_share(&self, capacity: usize) -> bool {
        let active = u128::from(self.active.max(u64::from(self.weight)));
        (self.held as u128) * active <= (capacity as u128) * u128::from(self.weight)
    }
}

impl Ledger {
    /// A ledger for a table over `shards` shards.
    pub(crate) fn new(shards: usize) -> Ledger {
        let count = (shards * 4).next_power_of_two().clamp(1, MAX_STRIPES);
        Ledger {
            stripes: (0..count)
                .map(|_| CachePadded::new(Mutex::new(Stripe::default())))
                .collect(),
            mask: count - 1,
            active: CachePadded::new(AtomicU64::new(0)),
            keys: AtomicUsize::new(0),
            per_key_cap: AtomicUsize::new(usize::MAX),
        }
    }

    fn stripe(&self, id: u64) -> &Mutex<Stripe> {
        // The top bits pick the stripe; the map files by the whole id.
        &self.stripes[(id >> 40) as usize & self.mask]
    }

    /// Counts `n` units (`n > 0`) to key `id`, all or nothing: `KeyBusy`
    /// if that would take it past its cap, `TooLarge` if `n` alone is more
    /// than its cap.
    pub(crate) fn enter(&self, id: u64, n: usize) -> Result<Entered, Error> {
        debug_assert!(n > 0 && id != 0);
        // Relaxed: a setting, read as it stands; ordered with nothing.
        let default_cap = self.per_key_cap.load(Relaxed);
        let mut stripe = self.stripe(id).lock();
        let entry = stripe.entry(id);
        let cap = entry.cap.unwrap_or(default_cap);
        if n > cap {
            return Err(Error::TooLarge);
        }
        if entry.held.saturating_add(n) > cap {
            return Err(Error::KeyBusy);
        }
        let weight = entry.weight();
        self.count_in(entry, n);
        let held = entry.held;
        drop(stripe);
        Ok(Entered {
            held,
            weight,
            // Relaxed: as in `count_in`.
            active: self.active.load(Relaxed),
        })
    }

    /// Gives `n` of key `id`'s units back (it holds at least `n`),
    /// forgetting the key if it holds none and has no rule.
    pub(crate) fn release(&self, id: u64, n: usize) {
        if n == 0 {
            return;
        }
        let mut stripe = self.stripe(id).lock();
        let Some(entry) = stripe.map.find_mut(id, |e| e.id == id) else {
            debug_assert!(false, "a key gave back units it did not hold");
            return;
        };
        debug_assert!(entry.held >= n, "a key gave back more than it held");
        entry.held = entry.held.saturating_sub(n);
        if entry.held == 0 {
            // Relaxed: as in `enter`. The entry stays, idle (module docs,
            // "Bounded state").
            self.active.fetch_sub(u64::from(entry.weight()), Relaxed);
            self.keys.fetch_sub(1, Relaxed);
        }
    }

    /// Moves `n` units held by key `from` to key `to` (a permit merged
    /// into one of another key): counted to `to` whatever its cap, as the
    /// units are already held.
    pub(crate) fn transfer(&self, from: u64, to: u64, n: usize) {
        if from == to || n == 0 {
            return;
        }
        if to != 0 {
            self.force(to, n);
        }
        if from != 0 {
            self.release(from, n);
        }
    }

    /// Counts `n` units to `id` past its cap: units already held.
    fn force(&self, id: u64, n: usize) {
        let mut stripe = self.stripe(id).lock();
        self.count_in(stripe.entry(id), n);
    }

    /// Counts `n` units to `entry` (under its stripe's lock): a key that
    /// held none becomes active, its weight counted in `W`.
    fn count_in(&self, entry: &mut Entry, n: usize) {
        if entry.held == 0 {
            // Relaxed: `active` is a reading for a policy, changed under
            // the stripe lock and ordered with nothing else (module docs).
            self.active.fetch_add(u64::from(entry.weight()), Relaxed);
            self.keys.fetch_add(1, Relaxed);
        }
        entry.held += n;
    }

    /// Sets key `id`'s rule: its own weight and cap (`None` for either:
    /// the default's). An active key's new weight counts in `W` at once;
    /// a key above a lowered cap keeps what it holds and takes no more
    /// until it is under it.
    pub(crate) fn set_rule(&self, id: u64, weight: Option<u32>, cap: Option<usize>) {
        self.change_rule(id, |_, _| (weight, cap));
    }

    /// Sets one part of key `id`'s rule, keeping the other (under one
    /// lock: two settings of one key at once lose neither).
    pub(crate) fn update_rule(&self, id: u64, rule: Rule) {
        self.change_rule(id, |weight, cap| match rule {
            Rule::Weight(w) => (Some(w), cap),
            Rule::Cap(c) => (weight, Some(c)),
        });
    }

    /// Sets key `id`'s rule to what `change` makes of its present one.
    fn change_rule(
        &self,
        id: u64,
        change: impl FnOnce(Option<u32>, Option<usize>) -> (Option<u32>, Option<usize>),
    ) {
        let mut stripe = self.stripe(id).lock();
        let present = stripe
            .map
            .find(id, |e| e.id == id)
            .map(|e| (e.weight, e.cap));
        let (weight, cap) = match present {
            Some((weight, cap)) => change(weight, cap),
            None => match change(None, None) {
                (None, None) => return,
                rule => rule,
            },
        };
        let entry = stripe.entry(id);
        if entry.held > 0 {
            let (old, new) = (
                u64::from(entry.weight()),
                u64::from(weight.unwrap_or(DEFAULT_WEIGHT)),
            );
            // Relaxed: as in `enter`.
            if new > old {
                self.active.fetch_add(new - old, Relaxed);
            } else {
                self.active.fetch_sub(old - new, Relaxed);
            }
        }
        entry.weight = weight;
        entry.cap = cap;
    }

    /// Key `id`'s own weight and cap, if it has them.
    pub(crate) fn rule(&self, id: u64) -> (Option<u32>, Option<usize>) {
        let stripe = self.stripe(id).lock();
        stripe
            .map
            .find(id, |e| e.id == id)
            .map_or((None, None), |e| (e.weight, e.cap))
    }

    /// Sets the cap of every key with none of its own (`usize::MAX`:
    /// none). Keys above a lowered cap keep what they hold and take no
    /// more until they are under it.
    pub(crate) fn set_per_key_cap(&self, cap: usize) {
        // Relaxed: a setting; takes read it as it stands.
        self.per_key_cap.store(cap, Relaxed);
    }

    /// The cap of a key with none of its own (`usize::MAX`: none).
    pub(crate) fn per_key_cap(&self) -> usize {
        // Relaxed: a reading.
        self.per_key_cap.load(Relaxed)
    }

    /// The weight key `id` is counted with now.
    pub(crate) fn weight(&self, id: u64) -> u32 {
        self.rule(id).0.unwrap_or(DEFAULT_WEIGHT)
    }

    /// The units key `id` holds now.
    pub(crate) fn held(&self, id: u64) -> usize {
        let stripe = self.stripe(id).lock();
        stripe.map.find(id, |e| e.id == id).map_or(0, |e| e.held)
    }

    /// How many keys hold units now.
    pub(crate) fn active_keys(&self) -> usize {
        // Relaxed: a reading.
        self.keys.load(Relaxed)
    }

    /// The weight of the keys that hold units now.
    pub(crate) fn active_weight(&self) -> u64 {
        // Relaxed: a reading.
        self.active.load(Relaxed)
    }

    /// How many keys the ledger tracks: those holding units or with a
    /// rule.
    pub(crate) fn entries(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| s.lock().map.iter().filter(|e| !e.is_spent()).count())
            .sum()
    }

    /// How many entries the ledger keeps, idle ones included: its memory,
    /// in entries (module docs, "Bounded state").
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().map.len()).sum()
    }
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("active_keys", &self.active_keys())
            .field("active_weight", &self.active_weight())
            .finish()
    }
}
