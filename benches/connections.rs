//! A pool of connections below saturation (issue 27, "every worker
//! works"): an async pool of capacity 32 with 8 workers, each owning a TCP
//! connection to a backend on 127.0.0.1, beside the tokio actor idiom with
//! the same connections and the same bound, in one run.
//!
//! * The backend: a TCP server on its own thread and runtime; each
//!   connection reads an 8-byte request, waits the backend's round trip
//!   for that connection's `n`th request (a tokio timer: the server's
//!   work), and writes the 8 bytes back.
//! * Two backends: a fixed 2 ms, and a varied 1 to 5 ms (a fixed cycle per
//!   connection), where one slow reply holds up whatever queues behind it.
//! * 16 client tasks call in a closed loop for [`SPAN`] a case: 16 requests
//!   in flight against 8 connections, so every connection should be busy
//!   with one request waiting behind it.
//! * The idiom, two ways: 8 actor tasks each owning a connection, fed by
//!   one shared bounded `mpsc` (its receiver behind a tokio `Mutex`, the
//!   usual way to share it: whichever actor is free takes the next
//!   request), and the same actors each fed by a bounded `mpsc` of its own,
//!   a caller picking the next actor round-robin. Replies come back through
//!   a `oneshot`. Both bounds total 32, as the pool's capacity (24 queued +
//!   8 in hand; 8 x 4).
//! * Ours: the default build (one queue every free worker takes from), and
//!   `steal(false)` (the affinity setting: each request runs on the worker
//!   whose shard admitted it).
//!
//! Printed: ok/s, p50 and p99 of each, refusals, the most requests in a
//! handler at once, the most requests admitted and unfinished that any
//! client saw right after its call was made (`usage()` for ours; queued
//! in the mailboxes plus in an actor's hands for the idiom: the bound,
//! checked, must stay <= 32), and each / shared-mpsc actors (throughput,
//! p50). Targets: the default at >= 0.95x the idiom's
//! throughput and <= 1.1x its p50, with the bound kept.
//!
//! Run: `cargo bench --all-features --bench connections`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sidejob::{AsyncPool, AsyncWorker, Error, Pool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

const CAPACITY: usize = 32;
const WORKERS: usize = 8;
const CLIENTS: usize = 16;
const SPAN: Duration = Duration::from_secs(5);

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

    /// The server's time for a connection's `n`th request.
    fn round_trip(self, n: usize) -> Duration {
        match self {
            Backend::Fixed => Duration::from_millis(2),
            // 1, 4, 2, 5, 3 ms: mean 3 ms.
            Backend::Varied => Duration::from_millis([1, 4, 2, 5, 3][n % 5]),
        }
    }

    /// Starts the server on a thread of its own; its address.
    fn serve(self) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                loop {
                    let (mut stream, _) = listener.accept().await.unwrap();
                    stream.set_nodelay(true).unwrap();
                    tokio::spawn(async move {
                        let mut buf = [0u8; 8];
                        for n in 0.. {
                            if stream.read_exact(&mut buf).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(self.round_trip(n)).await;
                            if stream.write_all(&buf).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
        });
        addr
    }
}

/// Requests in a handler now, and the most seen.
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

