//! A real `redis-sentinel` (Debian's package), started by the test on a
//! free loopback port in its own temp dir and killed (by pid) when dropped.
//! It reuses the `redis-server` helper's machinery (`free_port`,
//! `wait_started`: a start counts only when our child answers, and is
//! tried again on a new port if another process won the port), so the
//! test file must load that helper as `redis_support`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_support::{free_port, wait_started, Started, START_ATTEMPTS};

/// The name under which the Sentinel monitors the primary.
pub const MASTER: &str = "pulse";

/// A redis-sentinel child process.
pub struct Sentinel {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

/// Whether `redis-sentinel` runs here: `false` with a loud message if it is
/// not installed, a failure instead under `CI=true` (`.ci/run` installs it).
pub fn available() -> bool {
    if Command::new("redis-sentinel")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("redis-sentinel is not installed, and CI=true: .ci/run installs it");
    }
    eprintln!("\n!!!!!!!! SKIPPED: redis-sentinel is not installed (apt-get install redis-sentinel) !!!!!!!!\n");
    false
}

/// Starts a Sentinel monitoring the primary on `primary` (quorum 1: it is
/// the only Sentinel), judging it down after `down_after` without an
/// answer; with `primary` `None`, a Sentinel that monitors nothing.
/// `None` if redis-sentinel is not installed (see [`available`]).
pub fn start(primary: Option<u16>, down_after: Duration) -> Option<Sentinel> {
    if !available() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!(
        "sidejob-sentinel-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut s = Sentinel {
        child: None,
        port: free_port(),
        dir,
    };
    for attempt in 1..=START_ATTEMPTS {
        let monitor = match primary {
            Some(p) => format!(
                "sentinel monitor {MASTER} 127.0.0.1 {p} 1\n\
                 sentinel down-after-milliseconds {MASTER} {}\n\
                 sentinel failover-timeout {MASTER} 10000\n\
                 sentinel parallel-syncs {MASTER} 1\n",
                down_after.as_millis()
            ),
            None => String::new(),
        };
        // Sentinel rewrites its config file: it lives in the temp dir.
        let conf = s.dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "bind 127.0.0.1\nport {}\ndir {}\ndaemonize no\nlogfile \"\"\nloglevel warning\n{monitor}",
                s.port,
                s.dir.display()
            ),
        )
        .expect("write sentinel.conf");
        let mut child = Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-sentinel");
        let client = s.client();
        match wait_started(&mut child, || {
            client.get_connection_with_timeout(Duration::from_millis(200))
        }) {
            Started::Ours => {
                s.child = Some(child);
                return Some(s);
            }
            Started::Exited(status) => {
                eprintln!(
                    "redis-sentinel on port {} exited ({status}), attempt {attempt}: trying another port",
                    s.port
                );
                s.port = free_port();
            }
        }
    }
    panic!("redis-sentinel did not start on any of {START_ATTEMPTS} free ports");
}

impl Sentinel {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("url")
    }

    fn conn(&self) -> redis::Connection {
        let c = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to the sentinel");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        c
    }

    /// The primary's port as the Sentinel names it now (`None`: it names
    /// none).
    pub fn primary(&self) -> Option<u16> {
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER)
            .query(&mut self.conn())
            .expect("SENTINEL get-master-addr-by-name");
        addr.map(|(_, port)| port)
    }

    /// Whether the Sentinel knows `replica` as a healthy replica of the
    /// primary (it learns of replicas from the primary's INFO).
    pub fn knows_replica(&self, replica: u16) -> bool {
        let replicas: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("replicas")
            .arg(MASTER)
            .query(&mut self.conn())
            .expect("SENTINEL replicas");
        replicas.iter().any(|r| {
            r.get("port").map(String::as_str) == Some(&replica.to_string())
                && r.get("flags").map(String::as_str) == Some("slave")
                && r.get("master-link-status").map(String::as_str) == Some("ok")
        })
    }

    /// Polls `what` every 20 ms until it holds, or panics after `limit`.
    pub fn wait_for(&self, limit: Duration, what: &str, mut cond: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !cond(self) {
            assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
            // Polling the Sentinel's view with a deadline.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
