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
//!
//! A user's value dropped by the crate (a request nobody will handle, a
//! reply nobody reads, a panic's payload) is foreign code too: its `Drop`
//! may panic, and must not take a worker down ([`drop_quietly`],
//! [`drop_payload`]).
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
        drop_payload(payload);
    }
}

/// Runs `f`; a panic in it is dropped as in [`each_quietly`].
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn quietly(f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        drop_payload(payload);
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
                Some(_) => drop_payload(payload),
            }
        }
    }
    first
}

/// Drops `value`, catching a panic from its `Drop`.
pub(crate) fn drop_quietly<T>(value: T) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        drop_payload(payload);
    }
}

/// Drops a caught panic's payload, which is user data (`panic_any`) and
/// whose `Drop` may panic in turn.
pub(crate) fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        // The payload's drop panicked, and the new payload may be just as
        // hostile: dropping it could panic again, and so on without end. One
        // retry under a catch covers the common case (a payload whose Drop
        // panics with a plain message); anything past that is leaked rather
        // than risking the loop (forgetting is safe, and only leaks memory).
        if let Err(third) = catch_unwind(AssertUnwindSafe(move || drop(again))) {
            std::mem::forget(third);
        }
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
