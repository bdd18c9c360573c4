//! What a node's threads share: the node's settings and state, its view
//! of the membership, and each worker's cell (the part of a worker that
//! the keeper and the worker's handle reach). `node.rs` (the public
//! handle and the keeper), `worker.rs` (the worker's handle) and `run.rs`
//! (the worker's run loop) build on this module, and none on another's
//! insides.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sidejob::Limiter;
use sidejob_redis::{escape_name, Endpoint};

use crate::durability::Durability;
use crate::error::{Error, RedisError};
use crate::generation::Generation;
use crate::store::{now, Conn, Scripts};

/// Tolerated rate error between a node's monotonic clock and Redis' clock.
pub(crate) const CLOCK_RATE_MARGIN: f64 = 1e-3;

/// The longest pending-job TTL and worker shutdown TTL: a day, far from
/// any overflow of the clock arithmetic they go through.
pub(crate) const MAX_LONG_WAIT: Duration = Duration::from_secs(24 * 3600);

/// `d` from now, or as far as the clock goes: deadlines from settings never
/// overflow (and so never panic, in a `Drop` least of all).
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let t = now();
    t.checked_add(d)
        .or_else(|| t.checked_add(MAX_LONG_WAIT))
        .unwrap_or(t)
}

/// The name of one of the node's threads: `sidejob-pulse-<what>:<pool>`,
/// the pool's name escaped as in its keys (a thread name cannot hold a
/// NUL, a pool name can).
pub(crate) fn thread_name(what: &str, pool: &str) -> String {
    format!("sidejob-pulse-{what}:{}", escape_name(pool))
}

/// A node's settings, checked by [`NodeBuilder::join`](crate::NodeBuilder::join).
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) worker_ttl: Duration,
    pub(crate) pending_job_ttl: Duration,
    pub(crate) worker_shutdown_ttl: Duration,
    pub(crate) max_queued_jobs: usize,
    pub(crate) client_only: bool,
    pub(crate) job_sink_block: Duration,
    pub(crate) heartbeat_every: Duration,
    pub(crate) grace: Duration,
    pub(crate) stop_margin: Duration,
    pub(crate) io_timeout: Duration,
    pub(crate) durability: Durability,
}

impl Options {
    /// How long after sending a heartbeat that Redis accepted a worker may
    /// hold its jobs: `ttl·(1−2ρ) − stop_margin`. Redis removes the worker
    /// only at `ttl + grace` after its script ran (which is later, on
    /// Redis' clock).
    pub(crate) fn lease_window(&self) -> Duration {
        self.worker_ttl
            .mul_f64(1.0 - 2.0 * CLOCK_RATE_MARGIN)
            .saturating_sub(self.stop_margin)
    }
}

/// The membership as this node last saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    pub(crate) ver: u64,
    pub(crate) slots: Vec<String>,
    pub(crate) generation: String,
    /// Generations this node saw replaced, newest last (a few): a reply
    /// that left Redis before the change and is read after it names one,
    /// and must not bring it back.
    pub(crate) superseded: VecDeque<String>,
    pub(crate) shut: u64,
}

/// Superseded generations a node remembers.
const SUPERSEDED_KEPT: usize = 8;

/// What the node's threads share.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) prefix: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) opts: Options,
    pub(crate) scripts: Scripts,
    pub(crate) epoch: String,
    pub(crate) conn: Mutex<Conn>,
    pub(crate) view: Mutex<View>,
    pub(crate) state: Mutex<NodeState>,
    pub(crate) workers: Mutex<Vec<Arc<WorkerCell>>>,
    pub(crate) keeper: Mutex<Option<(mpsc::Sender<()>, JoinHandle<()>)>>,
    /// Told of each new generation ([`Node::watch_generation`](crate::Node::watch_generation)).
    pub(crate) watchers: Mutex<Vec<mpsc::Sender<Generation>>>,
}

#[derive(Debug, Default)]
pub(crate) struct NodeState {
    pub(crate) closed: bool,
    pub(crate) shutting: bool,
    /// The pool was shut down for good (seen here or in Redis).
    pub(crate) shut_down: bool,
}

