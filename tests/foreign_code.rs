//! Code the crate does not own never runs under the table's control lock:
//! a waker's `wake`, its `drop` and its `clone` run after the lock is let
//! go, and a waker that panics leaves the table consistent (un-gated, the
//! lock free, every other waiter woken, the counts right).
//!
//! Each test runs its scenario on a thread of its own and waits for the
//! outcome with a generous bound: on code that runs the waker under the
//! lock the scenario deadlocks, and the bound turns the hang into a
//! failure. The bound is never a measure of speed.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Limiter, OwnedPermit, Supervisor};

mod common;
use common::bounded;

/// A `max_wait` no passing test reaches.
const LONG: Duration = Duration::from_secs(60);

fn limiter(capacity: usize, waiters: usize) -> Arc<Limiter> {
    Arc::new(
        Limiter::builder()
            .capacity(capacity)
            .shards(1)
            .max_waiters(waiters)
            .max_wait(LONG)
            .build()
            .unwrap(),
    )
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// The swap: `wait` was polled once (pending) with a waker that owns what
/// it waits for, and only the room holds that waker now. Polls it with a
/// new waker, so the room drops the old one, which gives back what it
/// owned, which is handed to this very future: ready at once, or pending
/// with the new waker woken, and ready on the next poll.
fn swap_wakers<F: Future + ?Sized>(mut wait: Pin<&mut F>) -> F::Output {
    let woken = Arc::new(Counting::default());
    let second = Waker::from(Arc::clone(&woken));
    let mut cx = Context::from_waker(&second);
    if let Poll::Ready(got) = wait.as_mut().poll(&mut cx) {
        return got;
    }
    assert_eq!(woken.0.load(SeqCst), 1, "the new waker was not woken");
    match wait.poll(&mut cx) {
        Poll::Ready(got) => got,
        Poll::Pending => panic!("woken, yet still pending"),
    }
}

/// A waker that owns a permit of the limiter its future waits on: when
/// its last clone is dropped, the permit goes back into the same table.
struct Owning(#[allow(dead_code)] Mutex<Option<OwnedPermit>>);

impl Wake for Owning {
    fn wake(self: Arc<Self>) {}
}

/// tokio's `release_permits_at_drop`: capacity 1; a waiting future's first
/// waker owns the only permit; the future is polled again with another
/// waker, so the room drops the first one, whose drop releases the permit
/// into the table, which hands it to this very future. With the old waker
/// dropped under the lock the hand-off took the same lock: a deadlock.
#[test]
fn a_waker_whose_drop_releases_a_permit_can_be_swapped() {
    let limiter = limiter(1, 1);
    let shared = Arc::clone(&limiter);
    let outcome = bounded("the waker swap", move || {
        let permit = shared.try_acquire_owned().unwrap();
        let first = Waker::from(Arc::new(Owning(Mutex::new(Some(permit)))));
        let mut wait = Box::pin(Arc::clone(&shared).acquire_owned_async());
        assert!(wait
            .as_mut()
            .poll(&mut Context::from_waker(&first))
            .is_pending());
        // The room's clone is now the only one: it owns the permit.
        drop(first);
        swap_wakers(wait.as_mut()).map(|permit| permit.shard())
    });
    assert_eq!(outcome, Ok(0));
    assert_eq!(limiter.usage(), 0, "the permit went back when dropped");
    assert_eq!(limiter.waiting(), 0);
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.completed), (2, 2));
}

/// A waker whose `wake` calls `try_acquire` on the limiter it waits on.
struct Reentrant {
    limiter: Arc<Limiter>,
    answers: Mutex<Vec<Result<(), Error>>>,
}

impl Wake for Reentrant {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let answer = self.limiter.try_acquire().map(drop);
        self.answers.lock().unwrap().push(answer);
    }
}

/// A grow hands its new room to a waiter and wakes it; the waker calls
/// back into the table. Woken under the lock (and before the un-gate), the
/// call hung `set_capacity` and every later admission.
#[test]
fn a_grow_wakes_waiters_after_the_lock_is_let_go() {
    let limiter = limiter(1, 1);
    let shared = Arc::clone(&limiter);
    let (answers, got) = bounded("the grow", move || {
        let held = shared.try_acquire_owned().unwrap();
        let waker = Arc::new(Reentrant {
            limiter: Arc::clone(&shared),
            answers: Mutex::new(Vec::new()),
        });
        let waker_handle = Waker::from(Arc::clone(&waker));
        let mut cx = Context::from_waker(&waker_handle);
        let mut wait = Box::pin(Arc::clone(&shared).acquire_owned_async());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        // Two new units: one handed to the waiter, one left free, so the
        // waker's `try_acquire` reaches a shard (and finds it gated, on
        // code that wakes before the un-gate).
        shared.set_capacity(3).unwrap();
        let got = match wait.as_mut().poll(&mut cx) {
            Poll::Ready(got) => got.map(|permit| permit.shard()),
            Poll::Pending => panic!("the grow's unit was not handed over"),
        };
        drop(held);
        let answers = waker.answers.lock().unwrap().clone();
        (answers, got)
    });
    assert_eq!(got, Ok(0));
    // The waker ran once, after the grow: the free unit was its (and went
    // back as its permit dropped).
    assert_eq!(answers, [Ok(())]);
    assert_eq!(limiter.usage(), 0);
    assert!(limiter.try_acquire().is_ok());
}

