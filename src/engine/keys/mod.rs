//! The key ledger: how many units each tenant key holds, its weight and
//! its cap, and the total weight of the keys that hold units now (the
//! *active* keys); what a keyed ask's fair share and its cap are checked
//! against.
//!
//! A key's count lives first in a *resident word* (`words.rs`): one
//! atomic word per slot, `id | count`, entered and left with one CAS, so
//! a tenant that asks again and again takes no lock and allocates
//! nothing. A key whose slot another key holds, that holds more than a
//! word counts, or that has a rule of its own (a weight or a cap) lives
//! in its stripe's map, under the stripe's lock. Beside it, `children/`:
//! the supervisor's key set, which bounds the live children of one key
//! (`per_key`, one workflow's tasks one at a time) on the same words.
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
//! A key's count is changed by a CAS on its word, or under its stripe's
//! lock with the word pinned (`words.rs`), so a cap is exact: no key ever
//! holds more units than its cap, whatever races. A resident key has no
//! rule of its own, so its cap is the default one, checked against the
//! word it swaps. `W` is one counter, moved when a key becomes active or
//! idle (or its weight changes) and read without a lock: counted in
//! before the key is seen active, out after it is seen idle, so it is
//! never below the truth, and a share is computed from a reading that
//! another key's start or end may move a moment later. Shares are a
//! policy, the capacity and the caps are the bounds: a stale `W` can let
//! a key one take past its share, never a unit past the capacity or its
//! cap.
//!
//! # Idle words
//!
//! A resident key that gives its last unit back leaves its word *idle*
//! (`id | 0`) rather than empty, and stays counted in `W`: a tenant that
//! asks again (most do, request after request) takes its word back with
//! one CAS and moves no shared counter, and one that leaves for good is
//! counted out when another key takes its slot (one out, one in: `W`
//! unmoved) or when the ledger sweeps. `W` is read only to tell a key
//! whether it is within its share, and a `W` too large only makes shares
//! smaller; so the ledger sweeps (every idle word emptied, counted out)
//! exactly when a share would refuse a take, and the table reads the
//! share again before it does (`table/keyed.rs`). No take is refused on
//! a `W` that counts idle words.
//!
//! # Bounded state
//!
//! A key is *tracked* while it holds units, or while a rule (a weight or
//! a cap of its own) is set for it: at most as many keys as units are
//! held, plus the rules the user set, however many distinct keys come and
//! go. A resident key that gives its last unit back leaves an idle word
//! (above); a key in the map with no rule is dropped from it then.
//! Nothing else is kept: the words are a fixed 2 KiB per ledger, the maps
//! hold the tracked keys that are not resident.
//!
//! # Identity
//!
//! A key is hashed once, when the ask is built (foldhash, seeded per
//! process, as hashbrown's maps are), and known by the hash's top 44 bits,
//! its *id*, which a resident word carries. Two keys with the same id
//! (that any two of 1,000 live keys agree is about one chance in 3.5·10^7,
//! of a million about one in 35; the seed keeps an adversary from
//! choosing them) are one key: they share a count, a weight and a cap.
//! That is safe, it only shares more. Hashing costs what the key's `Hash`
//! costs: a long key (a 1 MB string) is read once, by the caller, and
//! nothing of it is kept.

use crate::error::{ConfigError, Error};
use crate::sync::{AtomicU64, AtomicUsize, Mutex, Ordering::Relaxed};
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use std::hash::{BuildHasher, Hash};
use words::{count_of, map_hash, Enter, Words, MAX_COUNT, ONE, PINNED};

mod api;
pub(crate) mod children;
#[cfg(all(test, not(loom)))]
mod tests;
pub(crate) mod words;

pub(crate) use api::{key_readings, key_settings};

/// The hasher keys go through: foldhash with a per-process random seed
/// normally; a fixed one under loom, whose models must replay the same
/// choices on every run.
#[cfg(not(loom))]
#[inline]
fn hasher() -> &'static hashbrown::DefaultHashBuilder {
    static HASHER: std::sync::OnceLock<hashbrown::DefaultHashBuilder> = std::sync::OnceLock::new();
    HASHER.get_or_init(Default::default)
}

