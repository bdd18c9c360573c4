//! Admission by tenant key: a keyed ask's units are counted to its key
//! (`engine/keys/`) before they are taken, against the key's cap (exact),
//! and, while the capacity binds, against the key's fair share.
//!
//! # The fair line
//!
//! A fail-fast ask of a key within its share (`capacity × weight / W`,
//! its units counted in) takes as any ask does: up to the capacity,
//! under its class's line. A key *over* its share takes only while the
//! table's usage, its units counted in, stays at or below the *fair
//! line*: `floor(fair_line × capacity)`, 0.9 of it unless the builder
//! says otherwise. The units above the line are kept for keys within
//! their share: a tenant that floods holds at most the line, and a light
//! tenant that comes then finds units free. Below the line no share
//! stops anyone, so the capacity is used whoever asks: two keys of a
//! thousand, both busy, can use all of it between them (each is within
//! its half), and one alone all of it (its share is everything).
//!
//! # Waiting
//!
//! A waiting ask in a table with a room does not stop at the line: it
//! takes free units if there are any (nobody waits for them, or they
//! would have been handed over), else it waits in the room in its key's
//! place in the fair order (`waiters/fair.rs`), which serves the key
//! served least for its weight first. Its units are counted to its key
//! from the moment it asks, so a key's cap bounds what it holds and waits
//! for together.
//!
//! # What is exact
//!
//! The capacity (the table's takes decide) and each key's cap (the
//! ledger counts under a lock) are bounds no race crosses. The share and
//! the line are read, not reserved: two keys racing may both pass the
//! line by one take, never the capacity.

use super::{Grant, Table};
use crate::engine::ask::{Ask, How};
use crate::engine::class::Class;
use crate::engine::keys::{id_of, Entered, KeySettings, Ledger, Rule};
use crate::error::{ConfigError, Error};
use std::hash::Hash;

/// The fair line unless the builder sets one: 0.9 of the capacity.
pub(super) const DEFAULT_FAIR_LINE: f64 = 0.9;

/// A key's units counted in the ledger while an ask is under way: given
/// back if the ask fails, is refused or is dropped (a future cancelled
/// in its wait), kept by the grant if it succeeds.
struct Counted<'a> {
    table: &'a Table,
    key: u64,
    units: usize,
}

impl Counted<'_> {
    /// The ask succeeded: its grant carries the key from now on.
    fn keep(self, mut grant: Grant) -> Grant {
        grant.key = self.key;
        std::mem::forget(self);
        grant
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.table.keys.release(self.key, self.units);
    }
}

impl Table {
    /// [`admit`](Self::admit) of a keyed ask (module docs) but the
    /// common one, which takes [`admit_keyed_one`](Self::admit_keyed_one).
    #[cold]
    #[inline(never)]
    pub(super) fn admit_keyed(&self, ask: &Ask) -> Result<Grant, Error> {
        let plain = Ask { key: 0, ..*ask };
        let Some((counted, entered)) = self.count_to_key(ask)? else {
            return self.admit(&plain);
        };
        let grant = match ask.how {
            How::Wait(deadline) if self.room.is_some() => {
                let tenant = entered.tenant(ask.key);
                self.admit_classed_waiting(ask.units, ask.class, deadline, tenant)?
            }
            _ => self.admit_fail_fast(&plain, entered)?,
        };
        Ok(counted.keep(grant))
    }

    /// The common keyed ask, one unit of the default class that does not
    /// wait: the key's word, the share, the table's own take; nothing
    /// else on the way ([`admit_keyed`](Self::admit_keyed) answers the
    /// same).
    #[inline(always)]
    pub(super) fn admit_keyed_one(&self, key: u64) -> Result<Grant, Error> {
        let over = self.keys.enter_then(key, 1, |entered| {
            (!entered.within_share(self.capacity())).then_some(entered)
        })?;
        // A capacity of 0 has no share for anyone: the cold path answers.
        if let Some(entered) = over {
            return self.admit_over_share(key, entered);
        }
        match self.acquire() {
            Ok(shard) => Ok(Grant {
                key,
                ..Grant::one(shard)
            }),
            Err(err) => Err(self.refused_keyed_one(key, err)),
        }
    }

    /// The table refused a keyed unit: its key's count goes back.
    #[cold]
    #[inline(never)]
    fn refused_keyed_one(&self, key: u64, err: Error) -> Error {
        self.keys.release(key, 1);
        err
    }

    /// [`admit_keyed_one`](Self::admit_keyed_one) of a key over its share:
    /// the general path's answer, its unit counted to the key already.
    #[cold]
    #[inline(never)]
    fn admit_over_share(&self, key: u64, entered: Entered) -> Result<Grant, Error> {
        let counted = Counted {
            table: self,
            key,
            units: 1,
        };
        if self.capacity() == 0 {
            return Err(Error::TooLarge); // as `count_to_key` answers
        }
        let grant = self.admit_fail_fast(&Ask::new().fail_fast(), entered)?;
        Ok(counted.keep(grant))
    }

