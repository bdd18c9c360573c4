//! Three nodes (threads here, processes in production) share one budget
//! on a local redis-server: each prints its lease as the load moves from
//! one node to another, with the fleet total and the real in-flight count.
//!
//! `cargo run -p sidejob-redis --example three_nodes [redis-url]`; without
//! a URL it starts its own redis-server on a free loopback port.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sidejob::Limiter;
use sidejob_redis::Budget;

const C: usize = 30;

fn start_redis() -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
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
        .expect("redis-server (apt-get install redis-server), or pass a redis:// URL");
    let url = format!("redis://127.0.0.1:{port}/");
    let client = redis::Client::open(url.as_str()).unwrap();
    while client.get_connection().is_err() {
        std::thread::sleep(Duration::from_millis(10)); // the child is starting
    }
    (child, url)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut child, url) = match std::env::args().nth(1) {
        Some(url) => (None, url),
        None => {
            let (c, u) = start_redis();
            (Some(c), u)
        }
    };
    let ms = Duration::from_millis;
    let budget = Budget::builder()
        .url(&url)
        .name("three-nodes-demo")
        .capacity(C)
        .ttl(ms(3000))
        .renew_every(ms(500))
        .grace(ms(1000))
        .max_hold(ms(300))
        .pause_margin(ms(100))
        .fresh(true)
        .build()?;
    let inflight = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let limiter = Arc::new(Limiter::new(1)?);
        let keeper = budget.attach(limiter.clone())?;
        let on = Arc::new(AtomicBool::new(false));
        for t in 0..12 {
            let (limiter, on, stop, inflight) =
                (limiter.clone(), on.clone(), stop.clone(), inflight.clone());
            std::thread::spawn(move || {
                let mut x = t as u64 + 1;
                while !stop.load(SeqCst) {
                    if !on.load(SeqCst) {
                        std::thread::sleep(ms(5)); // this node has no load now
                        continue;
                    }
                    if let Ok(permit) = limiter.try_acquire() {
                        inflight.fetch_add(1, SeqCst);
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        std::thread::sleep(ms(5 + (x >> 33) % 40)); // the request's work
                        inflight.fetch_sub(1, SeqCst);
                        drop(permit);
                    } else {
                        std::thread::sleep(ms(1)); // Overload: shed, come back later
                    }
                }
            });
        }
        nodes.push((limiter, keeper, on));
    }
    let phases: [(&str, [bool; 3]); 4] = [
        ("load on node A", [true, false, false]),
        ("load moves to node B", [false, true, false]),
        ("load on all three", [true, true, true]),
        ("load on node C only", [false, false, true]),
    ];
    let start = Instant::now();
    println!("budget {C} units for the fleet; each line: lease (grant) / in use per node");
    for (name, on) in phases {
        println!("-- {name}");
        for (n, o) in nodes.iter().zip(on) {
            n.2.store(o, SeqCst);
        }
        for _ in 0..6 {
            std::thread::sleep(ms(500)); // the demo's print interval
            let mut line = format!("{:>5.1}s", start.elapsed().as_secs_f64());
            let mut total = 0;
            for (i, (limiter, keeper, _)) in nodes.iter().enumerate() {
                let s = keeper.stats();
                total += s.leased;
                line += &format!(
                    "  {}: {:>2} ({:>2}) / {:>2}",
                    ["A", "B", "C"][i],
                    s.leased,
                    s.grant,
                    limiter.usage()
                );
            }
            let status = budget.status()?.map_or(0, |s| s.granted);
            println!(
                "{line}   fleet: leased {total:>2}, granted in Redis {status:>2}, in flight {:>2}",
                inflight.load(SeqCst)
            );
        }
    }
    stop.store(true, SeqCst);
    for (_, keeper, _) in nodes {
        keeper.shutdown();
    }
    println!(
        "after shutdown: granted in Redis {}",
        budget.status()?.map_or(0, |s| s.granted)
    );
    if let Some(c) = child.as_mut() {
        c.kill()?;
        c.wait()?;
    }
    Ok(())
}
