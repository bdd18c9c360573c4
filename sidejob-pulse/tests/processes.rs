//! The properties with real processes and a real Redis: several nodes run
//! as child processes (this test binary re-executed with `PULSE_CHILD`
//! set), each writing its workers' start and stop records to append-only
//! files. The parent dispatches through a client-only node, and kills
//! (`kill -9`), freezes (SIGSTOP/SIGCONT) and restarts things. The auditor
//! never reads the Redis under test: it judges one owner per key, no loss
//! and the restart time from the records alone, plus the parent's own log
//! of what was acknowledged and when it struck.
//!
//! Each job also writes "ticks" to one shared append-only resource log
//! while it runs, naively (it never checks its lease): replayed as a
//! fenced resource (refuse a token below the largest seen for the key),
//! the log shows which failures need the fencing token. Only a frozen
//! process writes with a stale token.
//!
//! `harness = false`: `main` runs every scenario (or those whose name
//! contains the first argument) and prints `N passed, N failed`.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

#[path = "../../sidejob-redis/tests/support/proxy.rs"]
#[allow(dead_code)]
mod proxy;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sidejob_pulse::{Durability, Error, Handler, Job, Node, StopReason, Token};

const TTL: Duration = Duration::from_millis(1000);
const PENDING_TTL: Duration = Duration::from_millis(2000);

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

// ---------------------------------------------------------------- child --

struct Audited {
    log: File,
    running: Arc<Mutex<HashMap<String, u64>>>,
}

impl Handler for Audited {
    fn start(&mut self, job: Job) {
        self.running
            .lock()
            .unwrap()
            .insert(job.key.clone(), job.token.get());
        let line = format!("start {} {} {}\n", job.key, job.token, wall_ns());
        self.log.write_all(line.as_bytes()).unwrap();
    }
    fn stop(&mut self, key: &str, token: Token, why: StopReason) {
        self.running.lock().unwrap().remove(key);
        let line = format!("stop {key} {token} {why:?} {}\n", wall_ns());
        // One write per record: a reader never sees half a line but the
        // last, which it skips until its newline lands.
        self.log.write_all(line.as_bytes()).unwrap();
    }
}

fn child_main() {
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let audit = PathBuf::from(env("PULSE_AUDIT"));
    let label = env("PULSE_CHILD");
    let node = Node::builder()
        .name(env("PULSE_POOL"))
        .url(env("PULSE_URL"))
        .worker_ttl(TTL)
        .pending_job_ttl(PENDING_TTL)
        .worker_shutdown_ttl(Duration::from_secs(10))
        .job_sink_block(Duration::from_millis(100))
        .join()
        .expect("child join");
    let running: Arc<Mutex<HashMap<String, u64>>> = Arc::new(Mutex::new(HashMap::new()));
    // The naive jobs: every 20 ms each running job writes a tick.
    {
        let running = running.clone();
        let mut res = OpenOptions::new()
            .create(true)
            .append(true)
            .open(audit.join("resource.log"))
            .unwrap();
        let pid = std::process::id();
        std::thread::spawn(move || loop {
            let jobs: Vec<(String, u64)> = running
                .lock()
                .unwrap()
                .iter()
                .map(|(k, t)| (k.clone(), *t))
                .collect();
            let mut buf = String::new();
            for (k, t) in jobs {
                buf.push_str(&format!("tick {k} {t} {pid}\n"));
            }
            // One write per line keeps each line whole in an O_APPEND file.
            for line in buf.lines() {
                res.write_all(format!("{line}\n").as_bytes()).unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        });
    }
    let mut workers = Vec::new();
    let mut next = 0;
    let mut add = |workers: &mut Vec<sidejob_pulse::Worker>| {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(audit.join(format!("w-{label}-{next}-{}.log", std::process::id())))
            .unwrap();
        next += 1;
        let h = Audited {
            log,
            running: running.clone(),
        };
        workers.push(node.add_worker(10_000, h).expect("add worker"));
    };
    let n: usize = env("PULSE_WORKERS").parse().unwrap();
    for _ in 0..n {
        add(&mut workers);
    }
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().as_str() {
            "add" => {
                add(&mut workers);
                println!("added");
            }
            "remove" => {
                if !workers.is_empty() {
                    workers.remove(0).remove().expect("remove worker");
                }
                println!("removed");
            }
            _ => break,
        }
    }
    node.close();
    println!("closed");
}

