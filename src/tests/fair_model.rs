//! A proptest model of keyed fail-fast takes on one shard, where every
//! answer is exact and so can be predicted.
//!
//! Random capacity (1..24), fair line, default cap, and rules (weights 1..4,
//! caps 1..8) for some of five keys; random sequences of: a keyed take of
//! `n` units (0..8, of key 0..5), an unkeyed take, a give-back, a merge of
//! two grants, a weight or cap set at run time, a resize. The model is a
//! ledger of grants (their key and units) and each key's rule.
//!
//! Properties, after every step:
//!
//! * every answer is the model's: `TooLarge` for more than the capacity or
//!   the key's cap, `KeyBusy` past the cap, `Overload` when the units are
//!   not free or when the key would be over its share
//!   (`held × W > C × w`, `W` the weight of the keys holding units, its own
//!   counted in) and the usage would pass the fair line; else admitted;
//! * the table's usage, each key's count and the active weight are the
//!   ledger's;
//! * at the end, with everything given back, the ledger keeps only the
//!   keys with rules.

use std::collections::HashMap;

use proptest::prelude::*;

use crate::engine::ask::Ask;
use crate::engine::grant::Grant;
use crate::engine::keys::{id_of, KeySettings, Rule};
use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::error::Error;

const KEYS: u64 = 5;

#[derive(Debug, Clone)]
enum Step {
    Take(u64, usize),
    Unkeyed(usize),
    Release(usize),
    Merge(usize, usize),
    Weight(u64, u32),
    Cap(u64, usize),
    Set(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => ((0..KEYS), 0usize..8).prop_map(|(k, n)| Step::Take(k, n)),
        1 => (1usize..4).prop_map(Step::Unkeyed),
        5 => any::<usize>().prop_map(Step::Release),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Step::Merge(a, b)),
        1 => ((0..KEYS), 1u32..5).prop_map(|(k, w)| Step::Weight(k, w)),
        1 => ((0..KEYS), 1usize..9).prop_map(|(k, c)| Step::Cap(k, c)),
        1 => (1usize..24).prop_map(Step::Set),
    ]
}

/// The model's rules and counts.
#[derive(Default)]
struct Model {
    weight: HashMap<u64, u32>,
    cap: HashMap<u64, usize>,
    per_key_cap: Option<usize>,
    held: HashMap<u64, usize>,
}

impl Model {
    fn weight(&self, key: u64) -> u32 {
        self.weight.get(&key).copied().unwrap_or(1)
    }

    fn cap(&self, key: u64) -> usize {
        self.cap
            .get(&key)
            .copied()
            .or(self.per_key_cap)
            .unwrap_or(usize::MAX)
    }

    fn held(&self, key: u64) -> usize {
        self.held.get(&key).copied().unwrap_or(0)
    }

    fn active_weight(&self) -> u64 {
        self.held
            .iter()
            .filter(|(_, &h)| h > 0)
            .map(|(&k, _)| u64::from(self.weight(k)))
            .sum()
    }