/// One connection to the backend.
struct Conn {
    stream: TcpStream,
    in_flight: Arc<InFlight>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr, in_flight: &Arc<InFlight>) -> Conn {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            in_flight: in_flight.clone(),
        }
    }

    async fn query(&mut self, n: u64) -> u64 {
        self.in_flight.enter();
        self.stream.write_all(&n.to_le_bytes()).await.unwrap();
        let mut buf = [0u8; 8];
        self.stream.read_exact(&mut buf).await.unwrap();
        self.in_flight.leave();
        u64::from_le_bytes(buf)
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

/// The actor idiom: a task per connection.
#[derive(Clone)]
enum Actors {
    /// One shared mailbox every actor takes from.
    Shared(mpsc::Sender<ActorMsg>),
    /// A mailbox each, picked round-robin.
    RoundRobin(Arc<[mpsc::Sender<ActorMsg>]>, Arc<AtomicUsize>),
}

impl Actors {
    /// Actor `conn`'s loop over a receiver it may share.
    async fn serve(mut conn: Conn, receiver: Arc<tokio::sync::Mutex<mpsc::Receiver<ActorMsg>>>) {
        loop {
            // The lock is held only while waiting for a message.
            let msg = receiver.lock().await.recv().await;
            let Some((n, reply)) = msg else { return };
            let _ = reply.send(conn.query(n).await);
        }
    }

    fn start(
        rt: &Runtime,
        addr: std::net::SocketAddr,
        shared: bool,
        in_flight: &Arc<InFlight>,
    ) -> Self {
        let conns: Vec<Conn> = rt.block_on(async {
            let mut conns = Vec::new();
            for _ in 0..WORKERS {
                conns.push(Conn::open(addr, in_flight).await);
            }
            conns
        });
        if shared {
            let (tx, rx) = mpsc::channel::<ActorMsg>(CAPACITY - WORKERS);
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            for conn in conns {
                rt.spawn(Actors::serve(conn, rx.clone()));
            }
            return Actors::Shared(tx);
        }
        let senders: Vec<_> = conns
            .into_iter()
            .map(|conn| {
                let (tx, rx) = mpsc::channel::<ActorMsg>(CAPACITY / WORKERS);
                rt.spawn(Actors::serve(conn, Arc::new(tokio::sync::Mutex::new(rx))));
                tx
            })
            .collect();
        Actors::RoundRobin(senders.into(), Arc::default())
    }

    /// Requests queued in the mailboxes now (sent, not yet taken by an
    /// actor): with those in an actor's hands, what the bound counts.
    fn queued(&self) -> usize {
        match self {
            Actors::Shared(sender) => sender.max_capacity() - sender.capacity(),
            Actors::RoundRobin(senders, _) => senders
                .iter()
                .map(|sender| sender.max_capacity() - sender.capacity())
                .sum(),
        }
    }

    async fn call(&self, n: u64) -> Result<u64, Error> {
        let sender = match self {
            Actors::Shared(sender) => sender,
            Actors::RoundRobin(senders, next) => {
                &senders[next.fetch_add(1, Ordering::Relaxed) % senders.len()]
            }
        };
        let (tx, rx) = oneshot::channel();
        sender.send((n, tx)).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)
    }
}

/// What one case measured.
struct Row {
    ok_per_s: f64,
    p50: Duration,
    p99: Duration,
    refused: u64,
    max_in_handlers: usize,
    /// The highest count of requests admitted and unfinished seen.
    max_usage: usize,
}

/// `CLIENTS` tasks call in a closed loop for `SPAN`. `usage` reads how
/// many requests are admitted and unfinished; each client reads it right
/// after its call was made (admission is synchronous), when it can have
/// just risen, and the highest reading is kept.
fn load<F, Fut>(
    rt: &Runtime,
    in_flight: &InFlight,
    usage: Arc<dyn Fn() -> usize + Send + Sync>,
    call: F,
) -> Row
where
    F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<u64, Error>> + Send,
{
    let (latencies, refused, span, max_usage) = rt.block_on(async move {
        let start = Instant::now();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let call = call.clone();
                let usage = usage.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut refused = 0u64;
                    let mut max_usage = 0;
                    let mut n = (client as u64) << 32;
                    while start.elapsed() < SPAN {
                        let began = Instant::now();
                        let reply = call(n);
                        max_usage = max_usage.max(usage());
                        match reply.await {
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
                    (latencies, refused, max_usage)
                })
            })
            .collect();
        let mut all = Vec::new();
        let (mut refused, mut max_usage) = (0, 0);
        for client in clients {
            let (latencies, r, m) = client.await.unwrap();
            all.extend(latencies);
            refused += r;
            max_usage = max_usage.max(m);
        }
        (all, refused, start.elapsed(), max_usage)
    });
    let ok = latencies.len();
    let (p50, p99, _) = common::quantiles(latencies);
    Row {
        ok_per_s: ok as f64 / span.as_secs_f64(),
        p50,
        p99,
        refused,
        max_in_handlers: in_flight.max.swap(0, Ordering::SeqCst),
        max_usage,
    }
}

