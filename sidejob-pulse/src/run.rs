//! A worker's run loop: one thread that reads its mailbox (a Redis
//! stream), claims the jobs assigned to it, runs the user's [`Handler`],
//! and hands jobs over when the membership changes; a sidejob
//! [`Limiter`](sidejob::Limiter) bounds how many of its jobs run at once.
//!
//! The worker holds its jobs only while its lease is valid on its own
//! monotonic clock: `valid_until = t_send + ttl·(1−2ρ) − margin` after the
//! last heartbeat Redis accepted. It never blocks past that instant (its
//! mailbox read is cut short there), and when it passes without renewal it
//! stops every job ([`StopReason::LeaseLost`]) before Redis, at `ttl +
//! grace` after the heartbeat on Redis' clock, can give them away.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sidejob::OwnedPermit;

use crate::error::{Error, RedisError};
use crate::job::{Handler, Job, StopReason, Token};
use crate::route::route;
use crate::shared::{deadline_after, lock, random_id, Options, Shared, WorkerCell};
use crate::store::{ms, now, num, slots_from, text, Arg, Conn, Msg, Tag};

struct Running {
    token: u64,
    payload: Vec<u8>,
    _permit: OwnedPermit,
}

enum Handoff {
    /// Hand the job (stopped here, or never started) to its owner now; its
    /// payload is kept in case Redis loses the record meanwhile.
    Move(String, u64, Vec<u8>),
    /// The job was stopped on request: forget it (or re-place it).
    Done(String, u64),
}

/// The worker thread's state.
pub(crate) struct Run {
    s: Arc<Shared>,
    cell: Arc<WorkerCell>,
    handler: Box<dyn Handler>,
    conn: Conn,
    wid: String,
    stream: String,
    last_id: String,
    running: HashMap<String, Running>,
    waiting: VecDeque<(String, u64, Vec<u8>)>,
    handoffs: VecDeque<Handoff>,
    /// Left the slots (removal phase 1 done).
    left: bool,
    /// Something waits on Redis: wake again soon.
    retry: bool,
    shutdown: bool,
    remove_deadline: Option<Instant>,
    /// A membership change arrived before the jobs were re-asserted after
    /// a state loss: rebalance once they are.
    rebalance_due: bool,
    /// Jobs this worker stopped (or had not started) when the pool's state
    /// was lost under it, to hand back once the pool is re-created.
    /// By key.
    lost: HashMap<String, Lost>,
}

/// A job the worker held when the pool's state was lost: what it needs
/// to hand the job back (`lua/handback.lua`).
struct Lost {
    token: u64,
    payload: Vec<u8>,
    /// The epoch of the pool the worker held it in.
    epoch: String,
}

/// The epoch part of a generation `epoch:losses` (the pool's creation).
fn epoch_of(generation: &str) -> &str {
    generation
        .rsplit_once(':')
        .map_or(generation, |(epoch, _)| epoch)
}

const RETRY: Duration = Duration::from_millis(50);

impl Run {
    /// A worker's run loop, not registered yet.
    pub(crate) fn new(
        s: Arc<Shared>,
        cell: Arc<WorkerCell>,
        handler: Box<dyn Handler>,
        conn: Conn,
    ) -> Run {
        Run {
            s,
            cell,
            handler,
            conn,
            wid: String::new(),
            stream: String::new(),
            last_id: "0".into(),
            running: HashMap::new(),
            waiting: VecDeque::new(),
            handoffs: VecDeque::new(),
            left: false,
            retry: false,
            shutdown: false,
            remove_deadline: None,
            rebalance_due: false,
            lost: HashMap::new(),
        }
    }

    /// The current incarnation's id ("" before the first registration).
    pub(crate) fn wid(&self) -> &str {
        &self.wid
    }

    fn opts(&self) -> &Options {
        &self.s.opts
    }

