//! A `redis-server` that asks for a login and speaks TLS: `requirepass`
//! for the default user, an ACL user `alice`, a plain port and a
//! `tls-port`, with a CA and server certificate made for the test by the
//! `openssl` command line (installed by `.ci/run` when missing). Killed by
//! pid when dropped. Shared by sidejob-redis's and sidejob-pulse's tests.
//! Started as `redis.rs` starts its servers: only our own child answering
//! counts, and a port lost to another test is tried again on a new one.

#[path = "redis.rs"]
pub mod plain;

use plain::{free_port, wait_started, Started, START_ATTEMPTS};

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

pub const PASSWORD: &str = "s3cret-default-pw";
pub const ACL_USER: &str = "alice";
pub const ACL_PASSWORD: &str = "alice-Secret-42";

pub struct Secure {
    child: Child,
    pub port: u16,
    pub tls_port: u16,
    pub dir: PathBuf,
    /// The CA that signed the server's certificate (PEM).
    pub ca: Vec<u8>,
    /// Another CA, which signed nothing the server has (PEM).
    pub other_ca: Vec<u8>,
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).output().is_ok()
}

fn openssl(dir: &PathBuf, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn make_ca(dir: &PathBuf, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
}

/// Starts the server, or `None` with a loud message if `redis-server` or
/// `openssl` is missing (a failure under `CI=true`).
pub fn start() -> Option<Secure> {
    if !have("redis-server", "--version") || !have("openssl", "version") {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("redis-server or openssl missing, and CI=true: .ci/run installs them");
        }
        eprintln!("\n!!!!!!!! SKIPPED: redis-server or openssl is not installed !!!!!!!!\n");
        return None;
    }
    let dir = std::env::temp_dir().join(format!(
        "sidejob-secure-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    make_ca(&dir, "ca");
    make_ca(&dir, "other");
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let other_ca = std::fs::read(dir.join("other.crt")).unwrap();
    for attempt in 1..=START_ATTEMPTS {
        let port = free_port();
        let mut tls_port = free_port();
        while tls_port == port {
            tls_port = free_port();
        }
        let conf = dir.join("redis.conf");
        std::fs::write(
            &conf,
            format!(
                "bind 127.0.0.1\nport {port}\ntls-port {tls_port}\ndir {d}\n\
                 tls-cert-file {d}/server.crt\ntls-key-file {d}/server.key\n\
                 tls-ca-cert-file {d}/ca.crt\ntls-auth-clients no\n\
                 requirepass {PASSWORD}\nuser {ACL_USER} on >{ACL_PASSWORD} ~* &* +@all\n\
                 save \"\"\nappendonly no\nloglevel warning\nlogfile \"\"\ndaemonize no\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let mut child = plain::spawn_server(&conf);
        // Redis exits when it cannot bind either port, so our child
        // answering on the plain one holds the TLS one too.
        let client = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{port}/")).unwrap();
        match wait_started(&mut child, || {
            client.get_connection_with_timeout(Duration::from_millis(200))
        }) {
            Started::Ours => {
                return Some(Secure {
                    child,
                    port,
                    tls_port,
                    ca,
                    other_ca,
                    dir,
                })
            }
            Started::Exited(status) => eprintln!(
                "secure redis-server on ports {port}/{tls_port} exited ({status}), attempt {attempt}: a port was taken; trying others"
            ),
        }
    }
    panic!("secure redis-server did not start on any of {START_ATTEMPTS} pairs of free ports");
}

impl Secure {
    /// The plain port's URL with `userinfo` (`":pw"`, `"user:pw"`) or none.
    pub fn url(&self, userinfo: &str) -> String {
        if userinfo.is_empty() {
            format!("redis://127.0.0.1:{}/", self.port)
        } else {
            format!("redis://{userinfo}@127.0.0.1:{}/", self.port)
        }
    }

    /// The TLS port's URL (`host` "localhost" or "127.0.0.1").
    pub fn tls_url(&self, userinfo: &str, host: &str) -> String {
        if userinfo.is_empty() {
            format!("rediss://{host}:{}/", self.tls_port)
        } else {
            format!("rediss://{userinfo}@{host}:{}/", self.tls_port)
        }
    }
}

impl Drop for Secure {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