/// Locks a mutex, recovering it if a panicking thread left it poisoned
/// (every value behind our locks is consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(crate) fn conn(&self) -> Result<Conn, RedisError> {
        Conn::new(&self.endpoint, self.opts.io_timeout)
    }

    /// After a script on `conn` recorded something a caller is told of
    /// (a dispatch, a stop): waits for what the node's [`Durability`]
    /// asks (replicas by `WAIT`; `Fsync` needs nothing more: the
    /// connection checked the server's settings when it opened).
    pub(crate) fn make_durable(&self, conn: &mut Conn) -> Result<(), Error> {
        if let Durability::Replicas { replicas, timeout } = self.opts.durability {
            let acked = conn.wait_replicas(replicas, timeout)?;
            if acked < replicas {
                return Err(Error::NotDurable {
                    replicas_acked: acked,
                    replicas_asked: replicas,
                    within: timeout,
                });
            }
        }
        Ok(())
    }

    /// Folds a newer membership into the view.
    pub(crate) fn learn_view(&self, ver: u64, slots: Option<Vec<String>>) {
        let mut v = lock(&self.view);
        if let Some(slots) = slots {
            if ver >= v.ver {
                v.ver = ver;
                v.slots = slots;
            }
        }
    }

    /// Folds a generation read from Redis into the view; tells every
    /// watcher if it is a new one. An empty one (no pool) changes nothing,
    /// nor does one this node saw replaced (a late reply).
    pub(crate) fn learn_generation(&self, generation: &str) {
        if generation.is_empty() {
            return;
        }
        {
            let mut v = lock(&self.view);
            if v.generation == generation || v.superseded.iter().any(|g| g == generation) {
                return;
            }
            let old = std::mem::replace(&mut v.generation, generation.to_string());
            if old.is_empty() {
                return;
            }
            if v.superseded.len() == SUPERSEDED_KEPT {
                v.superseded.pop_front();
            }
            v.superseded.push_back(old);
        }
        // Outside the view's lock; a send on a channel runs no user code
        // and never blocks. A watcher whose receiver is gone is dropped.
        let g = Generation(generation.to_string());
        lock(&self.watchers).retain(|w| w.send(g.clone()).is_ok());
    }

    /// Whether this node may act. A pool this node saw shutting down is
    /// left for Redis to judge: it answers `ShuttingDown` while the
    /// shutdown runs and `PoolShutDown` once it is done.
    pub(crate) fn check_open(&self) -> Result<(), Error> {
        let s = lock(&self.state);
        if s.closed {
            Err(Error::Closed)
        } else if s.shut_down {
            Err(Error::PoolShutDown)
        } else {
            Ok(())
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.state).closed
    }

    pub(crate) fn is_shutting(&self) -> bool {
        lock(&self.state).shutting
    }

    /// Records that the pool was shut down for good; the error to answer.
    pub(crate) fn saw_shut_down(&self) -> Error {
        let mut st = lock(&self.state);
        st.shutting = true;
        st.shut_down = true;
        Error::PoolShutDown
    }
}

/// 128 random bits in hex (std's randomly seeded hasher, twice).
pub(crate) fn random_id() -> String {
    let part = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", part(), part())
}

/// What the worker thread, the keeper and the handle share.
pub(crate) struct WorkerCell {
    pub(crate) state: Mutex<CellState>,
    pub(crate) changed: Condvar,
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
pub(crate) struct CellState {
    /// The current incarnation's id in Redis ("" when not registered).
    pub(crate) wid: String,
    pub(crate) valid_until: Option<Instant>,
    /// The generation of the pool's state this worker has asserted its
    /// jobs under.
    pub(crate) generation: String,
    /// The keeper found the worker forgotten by a Redis that lost state.
    pub(crate) reregister: bool,
    pub(crate) removing: bool,
    pub(crate) exited: bool,
    pub(crate) running: usize,
}

impl WorkerCell {
    pub(crate) fn wid(&self) -> String {
        lock(&self.state).wid.clone()
    }

    /// The keeper's heartbeat answer for incarnation `wid`.
    pub(crate) fn heartbeat_result(
        &self,
        wid: &str,
        renewed: bool,
        valid_until: Instant,
        generation: &str,
        s: &Shared,
        conn: &mut Conn,
    ) {
        let mut st = lock(&self.state);
        if st.wid != wid {
            return;
        }
        if renewed {
            st.valid_until = Some(st.valid_until.map_or(valid_until, |v| v.max(valid_until)));
        } else if !generation.is_empty() && st.generation != generation {
            // Forgotten by a Redis that lost its state: re-register at once
            // (the lease still runs) and re-assert the jobs.
            st.reregister = true;
        }
        let poke = !renewed || (!generation.is_empty() && st.generation != generation);
        drop(st);
        if poke {
            wake(s, conn, wid);
        }
    }

    /// Asks the worker to leave (its jobs move); returns at once.
    pub(crate) fn begin_remove(&self, s: &Shared) {
        let wid = {
            let mut st = lock(&self.state);
            st.removing = true;
            st.wid.clone()
        };
        if let Ok(mut c) = s.conn() {
            wake(s, &mut c, &wid);
        }
    }

    /// Waits until the worker thread has exited, or `deadline`.
    pub(crate) fn wait_exit(&self, deadline: Instant) -> bool {
        let mut st = lock(&self.state);
        while !st.exited {
            let left = deadline.saturating_duration_since(now());
            if left.is_zero() {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(st);
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
        true
    }
}

fn wake(s: &Shared, conn: &mut Conn, wid: &str) {
    if wid.is_empty() {
        return;
    }
    // NOMKSTREAM: a wake-up never creates a mailbox (nor re-creates one of
    // a pool that is gone).
    let _ = conn.cmd(
        redis::cmd("XADD")
            .arg(format!("{}s:{wid}", s.prefix))
            .arg("NOMKSTREAM")
            .arg("MAXLEN")
            .arg("~")
            .arg(100_000)
            .arg("*")
            .arg("t")
            .arg("w"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_from_settings_never_overflow() {
        let t = now();
        assert!(deadline_after(Duration::MAX) >= t);
        let d = deadline_after(Duration::from_secs(60));
        assert!(d >= t + Duration::from_secs(60) && d <= now() + Duration::from_secs(60));
    }

    #[test]
    fn thread_names_hold_no_nul() {
        assert_eq!(thread_name("keeper", "a\0b"), "sidejob-pulse-keeper:a%00b");
        assert_eq!(
            thread_name("worker", "tenants"),
            "sidejob-pulse-worker:tenants"
        );
    }
}