/// A waker that panics when woken.
struct Panicking;

impl Wake for Panicking {
    fn wake(self: Arc<Self>) {
        panic!("a waker that panics");
    }
}

/// A grow wakes two waiters; the first one's waker panics. The panic
/// reaches the caller of `set_capacity`, but only after the table is
/// consistent: un-gated, the lock free, the second waiter woken, every
/// count right. (Woken under the lock before the un-gate, the unwind
/// skipped the un-gate, and the next `try_acquire` deadlocked on itself.)
#[test]
fn a_waker_that_panics_in_a_grow_leaves_the_table_consistent() {
    let limiter = limiter(1, 2);
    let shared = Arc::clone(&limiter);
    let outcome = bounded("the grow with a panicking waker", move || {
        let held = shared.try_acquire_owned().unwrap();
        let panicking = Waker::from(Arc::new(Panicking));
        let counting = Arc::new(Counting::default());
        let quiet = Waker::from(Arc::clone(&counting));
        let mut first = Box::pin(Arc::clone(&shared).acquire_owned_async());
        let mut second = Box::pin(Arc::clone(&shared).acquire_owned_async());
        assert!(first
            .as_mut()
            .poll(&mut Context::from_waker(&panicking))
            .is_pending());
        assert!(second
            .as_mut()
            .poll(&mut Context::from_waker(&quiet))
            .is_pending());
        let grown = catch_unwind(AssertUnwindSafe(|| shared.set_capacity(3)));
        assert!(grown.is_err(), "the waker's panic reaches the caller");
        assert_eq!(shared.capacity(), 3);
        // Un-gated and unlocked: a fail-fast admission answers at once.
        assert_eq!(shared.try_acquire().map(drop), Err(Error::Overload));
        assert_eq!(counting.0.load(SeqCst), 1, "the second waiter was woken");
        let idle = Waker::from(Arc::new(Counting::default()));
        let mut cx = Context::from_waker(&idle);
        let a = match first.as_mut().poll(&mut cx) {
            Poll::Ready(got) => got.unwrap(),
            Poll::Pending => panic!("the first waiter lost its unit"),
        };
        let b = match second.as_mut().poll(&mut cx) {
            Poll::Ready(got) => got.unwrap(),
            Poll::Pending => panic!("the second waiter lost its unit"),
        };
        assert_eq!(shared.usage(), 3);
        drop((a, b, held));
        let stats = shared.stats();
        (stats.usage, stats.accepted, stats.completed, stats.waited)
    });
    assert_eq!(outcome, (0, 3, 3, 2));
    assert!(limiter.try_acquire().is_ok());
}

/// A waker whose drop panics is dropped after the lock is let go too: a
/// future dropped while queued leaves the queue, the panic reaches the
/// dropper, and the table still serves.
struct PanicsOnDrop;

impl Wake for PanicsOnDrop {
    fn wake(self: Arc<Self>) {}
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !thread::panicking() {
            panic!("a waker whose drop panics");
        }
    }
}

#[test]
fn a_waker_that_panics_on_drop_leaves_the_queue_consistent() {
    let limiter = limiter(1, 1);
    let shared = Arc::clone(&limiter);
    let outcome = bounded("the drop of a panicking waker", move || {
        let held = shared.try_acquire_owned().unwrap();
        let mut wait = Box::pin(Arc::clone(&shared).acquire_owned_async());
        {
            let waker = Waker::from(Arc::new(PanicsOnDrop));
            assert!(wait
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            // The room's clone is the last one now.
            drop(waker);
        }
        let dropped = catch_unwind(AssertUnwindSafe(|| drop(wait)));
        assert!(dropped.is_err(), "the waker's drop panicked");
        assert_eq!(shared.waiting(), 0);
        drop(held);
        // The unit is back and the lock free.
        let again = shared.try_acquire().map(drop);
        (again, shared.usage())
    });
    assert_eq!(outcome, (Ok(()), 0));
}

/// The supervisor's keyed wait has a lock of its own, and the same rule: a
/// future whose first waker owns the key's only child is polled with a new
/// waker; the old waker's drop ends the child, which hands the key to this
/// very future.
#[test]
fn a_keyed_waker_whose_drop_ends_the_keys_child_can_be_swapped() {
    let sup = Arc::new(
        Supervisor::builder()
            .capacity(4)
            .per_key(1)
            .max_waiters(4)
            .max_wait(LONG)
            .build()
            .unwrap(),
    );
    let shared = Arc::clone(&sup);
    let outcome = bounded("the keyed waker swap", move || {
        struct OwnsChild(#[allow(dead_code)] Mutex<Option<sidejob::ChildGuard>>);
        impl Wake for OwnsChild {
            fn wake(self: Arc<Self>) {}
        }
        let child = shared.try_reserve_keyed(&"k").unwrap();
        let first = Waker::from(Arc::new(OwnsChild(Mutex::new(Some(child)))));
        let mut wait: Pin<Box<dyn Future<Output = _> + Send>> =
            Box::pin(shared.reserve_keyed_async(&"k"));
        assert!(wait
            .as_mut()
            .poll(&mut Context::from_waker(&first))
            .is_pending());
        drop(first);
        swap_wakers(wait.as_mut()).map(drop)
    });
    assert_eq!(outcome, Ok(()));
    assert_eq!(sup.busy_keys(), 0);
    assert_eq!(sup.stats().usage, 0);
}
