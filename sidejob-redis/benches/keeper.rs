//! Local admission with a lease keeper running, beside a plain `Limiter`,
//! and the renew script's cost on a real redis-server on loopback.
//!
//! * criterion group `admission`: `try_acquire` + drop on a `Limiter` with
//!   no keeper, and on one whose capacity a keeper drives from a budget on
//!   a real redis-server (started by the bench on a free port). The keeper
//!   polls the limiter's stats every 50 ms and renews every 200 ms while the
//!   bench runs; the hot path itself is the same CAS.
//! * then, under `--bench`: an interleaved side-by-side timing (the ratio
//!   is the figure), renew-script latency p50/p99 over one connection, and
//!   the script rate one Redis serves with 1 and 8 clients.

use std::hint::black_box;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use sidejob::Limiter;
use sidejob_redis::{
    Budget, FleetCapacity, InitArgs, Keeper, LeaseStore, RedisStore, RenewArgs, RenewReply,
};

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_server() -> Option<Server> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Server(child, port);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    for _ in 0..200 {
        if let Ok(mut c) = client.get_connection() {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                return Some(server);
            }
        }
        std::thread::sleep(Duration::from_millis(10)); // waiting for the child to listen
    }
    None
}

const CAP: usize = 1 << 16;

fn kept(url: &str) -> (Arc<Limiter>, Keeper) {
    let ms = Duration::from_millis;
    let budget = Budget::builder()
        .url(url)
        .name("bench")
        .capacity(CAP)
        .fresh(true)
        .min_block(CAP as u64 / 8)
        .ttl(ms(1000))
        .renew_every(ms(200))
        .grace(ms(300))
        .max_hold(ms(200))
        .pause_margin(ms(50))
        .build()
        .expect("budget");
    let limiter = Arc::new(Limiter::new(1).expect("limiter"));
    let keeper = budget.attach(limiter.clone()).expect("attach");
    // Make it ask: hold what is granted; refusals trigger early grows until
    // the lease is large enough for the bench.
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !keeper.wait_for(ms(20), |s| s.leased as usize >= CAP / 4) {
        while let Ok(p) = limiter.try_acquire_owned() {
            held.push(p);
        }
        assert!(
            Instant::now() < deadline,
            "the lease did not grow: {:?}",
            keeper.stats()
        );
    }
    drop(held);
    (limiter, keeper)
}

#[inline]
fn once(limiter: &Limiter) {
    let permit = limiter.try_acquire().expect("capacity to spare");
    black_box(&permit);
}

fn side_by_side(plain: &Limiter, resized: &Limiter, kept: &Limiter) {
    const ITERS: u64 = 2_000_000;
    const ROUNDS: usize = 7;
    let time = |l: &Limiter| {
        let t = Instant::now();
        for _ in 0..ITERS {
            once(l);
        }
        t.elapsed().as_nanos() as f64 / ITERS as f64
    };
    let (mut p, mut r, mut k) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..ROUNDS {
        p = p.min(time(plain));
        r = r.min(time(resized));
        k = k.min(time(kept));
    }
    println!("== side-by-side (min of {ROUNDS} interleaved runs, {ITERS} ops each) ==");
    println!("plain Limiter try_acquire+drop          {p:.2} ns");
    println!("plain Limiter resized by hand           {r:.2} ns");
    println!("Limiter driven by a keeper (on Redis)   {k:.2} ns");
    println!("ratio kept/plain   = {:.3}   (target <= 1.05)", k / p);
    println!(
        "ratio kept/resized = {:.3}   (the keeper's own cost)",
        k / r
    );
}

fn budget_store(url: &str, name: &str) -> RedisStore {
    let mut store = RedisStore::new(url, name, Duration::from_secs(1)).expect("store");
    store
        .init(&InitArgs {
            capacity: 100_000,
            capacity_version: 0,
            ttl_ms: 10_000,
            grace_ms: 5_000,
            epoch: "e".into(),
            fresh: true,
            test: false,
            debug_now: None,
        })
        .expect("init");
    store
}

