//! The README's example: one background job per tenant, on a pool of
//! dedicated workers. `cargo run -p sidejob-pulse --example tenants --
//! redis://127.0.0.1:6379/` (`tests/readme.rs` runs it against a
//! redis-server it starts).

use std::sync::mpsc;
use std::time::Duration;

use sidejob_pulse::{Error, Handler, Job, Node, StopReason, Token};

/// One background task per tenant (here: a line per event).
struct Tenants(mpsc::Sender<String>);

impl Handler for Tenants {
    fn start(&mut self, job: Job) {
        // Spawn the tenant's task here, handing it job.token to write with.
        let _ = self
            .0
            .send(format!("start {} (token {})", job.key, job.token));
    }
    fn stop(&mut self, key: &str, _token: Token, why: StopReason) {
        let _ = self.0.send(format!("stop {key}: {why:?}"));
    }
    fn notify(&mut self, key: &str, _token: Token, payload: &[u8]) {
        let _ = self.0.send(format!(
            "notify {key}: {}",
            String::from_utf8_lossy(payload)
        ));
    }
}

/// Runs the pool's operations on "tenants" at `url`; returns what
/// the handlers saw.
pub fn run(url: &str) -> Result<Vec<String>, Error> {
    let (tx, rx) = mpsc::channel();
    let next = || rx.recv_timeout(Duration::from_secs(30)).expect("an event");
    // A node joins the pool (created in Redis if missing). The Pulse design's
    // defaults are the builder's (worker TTL 10 s, pending-job TTL 20 s,
    // worker shutdown TTL 2 min, 1,000 queued jobs); a short worker TTL
    // shortens the wait on a Redis that has just started.
    let node = Node::builder()
        .name("tenants")
        .url(url)
        .worker_ttl(Duration::from_secs(2))
        .join()?;
    // A client-only node dispatches without hosting workers (every node
    // of a pool shares its worker TTL).
    let client = Node::builder()
        .name("tenants")
        .url(url)
        .worker_ttl(Duration::from_secs(2))
        .client_only(true)
        .join()?;
    // Two workers, each running at most 100 jobs (a sidejob Limiter).
    let w1 = node.add_worker(100, Tenants(tx.clone()))?;
    let _w2 = node.add_worker(100, Tenants(tx.clone()))?;
    for tenant in ["acme", "globex", "initech"] {
        client.dispatch(tenant, b"{\"plan\":\"pro\"}")?;
    }
    assert_eq!(client.dispatch("acme", b"{}"), Err(Error::Exists));
    let mut seen: Vec<String> = (0..3).map(|_| next()).collect();
    client.notify("acme", b"reload")?;
    seen.push(next());
    client.stop("globex")?;
    seen.push(next());
    w1.remove()?; // its jobs move to the other worker
    node.shutdown()?; // every job stops; the pool's keys leave Redis
                      // ...and it stays shut (`NodeBuilder::reopen` brings it back).
    assert_eq!(client.dispatch("hooli", b"{}"), Err(Error::PoolShutDown));
    seen.extend(rx.try_iter());
    Ok(seen)
}

fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    for line in run(&url)? {
        println!("{line}");
    }
    Ok(())
}
