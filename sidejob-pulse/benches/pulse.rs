//! sidejob-pulse against its limits, in one run on one local redis-server:
//!
//! 1. dispatch-to-start latency (a client-only node dispatches, a worker in
//!    this process starts the job) beside one Redis round trip (`PING`):
//!    criterion's means, then p50 and p99 of 2,000 samples each;
//! 2. the time for a `kill -9`'d node's jobs to start elsewhere, against
//!    worker TTL + pending-job TTL (short TTLs here: 1 s and 2 s; the node
//!    is this bench binary re-executed as a child process);
//! 3. keys moved when a worker joins `n`, against `1/(n+1)`;
//! 4. from spawning a new `redis-server` to the first job's start, with
//!    and without learning mode (`assume_fresh_redis`), beside one `PING`
//!    on that Redis;
//! 5. dispatch-to-start and the dispatch call alone with durable
//!    acknowledgements (`Durability::Replicas`, `WAIT 1` on a replica),
//!    beside the same without, and one `PING`, interleaved.
//!
//! `cargo bench -p sidejob-pulse --bench pulse`.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use sidejob_pulse::{Durability, Handler, Job, Node, StopReason, Token};

const TTL: Duration = Duration::from_millis(1000);
const PENDING_TTL: Duration = Duration::from_millis(2000);

enum Ev {
    Start(String, Instant),
    Stop(String, StopReason),
}

struct Signal(usize, Sender<(usize, Ev)>);

impl Handler for Signal {
    fn start(&mut self, job: Job) {
        let _ = self.1.send((self.0, Ev::Start(job.key, Instant::now())));
    }
    fn stop(&mut self, key: &str, _: Token, why: StopReason) {
        let _ = self.1.send((self.0, Ev::Stop(key.into(), why)));
    }
}

fn node(url: &str, pool: &str, client_only: bool) -> Node {
    Node::builder()
        .name(pool)
        .url(url)
        .worker_ttl(TTL)
        .pending_job_ttl(PENDING_TTL)
        .max_queued_jobs(1_000_000)
        .client_only(client_only)
        .job_sink_block(Duration::from_millis(100))
        .join()
        .expect("join")
}

/// Waits past the learning window of a pool created on a fresh Redis.
fn warm(client: &Node, rx: &Receiver<(usize, Ev)>) {
    client.dispatch("warm-up", b"").unwrap();
    loop {
        if let (_, Ev::Start(k, _)) = rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            if k == "warm-up" {
                break;
            }
        }
    }
    client.stop("warm-up").unwrap();
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn latency(c: &mut Criterion, url: &str) {
    let host = node(url, "latency", false);
    let client = node(url, "latency", true);
    let (tx, rx) = channel();
    let _w = host.add_worker(1_000_000, Signal(0, tx)).unwrap();
    warm(&client, &rx);
    let mut ping = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut seq = 0u64;
    let mut one = |client: &Node| -> Duration {
        seq += 1;
        let key = format!("k{seq}");
        let t = Instant::now();
        client.dispatch(&key, b"payload").unwrap();
        loop {
            if let (_, Ev::Start(k, at)) = rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                if k == key {
                    return at - t;
                }
            }
        }
    };
    let mut g = c.benchmark_group("dispatch_to_start");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    g.bench_function(BenchmarkId::new("redis", "PING"), |b| {
        b.iter(|| redis::cmd("PING").query::<String>(&mut ping).unwrap())
    });
    g.bench_function(BenchmarkId::new("pulse", "dispatch_to_start"), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| one(&client)).sum())
    });
    g.finish();
    // Interleaved, so that both see the same machine (it is shared).
    let n = 2000;
    let (mut pings, mut starts) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        redis::cmd("PING").query::<String>(&mut ping).unwrap();
        pings.push(t.elapsed());
        starts.push(one(&client));
    }
    let (p50, p99) = (pct(&mut starts, 0.5), pct(&mut starts, 0.99));
    let (q50, q99) = (pct(&mut pings, 0.5), pct(&mut pings, 0.99));
    println!(
        "\ndispatch to start ({n} jobs): p50 {:?}, p99 {:?}; one PING: p50 {:?}, p99 {:?}; \
         ratio p50 {:.1}x, p99 {:.1}x PING",
        p50,
        p99,
        q50,
        q99,
        p50.as_secs_f64() / q50.as_secs_f64(),
        p99.as_secs_f64() / q99.as_secs_f64()
    );
    host.close();
    client.close();
}

/// The child: a node with one worker that prints each start, until killed.
fn child(url: &str, pool: &str) {
    let n = node(url, pool, false);
    let (tx, rx) = channel();
    let _w = n.add_worker(1_000_000, Signal(1, tx)).unwrap();
    println!("ready");
    while let Ok((_, ev)) = rx.recv() {
        if let Ev::Start(k, _) = ev {
            println!("start {k}");
        }
    }
}

