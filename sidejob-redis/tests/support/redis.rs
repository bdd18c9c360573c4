//! A real `redis-server`, started by the test on a free loopback port in
//! its own temp dir and killed (by pid) when dropped.

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
    s.spawn();
    Some(s)
}

impl Server {
    fn spawn(&mut self) {
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
        let child = Command::new("redis-server")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = self
                .client()
                .get_connection_with_timeout(Duration::from_millis(200))
            {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20)); // polling a child process's start-up
        }
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
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
