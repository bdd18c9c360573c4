//! A loopback TCP proxy that can pass, blackhole (accept and drop bytes,
//! connections open) or cut (close everything, refuse new) traffic.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

pub const PASS: u8 = 0;
pub const BLACKHOLE: u8 = 1;
pub const CUT: u8 = 2;

pub struct Proxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    upstream: Arc<AtomicU16>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let mode = Arc::new(AtomicU8::new(PASS));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (mode.clone(), stop.clone());
        let upstream = Arc::new(AtomicU16::new(upstream));
        let up_port = upstream.clone();
        std::thread::spawn(move || {
            while !s.load(SeqCst) {
                match listener.accept() {
                    Ok((down, _)) => {
                        if m.load(SeqCst) == CUT {
                            continue; // dropped: refused
                        }
                        let Ok(up) = TcpStream::connect(("127.0.0.1", up_port.load(SeqCst))) else {
                            continue;
                        };
                        down.set_nonblocking(false).expect("blocking");
                        for (from, to) in [
                            (down.try_clone().unwrap(), up.try_clone().unwrap()),
                            (up, down),
                        ] {
                            let (m, s) = (m.clone(), s.clone());
                            std::thread::spawn(move || pump(from, to, &m, &s));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)), // accept poll
                }
            }
        });
        Proxy {
            port,
            mode,
            stop,
            upstream,
        }
    }

    /// New connections go to `port` from now on (a failover).
    pub fn retarget(&self, port: u16) {
        self.upstream.store(port, SeqCst);
    }

    pub fn set(&self, mode: u8) {
        self.mode.store(mode, SeqCst);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, mode: &AtomicU8, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(10)))
        .expect("timeout");
    let mut buf = [0u8; 16 * 1024];
    loop {
        if stop.load(SeqCst) || mode.load(SeqCst) == CUT {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
            Ok(n) => {
                if mode.load(SeqCst) == PASS && to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}