fn pool(
    rt: &Runtime,
    addr: std::net::SocketAddr,
    steal: Option<bool>,
    in_flight: &Arc<InFlight>,
) -> AsyncPool<Conn> {
    let mut builder = Pool::builder();
    builder.name("conns").capacity(CAPACITY).workers(WORKERS);
    if let Some(steal) = steal {
        builder.steal(steal);
    }
    // Each worker opens its connection when it starts.
    let in_flight = in_flight.clone();
    rt.block_on(builder.build_async_init(move |_| {
        let in_flight = in_flight.clone();
        async move { Ok::<_, std::io::Error>(Conn::open(addr, &in_flight).await) }
    }))
    .unwrap()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    println!(
        "connections: capacity {CAPACITY}, {WORKERS} workers (a TCP connection each to a backend on 127.0.0.1), {CLIENTS} clients in a closed loop, {SPAN:?} a case, 2-thread runtime"
    );
    println!(
        "{:<7} {:<30} {:>7} {:>9} {:>9} {:>7} {:>8} {:>6} {:>9} {:>8}",
        "backend", "", "ok/s", "p50", "p99", "refused", "handlers", "usage", "tput/idm", "p50/idm"
    );
    for backend in [Backend::Fixed, Backend::Varied] {
        let addr = backend.serve();
        let rt = common::two_thread_runtime();
        let in_flight = Arc::new(InFlight::default());
        let mut rows = Vec::new();
        for (name, shared) in [
            ("tokio actors, shared mpsc", true),
            ("tokio actors, round-robin", false),
        ] {
            let actors = Actors::start(&rt, addr, shared, &in_flight);
            let usage = {
                let (actors, in_flight) = (actors.clone(), in_flight.clone());
                Arc::new(move || actors.queued() + in_flight.now.load(Ordering::SeqCst))
            };
            let row = load(&rt, &in_flight, usage, move |n| {
                let actors = actors.clone();
                async move { actors.call(n).await }
            });
            rows.push((name, row));
        }
        for (name, steal) in [
            ("async pool, default", None),
            ("async pool, steal(false)", Some(false)),
        ] {
            let pool = pool(&rt, addr, steal, &in_flight);
            let usage = {
                let pool = pool.clone();
                Arc::new(move || pool.usage())
            };
            let row = {
                let pool = pool.clone();
                load(&rt, &in_flight, usage, move |n| pool.call_async(n))
            };
            rt.block_on(pool.shutdown_async());
            rows.push((name, row));
        }
        let (idiom_tput, idiom_p50) = (rows[0].1.ok_per_s, rows[0].1.p50.as_secs_f64());
        for (name, row) in &rows {
            println!(
                "{:<7} {:<30} {:>7.0} {:>9} {:>9} {:>7} {:>8} {:>6} {:>8.3}x {:>7.3}x",
                backend.name(),
                name,
                row.ok_per_s,
                ms(row.p50),
                ms(row.p99),
                row.refused,
                row.max_in_handlers,
                row.max_usage,
                row.ok_per_s / idiom_tput,
                row.p50.as_secs_f64() / idiom_p50,
            );
            assert!(
                row.max_in_handlers <= WORKERS,
                "more requests in handlers than connections"
            );
            assert!(row.max_usage <= CAPACITY, "the bound was broken");
        }
        let default = &rows[2].1;
        println!(
            "  default / shared-mpsc actors: throughput {:.3}x (target >= 0.95), p50 {:.3}x (target <= 1.1), usage <= {CAPACITY}: {}",
            default.ok_per_s / idiom_tput,
            default.p50.as_secs_f64() / idiom_p50,
            default.max_usage <= CAPACITY,
        );
    }
}