#[cfg(loom)]
fn hasher() -> std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher> {
    Default::default()
}

/// The id of `key`: the top 44 bits of its hash, never 0 (0 is "no key"
/// in an ask); the id a resident word carries (`words.rs`).
#[inline]
pub(crate) fn id_of<K: Hash + ?Sized>(key: &K) -> u64 {
    words::id_from_hash(hasher().hash_one(key))
}

/// Stripes per table shard (one under loom, so that models meet).
#[cfg(not(loom))]
const STRIPES_PER_SHARD: usize = 4;

#[cfg(loom)]
const STRIPES_PER_SHARD: usize = 1;

/// Resident slots of a ledger: 2 KiB of words, shared by its stripes
/// (slot `i` is stripe `i mod stripes`'s). Keys past them live in the
/// maps, correctly and a little slower. Under loom, one: any two keys
/// share it, so models see the map and the pin as well as the fast paths.
#[cfg(not(loom))]
const SLOTS: usize = 256;

#[cfg(loom)]
const SLOTS: usize = 1;

/// The most stripes: one slot each at least.
const MAX_STRIPES: usize = SLOTS;

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
    /// The resident words; an id's bits 32 and up pick its slot, and so
    /// its stripe. In place (a keyed take follows no pointer to them), on
    /// lines of their own (the settings read on every take never share a
    /// line with a word another tenant writes).
    words: CachePadded<Words<32, words::Inline<SLOTS>>>,
    /// The stripes' locks, over their maps.
    stripes: Box<[CachePadded<Mutex<State>>]>,
    /// `log2(stripes.len())`: slot `i` is stripe `i & (stripes - 1)`'s,
    /// its `i >> stripe_bits`-th.
    stripe_bits: u32,
    /// The weight of the active keys: changed as a key becomes active or
    /// idle (or its weight changes), read without a lock (module docs,
    /// "Exact caps, approximate shares").
    active: CachePadded<AtomicU64>,
    /// The cap of a key with none of its own (`usize::MAX`: none).
    per_key_cap: AtomicUsize,
    /// The most a resident word may count, less one: the default cap,
    /// or `MAX_COUNT` if that is less (`words.rs`, `Words::enter`).
    most_resident: AtomicU64,
}

/// One stripe of the ledger under its lock: the keys of its slots that
/// are not resident.
struct State {
    /// The keys with a rule of their own, and those holding units whose
    /// slot another key holds.
    map: HashTable<Entry>,
    /// Per slot, the map's keys of it; the slot stays pinned while it is
    /// not 0 (`words.rs`).
    spills: Box<[u32]>,
}

impl State {
    fn find(&self, id: u64) -> Option<&Entry> {
        self.map.find(map_hash(id), |e| e.id == id)
    }

    /// Files a new entry for the stripe's slot `local` (pinned by the
    /// caller).
    fn insert(&mut self, local: usize, entry: Entry) -> &mut Entry {
        self.spills[local] += 1;
        self.map
            .insert_unique(map_hash(entry.id), entry, |e| map_hash(e.id))
            .into_mut()
    }

    /// The stripe's slot `local`'s count of keys in the map.
    fn spills(&self, local: usize) -> u32 {
        self.spills[local]
    }

    /// Drops key `id`'s entry if it has nothing left to keep (the
    /// stripe's slot `local` pinned by the caller).
    fn forget_if_spent(&mut self, id: u64, local: usize) {
        if let Ok(found) = self.map.find_entry(map_hash(id), |e| e.id == id) {
            if found.get().is_spent() {
                found.remove();
                self.spills[local] -= 1;
            }
        }
    }
}

/// A key in a stripe's map: one with a rule of its own, or holding units
/// while its slot is another key's.
struct Entry {
    id: u64,
    held: usize,
    /// Its own weight, if it has one.
    weight: Option<u32>,
    /// Its own cap, if it has one.
    cap: Option<usize>,
}

