use super::*;

#[test]
fn a_cap_is_exact_and_a_key_too_large_for_it_is_told_so() {
    let ledger = Ledger::new(2);
    let id = id_of("tenant-a");
    ledger.set_rule(id, None, Some(5));
    assert_eq!(ledger.enter(id, 3).map(|e| e.held), Ok(3));
    assert_eq!(ledger.enter(id, 3), Err(Error::KeyBusy));
    assert_eq!(ledger.enter(id, 6), Err(Error::TooLarge));
    assert_eq!(ledger.enter(id, 2).map(|e| e.held), Ok(5));
    assert_eq!(ledger.held(id), 5);
    ledger.release(id, 5);
    assert_eq!(ledger.held(id), 0);
    // The rule stays with the key while it is set.
    assert_eq!(ledger.entries(), 1);
    assert_eq!(ledger.rule(id), (None, Some(5)));
}

#[test]
fn the_default_cap_applies_to_keys_without_their_own() {
    let ledger = Ledger::new(1);
    ledger.set_per_key_cap(2);
    let (a, b) = (id_of(&1_u64), id_of(&2_u64));
    ledger.set_rule(b, None, Some(4));
    assert!(ledger.enter(a, 2).is_ok());
    assert_eq!(ledger.enter(a, 1), Err(Error::KeyBusy));
    assert_eq!(ledger.enter(id_of(&3_u64), 3), Err(Error::TooLarge));
    assert!(ledger.enter(b, 4).is_ok());
    // A refused key that held nothing leaves nothing behind.
    assert_eq!(ledger.entries(), 2);
}

#[test]
fn the_active_weight_counts_each_key_that_holds_units_once() {
    let ledger = Ledger::new(2);
    let (a, b) = (id_of("a"), id_of("b"));
    ledger.set_rule(b, Some(5), None);
    let first = ledger.enter(a, 1).unwrap();
    assert_eq!((first.weight, first.active), (1, 1));
    assert_eq!(ledger.enter(a, 2).unwrap().active, 1);
    let second = ledger.enter(b, 1).unwrap();
    assert_eq!((second.weight, second.active), (5, 6));
    assert_eq!(ledger.active_keys(), 2);
    // A weight changed while active moves the total at once.
    ledger.set_rule(b, Some(2), None);
    assert_eq!(ledger.active_weight(), 3);
    ledger.release(a, 3);
    assert_eq!((ledger.active_weight(), ledger.active_keys()), (2, 1));
    ledger.release(b, 1);
    assert_eq!(ledger.active_weight(), 0);
}

#[test]
fn a_share_is_the_capacity_times_the_weight_over_the_active_weight() {
    let at = |held, weight, active| Entered {
        held,
        weight,
        active,
    };
    // 3 equal keys of 64: 21.33 each.
    assert!(at(21, 1, 3).within_share(64));
    assert!(!at(22, 1, 3).within_share(64));
    // Weight 5 of 8: 40 of 64.
    assert!(at(40, 5, 8).within_share(64));
    assert!(!at(41, 5, 8).within_share(64));
    // Alone, a key's share is everything.
    assert!(at(64, 1, 1).within_share(64));
    // A stale reading below its own weight counts as itself alone.
    assert!(at(64, 2, 0).within_share(64));
    // No overflow at the extremes.
    assert!(!at(usize::MAX, u32::MAX, u64::MAX).within_share(usize::MAX));
    assert!(at(usize::MAX, u32::MAX, u64::from(u32::MAX)).within_share(usize::MAX));
}

#[test]
fn a_million_keys_churned_leave_no_entry_behind() {
    let ledger = Ledger::new(4);
    let mut held = Vec::new();
    for i in 0..1_000_000_u64 {
        let id = id_of(&i);
        ledger.enter(id, 1).unwrap();
        held.push(id);
        // At most 64 keys hold a unit at once, as in a table of 64.
        if held.len() == 64 {
            for id in held.drain(..) {
                ledger.release(id, 1);
            }
        }
        if i % 100_000 == 0 {
            assert!(ledger.entries() <= 64);
            assert!(ledger.kept() <= 64, "{} kept", ledger.kept());
        }
    }
    for id in held.drain(..) {
        ledger.release(id, 1);
    }
    assert_eq!((ledger.entries(), ledger.active_weight()), (0, 0));
    assert_eq!(ledger.kept(), 0);
}

