//! The tonic example on 127.0.0.1, called by a real tonic client: a call
//! past the capacity and the waiting room is `RESOURCE_EXHAUSTED`, one
//! that waited its `max_wait` or met a closed limiter is `UNAVAILABLE`,
//! each with the retry pushback; admitted calls answer, and the limiter's
//! counts agree with what the client saw. The class rides in the call's
//! `x-priority` metadata: a sheddable call is refused first, a
//! `critical_plus` one waits ahead of the rest, and a value that names no
//! class is the default class, in its turn.

#[path = "../examples/tonic_server.rs"]
mod tonic_server;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sidejob::{Class, Limiter};
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
    /// The messages of the calls that reached the handler, in order.
    entered: Arc<Mutex<Vec<String>>>,
    channel: Channel,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

/// A limiter of one unit with a room of `waiters` and its `max_wait`.
fn one_unit(waiters: usize, max_wait: Duration) -> Limiter {
    Limiter::builder()
        .capacity(1)
        .max_waiters(waiters)
        .max_wait(max_wait)
        .build()
        .unwrap()
}

async fn fixture(limiter: Limiter) -> Fixture {
    let limiter = Arc::new(limiter);
    let gate = Arc::new(Semaphore::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(Mutex::new(Vec::new()));
    let work: Work = {
        let (gate, inside, entered) =
            (Arc::clone(&gate), Arc::clone(&inside), Arc::clone(&entered));
        Arc::new(move |message: String| {
            let (gate, inside) = (Arc::clone(&gate), Arc::clone(&inside));
            entered.lock().unwrap().push(message.clone());
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
        entered,
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

    /// Opens the gate for one call and checks that the one call `held`
    /// (from [`hold`](Self::hold)) is answered.
    async fn let_one_go(&self, held: Vec<tokio::task::JoinHandle<Result<String, Status>>>) {
        self.gate.add_permits(1);
        let [only] = <[_; 1]>::try_from(held).expect("one held call");
        assert_eq!(only.await.unwrap().unwrap(), "echo: held 0");
    }

    /// Starts a call with `priority` that stays inside the handler until
    /// the gate opens, once it is inside.
    async fn hold_as(
        &self,
        message: &'static str,
        priority: Option<&'static str>,
    ) -> tokio::task::JoinHandle<Result<tonic::Response<String>, Status>> {
        let before = self.inside.load(SeqCst);
        let call = tokio::spawn(tonic_server::call_as(
            self.channel.clone(),
            message,
            priority,
        ));
        while self.inside.load(SeqCst) <= before {
            tokio::task::yield_now().await;
        }
        call
    }

    /// Starts a call with `priority` that waits in the room, once it is
    /// queued.
    async fn queue_as(
        &self,
        message: &'static str,
        priority: Option<&'static str>,
    ) -> tokio::task::JoinHandle<Result<tonic::Response<String>, Status>> {
        let before = self.limiter.waiting();
        let call = tokio::spawn(tonic_server::call_as(
            self.channel.clone(),
            message,
            priority,
        ));
        while self.limiter.waiting() <= before {
            tokio::task::yield_now().await;
        }
        call
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
        let limiter = one_unit(1, Duration::from_millis(20));
        let f = fixture(limiter).await;
        let held = f.hold(1).await;

        let (code, message, pushback) =
            refusal(tonic_server::call(f.channel.clone(), "waits").await);
        assert_eq!(code, Code::Unavailable);
        assert_eq!(message, sidejob::Error::Timeout.to_string());
        assert_eq!(pushback.as_deref(), Some("1500"));
        let stats = f.limiter.stats();
        assert_eq!((stats.waited, stats.timed_out, stats.rejected), (0, 1, 0));

        f.let_one_go(held).await;
        f.stop().await;
    })
    .await
    .expect("the scenario finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_limiter_answers_unavailable_to_waiters_and_newcomers() {
    tokio::time::timeout(HUNG, async {
        let limiter = one_unit(4, Duration::from_secs(3600));
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

        f.let_one_go(held).await;
        assert_eq!(f.limiter.usage(), 0);
        f.stop().await;
    })
    .await
    .expect("the scenario finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sheddable_call_is_refused_while_a_default_one_is_served() {
    tokio::time::timeout(HUNG, async {
        // Capacity 4 on one shard, no waiting room: every refusal is at
        // once. Sheddable calls may fill 80 %: 3 units.
        let limiter = Limiter::builder().capacity(4).shards(1).build().unwrap();
        let f = fixture(limiter).await;
        let held = f.hold(3).await;

        let (code, message, pushback) =
            refusal(tonic_server::call_as(f.channel.clone(), "prefetch", Some("sheddable")).await);
        assert_eq!(code, Code::ResourceExhausted);
        assert_eq!(message, sidejob::Error::Overload.to_string());
        assert_eq!(pushback.as_deref(), Some("1500"));

        // A value that names no class is the default class: it gets the
        // last unit, where the sheddable call was refused.
        let unknown = f.hold_as("unknown", Some("urgent!!")).await;
        assert_eq!(f.limiter.usage(), 4);
        // Full: refused now, like any call.
        let (code, _, _) = refusal(tonic_server::call(f.channel.clone(), "late").await);
        assert_eq!(code, Code::ResourceExhausted);

        f.gate.add_permits(1);
        for call in held {
            assert!(call.await.unwrap().unwrap().starts_with("echo: held"));
        }
        assert_eq!(
            unknown.await.unwrap().unwrap().into_inner(),
            "echo: unknown"
        );
        let stats = f.limiter.stats();
        let sheddable = &stats.classes[Class::Sheddable.rank()];
        assert_eq!((sheddable.accepted, sheddable.rejected), (0, 1));
        let critical = &stats.classes[Class::Critical.rank()];
        assert_eq!((critical.accepted, critical.rejected), (4, 1));
        assert!(
            !f.entered.lock().unwrap().iter().any(|m| m == "prefetch"),
            "the handler never saw the refused call"
        );
        f.stop().await;
    })
    .await
    .expect("the scenario finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_room_serves_critical_plus_first_and_an_unknown_value_in_its_turn() {
    tokio::time::timeout(HUNG, async {
        // One unit: the calls go through it one at a time, in the order
        // the room serves them.
        let limiter = one_unit(4, Duration::from_secs(3600));
        let f = fixture(limiter).await;
        let held = f.hold(1).await;
        // Queued in this order: no metadata, a value that names no class,
        // the top class.
        let plain = f.queue_as("plain", None).await;
        let unknown = f.queue_as("unknown", Some("urgent!!")).await;
        let top = f.queue_as("top", Some("critical_plus")).await;
        let stats = f.limiter.stats();
        let waiting: Vec<usize> = stats.classes.iter().map(|c| c.waiting).collect();
        assert_eq!(waiting, [1, 2, 0, 0], "the unknown value waits as critical");

        f.let_one_go(held).await;
        for (call, message) in [(top, "top"), (plain, "plain"), (unknown, "unknown")] {
            let answer = call.await.unwrap().unwrap().into_inner();
            assert_eq!(answer, format!("echo: {message}"));
        }
        // The top class first; the unknown value behind the call of the
        // default class that came before it.
        assert_eq!(
            *f.entered.lock().unwrap(),
            ["held 0", "top", "plain", "unknown"]
        );
        let stats = f.limiter.stats();
        let accepted: Vec<u64> = stats.classes.iter().map(|c| c.accepted).collect();
        assert_eq!(accepted, [1, 3, 0, 0]);
        assert_eq!((stats.waited, stats.rejected, stats.usage), (3, 0, 0));
        f.stop().await;
    })
    .await
    .expect("the scenario finishes");
}