impl Entry {
    /// A key with `held` units and no rule.
    fn new(id: u64, held: usize) -> Entry {
        Entry {
            id,
            held,
            weight: None,
            cap: None,
        }
    }

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
    #[inline]
    pub(crate) fn within_share(&self, capacity: usize) -> bool {
        let weight = u64::from(self.weight);
        let active = self.active.max(weight);
        // In 64 bits while the left side fits (a saturated right side is
        // past any left side that fits); in 128 past that.
        match (self.held as u64).checked_mul(active) {
            Some(need) => need <= (capacity as u64).saturating_mul(weight),
            None => {
                (self.held as u128) * u128::from(active) <= (capacity as u128) * u128::from(weight)
            }
        }
    }
}

impl Ledger {
    /// A ledger for a table over `shards` shards.
    pub(crate) fn new(shards: usize) -> Ledger {
        let count = (shards.saturating_mul(STRIPES_PER_SHARD))
            .next_power_of_two()
            .clamp(1, MAX_STRIPES);
        Ledger {
            words: CachePadded::new(Words::new(SLOTS, false)),
            stripes: (0..count)
                .map(|_| {
                    CachePadded::new(Mutex::new(State {
                        map: HashTable::new(),
                        spills: vec![0; SLOTS / count].into_boxed_slice(),
                    }))
                })
                .collect(),
            stripe_bits: count.trailing_zeros(),
            active: CachePadded::new(AtomicU64::new(0)),
            per_key_cap: AtomicUsize::new(usize::MAX),
            most_resident: AtomicU64::new(MAX_COUNT - 1),
        }
    }

    /// The stripe of slot `index`.
    fn stripe(&self, index: usize) -> &Mutex<State> {
        &self.stripes[index & (self.stripes.len() - 1)]
    }

    /// Slot `index`'s place among its stripe's slots.
    fn local(&self, index: usize) -> usize {
        index >> self.stripe_bits
    }

    /// Key `id`'s stripe, locked, and its slot pinned: the slot's index.
    fn lock_pinned(&self, id: u64) -> (crate::sync::MutexGuard<'_, State>, usize) {
        let state = self.stripe(self.words.index(id)).lock();
        (state, self.words.pin(id))
    }

    /// Counts `n` units (`n > 0`) to key `id`, all or nothing: `KeyBusy`
    /// if that would take it past its cap, `TooLarge` if `n` alone is more
    /// than its cap.
    #[inline(always)]
    pub(crate) fn enter(&self, id: u64, n: usize) -> Result<Entered, Error> {
        self.enter_then(id, n, |entered| entered)
    }

    /// [`enter`](Self::enter), answering what `then` makes of the
    /// [`Entered`]: called where each path enters, so that inlined it
    /// sees what each path knows (the resident word's weight of 1).
    #[inline(always)]
    pub(crate) fn enter_then<R>(
        &self,
        id: u64,
        n: usize,
        then: impl Fn(Entered) -> R,
    ) -> Result<R, Error> {
        debug_assert!(n > 0 && id != 0);
        // A resident key has no rule of its own: the default cap is its
        // cap (clamped to what a word counts). A key past it is busy,
        // unless the word only cannot count that much, or the key is in
        // the map with a cap of its own: the lock decides those.
        let fast = self.words.enter(
            id,
            n as u64,
            // Relaxed: a setting, read as it stands; ordered with nothing.
            self.most_resident.load(Relaxed),
            // Relaxed, both: `active` is a reading for a policy, ordered
            // with nothing else (module docs). Counted in before the key
            // can be seen active, out only after it is idle: a racing
            // exit never takes the sum below the truth.
            || {
                self.active.fetch_add(u64::from(DEFAULT_WEIGHT), Relaxed);
            },
            || {
                self.active.fetch_sub(u64::from(DEFAULT_WEIGHT), Relaxed);
            },
        );
        match fast {
            Enter::Entered(held) => {
                return Ok(then(Entered {
                    held: held as usize,
                    weight: DEFAULT_WEIGHT,
                    // Relaxed: as above.
                    active: self.active.load(Relaxed),
                }));
            }
            Enter::Claimed => {
                return Ok(then(Entered {
                    held: n,
                    weight: DEFAULT_WEIGHT,
                    // Relaxed: as above.
                    active: self.active.load(Relaxed),
                }));
            }
            Enter::Over(count) => {
                if let Some(refused) = self.over_resident(n, count) {
                    return Err(refused);
                }
            }
            Enter::Locked => {}
        }
        self.enter_locked(id, n, true).map(then)
    }

