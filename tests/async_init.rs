//! `PoolBuilder::build_async_init`: every worker's async init is awaited
//! before the pool starts; a failed init fails the build, naming the
//! worker and carrying the error, with every worker already made dropped
//! and every other init cancelled before the error comes back; a panicking
//! init's panic is resumed after the same clean-up; an init that awaits
//! real I/O (a TCP connection to 127.0.0.1); the init awaited again after
//! a handler panics. Barriers and counters, never sleeps.

use std::error::Error as _;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use sidejob::{AsyncWorker, BuildError, Error, Pool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::{bounded, current_thread, multi_thread, poll_once};

/// Counts what the test needs to see: workers made, workers dropped,
/// inits cancelled.
#[derive(Default)]
struct Counts {
    inits: AtomicUsize,
    made: AtomicUsize,
    dropped: AtomicUsize,
    cancelled: AtomicUsize,
    terminated: AtomicUsize,
}

/// A worker that knows its index and says when it is dropped.
struct Indexed {
    index: usize,
    counts: Arc<Counts>,
}

impl Indexed {
    fn new(index: usize, counts: &Arc<Counts>) -> Indexed {
        counts.made.fetch_add(1, SeqCst);
        Indexed {
            index,
            counts: counts.clone(),
        }
    }
}

impl Drop for Indexed {
    fn drop(&mut self) {
        self.counts.dropped.fetch_add(1, SeqCst);
    }
}

/// What a request asks.
#[derive(Debug)]
enum Ask {
    /// The index of the worker that took it.
    Index,
    Panic,
}

impl AsyncWorker for Indexed {
    type Request = Ask;
    type Reply = usize;
    type Message = ();
    async fn handle_call(&mut self, ask: Ask) -> usize {
        match ask {
            Ask::Index => self.index,
            Ask::Panic => panic!("told to panic"),
        }
    }
    async fn handle_cast(&mut self, _: ()) {}
    async fn terminate(&mut self) {
        self.counts.terminated.fetch_add(1, SeqCst);
    }
}

/// The user's error: an `Error`, so the build's error is one too and
/// returns it as its source.
#[derive(Debug, PartialEq, Eq)]
struct Refused(&'static str);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused: {}", self.0)
    }
}

impl std::error::Error for Refused {}

/// Counts its drop: stands for an init still awaiting when it is
/// cancelled.
struct CancelGuard(Arc<Counts>);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.0.cancelled.fetch_add(1, SeqCst);
    }
}