    /// Registers incarnation `wid` (a new id, or the same one again after
    /// Redis lost its state).
    pub(crate) fn register(&mut self, wid: &str) -> Result<(), Error> {
        let t_send = now();
        // No epoch once the pool is shutting down: a missing pool is then
        // a closed one, not to be re-created.
        let epoch = if self.s.is_shutting() {
            String::new()
        } else {
            self.s.epoch.clone()
        };
        let a = self.conn.run(
            &self.s.scripts.register,
            &self.s.prefix,
            &[
                Arg::N(ms(self.opts().worker_ttl)),
                Arg::N(ms(self.opts().grace)),
                Arg::S(&epoch),
                Arg::S(wid),
                Arg::N(ms(self.opts().pending_job_ttl)),
            ],
        )?;
        match Tag::of(&a) {
            Some(Tag::Ok) => {}
            Some(Tag::ShuttingDown) => return Err(Error::ShuttingDown),
            Some(Tag::Closed) => return Err(Error::PoolShutDown),
            _ => return Err(RedisError(format!("unexpected register reply {a:?}")).into()),
        }
        let generation = a.get(2).map(text).unwrap_or_default();
        self.s
            .learn_view(a.get(1).map(num).unwrap_or(0), Some(slots_from(&a, 3)));
        self.s.learn_generation(&generation);
        let fresh = wid != self.wid;
        {
            let mut st = lock(&self.cell.state);
            st.wid = wid.to_string();
            st.valid_until = Some(t_send + self.opts().lease_window());
            st.reregister = false;
            if fresh {
                st.generation = generation;
            }
        }
        if fresh {
            self.wid = wid.to_string();
            self.stream = format!("{}s:{wid}", self.s.prefix);
            self.last_id = "0".into();
        }
        Ok(())
    }

    pub(crate) fn main(mut self) {
        self.serve();
        let mut st = lock(&self.cell.state);
        st.exited = true;
        st.wid.clear();
        st.running = 0;
        self.cell.changed.notify_all();
    }

    fn serve(&mut self) {
        loop {
            let (valid_until, reregister, removing, generation) = {
                let st = lock(&self.cell.state);
                (
                    st.valid_until,
                    st.reregister,
                    st.removing,
                    st.generation.clone(),
                )
            };
            let t = now();
            let valid_until = valid_until.unwrap_or(t);
            if t >= valid_until {
                // The lease ran out on our clock: stop everything before
                // Redis can give it away, then join again as a new worker.
                self.lose_all(StopReason::LeaseLost);
                self.leave(2);
                if removing || self.shutdown || self.s.is_closed() {
                    return;
                }
                if !self.rejoin() {
                    return;
                }
                continue;
            }
            if self.shutdown {
                self.lose_all(StopReason::Shutdown);
                self.leave(2);
                return;
            }
            if reregister {
                let wid = self.wid.clone();
                if self.register(&wid).is_err() {
                    self.retry = true;
                }
            }
            let current = lock(&self.s.view).generation.clone();
            if !current.is_empty() && current != generation && !reregister {
                self.adopt_all(&current);
            }
            if removing {
                let deadline = *self
                    .remove_deadline
                    .get_or_insert_with(|| deadline_after(self.s.opts.worker_shutdown_ttl));
                if !self.left {
                    if self.leave(1) {
                        self.left = true;
                        self.refresh_view();
                        self.rebalance();
                    } else {
                        self.retry = true;
                    }
                }
                self.pump();
                let idle =
                    self.running.is_empty() && self.waiting.is_empty() && self.handoffs.is_empty();
                if (self.left && idle) || now() >= deadline {
                    self.lose_all(StopReason::Moved);
                    self.leave(2);
                    return;
                }
            }
            let mut block = self.opts().job_sink_block.min(valid_until - t);
            if self.retry {
                block = block.min(RETRY);
            }
            match self.conn.xread(&self.stream, &self.last_id.clone(), block) {
                Ok(_) if !self.lease_valid() => {
                    // Woken after the lease ran out (frozen in the read, say):
                    // act on nothing (the messages stay unread); the top of
                    // the loop stops every job.
                    continue;
                }
                Ok(msgs) => {
                    let n = msgs.len();
                    for m in msgs {
                        self.last_id = m.id.clone();
                        self.handle(m);
                    }
                    if n > 0 {
                        let _ = self.conn.cmd(
                            redis::cmd("XTRIM")
                                .arg(&self.stream)
                                .arg("MINID")
                                .arg(&self.last_id),
                        );
                    }
                }
                Err(_) => {
                    // Redis unreachable: try again shortly, never past the
                    // lease.
                    let pause = RETRY.min(valid_until.saturating_duration_since(now()));
                    std::thread::sleep(pause);
                }
            }
            self.pump();
            lock(&self.cell.state).running = self.running.len();
        }
    }

    /// Whether the lease, as the keeper last renewed it, still runs.
    fn lease_valid(&self) -> bool {
        lock(&self.cell.state)
            .valid_until
            .is_some_and(|v| now() < v)
    }