    fn add(&mut self, key: u64, n: usize) {
        *self.held.entry(key).or_insert(0) += n;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn keyed_takes_match_a_ledger_of_keys(
        capacity in 1usize..24,
        line in prop_oneof![Just(0.5), Just(0.75), Just(0.9), Just(1.0)],
        per_key_cap in proptest::option::of(1usize..10),
        rules in proptest::collection::vec(((0..KEYS), 1u32..5, proptest::option::of(1usize..9)), 0..4),
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let mut model = Model { per_key_cap, ..Model::default() };
        let mut settings = KeySettings { per_key_cap, fair_line: Some(line), rules: Vec::new() };
        for &(key, weight, cap) in &rules {
            settings.rules.push((id_of(&key), Rule::Weight(weight)));
            model.weight.insert(key, weight);
            if let Some(cap) = cap {
                settings.rules.push((id_of(&key), Rule::Cap(cap)));
                model.cap.insert(key, cap);
            }
        }
        let table = Table::new(capacity, 1, Probe::Thread).unwrap().with_keys(&settings).unwrap();
        let mut capacity = capacity;
        // Each grant held, with its key (`None`: unkeyed).
        let mut held: Vec<(Option<u64>, Grant)> = Vec::new();
        for step in steps {
            let used: usize = held.iter().map(|(_, g)| g.units()).sum();
            match step {
                Step::Take(key, n) => {
                    let answer = table.admit(&Ask::new().key(&key).units(n).fail_fast());
                    let mine = model.held(key);
                    let w = model.weight(key);
                    let active = model.active_weight() + if mine == 0 { u64::from(w) } else { 0 };
                    let within = ((mine + n) as u128) * u128::from(active)
                        <= (capacity as u128) * u128::from(w);
                    let line_units = (line * capacity as f64).floor() as usize;
                    let expected = if n == 0 {
                        Ok(())
                    } else if n > capacity || n > model.cap(key) {
                        Err(Error::TooLarge)
                    } else if mine + n > model.cap(key) {
                        Err(Error::KeyBusy)
                    } else if used + n > capacity || (!within && used + n > line_units) {
                        Err(Error::Overload)
                    } else {
                        Ok(())
                    };
                    prop_assert_eq!(answer.as_ref().map(|_| ()).map_err(|e| *e), expected,
                        "key {} takes {} holding {} of cap {}, {} of {} used, W {}", key, n, mine, model.cap(key), used, capacity, active);
                    if let Ok(grant) = answer {
                        prop_assert_eq!(grant.units(), n);
                        if n > 0 {
                            model.add(key, n);
                            held.push((Some(key), grant));
                        } else {
                            table.release_grant(&grant, false);
                        }
                    }
                }
                Step::Unkeyed(n) => {
                    if let Ok(grant) = table.admit(&Ask::new().units(n).fail_fast()) {
                        prop_assert!(used + n <= capacity);
                        held.push((None, grant));
                    } else {
                        prop_assert!(used + n > capacity);
                    }
                }
                Step::Release(k) if !held.is_empty() => {
                    let (key, grant) = held.swap_remove(k % held.len());
                    if let Some(key) = key {
                        *model.held.get_mut(&key).unwrap() -= grant.units();
                    }
                    table.release_grant(&grant, false);
                }
                Step::Merge(a, b) if held.len() >= 2 => {
                    let a = a % held.len();
                    let mut b = b % held.len();
                    if a == b {
                        b = (b + 1) % held.len();
                    }
                    let (theirs_key, theirs) = held.remove(b);
                    let a = if b < a { a - 1 } else { a };
                    let n = theirs.units();
                    table.keys().transfer(theirs.key, held[a].1.key, n);
                    if let Some(key) = theirs_key {
                        *model.held.get_mut(&key).unwrap() -= n;
                    }
                    if let Some(key) = held[a].0 {
                        model.add(key, n);
                    }
                    held[a].1.merge(theirs);
                }
                Step::Weight(key, w) => {
                    table.keys().update_rule(id_of(&key), Rule::Weight(w));
                    model.weight.insert(key, w);
                }
                Step::Cap(key, c) => {
                    table.keys().update_rule(id_of(&key), Rule::Cap(c));
                    model.cap.insert(key, c);
                }
                Step::Set(c) => {
                    table.set_capacity(c).unwrap();
                    capacity = c;
                }
                _ => {}
            }
            let used: usize = held.iter().map(|(_, g)| g.units()).sum();
            prop_assert_eq!(table.usage(), used);
            for key in 0..KEYS {
                prop_assert_eq!(table.keys().held(id_of(&key)), model.held(key), "key {}", key);
            }
            prop_assert_eq!(table.keys().active_weight(), model.active_weight());
        }
        for (_, grant) in held.drain(..) {
            table.release_grant(&grant, false);
        }
        let ruled = (0..KEYS).filter(|k| model.weight.contains_key(k) || model.cap.contains_key(k)).count();
        prop_assert_eq!(table.keys().entries(), ruled);
        prop_assert_eq!((table.usage(), table.keys().active_weight()), (0, 0));
    }
}