#[test]
fn every_init_is_awaited_once_before_the_pool_serves() {
    let rt = multi_thread();
    let counts = Arc::new(Counts::default());
    let pool = {
        let counts = counts.clone();
        rt.block_on(
            Pool::builder()
                .capacity(8)
                .workers(4)
                .build_async_init(move |index| {
                    let counts = counts.clone();
                    async move {
                        counts.inits.fetch_add(1, SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, Refused>(Indexed::new(index, &counts))
                    }
                }),
        )
        .unwrap()
    };
    // Every worker made, once, before the build answered.
    assert_eq!(counts.inits.load(SeqCst), 4);
    assert_eq!(counts.made.load(SeqCst), 4);
    assert_eq!(counts.dropped.load(SeqCst), 0);
    assert_eq!(pool.workers(), 4);
    rt.block_on(async {
        for _ in 0..16 {
            let index = pool.call_async(Ask::Index).await.unwrap();
            assert!(index < 4);
        }
        pool.shutdown_async().await;
    });
    assert_eq!(counts.terminated.load(SeqCst), 4);
    assert_eq!(counts.inits.load(SeqCst), 4, "no init after the start");
    assert_eq!(counts.dropped.load(SeqCst), 4);
}

#[test]
fn a_failed_init_fails_the_build_naming_its_worker_after_the_others_are_dropped_and_cancelled() {
    bounded("a failed init", || {
        let rt = multi_thread();
        let counts = Arc::new(Counts::default());
        // Worker 2 fails once workers 0 and 1 are made and worker 3's init
        // is under way; worker 3 never answers (it must be cancelled).
        let all_there = Arc::new(tokio::sync::Barrier::new(4));
        let built = {
            let counts = counts.clone();
            rt.block_on(
                Pool::builder()
                    .capacity(8)
                    .workers(4)
                    .build_async_init(move |index| {
                        let (counts, all_there) = (counts.clone(), all_there.clone());
                        async move {
                            match index {
                                0 | 1 => {
                                    let worker = Indexed::new(index, &counts);
                                    all_there.wait().await;
                                    Ok(worker)
                                }
                                2 => {
                                    all_there.wait().await;
                                    Err(Refused("worker 2's server"))
                                }
                                _ => {
                                    let _guard = CancelGuard(counts.clone());
                                    all_there.wait().await;
                                    std::future::pending::<()>().await;
                                    unreachable!("never answers")
                                }
                            }
                        }
                    }),
            )
        };
        // No `T: Debug` needed to take the error out.
        let err = built.unwrap_err();
        assert_eq!(err.worker(), Some(2));
        assert_eq!(err.to_string(), "worker 2 failed to start");
        let source = err.source().expect("the init's error is the source");
        assert_eq!(source.to_string(), "refused: worker 2's server");
        assert!(format!("{err:?}").contains("worker: 2"));
        // By the time the error came back: both workers made are dropped,
        // the init still awaiting is cancelled, nothing else was made.
        assert_eq!(counts.made.load(SeqCst), 2);
        assert_eq!(counts.dropped.load(SeqCst), 2);
        assert_eq!(counts.cancelled.load(SeqCst), 1);
        assert_eq!(err.into_init_error(), Some(Refused("worker 2's server")));
        // `?` into a boxed error keeps the chain.
        let boxed: Box<dyn std::error::Error> = BuildError::<Refused>::Init {
            worker: 5,
            error: Refused("x"),
        }
        .into();
        assert_eq!(boxed.source().unwrap().to_string(), "refused: x");
    });
}

#[test]
fn a_panicking_init_resumes_its_panic_in_the_builder_after_the_clean_up() {
    bounded("a panicking init", || {
        let rt = multi_thread();
        let counts = Arc::new(Counts::default());
        // Worker 1 panics once worker 0 is made and worker 2's init is
        // under way; worker 2 never answers (it must be cancelled).
        let all_there = Arc::new(tokio::sync::Barrier::new(3));
        let caught =
            {
                let counts = counts.clone();
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    rt.block_on(Pool::builder().capacity(4).workers(3).build_async_init(
                        move |index| {
                            let (counts, all_there) = (counts.clone(), all_there.clone());
                            async move {
                                match index {
                                    0 => {
                                        let worker = Indexed::new(0, &counts);
                                        all_there.wait().await;
                                        Ok::<_, Refused>(worker)
                                    }
                                    1 => {
                                        all_there.wait().await;
                                        panic!("init of worker 1 panicked")
                                    }
                                    _ => {
                                        let _guard = CancelGuard(counts.clone());
                                        all_there.wait().await;
                                        std::future::pending::<()>().await;
                                        unreachable!("never answers")
                                    }
                                }
                            }
                        },
                    ))
                }))
            };
        let payload = match caught {
            Err(payload) => payload,
            Ok(_) => panic!("the build should have panicked"),
        };
        assert_eq!(
            payload.downcast_ref::<&str>(),
            Some(&"init of worker 1 panicked")
        );
        assert_eq!(counts.made.load(SeqCst), 1);
        assert_eq!(counts.dropped.load(SeqCst), 1, "worker 0 dropped");
        assert_eq!(
            counts.cancelled.load(SeqCst),
            1,
            "worker 2's init cancelled"
        );
    });
}

/// A worker owning a TCP connection to an echo server.
struct Conn {
    stream: TcpStream,
}

impl AsyncWorker for Conn {
    type Request = u8;
    type Reply = u8;
    type Message = ();
    async fn handle_call(&mut self, byte: u8) -> u8 {
        self.stream.write_all(&[byte]).await.unwrap();
        self.stream.read_u8().await.unwrap()
    }
    async fn handle_cast(&mut self, _: ()) {}
}

/// An echo server on 127.0.0.1; its address, and how many connections it
/// accepted.
async fn echo_server() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                accepted.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
    }
    (addr, accepted)
}

#[test]
fn an_init_that_connects_over_tcp_gives_every_worker_its_connection() {
    let rt = multi_thread();
    rt.block_on(async {
        let (addr, accepted) = echo_server().await;
        let pool = Pool::builder()
            .capacity(32)
            .workers(4)
            .build_async_init(move |_| async move {
                let stream = TcpStream::connect(addr).await?;
                Ok::<_, std::io::Error>(Conn { stream })
            })
            .await
            .unwrap();
        let calls: Vec<_> = (0..32u8).map(|n| pool.call_async(n)).collect();
        for (n, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await, Ok(n as u8));
        }
        pool.shutdown_async().await;
        // One connection per worker, opened by its init (the server may
        // count the last one a moment after the client's connect returns).
        while accepted.load(SeqCst) < 4 {
            tokio::task::yield_now().await;
        }
        assert_eq!(accepted.load(SeqCst), 4);
    });
}