    /// After a lease loss: a new incarnation, retried until Redis answers
    /// or the node closes.
    fn rejoin(&mut self) -> bool {
        self.left = false;
        loop {
            if self.s.is_closed() || lock(&self.cell.state).removing {
                return false;
            }
            match self.register(&random_id()) {
                Ok(()) => return true,
                Err(Error::ShuttingDown | Error::PoolShutDown) => return false,
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Leaves the slots (phase 1) or the pool (phase 2); one try.
    fn leave(&mut self, phase: u64) -> bool {
        if self.wid.is_empty() {
            return true;
        }
        let r = self.conn.run(
            &self.s.scripts.leave,
            &self.s.prefix,
            &[Arg::S(&self.wid.clone()), Arg::N(phase)],
        );
        if phase == 2 {
            lock(&self.cell.state).wid.clear();
        }
        r.is_ok()
    }

    fn refresh_view(&mut self) {
        if let Ok(a) = self.conn.run(&self.s.scripts.view, &self.s.prefix, &[]) {
            self.s
                .learn_view(a.first().map(num).unwrap_or(0), Some(slots_from(&a, 4)));
            self.s
                .learn_generation(&a.get(1).map(text).unwrap_or_default());
        }
    }

    /// Whether this worker's jobs are asserted under the pool's current
    /// generation. After Redis lost state they are not, and until they are
    /// the worker moves nothing and claims nothing: its records may be
    /// missing, and a hand-over would find no record and drop the job.
    fn adopted(&self) -> bool {
        let current = lock(&self.s.view).generation.clone();
        current.is_empty() || current == lock(&self.cell.state).generation
    }

    fn owner(&self, key: &str) -> String {
        let v = lock(&self.s.view);
        route(key.as_bytes(), &v.slots).unwrap_or("").to_string()
    }

    fn handle(&mut self, m: Msg) {
        match m.kind.as_str() {
            "s" => {
                if let Some(r) = self.running.get(&m.key) {
                    if r.token >= m.token {
                        return;
                    }
                    // A newer assignment of a job we run: hand the old
                    // run over first (it cannot happen without a lost
                    // state, but the order stays stop-then-start).
                    let r = self.running.remove(&m.key).expect("present");
                    self.call_stop(&m.key, r.token, StopReason::Superseded);
                }
                if let Some(w) = self.waiting.iter_mut().find(|w| w.0 == m.key) {
                    if w.1 < m.token {
                        *w = (m.key, m.token, m.payload);
                    }
                } else {
                    self.waiting.push_back((m.key, m.token, m.payload));
                }
                // Start it before the next message: a notification mailed
                // right after the start finds the job running.
                self.pump();
            }
            "x" => {
                if self.running.get(&m.key).is_some_and(|r| r.token == m.token) {
                    self.running.remove(&m.key);
                    self.call_stop(&m.key, m.token, StopReason::Requested);
                }
                self.waiting.retain(|w| !(w.0 == m.key && w.1 == m.token));
                self.handoffs.push_back(Handoff::Done(m.key, m.token));
            }
            "n" => {
                if let Some(r) = self.running.get(&m.key) {
                    let token = Token::from_raw(r.token);
                    let (h, key, p) = (&mut self.handler, &m.key, &m.payload);
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        h.notify(key, token, p)
                    }));
                }
            }
            "m" => {
                if m.ver > lock(&self.s.view).ver {
                    self.refresh_view();
                }
                if self.adopted() {
                    self.rebalance();
                } else {
                    self.rebalance_due = true;
                }
            }
            "X" => self.shutdown = true,
            _ => {}
        }
    }