fn renew_cost(url: &str, nodes: u64) {
    let name = format!("bench-renew-{nodes}");
    let mut store = budget_store(url, &name);
    let mut req = vec![0u64; nodes as usize];
    let mut lat = Vec::with_capacity(20_000);
    for i in 0..20_000u64 {
        let n = (i % nodes) as usize;
        req[n] += 1;
        let args = RenewArgs {
            node: format!("node{n}"),
            req: req[n],
            epoch_seen: "e".into(),
            ver_seen: 0,
            has: 0,
            need: 100,
            want: 120,
            capacity: FleetCapacity {
                capacity: 100_000,
                version: 0,
            },
        };
        let t = Instant::now();
        let reply = store.renew(&args).expect("renew");
        lat.push(t.elapsed());
        assert!(matches!(reply, RenewReply::Ok(_)), "{reply:?}");
    }
    lat.sort();
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!("\n== renew script on loopback (one connection, {nodes} nodes, 20000 calls) ==");
    println!("p50 {:?}   p99 {:?}   max {:?}", p(0.50), p(0.99), p(1.0));
    for clients in [1usize, 8] {
        let stop = Instant::now() + Duration::from_secs(2);
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let url = url.to_string();
                // A budget of its own per phase: `nodes` nodes in it, no more.
                let name = format!("bench-rate-{nodes}-{clients}");
                std::thread::spawn(move || {
                    let mut store = budget_store(&url, &name);
                    let mut calls = 0u64;
                    while Instant::now() < stop {
                        calls += 1;
                        let args = RenewArgs {
                            // Each client renews its own nodes, `nodes` in all.
                            node: format!(
                                "c{clients}-{c}-node{}",
                                calls % (nodes / clients as u64).max(1)
                            ),
                            req: calls,
                            epoch_seen: "e".into(),
                            ver_seen: 0,
                            has: 0,
                            need: 10,
                            want: 12,
                            capacity: FleetCapacity {
                                capacity: 100_000,
                                version: 0,
                            },
                        };
                        let reply = store.renew(&args).expect("renew");
                        assert!(matches!(reply, RenewReply::Ok(_)), "{reply:?}");
                    }
                    calls
                })
            })
            .collect();
        let total: u64 = handles.into_iter().map(|h| h.join().expect("client")).sum();
        let rate = total as f64 / 2.0;
        println!(
            "{clients} client(s): {rate:.0} renew scripts/s with {nodes} nodes in the budget; \
             {nodes} nodes at R = 2 s need {:.0}/s, {:.1} % of that",
            nodes as f64 / 2.0,
            100.0 * nodes as f64 / 2.0 / rate
        );
    }
}

fn main() {
    let Some(server) = redis_server() else {
        eprintln!(
            "!!!!!!!! SKIPPED: redis-server is not installed: the keeper bench needs one !!!!!!!!"
        );
        return;
    };
    let url = format!("redis://127.0.0.1:{}/", server.1);
    let plain = Limiter::new(CAP).expect("limiter");
    let (kept, keeper) = kept(&url);
    // The same history of resizes without a keeper: built at 1, grown.
    let resized = Limiter::new(1).expect("limiter");
    resized.set_capacity(kept.capacity()).expect("resize");
    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("admission");
        g.bench_function("plain Limiter", |b| b.iter(|| once(&plain)));
        g.bench_function("plain Limiter resized by hand", |b| {
            b.iter(|| once(&resized))
        });
        g.bench_function("Limiter driven by a keeper", |b| b.iter(|| once(&kept)));
        g.finish();
    }
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        side_by_side(&plain, &resized, &kept);
        let s = keeper.stats();
        println!(
            "(keeper during the bench: {} renewals, {} failures, lease {})",
            s.renewals, s.failures, s.leased
        );
        for nodes in [10, 300] {
            renew_cost(&url, nodes);
        }
    }
    drop(keeper);
}