#[test]
fn keys_past_their_slots_live_in_the_map_and_leave_it_when_idle() {
    let ledger = Ledger::new(1);
    // 256 slots; 1,000 keys held at once: most share a slot.
    let ids: Vec<u64> = (0..1_000_u64).map(|i| id_of(&i)).collect();
    for &id in &ids {
        assert_eq!(ledger.enter(id, 2).map(|e| e.held), Ok(2));
    }
    assert_eq!(ledger.entries(), 1_000);
    assert_eq!(ledger.active_weight(), 1_000);
    assert!(ledger.kept() >= 1_000 - 256);
    for &id in &ids {
        assert_eq!(ledger.held(id), 2);
        ledger.release(id, 1);
        assert_eq!(ledger.held(id), 1);
        ledger.release(id, 1);
    }
    assert_eq!(
        (ledger.entries(), ledger.kept(), ledger.active_weight()),
        (0, 0, 0)
    );
    // Every slot unpinned again: a key takes its fast path.
    let id = id_of(&0_u64);
    assert!(ledger.enter(id, 1).is_ok());
    assert_eq!(ledger.kept(), 0, "a resident key, not in the map");
    ledger.release(id, 1);
}

#[test]
fn a_resident_key_given_a_rule_moves_to_the_map_with_its_count() {
    let ledger = Ledger::new(1);
    let id = id_of("tenant");
    ledger.enter(id, 3).unwrap();
    assert_eq!((ledger.kept(), ledger.active_weight()), (0, 1));
    ledger.set_rule(id, Some(4), Some(5));
    assert_eq!((ledger.kept(), ledger.held(id)), (1, 3));
    assert_eq!(ledger.active_weight(), 4);
    assert_eq!(ledger.enter(id, 3), Err(Error::KeyBusy));
    assert_eq!(ledger.enter(id, 2).map(|e| (e.held, e.weight)), Ok((5, 4)));
    ledger.release(id, 5);
    assert_eq!(
        (ledger.held(id), ledger.active_weight(), ledger.entries()),
        (0, 0, 1)
    );
    // The rule taken away, nothing is left of the key.
    ledger.set_rule(id, None, None);
    assert_eq!((ledger.entries(), ledger.kept()), (0, 0));
    assert_eq!(ledger.enter(id, 1).map(|e| e.held), Ok(1));
    assert_eq!(ledger.kept(), 0, "resident again");
}

#[test]
fn a_count_past_what_a_word_holds_moves_to_the_map() {
    let ledger = Ledger::new(1);
    let id = id_of("big");
    let most = words::MAX_COUNT as usize;
    ledger.enter(id, most).unwrap();
    assert_eq!(ledger.kept(), 0);
    assert_eq!(ledger.enter(id, 2).map(|e| e.held), Ok(most + 2));
    assert_eq!(ledger.kept(), 1);
    assert_eq!(
        ledger.enter(id_of("huge"), usize::MAX / 2).map(|e| e.held),
        Ok(usize::MAX / 2)
    );
    ledger.release(id, most + 2);
    ledger.release(id_of("huge"), usize::MAX / 2);
    assert_eq!(
        (ledger.entries(), ledger.kept(), ledger.active_weight()),
        (0, 0, 0)
    );
}

#[test]
fn a_transfer_moves_units_between_keys_whatever_the_cap() {
    let ledger = Ledger::new(1);
    let (a, b) = (id_of("a"), id_of("b"));
    ledger.set_per_key_cap(2);
    ledger.enter(a, 2).unwrap();
    ledger.enter(b, 2).unwrap();
    ledger.transfer(a, b, 2);
    assert_eq!((ledger.held(a), ledger.held(b)), (0, 4));
    assert_eq!((ledger.active_keys(), ledger.active_weight()), (1, 1));
    ledger.release(b, 4);
    assert_eq!(ledger.entries(), 0);
}

