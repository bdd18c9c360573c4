//! A real `redis-server`, started by the test on a free loopback port in
//! its own temp dir and killed (by pid) when dropped.
//!
//! A free port is one the OS handed out and took back, so another test
//! starting a server at the same moment can be handed it too. A server
//! counts as started only when the process answering on its port is our
//! child (`INFO server`'s `process_id`); one that lost the race exits (Redis
//! does when it cannot bind), and the start is tried again on a new port.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("local addr")
        .port()
}

/// How many fresh ports a start tries before it gives up.
pub const START_ATTEMPTS: usize = 5;

/// Spawns `redis-server` on config file `conf`, its output discarded.
pub fn spawn_server(conf: &std::path::Path) -> Child {
    Command::new("redis-server")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server")
}

/// What became of one start of a `redis-server` child.
pub enum Started {
    /// Our child answers on the port.
    Ours,
    /// The child exited (it could not bind: another process has the port).
    Exited(std::process::ExitStatus),
}

/// Waits (up to 10 s) until `child` answers `PING` through `connect`, or
/// exits. Whatever answers must be `child` itself: a server of another
/// test that won the port is not ours.
pub fn wait_started(
    child: &mut Child,
    mut connect: impl FnMut() -> redis::RedisResult<redis::Connection>,
) -> Started {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Started::Exited(status);
        }
        if let Ok(mut c) = connect() {
            if let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut c) {
                let pid = info
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|p| p.trim().parse::<u32>().ok());
                if pid == Some(child.id()) {
                    return Started::Ours;
                }
                // Another server has the port; ours exits once it fails
                // to bind, and the next turn sees that.
            }
        }
        assert!(
            Instant::now() < deadline,
            "redis-server (pid {}) neither answered nor exited in 10 s",
            child.id()
        );
        std::thread::sleep(Duration::from_millis(20)); // polling a child process's start-up
    }
}

/// A redis-server child process.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    persist: bool,
    /// More config lines (`replicaof ...` for a replica).
    extra: String,
}

/// Starts a server, or `None` with a loud message if redis-server is not
/// installed (a failure instead under `CI=true`).
pub fn start(persist: bool) -> Option<Server> {
    start_with(persist, String::new())
}

/// A replica of the server on `primary`'s port (its own temp dir).
pub fn start_replica(primary: u16) -> Option<Server> {
    start_with(false, format!("replicaof 127.0.0.1 {primary}\n"))
}

fn start_with(persist: bool, extra: String) -> Option<Server> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("redis-server is not installed, and CI=true: .ci/run installs it");
        }
        eprintln!("\n!!!!!!!! SKIPPED: redis-server is not installed (apt-get install redis-server) !!!!!!!!\n");
        return None;
    }
    let dir = std::env::temp_dir().join(format!(
        "sidejob-redis-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut s = Server {
        child: None,
        port: free_port(),
        dir,
        persist,
        extra,
    };
    for attempt in 1..=START_ATTEMPTS {
        match s.spawn() {
            Started::Ours => return Some(s),
            Started::Exited(status) => {
                eprintln!(
                    "redis-server on port {} exited ({status}), attempt {attempt}: the port was taken; trying another",
                    s.port
                );
                s.port = free_port();
            }
        }
    }
    panic!("redis-server did not start on any of {START_ATTEMPTS} free ports");
}

impl Server {
    fn spawn(&mut self) -> Started {
        let conf = self.dir.join("redis.conf");
        let persistence = if self.persist {
            "save \"\"\nappendonly yes\nappendfsync always\n"
        } else {
            "save \"\"\nappendonly no\n"
        };
        std::fs::write(
            &conf,
            format!(
                "bind 127.0.0.1\nport {}\ndir {}\n{persistence}enable-debug-command local\nloglevel warning\nlogfile \"\"\ndaemonize no\nmaxmemory-policy noeviction\n{}",
                self.port,
                self.dir.display(),
                self.extra
            ),
        )
        .expect("write redis.conf");
        let mut child = spawn_server(&conf);
        let client = self.client();
        let started = wait_started(&mut child, || {
            client.get_connection_with_timeout(Duration::from_millis(200))
        });
        if matches!(started, Started::Ours) {
            self.child = Some(child);
        }
        started
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("url")
    }

    pub fn conn(&self) -> redis::Connection {
        let c = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        c
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(sig)
            .arg(self.pid().to_string())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// SIGSTOP: the server freezes (connections stay open).
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// SIGKILL and wait.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kill, then start again on the same port and dir (with the AOF, if
    /// persistent, the data comes back).
    pub fn restart(&mut self) {
        self.kill();
        if let Started::Exited(status) = self.spawn() {
            panic!(
                "redis-server could not come back on port {} ({status}): another process took it",
                self.port
            );
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
