//! Running code the crate does not own over a batch: each item's turn
//! comes, whatever the ones before it do.
//!
//! Wakers are the usual case: a release, a resize or a close wakes several
//! waiters after letting its lock go, and one waker that panics must not
//! leave the others asleep. So each runs under `catch_unwind`, and the
//! first panic goes on up once every one has run ([`each_then_resume`]),
//! to the caller whose call woke them; on a thread of the crate's own
//! (the deadline watcher), which has no caller to tell, the panics are
//! dropped once the panic hook has reported them ([`each_quietly`]).
//! `catch_unwind` costs nothing until something panics.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// Runs `each` on every item, even if some panic; then lets the first
/// panic go on.
pub(crate) fn each_then_resume<T>(items: impl IntoIterator<Item = T>, mut each: impl FnMut(T)) {
    if let Some(payload) = each_caught(items, &mut each) {
        resume_unwind(payload);
    }
}

/// Runs `each` on every item, even if some panic, and drops the panics
/// (the hook has printed them): for a thread of ours, which has no caller
/// to tell and must go on. (Not under loom: the watcher is not built.)
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn each_quietly<T>(items: impl IntoIterator<Item = T>, mut each: impl FnMut(T)) {
    if let Some(payload) = each_caught(items, &mut each) {
        drop_quietly(payload);
    }
}

/// Runs `f`; a panic in it is dropped as in [`each_quietly`].
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn quietly(f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        drop_quietly(payload);
    }
}

/// Every item run; the first panic, if any (the later ones dropped).
fn each_caught<T>(
    items: impl IntoIterator<Item = T>,
    each: &mut impl FnMut(T),
) -> Option<Box<dyn Any + Send>> {
    let mut first = None;
    for item in items {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| each(item))) {
            match first {
                None => first = Some(payload),
                Some(_) => drop_quietly(payload),
            }
        }
    }
    first
}

/// Drops a panic's payload, whose own `Drop` is foreign code too: a panic
/// there is caught, and its payload forgotten (leaked, never dropped).
fn drop_quietly(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_and_the_first_panic_goes_on() {
        let mut ran = Vec::new();
        let caught = catch_unwind(AssertUnwindSafe(|| {
            each_then_resume(0..5, |i| {
                ran.push(i);
                if i % 2 == 1 {
                    panic!("item {i}");
                }
            })
        }));
        assert_eq!(ran, [0, 1, 2, 3, 4]);
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<String>().unwrap(), "item 1");
    }

    #[test]
    fn quietly_runs_every_item_and_returns() {
        let mut ran = 0;
        each_quietly(0..3, |_| {
            ran += 1;
            panic!("dropped");
        });
        assert_eq!(ran, 3);
        quietly(|| panic!("dropped too"));
    }
}