// --------------------------------------------------------------- parent --

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pid: u32,
}

impl Proc {
    fn spawn(label: &str, url: &str, pool: &str, audit: &Path, workers: usize) -> Proc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("PULSE_CHILD", label)
            .env("PULSE_URL", url)
            .env("PULSE_POOL", pool)
            .env("PULSE_AUDIT", audit)
            .env("PULSE_WORKERS", workers.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut p = Proc {
            pid: child.id(),
            stdin: child.stdin.take(),
            child,
            lines,
        };
        p.expect("ready");
        p
    }

    fn expect(&mut self, what: &str) {
        let got = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("child {} did not say {what}", self.pid));
        assert_eq!(got, what);
    }

    fn send(&mut self, cmd: &str, reply: &str) {
        writeln!(self.stdin.as_mut().unwrap(), "{cmd}").unwrap();
        self.expect(reply);
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(sig)
            .arg(self.pid.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.pid);
    }

    /// `kill -9`; returns the wall time just before.
    fn kill9(&mut self) -> u128 {
        let t = wall_ns();
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        t
    }

    fn quit(mut self) {
        drop(self.stdin.take());
        let _ = self.lines.recv_timeout(Duration::from_secs(20));
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone)]
struct Interval {
    file: String,
    pid: u32,
    token: u64,
    start: u128,
    stop: Option<(u128, String)>,
}

/// What the parent knows that the records cannot say.
#[derive(Default)]
struct Faults {
    /// (pid, wall time) of each `kill -9`.
    kills: Vec<(u32, u128)>,
    /// (pid, SIGSTOP time, SIGCONT time).
    freezes: Vec<(u32, u128, u128)>,
}

struct Audit {
    by_key: BTreeMap<String, Vec<Interval>>,
    stale_ticks: HashMap<u32, usize>,
}

/// Reads every worker's records (and the resource log), nothing else.
fn read_audit(dir: &Path, faults: &Faults) -> Audit {
    let mut by_key: BTreeMap<String, Vec<Interval>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("w-") {
            continue;
        }
        let pid: u32 = name
            .trim_end_matches(".log")
            .rsplit('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut open: HashMap<String, Interval> = HashMap::new();
        for line in text
            .split_inclusive('\n')
            .filter_map(|l| l.strip_suffix('\n'))
        {
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "start" => {
                    let iv = Interval {
                        file: name.clone(),
                        pid,
                        token: f[2].parse().unwrap(),
                        start: f[3].parse().unwrap(),
                        stop: None,
                    };
                    assert!(
                        open.insert(f[1].into(), iv).is_none(),
                        "{name}: {line}: already running"
                    );
                }
                "stop" => {
                    let mut iv = open
                        .remove(f[1])
                        .unwrap_or_else(|| panic!("{name}: {line}: not running"));
                    assert_eq!(iv.token, f[2].parse::<u64>().unwrap(), "{name}: {line}");
                    iv.stop = Some((f[4].parse().unwrap(), f[3].into()));
                    by_key.entry(f[1].into()).or_default().push(iv);
                }
                _ => panic!("{name}: bad line {line}"),
            }
        }
        // A killed process's open jobs ended with it.
        let killed = faults.kills.iter().find(|(p, _)| *p == pid);
        for (k, mut iv) in open {
            if let Some((_, t)) = killed {
                iv.stop = Some((*t, "Killed".into()));
            }
            by_key.entry(k).or_default().push(iv);
        }
    }
    for ivs in by_key.values_mut() {
        ivs.sort_by_key(|i| i.start);
    }
    // The resource, replayed in file order with a fence per key.
    let mut stale_ticks = HashMap::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("resource.log")) {
        let mut highest: HashMap<&str, u64> = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() != 4 {
                continue; // a line cut by kill -9
            }
            let (k, t, pid): (&str, u64, u32) =
                (f[1], f[2].parse().unwrap(), f[3].parse().unwrap());
            let h = highest.entry(k).or_insert(0);
            if t < *h {
                *stale_ticks.entry(pid).or_insert(0) += 1;
            } else {
                *h = t;
            }
        }
    }
    Audit {
        by_key,
        stale_ticks,
    }
}

