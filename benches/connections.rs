//! A pool of connections below saturation (issue 27, "every worker
//! works"): an async pool of capacity 32 with 8 workers, each owning a
//! "connection" whose round trip is a tokio timer, against the tokio actor
//! idiom at the same bound, in one run.
//!
//! * 16 client tasks call in a closed loop for [`SPAN`] each case (16
//!   requests in flight against 8 connections: every connection should
//!   be busy, with one request waiting behind it).
//! * Two backends: a fixed round trip of 2 ms, and one of 1 to 5 ms
//!   (a fixed cycle), where one slow reply holds up whatever queues behind
//!   it.
//! * The peer: 8 actor tasks, each owning a connection and fed by its own
//!   bounded `mpsc` of 4 (32 in all: the same bound), a caller picking the
//!   next actor round-robin and awaiting `send` (the idiom as users write
//!   it), the reply through a `oneshot`.
//! * Ours, three ways: the default build, `steal(true)`, `steal(false)`
//!   (the affinity setting: each request runs on the worker whose shard
//!   admitted it).
//!
//! Printed: ok/s, p50 and p99 of each, and ours / actor (throughput, p50).
//! Targets: the default at >= 0.95x the actor's throughput and <= 1.1x its
//! p50, with the bound kept (`max in flight` <= 32, no refusal).
//!
//! Run: `cargo bench --all-features --bench connections`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sidejob::{AsyncPool, AsyncWorker, Error, Pool};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

const CAPACITY: usize = 32;
const WORKERS: usize = 8;
const CLIENTS: usize = 16;
const SPAN: Duration = Duration::from_secs(3);

/// A backend's round trips: the cycle each connection walks through.
#[derive(Clone, Copy)]
enum Backend {
    Fixed,
    Varied,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Fixed => "2 ms",
            Backend::Varied => "1-5 ms",
        }
    }

    /// The `n`th round trip of a connection.
    fn round_trip(self, n: usize) -> Duration {
        match self {
            Backend::Fixed => Duration::from_millis(2),
            // 1, 4, 2, 5, 3 ms: mean 3 ms.
            Backend::Varied => Duration::from_millis([1, 4, 2, 5, 3][n % 5]),
        }
    }
}

/// Requests in flight now, and the most seen: the bound, checked.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl InFlight {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection: each request awaits the backend's next round trip.
struct Conn {
    backend: Backend,
    sent: usize,
    in_flight: Arc<InFlight>,
}

impl Conn {
    async fn query(&mut self, n: u64) -> u64 {
        self.in_flight.enter();
        tokio::time::sleep(self.backend.round_trip(self.sent)).await;
        self.sent += 1;
        self.in_flight.leave();
        n
    }
}

impl AsyncWorker for Conn {
    type Request = u64;
    type Reply = u64;
    type Message = ();
    async fn handle_call(&mut self, n: u64) -> u64 {
        self.query(n).await
    }
    async fn handle_cast(&mut self, _: ()) {}
}

/// What an actor's mailbox carries: a request and where its reply goes.
type ActorMsg = (u64, oneshot::Sender<u64>);

/// The actor idiom: a task per connection, a bounded mailbox each,
/// round-robin dispatch.
#[derive(Clone)]
struct Actors {
    senders: Arc<[mpsc::Sender<ActorMsg>]>,
    next: Arc<AtomicUsize>,
}

impl Actors {
    fn start(rt: &Runtime, backend: Backend, in_flight: &Arc<InFlight>) -> Self {
        let senders: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (tx, mut rx) = mpsc::channel::<ActorMsg>(CAPACITY / WORKERS);
                let mut conn = Conn {
                    backend,
                    sent: 0,
                    in_flight: in_flight.clone(),
                };
                rt.spawn(async move {
                    while let Some((n, reply)) = rx.recv().await {
                        let _ = reply.send(conn.query(n).await);
                    }
                });
                tx
            })
            .collect();
        Actors {
            senders: senders.into(),
            next: Arc::default(),
        }
    }

    async fn call(&self, n: u64) -> Result<u64, Error> {
        let which = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
        let (tx, rx) = oneshot::channel();
        self.senders[which]
            .send((n, tx))
            .await
            .map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)
    }
}

