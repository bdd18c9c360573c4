//! Waiting for a supervisor to be idle: `wait_idle` and `wait_idle_async`, and the epoch that the leaver who empties a shard bumps (the supervisor's module docs argue the protocol).

use super::{Common, Supervisor};
use crate::sync::{now, Ordering::Relaxed};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

impl Supervisor {
    /// Blocks until no child is left, or `timeout` has passed; `true` if
    /// none was left.
    ///
    /// Sleeps on a condition variable: the child whose exit empties a
    /// shard wakes the waiters (if there are any: a drop with nobody waiting
    /// pays only a plain load), who re-check every shard. With
    /// `Duration::ZERO` this is a plain check. Children may be admitted
    /// again right after it returns `true`; call [`close`](Self::close)
    /// first to wait for the last one. In async code, use
    /// [`wait_idle_async`](Self::wait_idle_async): this call blocks the
    /// thread.
    ///
    /// A child that calls `wait_idle` on its own supervisor waits for
    /// itself: it counts as alive until it ends, so the call returns `false`
    /// when `timeout` runs out (and never returns without one), whatever the
    /// other children do.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::new(4)?;
    /// let guard = sup.reserve()?;
    /// assert!(!sup.wait_idle(Duration::ZERO));
    /// let job = std::thread::spawn(move || drop(guard));
    /// assert!(sup.wait_idle(Duration::from_secs(60)));
    /// assert_eq!(sup.usage(), 0);
    /// # job.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let common = &*self.inner.common;
        if common.is_idle() {
            return true;
        }
        if timeout.is_zero() {
            return false;
        }
        let deadline = now().checked_add(timeout);
        // Relaxed: published to leavers by the AcqRel RMW on each shard's
        // `given` that the scan in `is_idle` makes after it (module docs),
        // not by this RMW.
        common.waiters.fetch_add(1, Relaxed);
        let result = loop {
            // Step 1 of the module docs: the epoch before the scan.
            let seen = common.idle.lock().epoch;
            // Step 2: the scan, with the lock released.
            if common.is_idle() {
                break true;
            }
            // Step 3: sleep while no leaver has bumped the epoch since `seen`.
            let mut idle = common.idle.lock();
            let mut expired = false;
            while idle.epoch == seen && !expired {
                // A timeout too large to represent: wait in long steps.
                let step = deadline.unwrap_or_else(|| now() + Duration::from_secs(3600));
                let timed_out;
                (idle, timed_out) = common.idle_cv.wait_until(idle, step);
                expired = timed_out && deadline.is_some_and(|d| now() >= d);
            }
            drop(idle);
            if expired {
                break common.is_idle();
            }
        };
        // Relaxed: a leaver that still reads the old count only wakes
        // nobody, or wakes a waiter that re-checks.
        common.waiters.fetch_sub(1, Relaxed);
        result
    }

    /// Resolves when no child is left: the async form of
    /// [`wait_idle`](Self::wait_idle), for any executor.
    ///
    /// The future registers its task's waker with the supervisor; the child
    /// whose exit empties a shard wakes it, as it wakes `wait_idle`, and it
    /// re-checks every shard. It does not need the `tokio` feature: any
    /// executor that polls it works. For a deadline, wrap it in your
    /// runtime's timeout (`tokio::time::timeout`). Children may be admitted
    /// again right after it resolves; call [`close`](Self::close) first to
    /// wait for the last one.
    ///
    /// A child that awaits this on its own supervisor waits for itself: it
    /// counts as alive until it ends, so the future never resolves (until
    /// the timeout around it, if any).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future before it resolves removes its
    /// waker from the supervisor and leaves nothing behind.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = Supervisor::new(4)?;
    /// let guard = sup.reserve()?;
    /// let job = std::thread::spawn(move || drop(guard));
    /// sup.wait_idle_async().await;
    /// assert_eq!(sup.usage(), 0);
    /// # job.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_idle_async(&self) -> impl Future<Output = ()> + Send + '_ {
        WaitIdle {
            common: &self.inner.common,
            counted: false,
            registered: None,
        }
    }
}

/// What the idle lock guards.
#[derive(Debug, Default)]
pub(super) struct Idle {
    /// Bumped by every leaver that empties its shard while someone waits.
    /// Wraps; a waiter only compares it for equality with the value it read
    /// before its scan, and 2^64 wake-ups do not fit in one scan.
    epoch: u64,
    /// The wakers of pending [`WaitIdle`] futures, each with the future's
    /// key. A bump of the epoch takes them all, so while the epoch is the
    /// one a future registered under, its waker is still here.
    pub(super) wakers: Vec<(u64, Waker)>,
    /// The key of the next registration.
    next_key: u64,
}