    /// A resident word's answer that `n` more would make it count `count`,
    /// past its most: `TooLarge` or `KeyBusy` by the default cap, or
    /// `None` for the lock (a word cannot count that much; or the key is
    /// in the map, with a cap of its own).
    #[cold]
    fn over_resident(&self, n: usize, count: u64) -> Option<Error> {
        // Relaxed: as in `enter`.
        let cap = self.per_key_cap.load(Relaxed) as u64;
        match () {
            _ if n as u64 > cap => Some(Error::TooLarge),
            _ if count > cap => Some(Error::KeyBusy),
            _ => None,
        }
    }

    /// [`enter`](Self::enter) under the stripe's lock, the key's slot
    /// pinned; past every cap if not `check` (units already held, moved
    /// from another key).
    #[cold]
    #[inline(never)]
    fn enter_locked(&self, id: u64, n: usize, check: bool) -> Result<Entered, Error> {
        let default_cap = if check {
            // Relaxed: as in `enter`.
            self.per_key_cap.load(Relaxed)
        } else {
            usize::MAX
        };
        let (mut state, index) = self.lock_pinned(id);
        let entered = self.enter_pinned(&mut state, index, id, n, default_cap, check);
        self.unpin(&state, index);
        drop(state);
        let (held, weight) = entered?;
        Ok(Entered {
            held,
            weight,
            // Relaxed: as in `enter`.
            active: self.active.load(Relaxed),
        })
    }

    /// The counting of [`enter_locked`](Self::enter_locked), slot `index`
    /// pinned: the units held then and the key's weight.
    #[allow(clippy::too_many_arguments)]
    fn enter_pinned(
        &self,
        state: &mut State,
        index: usize,
        id: u64,
        n: usize,
        default_cap: usize,
        check: bool,
    ) -> Result<(usize, u32), Error> {
        let fits = |held: usize, cap: usize| match () {
            _ if !check => Ok(()),
            _ if n > cap => Err(Error::TooLarge),
            _ if held.saturating_add(n) > cap => Err(Error::KeyBusy),
            _ => Ok(()),
        };
        let word = self.words.pinned(index);
        if words::id_of(word) == id {
            // Resident (idle, perhaps, and counted in `W` as it is): no
            // rule of its own.
            let held = count_of(word) as usize;
            fits(held, default_cap)?;
            let now = held.saturating_add(n);
            if now as u64 <= MAX_COUNT {
                self.words
                    .set_pinned(index, id | (now as u64 * ONE) | PINNED);
            } else {
                // More than a word holds: the key moves to the map.
                self.words.set_pinned(index, PINNED);
                state.insert(self.local(index), Entry::new(id, now));
            }
            return Ok((now, DEFAULT_WEIGHT));
        }
        if let Some(entry) = state.map.find_mut(map_hash(id), |e| e.id == id) {
            fits(entry.held, entry.cap.unwrap_or(default_cap))?;
            let weight = entry.weight();
            if entry.held == 0 {
                // Relaxed: as in `enter`.
                self.active.fetch_add(u64::from(weight), Relaxed);
            }
            entry.held = entry.held.saturating_add(n);
            return Ok((entry.held, weight));
        }
        // Nowhere: no rule, nothing held.
        fits(0, default_cap)?;
        let fits_word = n as u64 <= MAX_COUNT;
        if word != PINNED && count_of(word) == 0 && fits_word {
            // Another key's idle word: the slot changes hands, one key
            // out of `W` and one in.
            self.words.set_pinned(index, id | (n as u64 * ONE) | PINNED);
            return Ok((n, DEFAULT_WEIGHT));
        }
        // Relaxed: as in `enter`, and before the key is seen active.
        self.active.fetch_add(u64::from(DEFAULT_WEIGHT), Relaxed);
        if word == PINNED && fits_word {
            // An empty slot: the key moves in.
            self.words.set_pinned(index, id | (n as u64 * ONE) | PINNED);
        } else {
            state.insert(self.local(index), Entry::new(id, n));
        }
        Ok((n, DEFAULT_WEIGHT))
    }

