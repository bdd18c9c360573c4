//! Fail-fast, sharded capacity limits: a Rust take on Erlang's
//! [`sidejob`](https://github.com/basho/sidejob), the library Riak uses to
//! bound its request state machines.
//!
//! A service under more load than it can handle should say "busy" at once
//! to the excess, not queue it: a queue that grows without bound turns
//! overload into latency for everyone, then into memory exhaustion.
//! `sidejob` gives every hot path a hard capacity and answers
//! [`Error::Overload`] the moment it is reached, in a few nanoseconds,
//! without a lock or a shared hot counter.
//!
//! # Hello, overload
//!
//! ```
//! use sidejob::{Error, Pool, Worker};
//!
//! /// The state of one worker; handlers take `&mut self`, no locks.
//! struct Kv(std::collections::HashMap<String, u64>);
//!
//! impl Worker for Kv {
//!     type Request = String;          // a key to read
//!     type Reply = Option<u64>;
//!     type Message = (String, u64);   // a write, fire and forget
//!     fn handle_call(&mut self, key: String) -> Option<u64> {
//!         self.0.get(&key).copied()
//!     }
//!     fn handle_cast(&mut self, (key, value): (String, u64)) {
//!         self.0.insert(key, value);
//!     }
//! }
//!
//! let pool = Pool::builder()
//!     .name("kv")
//!     .capacity(1) // at most one request queued or running
//!     .workers(1)
//!     .build(|_index| Kv(Default::default()))?;
//!
//! pool.cast(("answer".to_string(), 42))?;
//! // The cast holds the only unit until the worker has handled it; by the
//! // time this call is admitted it has, so the call sees the write.
//! let reply = loop {
//!     match pool.call("answer".to_string()) {
//!         Ok(reply) => break reply,
//!         Err(Error::Overload) => std::thread::yield_now(), // shed, or retry
//!         Err(other) => return Err(other.into()),
//!     }
//! };
//! assert_eq!(reply, Some(42));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! State is per worker: with `workers(1)` every request meets the same map,
//! but with more workers a write cast handled by one worker is invisible to
//! a read served by another. Keep shared state behind `workers(1)`, route
//! each key to one pool of its own, or share it explicitly (an `Arc` the
//! factory hands to every worker).
//!
//! # Guide
//!
//! The [`guide`] module has a page per topic; the sections below give
//! each in brief.
//!
//! * [`guide::choosing`]: which front-end for which work, and what one
//!   unit of capacity is in each.
//! * [`guide::waiting`]: a bounded waiting room, when failing fast is too
//!   strict; queue orders.
//! * [`guide::resizing`]: moving the capacity at run time.
//! * [`guide::priority`]: priority classes, the least important work
//!   refused first under overload.
//! * [`guide::fairness`]: fair shares among tenant keys, by weight,
//!   with per-key caps.
//! * [`guide::adaptive`]: a capacity that follows the backend (which
//!   algorithm for what), and a claim size for a task loop.
//! * [`guide::keyed`]: one at a time per key, for children and for pool
//!   requests.
//! * [`guide::stealing`]: queued work taken by whichever worker is free.
//! * [`guide::async_workers`]: stateful handlers that await I/O.
//! * [`guide::tower`]: limiting an axum, tonic or hyper service.
//! * [`guide::metrics`]: metrics export and health alarms.
//! * [`guide::shepherd`]: retried and delayed idempotent operations.
//! * [`guide::semantics`]: every promise, in full.
//! * [`guide::correctness`]: how the promises are checked.
//!
//! # Choosing a front-end
//!
//! All of them share one engine, the sharded admission table, and one
//! [`Stats`] snapshot type.
//!
//! | you want to bound | use | one unit is | released when |
//! |---|---|---|---|
//! | work on the caller's own thread | [`Limiter`] | a [`Permit`] / [`OwnedPermit`] | the permit drops |
//! | requests to stateful workers (gen_server style) whose handlers block or compute | [`Pool`] | a `call` or `cast` | the worker has *finished* handling it |
//! | requests to stateful workers whose handlers await I/O (feature `tokio`) | `AsyncPool`, from [`PoolBuilder::build_async`](PoolBuilder) | a `call_async` or `cast` | the worker has *finished* handling it |
//! | spawned children: threads, tokio tasks, anything | [`Supervisor`] | a [`Child`], [`ChildGuard`] or `Task` | the child ends, normally or by panic |
//! | idempotent operations that may fail, retried and delayed on one worker per resource | [`Shepherd`](shepherd::Shepherd) | an operation, from `submit` | its final outcome, after every retry |
//! | an HTTP or gRPC route (feature `tower`) | `tower::LimitLayer` over a [`Limiter`] | a request | its response is ready |
//!
//! More in [`guide::choosing`].
//!
//! # Fail fast, or wait a little
//!
//! Admission fails fast by default: full means [`Error::Overload`] at once.
//! Each builder can also give its front-end a bounded waiting room
//! (`max_waiters`, `max_wait`, [`QueueOrder`]): a caller refused by the
//! table waits if the room has space, and a freed unit is handed straight
//! to the next waiter (FIFO by default), never to a newcomer. The `try_`
//! forms never wait. [`Limiter::acquire`], [`Limiter::acquire_async`],
//! [`Pool::call`], [`Pool::call_async`], [`Supervisor::reserve_async`] and
//! friends wait under the policy. More in [`guide::waiting`].
//!
//! # Resizing
//!
//! [`Limiter::set_capacity`] (and the same on [`Pool`] and [`Supervisor`])
//! moves the capacity at run time, exactly: once it returns, nothing is
//! admitted while that many units are held. A shrink never revokes a unit;
//! those above the new capacity drain first. `available()` says how many
//! units are free, to size a batch of claims. More in [`guide::resizing`].
//!
//! # Requests of different sizes
//!
//! [`Limiter::try_acquire_many`] takes `n` units at once, all or nothing,
//! from one shard or, when none has room, from several;
//! [`Limiter::acquire_many`] and its async forms wait for them, letting
//! small requests pass a waiting large one for a bounded budget, then
//! keeping freed units for it (neither tokio's strict FIFO nor first
//! fit). Permits of many units split, merge and forget;
//! [`Limiter::add_capacity`] and [`Limiter::remove_capacity`] resize by a
//! difference. More in [`guide::weighted`].
//!
//! # One at a time per key
//!
//! [`Supervisor::reserve_keyed`] and its siblings (`try_`, `_async`, and
//! with feature `tokio` `spawn_task_keyed`) admit a child of a key: at most
//! `per_key` live children per key (1 by default) on top of the capacity,
//! so a workflow's tasks run one after another while different workflows
//! run in parallel. A busy key answers [`Error::KeyBusy`] at once, or waits
//! first come first served per key under the waiting policy.
//!
//! [`Pool::call_keyed`], [`Pool::cast_keyed`] and [`Pool::call_keyed_async`]
//! do the same for pool requests: one key's requests are handled one at a
//! time, in admission order, different keys in parallel. [`KeyedMode`]
//! picks how: `Pinned` (the default) runs a key's requests on its own
//! worker (jump consistent hash), for per-key state; `Ordered` keeps a FIFO
//! queue per key and lets whichever worker is free take the next key whose
//! turn it is, so a hot key holds one worker, not its neighbours. More in
//! [`guide::keyed`].
//!
//! # How admission works
//!
//! Capacity `C` is split over `M` shards (by default one per CPU), each an
//! atomic counter on its own cache line, with limits that add up to exactly
//! `C`. A caller starts at its own shard ([`Probe`]: its thread's index, or
//! its CPU) and takes a unit with one CAS if that shard is under its limit,
//! else walks on to the next shard whose "full" bit is clear. A small bitmap
//! of full shards (and, past 64 shards, a count of them) makes the refusal
//! cost the same at 2 or 65,536 shards. Releasing is one RMW on the shard's
//! own line. [`Error::Overload`] says exactly what a refusal promises, and
//! [`guide::semantics`] gives the argument in full.
//!
//! [`Probe`]: probe::Probe
//!
//! # Semantics
//!
//! * **Exact capacity.** Admitted-and-unfinished units never exceed the
//!   capacity in force, under any interleaving, resizes included
//!   (loom-checked). A caller is never refused because of its own shard's
//!   counters while that shard has room.
//! * **Waiting is bounded** by `max_waiters` and `max_wait`; a waiter that
//!   gives up (deadline, dropped future) strands no unit, and shutdown
//!   wakes every waiter with [`Error::Shutdown`].
//! * **Strict outstanding bound.** A pool request holds its unit from
//!   admission until the worker has finished it (queued + running), and
//!   gives it back *before* the reply is delivered.
//! * **Nothing lost.** Every admitted request is handled exactly once, even
//!   across a shutdown; a caller never waits for a reply that cannot come.
//! * **Panics** in handlers fail only their request
//!   ([`Error::WorkerPanicked`]); the worker is rebuilt and its mailbox kept.
//!   No other panic on a worker (a reply's or a panic payload's `Drop`)
//!   ends it either.
//! * **A worker calling its own pool** is never queued behind itself: the
//!   call goes to another worker, or gets [`Error::CallingSelf`] if there
//!   is none. Cycles through several pools remain the caller's to break
//!   (use `call_timeout`).
//! * **Refused values come back** from [`Pool::try_call`] and
//!   [`Pool::try_cast`] ([`Refused`], [`TryCallError`]).
//! * **Shutdown** refuses new work with [`Error::Shutdown`], drains what was
//!   admitted, runs [`Worker::terminate`], joins. Dropping the last handle
//!   does the same; workers that need a handle to their own pool hold a
//!   [`WeakPool`], or the pool keeps itself alive.
//! * **Bad configuration** is a [`ConfigError`] naming the field; nothing
//!   panics on user input.
//!
//! # Differences from Erlang sidejob
//!
//! * **The limit is a limit.** sidejob checks, then increments, then lets
//!   the worker overwrite the count: concurrent callers overshoot. Here one
//!   CAS under the shard's limit admits, and the limits add up to exactly
//!   `capacity` (sidejob's `L div W` admits 9 of 10 on 3 workers, 8 of 2 on
//!   8 workers).
//! * **Stricter bound.** sidejob's worker releases a request's slot when it
//!   dequeues it; here the unit is held until the handler has finished.
//! * **A crash loses nothing queued.** A panicking handler fails its own
//!   request; the requests behind it are still handled.
//! * **No leaked units.** Every unit is owned by a guard and released on
//!   every path, unwinding included.
//! * **Children start on the caller.** A slow child start never blocks
//!   other spawns; the supervisor's shard only counts.
//! * **Exact statistics** per shard instead of once-a-second reports; turn
//!   two snapshots into rates with [`Stats::rates_since`].
//! * **Handles, not names.** No global registry, no generated modules.
//!
//! # Correctness
//!
//! The admission table and the shutdown drain are small functions over the
//! atomics of a `sync` shim that switches to [loom](https://docs.rs/loom)
//! under `--cfg loom`; `loom-tests/` checks exact capacity, no false
//! refusal, the full-bitmap protocol, the admission/shutdown race, resize
//! against admission, the waiting room's hand-off, wake-up and
//! cancellation, and the supervisor's slot registry, and each argued
//! memory ordering or protocol step was removed or weakened once to see a
//! model fail. Proptest state machines (in the
//! spirit of sidejob's QuickCheck models) predict exactly which request is
//! admitted; stress tests check the bound and count every request. More in
//! [`guide::correctness`].
//!
//! # Performance
//!
//! Measured against peers in the same run (`benches/`, one results file
//! per bench in `benches/results/`; `PERFORMANCE.md` in the repository has
//! the figures, their ranges and how they were reached): an acquire +
//! release costs 1.05-1.10x a bare atomic CAS loop and less than half of
//! tokio's `Semaphore::try_acquire` (58 instructions against 130); a
//! refusal under overload 0.7x tokio's failed `try_acquire` up to 64
//! shards and 1.14x beyond, flat from 65 to 65,536 shards; a `call`
//! round trip about 1.2x two raw channels whose ends both spin, because
//! callers and workers spin briefly before they park.
//!
//! # Feature flags
//!
// Without the `tokio` feature `spawn_task` does not exist and a link to it
// would be broken (the front page showed a literal `[Supervisor::spawn_task]`),
// so the line is written twice: linked with the feature, plain without.
#![cfg_attr(
    feature = "tokio",
    doc = "* `tokio`: [`Supervisor::spawn_task`] and [`spawn_task_on`](Supervisor::spawn_task_on),"
)]
#![cfg_attr(
    not(feature = "tokio"),
    doc = "* `tokio`: `Supervisor::spawn_task` and `spawn_task_on`,"
)]
//!   bounded tokio tasks, and `Supervisor::abort_all` to abort them;
//!   `PoolBuilder::build_async`, a pool of async workers (`AsyncPool`,
//!   `AsyncWorker`), each a tokio task.
//!   ([`Supervisor::wait_idle_async`] needs no feature: it runs on any
//!   executor.)
//! * `tower`: `sidejob::tower::LimitLayer`, tower middleware (axum, tonic,
//!   hyper) that admits each request through a [`Limiter`], failing fast
//!   or (`LimitLayer::waiting`) waiting in the limiter's waiting room, and
//!   answers refusals with an error or a response of yours (`429` when the
//!   room is full, `503` after `max_wait`).
//! * `metrics`: a [`Reporter`](observe::Reporter) also exports the [`Stats`] through the
//!   [`metrics`](https://docs.rs/metrics) facade (`sidejob_in_flight`,
//!   `sidejob_rejected_total`, `sidejob_waiting`, ...; names in
//!   `sidejob::metrics`), for any exporter. Without it, a reporter only
//!   feeds its health [`Alarm`](observe::Alarm)s.
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The user's guide: one page per topic.
///
/// Each page is documentation only (no items); its text lives in
/// `docs/guide/<topic>.md`, and its examples run as doctests. Where an
/// item's own documentation already holds a topic in full (the tower
/// layer, the reporter's series, the shepherd's semantics), the page says
/// so and links to it.
pub mod guide {
    #[doc = include_str!("../docs/guide/choosing.md")]
    pub mod choosing {}
    #[doc = include_str!("../docs/guide/waiting.md")]
    pub mod waiting {}
    #[doc = include_str!("../docs/guide/resizing.md")]
    pub mod resizing {}
    #[doc = include_str!("../docs/guide/weighted.md")]
    pub mod weighted {}
    #[doc = include_str!("../docs/guide/priority.md")]
    pub mod priority {}
    #[doc = include_str!("../docs/guide/fairness.md")]
    pub mod fairness {}
    #[doc = include_str!("../docs/guide/adaptive.md")]
    pub mod adaptive {}
    #[doc = include_str!("../docs/guide/keyed.md")]
    pub mod keyed {}
    #[doc = include_str!("../docs/guide/stealing.md")]
    pub mod stealing {}
    // Items behind a feature are linked only when it is on (a link to a
    // missing item fails the docs build); the page names them in plain
    // code spans either way.
    #[doc = include_str!("../docs/guide/async_workers.md")]
    #[cfg_attr(
        feature = "tokio",
        doc = "\nThe types: [`AsyncPool`](crate::AsyncPool), [`AsyncWorker`](crate::AsyncWorker), [`PoolBuilder::build_async`](crate::PoolBuilder::build_async)."
    )]
    pub mod async_workers {}
    #[doc = include_str!("../docs/guide/tower.md")]
    #[cfg_attr(
        feature = "tower",
        doc = "\nThe module: [`sidejob::tower`](crate::tower), and [`LimitLayer`](crate::tower::LimitLayer)."
    )]
    pub mod tower {}
    #[doc = include_str!("../docs/guide/metrics.md")]
    #[cfg_attr(
        feature = "metrics",
        doc = "\nThe series' names: [`sidejob::metrics`](crate::metrics)."
    )]
    pub mod metrics {}
    #[doc = include_str!("../docs/guide/shepherd.md")]
    pub mod shepherd {}
    #[doc = include_str!("../docs/guide/semantics.md")]
    pub mod semantics {}
    #[doc = include_str!("../docs/guide/correctness.md")]
    pub mod correctness {}
}