impl Common {
    /// No unit held on any shard, read through the RMW that pairs with the
    /// leavers' releases (module docs). No unit means no occupied slot: a
    /// slot is freed before its unit is given back, and the RMW synchronizes
    /// with that give. Called without the idle lock.
    pub(super) fn is_idle(&self) -> bool {
        #[cfg(all(test, not(loom)))]
        super::tests::on_scan(self);
        let table = &self.table;
        (0..table.shard_count()).all(|i| table.shard(i).usage_synced() == 0)
    }

    #[cold]
    pub(super) fn wake_idle(&self) {
        // The bump is made under the lock: a waiter checks the epoch under
        // the same lock and sleeps without letting go of it in between, so
        // it either sees the bump or is already asleep when the notify
        // below runs.
        let mut idle = self.idle.lock();
        idle.epoch = idle.epoch.wrapping_add(1);
        let wakers = std::mem::take(&mut idle.wakers);
        drop(idle);
        // After unlocking, so the woken waiters do not wake into a held
        // lock, and no waker runs code of its executor under it.
        self.idle_cv.notify_all();
        // Every one woken even if one panics (`engine/foreign.rs`).
        crate::engine::foreign::each_then_resume(wakers, |(_, waker)| waker.wake());
    }
}

/// The future of [`Supervisor::wait_idle_async`]: the steps of the module
/// docs, with "register the waker" in place of "sleep".
struct WaitIdle<'a> {
    common: &'a Common,
    /// Counted in `Common::waiters`: from the first poll that found a child
    /// until the future resolves or is dropped.
    counted: bool,
    /// `(key, epoch)` while this future's waker is in `Idle::wakers`,
    /// registered under `epoch`.
    registered: Option<(u64, u64)>,
}

impl Future for WaitIdle<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let common = this.common;
        if let Some((key, seen)) = this.registered {
            let idle = common.idle.lock();
            if idle.epoch == seen {
                // No leaver has woken anyone since we registered: the wake
                // we wait for is still to come (module docs), and our
                // waker is still listed. Keep it current: compared under
                // the lock, cloned and dropped outside it (a waker is code
                // we do not own).
                match idle.wakers.iter().find(|(k, _)| *k == key) {
                    Some((_, waker)) if waker.will_wake(cx.waker()) => return Poll::Pending,
                    Some(_) => {
                        drop(idle);
                        let mut fresh = cx.waker().clone();
                        let mut idle = common.idle.lock();
                        if idle.epoch == seen {
                            if let Some((_, waker)) =
                                idle.wakers.iter_mut().find(|(k, _)| *k == key)
                            {
                                std::mem::swap(waker, &mut fresh);
                                drop(idle);
                                // The old waker, after the lock.
                                drop(fresh);
                                return Poll::Pending;
                            }
                        }
                        // Woken while the waker was cloned: scan again.
                        drop(idle);
                        drop(fresh);
                    }
                    None => {
                        // Not listed (cannot happen: only a bump or our own
                        // drop removes it): scan again rather than wait for
                        // nothing.
                        debug_assert!(false, "a registered waker went missing");
                    }
                }
            }
            // The epoch moved, and the bump took our waker: scan again.
            this.registered = None;
        }
        if !this.counted {
            if common.is_idle() {
                return Poll::Ready(());
            }
            // Relaxed: as in `wait_idle`, published to leavers by the RMWs
            // of the scan below.
            common.waiters.fetch_add(1, Relaxed);
            this.counted = true;
        }
        loop {
            // Step 1.
            let seen = common.idle.lock().epoch;
            // Step 2, without the lock.
            if common.is_idle() {
                this.finish();
                return Poll::Ready(());
            }
            // Step 3: register, unless a leaver bumped the epoch meanwhile.
            // The waker is cloned before the lock (and dropped after it if
            // unused): code we do not own.
            let waker = cx.waker().clone();
            let mut idle = common.idle.lock();
            if idle.epoch == seen {
                let key = idle.next_key;
                idle.next_key = key.wrapping_add(1);
                idle.wakers.push((key, waker));
                this.registered = Some((key, seen));
                return Poll::Pending;
            }
            drop(idle);
            drop(waker);
        }
    }
}

impl WaitIdle<'_> {
    /// Takes this future's waker out of the list (if a bump has not already
    /// taken it) and its count out of `waiters`.
    fn finish(&mut self) {
        if let Some((key, seen)) = self.registered.take() {
            let mut idle = self.common.idle.lock();
            let mut waker = None;
            if idle.epoch == seen {
                if let Some(at) = idle.wakers.iter().position(|(k, _)| *k == key) {
                    waker = Some(idle.wakers.swap_remove(at));
                }
            }
            drop(idle);
            // After the lock: a waker's drop is code we do not own (it may
            // end a child of this very supervisor).
            drop(waker);
        }
        if self.counted {
            self.counted = false;
            // Relaxed: as in `wait_idle`.
            self.common.waiters.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for WaitIdle<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}