/// What one case measured.
struct Row {
    ok_per_s: f64,
    p50: Duration,
    p99: Duration,
    refused: u64,
    max_in_flight: usize,
}

/// `CLIENTS` tasks call in a closed loop for `SPAN`.
fn load<F, Fut>(rt: &Runtime, in_flight: &InFlight, call: F) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<u64, Error>> + Send,
{
    let (latencies, refused, span) = rt.block_on(async move {
        let start = Instant::now();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let call = call.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut refused = 0u64;
                    let mut n = 0;
                    while start.elapsed() < SPAN {
                        let began = Instant::now();
                        match call(n).await {
                            Ok(reply) => {
                                assert_eq!(reply, n);
                                latencies.push(began.elapsed());
                            }
                            Err(Error::Overload) => {
                                refused += 1;
                                tokio::task::yield_now().await;
                            }
                            Err(other) => panic!("{other}"),
                        }
                        n += 1;
                    }
                    (latencies, refused)
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut refused = 0;
        for client in clients {
            let (latencies, r) = client.await.unwrap();
            all.extend(latencies);
            refused += r;
        }
        (all, refused, start.elapsed())
    });
    let ok = latencies.len();
    let (p50, p99, _) = common::quantiles(latencies);
    Row {
        ok_per_s: ok as f64 / span.as_secs_f64(),
        p50,
        p99,
        refused,
        max_in_flight: in_flight.max.swap(0, Ordering::SeqCst),
    }
}

fn pool(
    rt: &Runtime,
    backend: Backend,
    steal: Option<bool>,
    in_flight: &Arc<InFlight>,
) -> AsyncPool<Conn> {
    let mut builder = Pool::builder();
    builder.name("conns").capacity(CAPACITY).workers(WORKERS);
    if let Some(steal) = steal {
        builder.steal(steal);
    }
    let in_flight = in_flight.clone();
    builder
        .build_async_on(rt.handle(), move |_| Conn {
            backend,
            sent: 0,
            in_flight: in_flight.clone(),
        })
        .unwrap()
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    println!(
        "connections: capacity {CAPACITY}, {WORKERS} workers (a connection each), {CLIENTS} clients in a closed loop, {SPAN:?} a case, 2-thread runtime"
    );
    println!(
        "{:<8} {:<26} {:>9} {:>10} {:>10} {:>8} {:>10} {:>9} {:>9}",
        "backend", "", "ok/s", "p50", "p99", "refused", "in flight", "tput/act", "p50/act"
    );
    for backend in [Backend::Fixed, Backend::Varied] {
        let rt = runtime();
        let in_flight = Arc::new(InFlight::default());
        let actors = Actors::start(&rt, backend, &in_flight);
        let actor = {
            let actors = actors.clone();
            load(&rt, &in_flight, move |n| {
                let actors = actors.clone();
                async move { actors.call(n).await }
            })
        };
        let mut rows = vec![("tokio actor, round-robin", actor)];
        for (name, steal) in [
            ("async pool, default", None),
            ("async pool, steal(true)", Some(true)),
            ("async pool, steal(false)", Some(false)),
        ] {
            let pool = pool(&rt, backend, steal, &in_flight);
            let row = {
                let pool = pool.clone();
                load(&rt, &in_flight, move |n| pool.call_async(n))
            };
            rt.block_on(pool.shutdown_async());
            rows.push((name, row));
        }
        let (act_tput, act_p50) = (rows[0].1.ok_per_s, rows[0].1.p50.as_secs_f64());
        for (name, row) in &rows {
            println!(
                "{:<8} {:<26} {:>9.0} {:>10} {:>10} {:>8} {:>10} {:>8.2}x {:>8.2}x",
                backend.name(),
                name,
                row.ok_per_s,
                ms(row.p50),
                ms(row.p99),
                row.refused,
                row.max_in_flight,
                row.ok_per_s / act_tput,
                row.p50.as_secs_f64() / act_p50,
            );
            assert!(row.max_in_flight <= CAPACITY, "the bound was broken");
        }
    }
}