// The layout shows the architecture: the engine every front-end drives,
// one folder per front-end that has more than one file, the integrations
// behind their features. Each module has one path (`crate::engine::table`),
// no alias at the root.
pub mod adaptive;
pub mod claim;
mod engine;
pub mod env;
mod error;
mod integrations;
mod limiter;
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api;
mod pool;
pub mod probe;
pub mod shepherd;
mod stats;
mod supervisor;
mod sync;
#[cfg(all(test, not(loom)))]
mod tests;
pub mod units;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use integrations::metrics;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use integrations::tower;

pub use engine::class::Class;
pub use engine::waiters::QueueOrder;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use error::BuildError;
pub use error::{ConfigError, Error, Refused, TryCallError};
pub use integrations::observe;
pub use limiter::{Limiter, LimiterBuilder, OwnedPermit, Permit};
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use pool::asynchronous::{worker::AsyncWorker, AsyncPool, WeakAsyncPool};
pub use pool::worker::Worker;
pub use pool::{KeyedMode, Pool, PoolBuilder, WeakPool};
pub use stats::{ClassStats, Rates, ShardStats, Stats};
#[cfg(feature = "tokio")]
pub use supervisor::Task;
pub use supervisor::{
    Child, ChildGuard, ChildId, ChildInfo, ChildKind, Supervisor, SupervisorBuilder,
};
