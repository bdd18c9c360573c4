//! The tonic example on 127.0.0.1, called by a real tonic client: a call
//! past the capacity and the waiting room is `RESOURCE_EXHAUSTED`, one
//! that waited its `max_wait` or met a closed limiter is `UNAVAILABLE`,
//! each with the retry pushback; admitted calls answer, and the limiter's
//! counts agree with what the client saw.

#[path = "../examples/tonic_server.rs"]
mod tonic_server;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use sidejob::Limiter;
use tokio::sync::{oneshot, Semaphore};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// Bounds every scenario: a hang fails the test instead of stalling CI.
const HUNG: Duration = Duration::from_secs(60);

type Work = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// A server on loopback whose handler waits at `gate` (closed: every call
/// stays inside; open: they pass), counting the calls inside.
struct Fixture {
    limiter: Arc<Limiter>,
    gate: Arc<Semaphore>,
    inside: Arc<AtomicUsize>,
    channel: Channel,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

async fn fixture(limiter: Limiter) -> Fixture {
    let limiter = Arc::new(limiter);
    let gate = Arc::new(Semaphore::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let work: Work = {
        let (gate, inside) = (Arc::clone(&gate), Arc::clone(&inside));
        Arc::new(move |message: String| {
            let (gate, inside) = (Arc::clone(&gate), Arc::clone(&inside));
            Box::pin(async move {
                inside.fetch_add(1, SeqCst);
                gate.acquire().await.unwrap().forget();
                gate.add_permits(1);
                inside.fetch_sub(1, SeqCst);
                format!("echo: {message}")
            })
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move {
            tonic_server::serve(
                listener,
                limiter,
                move |m| work(m),
                Duration::from_millis(1500),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap()
        }
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Fixture {
        limiter,
        gate,
        inside,
        channel,
        stop: Some(stop),
        server,
    }
}

impl Fixture {
    /// Starts `n` calls that stay inside the handler until the gate opens.
    async fn hold(&self, n: usize) -> Vec<tokio::task::JoinHandle<Result<String, Status>>> {
        let calls = (0..n)
            .map(|i| {
                let channel = self.channel.clone();
                tokio::spawn(async move {
                    tonic_server::call(channel, &format!("held {i}"))
                        .await
                        .map(|r| r.into_inner())
                })
            })
            .collect();
        while self.inside.load(SeqCst) < n {
            tokio::task::yield_now().await;
        }
        calls
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.server.await.unwrap();
    }
}

/// A refusal as the client sees it: its code, message and pushback.
fn refusal(result: Result<tonic::Response<String>, Status>) -> (Code, String, Option<String>) {
    let status = result.expect_err("a refusal");
    let pushback = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .map(|v| v.to_str().unwrap().to_string());
    (status.code(), status.message().to_string(), pushback)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_capacity_and_the_room_is_resource_exhausted() {
    tokio::time::timeout(HUNG, async {
        // Capacity 2, room for 1 more.
        let limiter = Limiter::builder()
            .capacity(2)
            .max_waiters(1)
            .max_wait(Duration::from_secs(3600))
            .build()
            .unwrap();
        let f = fixture(limiter).await;
        let held = f.hold(2).await;
        assert_eq!(f.limiter.usage(), 2);
        let waiter = tokio::spawn(tonic_server::call(f.channel.clone(), "waits"));
        while f.limiter.waiting() < 1 {
            tokio::task::yield_now().await;
        }

        let (code, message, pushback) = refusal(tonic_server::call(f.channel.clone(), "x").await);
        assert_eq!(code, Code::ResourceExhausted);
        assert_eq!(message, sidejob::Error::Overload.to_string());
        assert_eq!(pushback.as_deref(), Some("1500"));
        assert_eq!(
            f.inside.load(SeqCst),
            2,
            "the handler never saw the refusal"
        );

        // Open the gate: the held calls and the waiter are all answered.
        f.gate.add_permits(1);
        for (i, call) in held.into_iter().enumerate() {
            assert_eq!(call.await.unwrap().unwrap(), format!("echo: held {i}"));
        }
        assert_eq!(waiter.await.unwrap().unwrap().into_inner(), "echo: waits");
        let answered = tonic_server::call(f.channel.clone(), "after")
            .await
            .unwrap();
        assert_eq!(answered.into_inner(), "echo: after");

        let stats = f.limiter.stats();
        assert_eq!(
            (stats.accepted, stats.waited, stats.rejected, stats.usage),
            (4, 1, 1, 0)
        );
        f.stop().await;
    })
    .await
    .expect("the scenario finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_waited_its_max_wait_is_unavailable() {
    tokio::time::timeout(HUNG, async {
        // The only unit is held until the end, so the waiter cannot be
        // admitted: its wait ends by its max_wait, whatever the timing.
        let limiter = Limiter::builder()
            .capacity(1)
            .max_waiters(1)
            .max_wait(Duration::from_millis(20))
            .build()
            .unwrap();
        let f = fixture(limiter).await;
        let held = f.hold(1).await;

        let (code, message, pushback) =
            refusal(tonic_server::call(f.channel.clone(), "waits").await);
        assert_eq!(code, Code::Unavailable);
        assert_eq!(message, sidejob::Error::Timeout.to_string());
        assert_eq!(pushback.as_deref(), Some("1500"));
        let stats = f.limiter.stats();
        assert_eq!((stats.waited, stats.timed_out, stats.rejected), (0, 1, 0));

        f.gate.add_permits(1);
        assert_eq!(
            held.into_iter().next().unwrap().await.unwrap().unwrap(),
            "echo: held 0"
        );
        f.stop().await;
    })
    .await
    .expect("the scenario finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_limiter_answers_unavailable_to_waiters_and_newcomers() {
    tokio::time::timeout(HUNG, async {
        let limiter = Limiter::builder()
            .capacity(1)
            .max_waiters(4)
            .max_wait(Duration::from_secs(3600))
            .build()
            .unwrap();
        let f = fixture(limiter).await;
        let held = f.hold(1).await;
        let waiter = tokio::spawn(tonic_server::call(f.channel.clone(), "waits"));
        while f.limiter.waiting() < 1 {
            tokio::task::yield_now().await;
        }

        // Draining: the waiter and every new call are told UNAVAILABLE,
        // the call already inside finishes.
        f.limiter.close();
        let (code, _, pushback) = refusal(waiter.await.unwrap());
        assert_eq!(code, Code::Unavailable);
        assert_eq!(pushback.as_deref(), Some("1500"));
        let (code, _, _) = refusal(tonic_server::call(f.channel.clone(), "late").await);
        assert_eq!(code, Code::Unavailable);

        f.gate.add_permits(1);
        assert_eq!(
            held.into_iter().next().unwrap().await.unwrap().unwrap(),
            "echo: held 0"
        );
        assert_eq!(f.limiter.usage(), 0);
        f.stop().await;
    })
    .await
    .expect("the scenario finishes");
}