impl Audit {
    /// Keys running now (one open interval on a live process), by key.
    fn running(&self) -> HashMap<&str, usize> {
        let mut r = HashMap::new();
        for (k, ivs) in &self.by_key {
            let n = ivs.iter().filter(|i| i.stop.is_none()).count();
            if n > 0 {
                r.insert(k.as_str(), n);
            }
        }
        r
    }

    /// One owner per key, tokens increasing: intervals of a key never
    /// overlap, except where the earlier holder was frozen when the later
    /// one started, and then it stopped the job for a lost lease.
    fn check_one_owner(&self, faults: &Faults) -> usize {
        let mut excused = 0;
        for (k, ivs) in &self.by_key {
            let mut tokens = HashSet::new();
            for w in ivs.windows(2) {
                let (a, b) = (&w[0], &w[1]);
                assert!(tokens.insert(a.token), "{k}: token {} reused", a.token);
                assert!(
                    b.token > a.token,
                    "{k}: token went from {} ({}) to {} ({})",
                    a.token,
                    a.file,
                    b.token,
                    b.file
                );
                let end = a.stop.as_ref().map_or(u128::MAX, |s| s.0);
                if end > b.start {
                    let frozen = faults
                        .freezes
                        .iter()
                        .any(|(p, from, to)| *p == a.pid && *from <= b.start && b.start <= *to);
                    assert!(
                        frozen,
                        "{k}: {} (token {}) ran until {end} but {} (token {}) started at {}",
                        a.file, a.token, b.file, b.token, b.start
                    );
                    assert_eq!(
                        a.stop.as_ref().map(|s| s.1.as_str()),
                        Some("LeaseLost"),
                        "{k}: a frozen owner stops for its lost lease"
                    );
                    excused += 1;
                }
            }
        }
        excused
    }

    /// No loss: every key in `want` runs exactly once, nothing else runs.
    fn check_complete(&self, want: &HashSet<String>) -> Result<(), String> {
        let running = self.running();
        for k in want {
            match running.get(k.as_str()) {
                Some(1) => {}
                n => {
                    return Err(format!(
                        "{k} running {n:?} times: {:?}",
                        self.by_key.get(k.as_str())
                    ))
                }
            }
        }
        if let Some(k) = running.keys().find(|k| !want.contains(**k)) {
            return Err(format!("{k} runs but was not wanted"));
        }
        Ok(())
    }
}