fn failover(url: &str) {
    let pool = "failover";
    let host = node(url, pool, false);
    let (tx, rx) = channel();
    let _w = host.add_worker(1_000_000, Signal(0, tx)).unwrap();
    let client = node(url, pool, true);
    warm(&client, &rx);
    let mut results = Vec::new();
    for round in 0..3 {
        let mut kid = Command::new(std::env::current_exe().unwrap())
            .env("PULSE_BENCH_CHILD", url)
            .env("PULSE_BENCH_POOL", pool)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (ktx, krx) = channel();
        let out = kid.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = ktx.send(l);
            }
        });
        assert_eq!(krx.recv_timeout(Duration::from_secs(20)).unwrap(), "ready");
        let keys: Vec<String> = (0..200).map(|i| format!("r{round}-{i}")).collect();
        for k in &keys {
            client.dispatch(k, b"").unwrap();
        }
        // Which keys the child holds once all 200 run somewhere.
        let (mut mine, mut theirs) = (HashSet::new(), HashSet::new());
        let deadline = Instant::now() + Duration::from_secs(20);
        while mine.len() + theirs.len() < keys.len() {
            assert!(Instant::now() < deadline, "jobs did not all start");
            while let Ok((_, ev)) = rx.try_recv() {
                match ev {
                    Ev::Start(k, _) => {
                        theirs.remove(&k);
                        mine.insert(k);
                    }
                    Ev::Stop(k, _) => {
                        mine.remove(&k);
                    }
                }
            }
            while let Ok(l) = krx.try_recv() {
                if let Some(k) = l.strip_prefix("start ") {
                    if !mine.contains(k) {
                        theirs.insert(k.to_string());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let t_kill = Instant::now();
        kid.kill().unwrap();
        kid.wait().unwrap();
        let mut left: HashSet<String> = theirs.clone();
        let mut last = Duration::ZERO;
        while !left.is_empty() {
            let (_, ev) = rx.recv_timeout(Duration::from_secs(30)).expect("failover");
            if let Ev::Start(k, at) = ev {
                if left.remove(&k) {
                    last = last.max(at - t_kill);
                }
            }
        }
        results.push((theirs.len(), last));
        for k in &keys {
            client.stop(k).unwrap();
        }
        // Drain the stops.
        while rx.recv_timeout(Duration::from_millis(300)).is_ok() {}
    }
    for (n, t) in &results {
        println!(
            "kill -9 of a node holding {n} jobs: all started elsewhere after {:?}; \
             worker TTL + pending-job TTL = {:?} ({:.0}% of it)",
            t,
            TTL + PENDING_TTL,
            100.0 * t.as_secs_f64() / (TTL + PENDING_TTL).as_secs_f64()
        );
    }
    host.close();
    client.close();
}

fn moved_on_join(url: &str) {
    for n in [2usize, 4, 8] {
        let pool = format!("join{n}");
        let host = node(url, &pool, false);
        let (tx, rx) = channel();
        let workers: Vec<_> = (0..n)
            .map(|i| host.add_worker(1_000_000, Signal(i, tx.clone())).unwrap())
            .collect();
        let keys = 2000;
        let mut owner: HashMap<String, usize> = HashMap::new();
        let settle = |owner: &mut HashMap<String, usize>, moved: &mut usize| loop {
            match rx.recv_timeout(Duration::from_millis(700)) {
                Ok((w, Ev::Start(k, _))) => {
                    owner.insert(k, w);
                }
                Ok((_, Ev::Stop(k, why))) => {
                    assert_eq!(why, StopReason::Moved);
                    owner.remove(&k);
                    *moved += 1;
                }
                Err(_) if owner.len() == keys => break,
                Err(_) => {}
            }
        };
        for i in 0..keys {
            host.dispatch(&format!("t{i}"), b"").unwrap();
        }
        let mut moved = 0;
        settle(&mut owner, &mut moved);
        let before = owner.clone();
        let _new = host.add_worker(1_000_000, Signal(n, tx.clone())).unwrap();
        settle(&mut owner, &mut moved);
        let to_new = owner.values().filter(|&&w| w == n).count();
        let elsewhere = owner
            .iter()
            .filter(|(k, w)| before[*k] != **w && **w != n)
            .count();
        println!(
            "worker {} joins {n}: {moved} of {keys} keys moved ({:.3}; 1/(n+1) = {:.3}), \
             {to_new} to the newcomer, {elsewhere} elsewhere",
            n + 1,
            moved as f64 / keys as f64,
            1.0 / (n + 1) as f64
        );
        drop(workers);
        host.shutdown().unwrap();
    }
}

/// From spawning a new redis-server to the first start of a job
/// dispatched as soon as the pool is joined; `fresh`: with
/// `assume_fresh_redis` (no learning mode).
fn redis_start_to_first_start(fresh: bool) -> (Duration, Duration) {
    let t0 = Instant::now();
    let redis = redis_support::start(false).expect("redis-server");
    let up = t0.elapsed();
    let url = redis.url();
    let host = Node::builder()
        .name("first")
        .url(&url)
        .worker_ttl(TTL)
        .assume_fresh_redis(fresh)
        .join()
        .expect("join");
    let (tx, rx) = channel();
    let _w = host.add_worker(10, Signal(0, tx)).unwrap();
    host.dispatch("first", b"").unwrap();
    let at = loop {
        if let (_, Ev::Start(k, at)) = rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            if k == "first" {
                break at;
            }
        }
    };
    let mut ping = redis.conn();
    let mut pings: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            redis::cmd("PING").query::<String>(&mut ping).unwrap();
            t.elapsed()
        })
        .collect();
    println!(
        "redis-server spawned to first start ({}): {:?} (of which spawn to answering PING {:?}); one PING on it p50 {:?}",
        if fresh { "assume_fresh_redis" } else { "learning mode: ttl + grace = 1.1 s, + up to 1 s of whole-second uptime" },
        at - t0,
        up,
        pct(&mut pings, 0.5)
    );
    host.close();
    (at - t0, up)
}

