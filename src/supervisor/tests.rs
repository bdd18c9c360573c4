//! The supervisor's unit tests (its private state is theirs to read).

use super::registry::{
    generation_of, next_free, occupant, GEN_MASK, GEN_SHIFT, OCCUPIED, START_MAX, START_UNIT_SHIFT,
};
use super::*;
use crate::error::Error;
use crate::sync::Ordering::Relaxed;
use std::future::Future;
use std::task::{Context, Waker};
use std::time::Duration;

#[test]
fn slot_words_round_trip() {
    for kind in [ChildKind::Thread, ChildKind::Task, ChildKind::Reserved] {
        for generation in [0, 1, GEN_MASK] {
            let free = generation << GEN_SHIFT;
            assert_eq!(free & OCCUPIED, 0);
            let ticks = 123_456_789_012;
            let word = free | occupant(ticks, kind);
            assert_ne!(word & OCCUPIED, 0);
            assert_eq!(kind_of(word), kind);
            assert_eq!(generation_of(word), generation);
            let started = started_of(word);
            assert!(started <= ticks && ticks - started < 1 << START_UNIT_SHIFT);
            assert_eq!(
                next_free(generation),
                ((generation + 1) & GEN_MASK) << GEN_SHIFT
            );
        }
    }
    // A start time past the field's range saturates instead of wrapping
    // into the generation.
    let word = occupant(u64::MAX, ChildKind::Reserved);
    assert_eq!(generation_of(word), 0);
    assert_eq!(started_of(word), START_MAX << START_UNIT_SHIFT);
}

#[test]
fn slots_are_reused_with_a_new_id_and_the_hint_finds_them() {
    let sup = Supervisor::builder().capacity(3).shards(1).build().unwrap();
    let registry = &sup.inner.registry[0];
    let a = sup.reserve().unwrap();
    let b = sup.reserve().unwrap();
    assert_eq!((a.slot, b.slot), (0, 1));
    assert_eq!((a.id().seq, b.id().seq), (1, 2));
    let (a_id, a_slot) = (a.id(), a.slot as usize);
    drop(a);
    // The freed slot is where the next claim looks first.
    assert_eq!(registry.hint.load(Relaxed), a_slot);
    let c = sup.reserve().unwrap();
    assert_eq!(c.slot as usize, a_slot);
    assert_ne!(c.id(), a_id);
    assert_eq!(c.id().seq, 1 + 3, "generation 1 of slot 0, limit 3");
    // Hint on an occupied slot: the walk finds the last free one.
    registry.hint.store(0, Relaxed);
    let d = sup.reserve().unwrap();
    assert_eq!(d.slot, 2);
    assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
    drop((b, c, d));
    assert!(sup.which_children().is_empty());
}

#[test]
fn registry_shards_own_whole_lines() {
    let sup = Supervisor::builder()
        .capacity(40)
        .shards(2)
        .build()
        .unwrap();
    for registry in sup.inner.registry.iter() {
        assert_eq!(registry.limit, 20);
        assert_eq!(registry.lines.len(), 2);
    }
}

std::thread_local! {
    /// Scans seen on this thread while `CHECK_SCANS` is set.
    static SCANS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Called by every `Common::is_idle`: on a thread that asked for it,
/// counts the scan and asserts that the idle lock is free (a scan under
/// it would make every leaver that must wake someone wait for it).
pub(super) fn on_scan(common: &Common) {
    if let Some(scans) = SCANS.with(|cell| cell.get()) {
        assert!(
            common.idle.try_lock().is_some(),
            "wait_idle scanned the shards under the idle lock"
        );
        SCANS.with(|cell| cell.set(Some(scans + 1)));
    }
}

/// Issue 7, item 1: a leaver that empties a shard must never wait behind
/// a `wait_idle` scanning every shard, so the scan runs without the idle
/// lock. Before the fix, the scans after the first ran under it.
#[test]
fn wait_idle_scans_without_the_idle_lock() {
    let sup = Supervisor::builder().capacity(4).shards(4).build().unwrap();
    let guard = sup.reserve().unwrap();
    SCANS.with(|cell| cell.set(Some(0)));
    // The child stays: every path through the wait scans and times out.
    assert!(!sup.wait_idle(Duration::from_millis(1)));
    let scans = SCANS.with(|cell| cell.replace(None)).unwrap();
    assert!(scans >= 2, "the wait scanned {scans} times");
    drop(guard);
    assert_eq!(sup.inner.common.waiters.load(Relaxed), 0);
}

/// A waker that counts its wakes.
struct CountingWaker(AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Relaxed);
    }
}

/// Issue 7, item 3: a `wait_idle_async` future dropped while pending
/// leaves no waker and no waiter count behind.
#[test]
fn a_dropped_wait_idle_async_leaves_nothing_registered() {
    let sup = Supervisor::builder().capacity(2).shards(2).build().unwrap();
    let common = &sup.inner.common;
    let guard = sup.reserve().unwrap();
    let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&counter));
    let mut cx = Context::from_waker(&waker);
    let mut first = Box::pin(sup.wait_idle_async());
    let mut second = Box::pin(sup.wait_idle_async());
    assert!(first.as_mut().poll(&mut cx).is_pending());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    // A second poll while nothing changed keeps one registration.
    assert!(first.as_mut().poll(&mut cx).is_pending());
    assert_eq!(common.idle.lock().wakers.len(), 2);
    assert_eq!(common.waiters.load(Relaxed), 2);
    drop(first);
    assert_eq!(common.idle.lock().wakers.len(), 1);
    assert_eq!(common.waiters.load(Relaxed), 1);
    // The last leave wakes the one still registered, once.
    drop(guard);
    assert_eq!(counter.0.load(Relaxed), 1);
    assert!(common.idle.lock().wakers.is_empty());
    assert!(second.as_mut().poll(&mut cx).is_ready());
    assert_eq!(common.waiters.load(Relaxed), 0);
    // A future that finds the supervisor idle registers nothing.
    assert!(Box::pin(sup.wait_idle_async())
        .as_mut()
        .poll(&mut cx)
        .is_ready());
    assert_eq!(common.waiters.load(Relaxed), 0);
    assert!(common.idle.lock().wakers.is_empty());
}

#[test]
fn capacity_above_the_registry_limit_is_refused() {
    let err = Supervisor::new(MAX_CHILDREN + 1).unwrap_err();
    assert_eq!(err.field(), "capacity");
}