#[test]
fn an_init_whose_connection_is_refused_fails_the_build_with_the_io_error() {
    let rt = multi_thread();
    rt.block_on(async {
        // A port nobody listens on any more.
        let closed = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let built = Pool::builder()
            .capacity(4)
            .workers(2)
            .build_async_init(move |_| async move {
                Ok::<_, std::io::Error>(Conn {
                    stream: TcpStream::connect(closed).await?,
                })
            })
            .await;
        match built {
            Err(BuildError::Init { worker, error }) => {
                assert!(worker < 2);
                assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
            }
            Err(other) => panic!("expected a failed init, got {other}"),
            Ok(_) => panic!("expected a failed init, got a pool"),
        }
    });
}

#[test]
fn after_a_handler_panics_the_init_runs_again_and_a_failed_reinit_is_retried_on_the_next_request() {
    let rt = current_thread();
    let counts = Arc::new(Counts::default());
    // The init's answers, in order: made, refused (the re-init after the
    // panic), made (on the next request).
    let script = Arc::new(Mutex::new(vec![true, false, true].into_iter()));
    let pool = {
        let counts = counts.clone();
        rt.block_on(
            Pool::builder()
                .capacity(4)
                .workers(1)
                .build_async_init(move |index| {
                    let (counts, script) = (counts.clone(), script.clone());
                    async move {
                        counts.inits.fetch_add(1, SeqCst);
                        let ok = script.lock().unwrap().next().expect("three inits at most");
                        if ok {
                            Ok(Indexed::new(index, &counts))
                        } else {
                            Err(Refused("reconnect"))
                        }
                    }
                }),
        )
        .unwrap()
    };
    rt.block_on(async {
        assert_eq!(
            pool.call_async(Ask::Panic).await,
            Err(Error::WorkerPanicked)
        );
        assert_eq!(pool.call_async(Ask::Index).await, Ok(0));
        assert_eq!(counts.inits.load(SeqCst), 3);
        assert_eq!(counts.made.load(SeqCst), 2);
        assert_eq!(counts.dropped.load(SeqCst), 1, "the panicked state");
        pool.shutdown_async().await;
    });
    assert_eq!(counts.terminated.load(SeqCst), 1);
}

#[test]
fn settings_and_a_missing_runtime_are_config_errors() {
    let rt = current_thread();
    let init = |index| async move { Ok::<_, Refused>(Indexed::new(index, &Arc::default())) };
    let err = rt
        .block_on(Pool::builder().workers(2).build_async_init(init))
        .unwrap_err();
    assert!(matches!(&err, BuildError::Config(config) if config.field() == "capacity"));
    assert_eq!(err.worker(), None);
    // The settings are read when called; the runtime, when first polled.
    let mut outside = Box::pin(Pool::builder().capacity(2).build_async_init(init));
    match poll_once(&mut outside) {
        std::task::Poll::Ready(Err(BuildError::Config(config))) => {
            assert_eq!(config.field(), "workers")
        }
        _ => panic!("expected no runtime"),
    }
}

#[test]
fn dropping_the_build_future_cancels_the_inits() {
    let rt = multi_thread();
    let counts = Arc::new(Counts::default());
    rt.block_on(async {
        // The test and both inits: passed once both inits are under way.
        let started = Arc::new(tokio::sync::Barrier::new(3));
        let mut build = {
            let (counts, started) = (counts.clone(), started.clone());
            Box::pin(
                Pool::builder()
                    .capacity(4)
                    .workers(2)
                    .build_async_init(move |_| {
                        let (counts, started) = (counts.clone(), started.clone());
                        async move {
                            let _guard = CancelGuard(counts);
                            started.wait().await;
                            std::future::pending::<Result<Indexed, Refused>>().await
                        }
                    }),
            )
        };
        // One poll spawns the inits; once both run, give up.
        assert!(poll_once(&mut build).is_pending());
        started.wait().await;
        drop(build);
        // Aborted tasks are dropped by the runtime soon after.
        while counts.cancelled.load(SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
    });
    assert_eq!(counts.cancelled.load(SeqCst), 2);
    assert_eq!(counts.made.load(SeqCst), 0);
}