    /// Unpins slot `index` after a locked path (under the lock), unless
    /// the map holds keys of it. A slot that stays pinned is never swept:
    /// an idle word in it is emptied here, its key counted out of `W`.
    fn unpin(&self, state: &State, index: usize) {
        let spills = state.spills(self.local(index));
        let word = self.words.pinned(index);
        if spills > 0 && word != PINNED && count_of(word) == 0 {
            self.words.set_pinned(index, PINNED);
            // Relaxed: as in `enter`; out after the word is empty.
            self.active.fetch_sub(u64::from(DEFAULT_WEIGHT), Relaxed);
        }
        self.words.unpin(index, spills);
    }

    /// Gives `n` of key `id`'s units back (it holds at least `n`),
    /// forgetting the key if it holds none and has no rule.
    #[inline(always)]
    pub(crate) fn release(&self, id: u64, n: usize) {
        // No units (a permit split to nothing): the word's exit changes
        // nothing, the lock's path returns at once.
        // A word left at 0 stays, idle, counted in `W` until its slot
        // changes hands or a sweep (module docs, "Idle words").
        if self.words.exit(id, n as u64).is_none() {
            self.release_locked(id, n);
        }
    }

    /// [`release`](Self::release) under the stripe's lock.
    #[cold]
    #[inline(never)]
    fn release_locked(&self, id: u64, n: usize) {
        if n == 0 {
            return;
        }
        let (mut state, index) = self.lock_pinned(id);
        let word = self.words.pinned(index);
        if words::id_of(word) == id {
            debug_assert!(
                count_of(word) >= n as u64,
                "a key gave back more than it held"
            );
            // At 0 the word stays idle (`unpin` empties it if the slot
            // stays pinned).
            let left = count_of(word).saturating_sub(n as u64);
            self.words.set_pinned(index, id | (left * ONE) | PINNED);
        } else if let Some(entry) = state.map.find_mut(map_hash(id), |e| e.id == id) {
            debug_assert!(entry.held >= n, "a key gave back more than it held");
            entry.held = entry.held.saturating_sub(n);
            if entry.held == 0 {
                // Relaxed: as in `enter`.
                self.active.fetch_sub(u64::from(entry.weight()), Relaxed);
                state.forget_if_spent(id, self.local(index));
            }
        } else {
            debug_assert!(false, "a key gave back units it did not hold");
        }
        self.unpin(&state, index);
    }

    /// Moves `n` units held by key `from` to key `to` (a permit merged
    /// into one of another key): counted to `to` whatever its cap, as the
    /// units are already held.
    pub(crate) fn transfer(&self, from: u64, to: u64, n: usize) {
        if from == to || n == 0 {
            return;
        }
        if to != 0 {
            // Past every cap: nothing to refuse.
            let _ = self.enter_locked(to, n, false);
        }
        if from != 0 {
            self.release(from, n);
        }
    }

