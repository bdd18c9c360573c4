//! The key set's unit tests.

use std::task::Waker;
use std::time::Duration;

use super::*;
use crate::engine::keys::words::{count_of, ID_SHIFT, ONE, PINNED};
use crate::error::Error;
use crate::sync::Arc;

fn set(per_key: u32, max_waiters: usize) -> KeySet {
    KeySet::new(1, 8, per_key, max_waiters, Duration::from_secs(3600))
}

/// An id of shard 0 and slot `slot`, told apart by `tag`.
fn id_at(set: &KeySet, slot: usize, tag: u64) -> u64 {
    let shard = &set.shards[0];
    let id = 1 << 63 | (slot as u64) << 44 | tag << ID_SHIFT;
    assert_eq!(
        (set.shard(id).words.index(id), shard.words.index(id)),
        (slot, slot)
    );
    assert!(Arc::ptr_eq(set.shard(id), shard));
    id
}

#[test]
fn a_key_is_forgotten_when_its_last_count_goes() {
    let set = set(2, 0);
    let a = set.id(&"a");
    let one = set.try_enter(a).unwrap();
    let two = set.try_enter(a).unwrap();
    assert_eq!(set.try_enter(a).err(), Some(Error::KeyBusy));
    assert_eq!((set.live(a), set.busy_keys()), (2, 1));
    drop(one);
    assert_eq!(set.live(a), 1);
    let three = set.try_enter(a).unwrap();
    drop((two, three));
    assert_eq!((set.live(a), set.busy_keys()), (0, 0));
}

/// Two keys of one slot: the first is resident, the second goes to the
/// map and pins the slot; both keep their own limit; when both are
/// gone the slot is empty and unpinned.
#[test]
fn keys_sharing_a_slot_spill_to_the_map_and_unpin_when_gone() {
    let set = set(1, 0);
    let shard = Arc::clone(&set.shards[0]);
    let (a, b) = (id_at(&set, 3, 1), id_at(&set, 3, 2));
    let ga = set.try_enter(a).unwrap();
    assert_eq!(shard.words.read(3), a | ONE, "resident, unpinned");
    let gb = set.try_enter(b).unwrap();
    assert_eq!(shard.words.read(3), a | ONE | PINNED, "b spilled");
    assert_eq!(set.try_enter(a).err(), Some(Error::KeyBusy));
    assert_eq!(set.try_enter(b).err(), Some(Error::KeyBusy));
    assert_eq!(set.busy_keys(), 2);
    // a leaves: the slot empties but stays pinned while b is in the
    // map, so a newcomer b cannot also move in.
    drop(ga);
    assert_eq!(shard.words.read(3), PINNED);
    assert_eq!(set.try_enter(b).err(), Some(Error::KeyBusy));
    drop(gb);
    assert_eq!(shard.words.read(3), 0);
    assert_eq!(set.busy_keys(), 0);
    // Now b moves in.
    let gb = set.try_enter(b).unwrap();
    assert_eq!(shard.words.read(3), b | ONE);
    drop(gb);
}

#[test]
fn equal_ids_are_one_key() {
    // Keys told apart only by their id: the same id is a collision,
    // which serializes them and is otherwise harmless.
    let set = set(1, 0);
    let id = set.id(&1u64);
    let first = set.try_enter(id).unwrap();
    assert_eq!(set.try_enter(id).err(), Some(Error::KeyBusy));
    drop(first);
    assert!(set.try_enter(id).is_ok());
}

struct Noop;

impl std::task::Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn a_release_hands_the_count_to_the_oldest_waiter_and_skips_the_expired() {
    let set = set(1, 8);
    let shard = Arc::clone(&set.shards[0]);
    let h = id_at(&set, 5, 7);
    let held = set.try_enter(h).unwrap();
    let (first, second) = {
        let mut state = shard.state.lock();
        let waker = Waker::from(Arc::new(Noop));
        let first = shard.enqueue(&mut state, h, &mut Some(Wake::Task(waker.clone())), None);
        let second = shard.enqueue(&mut state, h, &mut Some(Wake::Task(waker.clone())), None);
        let (first, second) = (first.unwrap().unwrap(), second.unwrap().unwrap());
        let entry = state.map.find_mut(map_hash(h), |e| e.id == h).unwrap();
        assert!(entry.resident);
        entry.queue[0].expired = true;
        (first, second)
    };
    assert_ne!(shard.words.read(5) & PINNED, 0, "waiters pin the slot");
    drop(held);
    let mut state = shard.state.lock();
    assert!(matches!(state.standing(h, first), Standing::Expired));
    assert!(matches!(state.standing(h, second), Standing::Granted));
    assert_eq!(count_of(shard.words.read(5)), 1, "handed over");
    // The expired waiter leaves; the entry goes, the slot unpins.
    drop(shard.cancel(&mut state, h, first));
    drop(state);
    assert_eq!(shard.words.read(5), h | ONE);
    drop(set.slot(h)); // the granted count, released
                       // Released unpinned: the word stays, idle (no child), for the key's
                       // next child or another key to take with one CAS.
    assert_eq!(
        (set.busy_keys(), set.live(h), shard.words.read(5)),
        (0, 0, h)
    );
}

#[test]
fn a_huge_per_key_keeps_every_key_in_the_map() {
    let set = KeySet::new(1, 8, u32::MAX, 0, Duration::ZERO);
    let a = set.id(&"a");
    let guards: Vec<_> = (0..3).map(|_| set.try_enter(a).unwrap()).collect();
    assert_eq!((set.live(a), set.busy_keys()), (3, 1));
    drop(guards);
    assert_eq!(set.busy_keys(), 0);
}

#[test]
fn shards_and_slots_are_powers_of_two() {
    for (shards, capacity) in [(1, 1), (3, 100), (4, 10_000), (7, 1 << 24), (1000, 5)] {
        let set = KeySet::new(shards, capacity, 1, 0, Duration::ZERO);
        assert!(set.shards.len().is_power_of_two());
        assert!(set.shards.len() >= shards.min(MAX_KEY_SHARDS / 4));
        assert!(set.shards.len() <= MAX_KEY_SHARDS);
        let slots = set.shards[0].words.len();
        assert!(slots.is_power_of_two() && (MIN_SLOTS..=MAX_SLOTS).contains(&slots));
    }
}

/// A key whose last child ends on the fast path leaves its word idle:
/// its next child takes it back with one CAS, and another key of the
/// slot takes it over, neither through the map.
#[test]
fn an_idle_word_is_taken_back_or_taken_over_without_the_map() {
    let set = set(1, 0);
    let shard = Arc::clone(&set.shards[0]);
    let (a, b) = (id_at(&set, 2, 1), id_at(&set, 2, 2));
    drop(set.try_enter(a).unwrap());
    assert_eq!(
        (shard.words.read(2), set.live(a), set.busy_keys()),
        (a, 0, 0)
    );
    let again = set.try_enter(a).unwrap();
    assert_eq!(shard.words.read(2), a | ONE);
    drop(again);
    let gb = set.try_enter(b).unwrap();
    assert_eq!(shard.words.read(2), b | ONE, "taken over, unpinned");
    assert_eq!(
        (set.live(a), set.live(b), shard.state.lock().map.len()),
        (0, 1, 0)
    );
    drop(gb);
}