fn durable_latency() {
    let primary = redis_support::start(false).expect("redis-server");
    let replica = redis_support::start_replica(primary.port).expect("replica");
    let mut rc = replica.conn();
    let linked = Instant::now() + Duration::from_secs(10);
    while !redis::cmd("INFO")
        .arg("replication")
        .query::<String>(&mut rc)
        .unwrap()
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < linked, "replica not linked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = primary.url();
    let join = |client_only: bool, durability: Durability| {
        Node::builder()
            .name("durable")
            .url(&url)
            .worker_ttl(TTL)
            .pending_job_ttl(PENDING_TTL)
            .max_queued_jobs(1_000_000)
            .assume_fresh_redis(true)
            .client_only(client_only)
            .durability(durability)
            .join()
            .expect("join")
    };
    let host = join(false, Durability::Primary);
    let plain = join(true, Durability::Primary);
    let durable = join(
        true,
        Durability::Replicas {
            replicas: 1,
            timeout: Duration::from_secs(1),
        },
    );
    let (tx, rx) = channel();
    let _w = host.add_worker(1_000_000, Signal(0, tx)).unwrap();
    let mut ping = primary.conn();
    let mut seq = 0u64;
    // (dispatch call, dispatch to start)
    let mut one = |client: &Node| -> (Duration, Duration) {
        seq += 1;
        let key = format!("d{seq}");
        let t = Instant::now();
        client.dispatch(&key, b"payload").unwrap();
        let call = t.elapsed();
        loop {
            if let (_, Ev::Start(k, at)) = rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                if k == key {
                    return (call, at - t);
                }
            }
        }
    };
    let n = 1000;
    let (mut pings, mut pc, mut ps, mut dc, mut ds) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        redis::cmd("PING").query::<String>(&mut ping).unwrap();
        pings.push(t.elapsed());
        let (c, s) = one(&plain);
        pc.push(c);
        ps.push(s);
        let (c, s) = one(&durable);
        dc.push(c);
        ds.push(s);
    }
    let q = |v: &mut Vec<Duration>| (pct(v, 0.5), pct(v, 0.99));
    let (ping50, ping99) = q(&mut pings);
    for (what, call, start) in [
        ("Durability::Primary", &mut pc, &mut ps),
        ("Durability::Replicas{1}", &mut dc, &mut ds),
    ] {
        let (c50, c99) = q(call);
        let (s50, s99) = q(start);
        println!(
            "{what} ({n} jobs, interleaved): dispatch call p50 {c50:?} p99 {c99:?}; dispatch to start p50 {s50:?} ({:.1}x PING) p99 {s99:?}",
            s50.as_secs_f64() / ping50.as_secs_f64()
        );
    }
    println!("one PING (same run): p50 {ping50:?} p99 {ping99:?}");
    host.close();
}

fn main() {
    if let Ok(url) = std::env::var("PULSE_BENCH_CHILD") {
        child(&url, &std::env::var("PULSE_BENCH_POOL").unwrap());
        return;
    }
    let Some(redis) = redis_support::start(false) else {
        eprintln!("no redis-server: nothing to measure");
        return;
    };
    let url = redis.url();
    let mut c = Criterion::default().configure_from_args();
    latency(&mut c, &url);
    c.final_summary();
    failover(&url);
    moved_on_join(&url);
    for fresh in [true, false] {
        for _ in 0..3 {
            redis_start_to_first_start(fresh);
        }
    }
    durable_latency();
}