#[test]
fn a_key_hashes_to_one_id_and_never_to_zero() {
    assert_eq!(id_of("tenant"), id_of(&String::from("tenant")));
    assert_ne!(id_of("tenant"), id_of("tenant2"));
    assert_ne!(id_of(&0_u64), 0);
    // A long key is hashed, and nothing of it kept.
    let big = "x".repeat(1 << 20);
    assert_ne!(id_of(big.as_str()), 0);
}

#[test]
fn a_key_gone_idle_keeps_its_word_until_a_sweep_or_another_key() {
    let ledger = Ledger::new(1);
    let a = id_of("a");
    ledger.enter(a, 2).unwrap();
    ledger.release(a, 2);
    // Idle: holding nothing, not tracked, but its word is kept and `W`
    // still counts it (as read without a sweep).
    assert_eq!(
        (ledger.held(a), ledger.active_keys(), ledger.entries()),
        (0, 0, 0)
    );
    assert_eq!(ledger.active_raw(), 1);
    // Back again: one CAS on its own word, `W` unmoved.
    assert_eq!(ledger.enter(a, 1).map(|e| (e.held, e.active)), Ok((1, 1)));
    ledger.release(a, 1);
    // A sweep counts it out.
    ledger.sweep();
    assert_eq!(ledger.active_raw(), 0);
    // Another key of the same slot takes an idle word over: one key out
    // of `W`, one in.
    let b = (0..)
        .map(|i: u64| id_of(&i))
        .find(|&b| b != a && ledger.words.index(b) == ledger.words.index(a))
        .unwrap();
    ledger.enter(a, 1).unwrap();
    ledger.release(a, 1);
    assert_eq!(ledger.active_raw(), 1);
    assert_eq!(ledger.enter(b, 3).map(|e| (e.held, e.active)), Ok((3, 1)));
    assert_eq!((ledger.held(a), ledger.held(b), ledger.kept()), (0, 3, 0));
    ledger.release(b, 3);
    assert_eq!(ledger.active_weight(), 0, "swept by the reading");
}

#[test]
fn an_idle_word_in_a_slot_that_stays_pinned_is_emptied_under_the_lock() {
    let ledger = Ledger::new(1);
    let a = id_of("a");
    let b = (0..)
        .map(|i: u64| id_of(&i))
        .find(|&b| b != a && ledger.words.index(b) == ledger.words.index(a))
        .unwrap();
    ledger.enter(a, 1).unwrap();
    // b is in the map (a holds the slot): the slot is pinned for good.
    ledger.enter(b, 1).unwrap();
    assert_eq!((ledger.kept(), ledger.active_raw()), (1, 2));
    // a's last unit goes through the lock, and its word is emptied there
    // (no sweep reaches a pinned word).
    ledger.release(a, 1);
    assert_eq!(ledger.active_raw(), 1);
    ledger.release(b, 1);
    assert_eq!(
        (ledger.kept(), ledger.active_raw(), ledger.entries()),
        (0, 0, 0)
    );
    // Unpinned again: a's next take is resident.
    ledger.enter(a, 1).unwrap();
    assert_eq!(ledger.kept(), 0);
}

#[test]
fn a_rule_given_to_an_idle_key_counts_it_out() {
    let ledger = Ledger::new(1);
    let a = id_of("a");
    ledger.enter(a, 1).unwrap();
    ledger.release(a, 1);
    assert_eq!(ledger.active_raw(), 1);
    ledger.set_rule(a, Some(3), None);
    assert_eq!((ledger.active_raw(), ledger.kept()), (0, 1));
    assert_eq!(ledger.enter(a, 1).map(|e| (e.weight, e.active)), Ok((3, 3)));
}