    /// Moves the active weight from `old` to `new` (a key's weight changed
    /// while it holds units).
    fn reweigh(&self, old: u32, new: u32) {
        let (old, new) = (u64::from(old), u64::from(new));
        // Relaxed: as in `enter`.
        if new > old {
            self.active.fetch_add(new - old, Relaxed);
        } else {
            self.active.fetch_sub(old - new, Relaxed);
        }
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

    /// Sets key `id`'s rule to what `change` makes of its present one. A
    /// key with a rule lives in the map: a resident key given one moves
    /// there with its count.
    fn change_rule(
        &self,
        id: u64,
        change: impl FnOnce(Option<u32>, Option<usize>) -> (Option<u32>, Option<usize>),
    ) {
        let (mut state, index) = self.lock_pinned(id);
        if let Some(entry) = state.map.find_mut(map_hash(id), |e| e.id == id) {
            let (weight, cap) = change(entry.weight, entry.cap);
            if entry.held > 0 {
                self.reweigh(entry.weight(), weight.unwrap_or(DEFAULT_WEIGHT));
            }
            (entry.weight, entry.cap) = (weight, cap);
            state.forget_if_spent(id, self.local(index));
        } else if let rule @ (Some(_), _) | rule @ (_, Some(_)) = change(None, None) {
            let word = self.words.pinned(index);
            let mut entry = Entry::new(id, 0);
            (entry.weight, entry.cap) = rule;
            if words::id_of(word) == id {
                // Resident: its count moves with it. Idle, it leaves `W`
                // (an entry holding nothing is not active).
                entry.held = count_of(word) as usize;
                self.words.set_pinned(index, PINNED);
                if entry.held > 0 {
                    self.reweigh(DEFAULT_WEIGHT, entry.weight());
                } else {
                    self.reweigh(DEFAULT_WEIGHT, 0);
                }
            }
            state.insert(self.local(index), entry);
        }
        self.unpin(&state, index);
    }

    /// Key `id`'s own weight and cap, if it has them.
    pub(crate) fn rule(&self, id: u64) -> (Option<u32>, Option<usize>) {
        let state = self.stripe(self.words.index(id)).lock();
        state.find(id).map_or((None, None), |e| (e.weight, e.cap))
    }

    /// Sets the cap of every key with none of its own (`usize::MAX`:
    /// none). Keys above a lowered cap keep what they hold and take no
    /// more until they are under it.
    pub(crate) fn set_per_key_cap(&self, cap: usize) {
        // Relaxed, both: settings; takes read them as they stand. A take
        // that reads one new and one old sees a cap being moved, and
        // answers as before or after the move.
        self.per_key_cap.store(cap, Relaxed);
        let most = (cap.max(1) as u64).min(MAX_COUNT);
        self.most_resident.store(most - 1, Relaxed);
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

    /// The units key `id` holds now: from its word if it is resident
    /// (no lock), else from the map.
    pub(crate) fn held(&self, id: u64) -> usize {
        if let Some(count) = self.words.resident_count(id) {
            return count as usize;
        }
        let state = self.stripe(self.words.index(id)).lock();
        // Again under the lock: the key may have moved in meanwhile.
        match self.words.resident_count(id) {
            Some(count) => count as usize,
            None => state.find(id).map_or(0, |e| e.held),
        }
    }

    /// How many keys hold units now: a reading, stripe by stripe.
    pub(crate) fn active_keys(&self) -> usize {
        self.count_stripes(|e| e.held > 0)
    }

    /// Empties every idle word, counting its key out of `W` (module
    /// docs, "Idle words"): before a share that may refuse a take is
    /// trusted.
    #[cold]
    pub(crate) fn sweep(&self) {
        self.words.sweep(|| {
            // Relaxed: as in `enter`; out after the word is empty.
            self.active.fetch_sub(u64::from(DEFAULT_WEIGHT), Relaxed);
        });
    }

    /// `W` as it stands, idle words included: a reading.
    pub(crate) fn active_raw(&self) -> u64 {
        // Relaxed: as in `enter`.
        self.active.load(Relaxed)
    }

    /// The weight of the keys that hold units now, idle words swept
    /// first.
    pub(crate) fn active_weight(&self) -> u64 {
        self.sweep();
        // Relaxed: a reading.
        self.active.load(Relaxed)
    }

    /// How many keys the ledger tracks: those holding units or with a
    /// rule (and all it keeps: a key with neither is forgotten at once).
    pub(crate) fn entries(&self) -> usize {
        self.count_stripes(|_| true)
    }

    /// How many entries the maps keep: the ledger's memory past its
    /// fixed words (module docs, "Bounded state").
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().map.len()).sum()
    }

    /// The resident keys and the map's entries that `counted` accepts.
    fn count_stripes(&self, counted: impl Fn(&Entry) -> bool) -> usize {
        let in_maps: usize = self
            .stripes
            .iter()
            .map(|stripe| stripe.lock().map.iter().filter(|e| counted(e)).count())
            .sum();
        self.words.busy() + in_maps
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