    fn call_stop(&mut self, key: &str, token: u64, why: StopReason) {
        let h = &mut self.handler;
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.stop(key, Token::from_raw(token), why)
        }));
    }

    /// Stops and hands over every running job another worker owns now.
    fn rebalance(&mut self) {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|k| self.owner(k) != self.wid)
            .cloned()
            .collect();
        for k in gone {
            let r = self.running.remove(&k).expect("present");
            self.call_stop(&k, r.token, StopReason::Moved);
            self.handoffs
                .push_back(Handoff::Move(k, r.token, r.payload));
        }
    }

    fn lose_all(&mut self, why: StopReason) {
        // A lost lease may mean that Redis lost the pool's state: keep what
        // is needed to hand each job back if it did (`hand_back`).
        let keep = why == StopReason::LeaseLost;
        let all: Vec<(String, Running)> = self.running.drain().collect();
        let mut kept = Vec::new();
        for (k, r) in all {
            self.call_stop(&k, r.token, why);
            if keep {
                kept.push((k, r.token, r.payload));
            }
        }
        let waiting = std::mem::take(&mut self.waiting);
        let handoffs = std::mem::take(&mut self.handoffs);
        let epoch = epoch_of(&lock(&self.cell.state).generation).to_string();
        // (An empty epoch: never registered, so nothing was held.)
        if keep && !epoch.is_empty() {
            kept.extend(waiting);
            kept.extend(handoffs.into_iter().filter_map(|h| match h {
                Handoff::Move(k, t, p) => Some((k, t, p)),
                Handoff::Done(..) => None,
            }));
            self.keep_lost(kept, &epoch);
        }
        lock(&self.cell.state).running = 0;
    }

    /// Records jobs to hand back if the pool turns out to be re-created
    /// (one entry per key: the newest token).
    fn keep_lost(&mut self, jobs: Vec<(String, u64, Vec<u8>)>, epoch: &str) {
        for (key, token, payload) in jobs {
            let l = Lost {
                token,
                payload,
                epoch: epoch.to_string(),
            };
            match self.lost.entry(key) {
                Entry::Occupied(mut o) if o.get().token < token => {
                    o.insert(l);
                }
                Entry::Occupied(_) => {}
                Entry::Vacant(v) => {
                    v.insert(l);
                }
            }
        }
    }

    /// Hands the jobs kept at a state loss back to the pool (as orphans
    /// that their owners start under new tokens; only into a pool
    /// re-created since, and only keys it does not hold: see
    /// `lua/handback.lua`). Kept for another try if Redis fails or the
    /// pool is missing; dropped if the pool is shutting down.
    fn hand_back(&mut self) {
        const BATCH: usize = 100;
        while !self.lost.is_empty() {
            let keys: Vec<String> = self.lost.keys().take(BATCH).cloned().collect();
            let toks: Vec<String> = keys
                .iter()
                .map(|k| self.lost[k].token.to_string())
                .collect();
            let mut args = vec![
                Arg::N(ms(self.s.opts.worker_ttl)),
                Arg::N(ms(self.s.opts.grace)),
                Arg::N(ms(self.s.opts.pending_job_ttl)),
            ];
            for (k, t) in keys.iter().zip(&toks) {
                let l = &self.lost[k];
                args.push(Arg::S(k));
                args.push(Arg::S(t));
                args.push(Arg::B(&l.payload));
                args.push(Arg::S(&l.epoch));
            }
            let a = self
                .conn
                .run(&self.s.scripts.handback, &self.s.prefix, &args);
            match a.as_deref().ok().and_then(Tag::of) {
                Some(Tag::Ok | Tag::ShuttingDown | Tag::Closed) => {
                    for k in &keys {
                        self.lost.remove(k);
                    }
                }
                _ => {
                    // NOPOOL (not re-created yet) or Redis failing.
                    self.retry = true;
                    return;
                }
            }
        }
    }

    /// Re-asserts every running job after Redis lost state.
    fn adopt_all(&mut self, generation: &str) {
        let keys: Vec<String> = self.running.keys().cloned().collect();
        for k in keys {
            let (tok, payload) = {
                let r = &self.running[&k];
                (r.token.to_string(), r.payload.clone())
            };
            let a = self.conn.run(
                &self.s.scripts.adopt,
                &self.s.prefix,
                &[
                    Arg::N(ms(self.s.opts.worker_ttl)),
                    Arg::N(ms(self.s.opts.grace)),
                    Arg::S(&self.wid.clone()),
                    Arg::S(&k),
                    Arg::S(&tok),
                    Arg::B(&payload),
                ],
            );
            match a.as_deref().ok().and_then(Tag::of) {
                Some(Tag::Ok) => {}
                Some(Tag::Gone) => {
                    // Not a member of the new generation yet: register
                    // (same id, the lease still runs), then adopt.
                    lock(&self.cell.state).reregister = true;
                    self.retry = true;
                    return;
                }
                Some(_) => {
                    if let Some(r) = self.running.remove(&k) {
                        self.call_stop(&k, r.token, StopReason::Superseded);
                    }
                }
                None => {
                    self.retry = true;
                    return;
                }
            }
        }
        let before = std::mem::replace(
            &mut lock(&self.cell.state).generation,
            generation.to_string(),
        );
        if !before.is_empty() && epoch_of(&before) != epoch_of(generation) {
            // The pool was re-created: the jobs assigned here and not
            // started, and those stopped here and not yet handed over,
            // have lost their records; hand them back (a copy: whatever
            // the new pool assigned meanwhile stays where it is).
            let mut kept: Vec<(String, u64, Vec<u8>)> = self.waiting.iter().cloned().collect();
            kept.extend(self.handoffs.iter().filter_map(|h| match h {
                Handoff::Move(k, t, p) => Some((k.clone(), *t, p.clone())),
                Handoff::Done(..) => None,
            }));
            self.keep_lost(kept, epoch_of(&before));
        }
        if std::mem::take(&mut self.rebalance_due) {
            self.rebalance();
        }
    }

    /// Retries hand-overs and starts waiting jobs, as far as Redis and the
    /// local bound allow.
    fn pump(&mut self) {
        self.retry = false;
        if !self.lost.is_empty() {
            self.hand_back();
        }
        if !self.adopted() {
            self.retry = true;
            return;
        }
        let mut tries = self.handoffs.len() * 2;
        while let Some(h) = self.handoffs.pop_front() {
            match self.handoff(&h) {
                Ok(true) => {}
                Ok(false) if tries > 0 => {
                    tries -= 1;
                    self.handoffs.push_back(h);
                }
                _ => {
                    self.handoffs.push_front(h);
                    self.retry = true;
                    break;
                }
            }
        }
        while let Some((key, token, _)) = self.waiting.front() {
            let (key, token) = (key.clone(), *token);
            if self.owner(&key) != self.wid {
                let (_, _, payload) = self.waiting.pop_front().expect("front");
                self.handoffs.push_back(Handoff::Move(key, token, payload));
                self.retry = true;
                continue;
            }
            let Ok(permit) = self.cell.limiter.try_acquire_owned() else {
                break; // full: a stop on this thread frees a unit
            };
            if !self.lease_valid() {
                break;
            }
            let tok = token.to_string();
            let a = self.conn.run(
                &self.s.scripts.take,
                &self.s.prefix,
                &[
                    Arg::N(ms(self.s.opts.worker_ttl)),
                    Arg::N(ms(self.s.opts.grace)),
                    Arg::N(lock(&self.s.view).ver),
                    Arg::S(&self.wid.clone()),
                    Arg::S(&key),
                    Arg::S(&tok),
                ],
            );
            match a.as_deref().ok().and_then(Tag::of) {
                Some(Tag::Ok) => {
                    let (key, token, payload) = self.waiting.pop_front().expect("front");
                    let job = Job {
                        key: key.clone(),
                        payload: payload.clone(),
                        token: Token::from_raw(token),
                    };
                    let h = &mut self.handler;
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.start(job)));
                    self.running.insert(
                        key,
                        Running {
                            token,
                            payload,
                            _permit: permit,
                        },
                    );
                }
                Some(Tag::Lost) => {
                    self.waiting.pop_front();
                }
                Some(Tag::Stale) => {
                    let a = a.expect("ok");
                    self.s
                        .learn_view(a.get(1).map(num).unwrap_or(0), Some(slots_from(&a, 2)));
                }
                _ => {
                    // WAIT (learning after a state loss) or Redis failing.
                    self.retry = true;
                    break;
                }
            }
        }
        lock(&self.cell.state).running = self.running.len();
    }

    /// One hand-over: `Ok(true)` done, `Ok(false)` the membership moved
    /// (view refreshed, try again).
    fn handoff(&mut self, h: &Handoff) -> Result<bool, Error> {
        let wid = self.wid.clone();
        let a = match h {
            Handoff::Move(key, token, _) => {
                let to = self.owner(key);
                self.conn.run(
                    &self.s.scripts.moved,
                    &self.s.prefix,
                    &[
                        Arg::N(ms(self.s.opts.worker_ttl)),
                        Arg::N(ms(self.s.opts.grace)),
                        Arg::N(ms(self.s.opts.pending_job_ttl)),
                        Arg::N(lock(&self.s.view).ver),
                        Arg::S(&wid),
                        Arg::S(key),
                        Arg::S(&token.to_string()),
                        Arg::S(&to),
                    ],
                )?
            }
            Handoff::Done(key, token) => self.conn.run(
                &self.s.scripts.done,
                &self.s.prefix,
                &[
                    Arg::N(ms(self.s.opts.worker_ttl)),
                    Arg::N(ms(self.s.opts.grace)),
                    Arg::N(ms(self.s.opts.pending_job_ttl)),
                    Arg::S(&wid),
                    Arg::S(key),
                    Arg::S(&token.to_string()),
                ],
            )?,
        };
        if Tag::of(&a) == Some(Tag::Stale) {
            self.s
                .learn_view(a.get(1).map(num).unwrap_or(0), Some(slots_from(&a, 2)));
            return Ok(false);
        }
        Ok(true)
    }
}