    /// [`admit_async`](Self::admit_async) of a keyed ask: cancel safe, as
    /// an unkeyed wait is, and its key's count goes with it.
    pub(super) async fn admit_keyed_async(&self, ask: Ask) -> Result<Grant, Error> {
        let plain = Ask { key: 0, ..ask };
        let Some((counted, entered)) = self.count_to_key(&ask)? else {
            return self.admit(&plain);
        };
        let grant = match (ask.how, self.room.is_some()) {
            (How::Wait(deadline), true) => {
                self.acquire_async_many(ask.units, ask.class, deadline)
                    .for_tenant(entered.tenant(ask.key))
                    .await?
            }
            _ => self.admit_fail_fast(&plain, entered)?,
        };
        Ok(counted.keep(grant))
    }

    /// Counts a keyed ask's units to its key: `None` for an ask of no
    /// units (nothing to count); `TooLarge` for more than the capacity in
    /// force (as the table would answer, before the key's own answer);
    /// the ledger's `KeyBusy` or `TooLarge` for the key's cap.
    fn count_to_key(&self, ask: &Ask) -> Result<Option<(Counted<'_>, Entered)>, Error> {
        if ask.units == 0 {
            return Ok(None);
        }
        if ask.units > self.capacity() {
            return Err(Error::TooLarge);
        }
        let entered = self.keys.enter(ask.key, ask.units)?;
        let counted = Counted {
            table: self,
            key: ask.key,
            units: ask.units,
        };
        Ok(Some((counted, entered)))
    }

    /// A keyed ask that does not wait, its units counted to its key as
    /// `entered` says: within its share, the table's take; over it, the
    /// same take only while the usage stays at or below the fair line
    /// (module docs), else `Overload`, counted as the table's refusals are
    /// (a probe's is not). Before it refuses, the ledger forgets its idle
    /// words and the share is read again: `W` may count keys that hold
    /// nothing (`keys/mod.rs`, "Idle words"), never fewer than hold.
    fn admit_fail_fast(&self, plain: &Ask, entered: Entered) -> Result<Grant, Error> {
        let plain = match plain.how {
            How::Wait(_) => plain.fail_fast(),
            _ => *plain,
        };
        let capacity = self.capacity();
        if !entered.within_share(capacity)
            && self.usage().saturating_add(plain.units) > self.fair_units(capacity)
        {
            self.keys.sweep();
            let now = Entered {
                active: self.keys.active_raw(),
                ..entered
            };
            if !now.within_share(capacity) {
                if plain.how != How::Probe {
                    self.count_refusal();
                    if plain.class != Class::Critical {
                        self.count_class_refusal(plain.class);
                    }
                }
                return Err(Error::Overload);
            }
        }
        self.admit(&plain)
    }

    /// The fair line in units, for `capacity`.
    fn fair_units(&self, capacity: usize) -> usize {
        // Exact for every capacity up to 2^53; above it, within one part
        // in 2^53 of the fraction, which a line is anyway.
        (self.fair_line * capacity as f64).floor() as usize
    }

    /// Counts `n` units of key `id` out of its holdings, as a grant of
    /// them is given back (`Grant::key`, `units::Many::key`). Nothing for
    /// no key.
    #[inline]
    pub(crate) fn release_key(&self, id: u64, n: usize) {
        if id != 0 {
            self.keys.release(id, n);
        }
    }

    /// Sets one part of tenant `key`'s rule from now on, checked as a
    /// builder's is (`Rule::check`). Every front-end's `set_key_weight`
    /// and `set_key_cap`.
    pub(crate) fn set_key_rule<K: Hash + ?Sized>(
        &self,
        key: &K,
        rule: Rule,
    ) -> Result<(), ConfigError> {
        rule.check()?;
        self.keys.update_rule(id_of(key), rule);
        Ok(())
    }

    /// The units tenant `key` holds now (those its waiting asks wait for
    /// included). Every front-end's `key_usage`.
    pub(crate) fn key_usage<K: Hash + ?Sized>(&self, key: &K) -> usize {
        self.keys.held(id_of(key))
    }

    /// The tenant keys' ledger: their weights, caps and counts.
    pub(crate) fn keys(&self) -> &Ledger {
        &self.keys
    }

    /// Takes a builder's key settings (checked): the fair line, the
    /// default cap and each key's rule. At build, before the table is
    /// shared.
    pub(crate) fn with_keys(mut self, settings: &KeySettings) -> Result<Self, ConfigError> {
        settings.check()?;
        self.fair_line = settings.fair_line.unwrap_or(DEFAULT_FAIR_LINE);
        settings.apply(&self.keys);
        Ok(self)
    }

    /// The fair line, as a fraction of the capacity.
    pub(crate) fn fair_line(&self) -> f64 {
        self.fair_line
    }
}