/// Polls the records (nothing else) until every wanted key runs once.
fn wait_complete(dir: &Path, faults: &Faults, want: &HashSet<String>, within: Duration) -> Audit {
    let deadline = Instant::now() + within;
    loop {
        let a = read_audit(dir, faults);
        match a.check_complete(want) {
            Ok(()) => return a,
            Err(e) if Instant::now() >= deadline => panic!("not complete in {within:?}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

struct Env {
    redis: redis_support::Server,
    dir: PathBuf,
    pool: String,
}

fn env(name: &str, persist: bool) -> Option<Env> {
    let redis = redis_support::start(persist)?;
    let dir = redis.dir.join(format!("audit-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    Some(Env {
        redis,
        dir,
        pool: name.into(),
    })
}

impl Env {
    fn client(&self) -> Node {
        self.client_with(Durability::Primary)
    }
    fn client_with(&self, durability: Durability) -> Node {
        Node::builder()
            .name(&self.pool)
            .url(self.redis.url())
            .client_only(true)
            .worker_ttl(TTL)
            .pending_job_ttl(PENDING_TTL)
            .max_queued_jobs(100_000)
            .durability(durability)
            .join()
            .unwrap()
    }
    fn spawn(&self, label: &str, workers: usize) -> Proc {
        Proc::spawn(label, &self.redis.url(), &self.pool, &self.dir, workers)
    }
}

fn dispatch_all(client: &Node, keys: impl IntoIterator<Item = String>, want: &mut HashSet<String>) {
    for k in keys {
        client.dispatch(&k, b"payload").unwrap();
        want.insert(k);
    }
}

fn kill9_moves_jobs_within_ttl_plus_pending_ttl() {
    kill9(false);
}

/// The same with durable acknowledgements (a replica, `WAIT 1`): a node's
/// death does not touch what Redis holds, and every acknowledged job the
/// killed node ran starts elsewhere within the same bound.
fn kill9_with_durable_acknowledgements_moves_jobs_the_same() {
    kill9(true);
}

fn kill9(durable: bool) {
    let Some(e) = env(if durable { "kill9-durable" } else { "kill9" }, false) else {
        return;
    };
    let replica = durable.then(|| {
        let r = redis_support::start_replica(e.redis.port).expect("replica");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut c = r.conn();
        while !redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut c)
            .unwrap()
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "replica not linked");
            std::thread::sleep(Duration::from_millis(20)); // polling the link
        }
        r
    });
    let mut procs: Vec<Proc> = (0..3).map(|i| e.spawn(&format!("p{i}"), 2)).collect();
    let client = e.client_with(if durable {
        Durability::Replicas {
            replicas: 1,
            timeout: Duration::from_secs(1),
        }
    } else {
        Durability::Primary
    });
    let mut want = HashSet::new();
    dispatch_all(&client, (0..150).map(|i| format!("k{i}")), &mut want);
    let mut faults = Faults::default();
    let before = wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    let victim = procs.remove(1);
    let victim_pid = victim.pid;
    let mut victim = victim;
    let t_kill = victim.kill9();
    faults.kills.push((victim_pid, t_kill));
    let victims: Vec<String> = before
        .by_key
        .iter()
        .filter(|(_, ivs)| ivs.iter().any(|i| i.pid == victim_pid && i.stop.is_none()))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(!victims.is_empty(), "the victim held jobs");
    let after = wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    after.check_one_owner(&faults);
    let bound = (TTL + PENDING_TTL).as_nanos();
    let mut worst = 0;
    for k in &victims {
        let next = after.by_key[k]
            .iter()
            .find(|i| i.start > t_kill)
            .unwrap_or_else(|| panic!("{k} never restarted"));
        worst = worst.max(next.start - t_kill);
        assert!(
            next.start - t_kill <= bound,
            "{k} restarted {} ms after the kill, past worker TTL + pending TTL",
            (next.start - t_kill) / 1_000_000
        );
    }
    assert!(after.stale_ticks.is_empty(), "{:?}", after.stale_ticks);
    println!(
        "  {} jobs of the killed node restarted elsewhere within {} ms (bound {} ms)",
        victims.len(),
        worst / 1_000_000,
        bound / 1_000_000
    );
    client.close();
    for p in procs {
        p.quit();
    }
    drop(replica);
}

fn sigstop_past_the_ttl_then_sigcont() {
    let Some(e) = env("sigstop", false) else {
        return;
    };
    let procs: Vec<Proc> = (0..3).map(|i| e.spawn(&format!("p{i}"), 1)).collect();
    let client = e.client();
    let mut want = HashSet::new();
    dispatch_all(&client, (0..90).map(|i| format!("k{i}")), &mut want);
    let mut faults = Faults::default();
    let before = wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    let frozen = &procs[0];
    let held: Vec<String> = before
        .by_key
        .iter()
        .filter(|(_, ivs)| ivs.iter().any(|i| i.pid == frozen.pid && i.stop.is_none()))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(!held.is_empty());
    let t_stop = wall_ns();
    frozen.signal("-STOP");
    // Its jobs start elsewhere while it is frozen: poll the records.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = read_audit(&e.dir, &faults);
        let moved = held.iter().all(|k| {
            a.by_key[k]
                .iter()
                .any(|i| i.pid != frozen.pid && i.stop.is_none())
        });
        if moved {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the frozen node's jobs did not move"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the new owners tick for a while, then thaw.
    std::thread::sleep(Duration::from_millis(300));
    frozen.signal("-CONT");
    faults.freezes.push((frozen.pid, t_stop, wall_ns()));
    // It stops the jobs it lost, joins again, and takes its share back.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let a = read_audit(&e.dir, &faults);
        let rejoined = a
            .by_key
            .values()
            .any(|ivs| ivs.iter().any(|i| i.pid == frozen.pid && i.start > t_stop));
        if rejoined && a.check_complete(&want).is_ok() {
            break a;
        }
        assert!(Instant::now() < deadline, "no settle after SIGCONT");
        std::thread::sleep(Duration::from_millis(50));
    };
    let excused = after.check_one_owner(&faults);
    assert_eq!(excused, held.len(), "each held job overlapped once, frozen");
    // Thawed, the frozen node stopped every job it had lost before it
    // started anything again.
    let t_cont = faults.freezes[0].2;
    let frozen_ivs = after
        .by_key
        .values()
        .flatten()
        .filter(|i| i.pid == frozen.pid);
    let last_lost_stop = frozen_ivs
        .clone()
        .filter_map(|i| i.stop.as_ref().filter(|s| s.1 == "LeaseLost").map(|s| s.0))
        .max()
        .expect("LeaseLost stops");
    let first_new_start = frozen_ivs
        .filter(|i| i.start > t_stop)
        .map(|i| i.start)
        .min()
        .expect("a new start");
    assert!(
        last_lost_stop < first_new_start,
        "stopped its lost jobs first"
    );
    assert!(
        last_lost_stop < t_cont + TTL.as_nanos(),
        "stopped them within a TTL of SIGCONT"
    );
    for (pid, n) in &after.stale_ticks {
        assert_eq!(
            *pid, frozen.pid,
            "{n} stale writes from a process never frozen"
        );
    }
    println!(
        "  {} jobs moved off the frozen node; after SIGCONT it stopped them (LeaseLost); \
         the fence refused {} stale writes, all from the frozen process",
        held.len(),
        after.stale_ticks.values().sum::<usize>()
    );
    client.close();
    for p in procs {
        p.quit();
    }
}

fn one_node_cut_off_from_redis_stops_before_its_jobs_move() {
    let Some(e) = env("partition", false) else {
        return;
    };
    // p0 reaches Redis through a proxy that the test blackholes.
    let gate = proxy::Proxy::start(e.redis.port);
    let cut = Proc::spawn("p0", &gate.url(), &e.pool, &e.dir, 2);
    let others: Vec<Proc> = (1..3).map(|i| e.spawn(&format!("p{i}"), 1)).collect();
    let client = e.client();
    let mut want = HashSet::new();
    dispatch_all(&client, (0..120).map(|i| format!("k{i}")), &mut want);
    let faults = Faults::default();
    let before = wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    let held: Vec<String> = before
        .by_key
        .iter()
        .filter(|(_, ivs)| ivs.iter().any(|i| i.pid == cut.pid && i.stop.is_none()))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(held.len() > 1);
    gate.set(proxy::BLACKHOLE);
    // One of its jobs is stopped while it is cut off: Redis keeps its
    // state, so when the node's lease runs out and it later joins again,
    // it must not hand that job back (it hands back only into a pool
    // re-created since: issue 38 item 1).
    let (stopped, held) = held.split_first().unwrap();
    client.stop(stopped).unwrap();
    want.remove(stopped);
    // Its other jobs start elsewhere while it is cut off.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = read_audit(&e.dir, &faults);
        if held.iter().all(|k| {
            a.by_key[k]
                .iter()
                .any(|i| i.pid != cut.pid && i.stop.is_none())
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cut-off node's jobs did not move"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    gate.set(proxy::PASS);
    // Healed, it joins again and takes its share back.
    let deadline = Instant::now() + Duration::from_secs(20);
    let t_heal = wall_ns();
    let after = loop {
        let a = read_audit(&e.dir, &faults);
        let back = a
            .by_key
            .values()
            .any(|ivs| ivs.iter().any(|i| i.pid == cut.pid && i.start > t_heal));
        if back && a.check_complete(&want).is_ok() {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "no settle after the partition healed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // No process was frozen, so no overlap is excused: the cut-off node
    // stopped each job (LeaseLost) before its new owner started it.
    assert_eq!(after.check_one_owner(&faults), 0);
    assert!(after.stale_ticks.is_empty(), "{:?}", after.stale_ticks);
    let gap = held
        .iter()
        .map(|k| {
            let ivs = &after.by_key[k];
            let lost = ivs.iter().find(|i| i.pid == cut.pid).unwrap();
            let (stop, why) = lost.stop.clone().unwrap();
            assert_eq!(why, "LeaseLost", "{k}");
            let next = ivs.iter().find(|i| i.start > lost.start).unwrap();
            next.start - stop
        })
        .min()
        .unwrap();
    println!(
        "  {} jobs of the cut-off node stopped on its own clock (LeaseLost); the \
         smallest gap from such a stop to the new owner's start: {} ms",
        held.len(),
        gap / 1_000_000
    );
    drop(gate);
    cut.quit();
    for p in others {
        p.quit();
    }
    // Every node has gone (the healed one had handed back what it would
    // by the time it started its share again): the job stopped while its
    // node was cut off was not brought back into the pool.
    assert_eq!(client.stop(stopped), Err(Error::NotFound), "{stopped}");
    client.close();
}

fn workers_added_and_removed_under_load() {
    let Some(e) = env("churn", false) else { return };
    let mut procs: Vec<Proc> = (0..2).map(|i| e.spawn(&format!("p{i}"), 1)).collect();
    let client = e.client();
    let want = Arc::new(Mutex::new(HashSet::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Load: keys dispatched and stopped all along.
    let load = {
        let (client, want, stop) = (client.clone(), want.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            // Relaxed: a flag to end the loop; nothing is published with it.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let k = format!("k{i}");
                client.dispatch(&k, b"x").unwrap();
                want.lock().unwrap().insert(k);
                if i % 3 == 2 {
                    let old = format!("k{}", i - 2);
                    client.stop(&old).unwrap();
                    want.lock().unwrap().remove(&old);
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            i
        })
    };
    for round in 0..3 {
        procs[round % 2].send("add", "added");
        std::thread::sleep(Duration::from_millis(400));
        procs[(round + 1) % 2].send("remove", "removed");
        std::thread::sleep(Duration::from_millis(400));
    }
    procs.push(e.spawn("p2", 2));
    std::thread::sleep(Duration::from_millis(400));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let dispatched = load.join().unwrap();
    let want = want.lock().unwrap().clone();
    let faults = Faults::default();
    let a = wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    assert_eq!(a.check_one_owner(&faults), 0, "no overlap at all");
    assert!(a.stale_ticks.is_empty(), "{:?}", a.stale_ticks);
    let moves = a
        .by_key
        .values()
        .flatten()
        .filter(|i| i.stop.as_ref().is_some_and(|s| s.1 == "Moved"))
        .count();
    assert!(moves > 0, "workers came and went, so jobs moved");
    println!(
        "  {dispatched} dispatched, {} running at the end, {moves} hand-overs, no overlap",
        want.len()
    );
    client.close();
    for p in procs {
        p.quit();
    }
}

fn redis_restart(persist: bool, outage: Duration) {
    let name = if persist {
        "restart-aof"
    } else {
        "restart-empty"
    };
    let Some(mut e) = env(name, persist) else {
        return;
    };
    let procs: Vec<Proc> = (0..2).map(|i| e.spawn(&format!("p{i}"), 2)).collect();
    let client = e.client();
    let mut want = HashSet::new();
    dispatch_all(&client, (0..80).map(|i| format!("a{i}")), &mut want);
    let faults = Faults::default();
    wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    e.redis.kill();
    std::thread::sleep(outage);
    e.redis.restart();
    // New jobs after the restart (retried while the pool comes back).
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..40 {
        let k = format!("b{i}");
        loop {
            match client.dispatch(&k, b"after") {
                Ok(()) | Err(Error::Exists) => break,
                Err(err) => {
                    assert!(Instant::now() < deadline, "dispatch after restart: {err}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        want.insert(k);
    }
    let a = wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    assert_eq!(a.check_one_owner(&faults), 0);
    assert!(a.stale_ticks.is_empty(), "{:?}", a.stale_ticks);
    let lost = a
        .by_key
        .values()
        .flatten()
        .filter(|i| i.stop.as_ref().is_some_and(|s| s.1 == "LeaseLost"))
        .count();
    println!(
        "  Redis {} after {} ms: {} jobs running, {lost} stopped for a lost lease and restarted",
        if persist {
            "restarted with its AOF"
        } else {
            "restarted empty"
        },
        outage.as_millis(),
        want.len()
    );
    if !persist {
        assert_eq!(
            lost, 0,
            "a short outage: every job kept running and was adopted"
        );
    }
    client.close();
    for p in procs {
        p.quit();
    }
}

/// Issue 38 item 1: Redis restarted empty and down for longer than the
/// lease. Every worker's lease runs out while Redis is away, so each stops
/// its jobs (`LeaseLost`); when Redis is back, empty, every job that was
/// acknowledged and running must run again, exactly once, under a larger
/// token, and never beside its old run. The figure printed is how many of
/// the jobs came back.
fn redis_restarts_empty_past_the_lease_and_running_jobs_run_again() {
    let Some(mut e) = env("restart-empty-long", false) else {
        return;
    };
    let procs: Vec<Proc> = (0..2).map(|i| e.spawn(&format!("p{i}"), 2)).collect();
    let client = e.client();
    let mut want = HashSet::new();
    dispatch_all(&client, (0..80).map(|i| format!("a{i}")), &mut want);
    let faults = Faults::default();
    let before = wait_complete(&e.dir, &faults, &want, Duration::from_secs(20));
    let tokens_before: HashMap<String, u64> = before
        .by_key
        .iter()
        .map(|(k, ivs)| (k.clone(), ivs.last().unwrap().token))
        .collect();
    e.redis.kill();
    let t_down = wall_ns();
    // Longer than the lease: every worker stops its jobs on its own clock
    // while Redis is away. Polling the records with a deadline.
    let outage = TTL + TTL / 2;
    let deadline = Instant::now() + outage;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let lease_lost = read_audit(&e.dir, &faults)
        .by_key
        .values()
        .flatten()
        .filter(|i| i.stop.as_ref().is_some_and(|s| s.1 == "LeaseLost"))
        .count();
    e.redis.restart();
    let t_up = wall_ns();
    // Every acknowledged running job runs again, exactly once: polled from
    // the records (nothing else) until a deadline well past learning mode
    // (ttl + grace) plus a heartbeat and a pending-job TTL.
    let within = Duration::from_secs(15);
    let deadline = Instant::now() + within;
    let (a, back) = loop {
        let a = read_audit(&e.dir, &faults);
        let running = a.running();
        let back = want
            .iter()
            .filter(|k| {
                running.get(k.as_str()) == Some(&1)
                    && a.by_key[k.as_str()]
                        .iter()
                        .any(|i| i.stop.is_none() && i.start > t_up)
            })
            .count();
        if back == want.len() || Instant::now() >= deadline {
            break (a, back);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "  Redis down {} ms (lease {} ms), restarted empty: {lease_lost} jobs stopped for a \
         lost lease while it was away; {back} of {} acknowledged running jobs run again, {} lost",
        (t_up - t_down) / 1_000_000,
        TTL.as_millis(),
        want.len(),
        want.len() - back
    );
    assert_eq!(lease_lost, want.len(), "every job stopped on its own clock");
    assert_eq!(
        back,
        want.len(),
        "{} of {} acknowledged running jobs lost after an empty restart",
        want.len() - back,
        want.len()
    );
    a.check_complete(&want).unwrap();
    // One owner per key (no overlap at all: no process was frozen), tokens
    // rising, and the new run's token above the one before the restart.
    assert_eq!(a.check_one_owner(&faults), 0);
    assert!(a.stale_ticks.is_empty(), "{:?}", a.stale_ticks);
    for (k, ivs) in &a.by_key {
        let now = ivs.iter().find(|i| i.stop.is_none()).unwrap();
        assert!(now.token > tokens_before[k], "{k}: the new run is fenced");
    }
    client.close();
    for p in procs {
        p.quit();
    }
}

fn redis_restarts_empty_within_the_ttl_and_jobs_are_adopted() {
    redis_restart(false, Duration::from_millis(100));
}

fn redis_restarts_from_its_aof_after_more_than_the_ttl() {
    redis_restart(true, Duration::from_millis(1500));
}

fn main() {
    if std::env::var("PULSE_CHILD").is_ok() {
        child_main();
        return;
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let tests: [(&str, fn()); 8] = [
        (
            "kill9_moves_jobs_within_ttl_plus_pending_ttl",
            kill9_moves_jobs_within_ttl_plus_pending_ttl,
        ),
        (
            "kill9_with_durable_acknowledgements_moves_jobs_the_same",
            kill9_with_durable_acknowledgements_moves_jobs_the_same,
        ),
        (
            "sigstop_past_the_ttl_then_sigcont",
            sigstop_past_the_ttl_then_sigcont,
        ),
        (
            "one_node_cut_off_from_redis_stops_before_its_jobs_move",
            one_node_cut_off_from_redis_stops_before_its_jobs_move,
        ),
        (
            "workers_added_and_removed_under_load",
            workers_added_and_removed_under_load,
        ),
        (
            "redis_restarts_empty_within_the_ttl_and_jobs_are_adopted",
            redis_restarts_empty_within_the_ttl_and_jobs_are_adopted,
        ),
        (
            "redis_restarts_empty_past_the_lease_and_running_jobs_run_again",
            redis_restarts_empty_past_the_lease_and_running_jobs_run_again,
        ),
        (
            "redis_restarts_from_its_aof_after_more_than_the_ttl",
            redis_restarts_from_its_aof_after_more_than_the_ttl,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, f) in tests {
        if filter.as_deref().is_some_and(|x| !name.contains(x)) {
            continue;
        }
        println!("test {name} ...");
        let t = Instant::now();
        match std::panic::catch_unwind(f) {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
            }
            Err(_) => {
                failed += 1;
                println!("test {name} ... FAILED");
            }
        }
    }
    println!("\n{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
