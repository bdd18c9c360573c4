//! A tonic gRPC server behind `LimitLayer` with `GrpcRefusal`: a refused
//! call is a gRPC status a client can act on, `RESOURCE_EXHAUSTED` when
//! the server is full (and its waiting room too) and `UNAVAILABLE` after
//! `max_wait` or while shutting down, each with a retry pushback.
//!
//! ```text
//! cargo run --features http --example tonic_server -- \
//!     --addr 127.0.0.1:50051 --capacity 10 --max-waiters 20
//! ```
//!
//! Each call's priority class is read from its `x-priority` metadata
//! (`LimitLayer::classify_by_header`; gRPC metadata are HTTP headers):
//! `sheddable` calls are refused first under overload, a `critical_plus`
//! call waits ahead of the others, and a call without it (or with a value
//! that names no class) is of the default class, `critical`.
//!
//! The service is one unary method, `/sidejob.example.Echo/Say`, taking
//! and answering a UTF-8 string, written by hand: no `.proto`, no
//! `protoc`, no code generation, so the example builds from crates.io
//! alone. A generated service (`tonic-build`) goes behind the layer the
//! same way. `tests/grpc.rs` serves it on loopback and calls it with a
//! real tonic client ([`call`] below).
//!
//! Cost: tonic, h2 and the tower features tonic turns on are
//! dev-dependencies only; building them took 13 s of a cold test build on
//! two cores (`cargo clean -p` of those crates, then
//! `cargo test --no-run --features http --test grpc`), and CI builds them
//! once more in release for `cargo bench --no-run`.
#![allow(dead_code)] // `main` is unused when tests/grpc.rs includes this file

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut};
use sidejob::tower::{GrpcRefusal, LimitLayer};
use sidejob::Limiter;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};
use tower::Service;

/// The method's path, as a generated client would name it.
pub const SAY: &str = "/sidejob.example.Echo/Say";

/// A codec for messages that are plain UTF-8 strings (a generated service
/// uses prost's instead).
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8Codec;

impl Codec for Utf8Codec {
    type Encode = String;
    type Decode = String;
    type Encoder = Utf8Codec;
    type Decoder = Utf8Codec;

    fn encoder(&mut self) -> Self::Encoder {
        Utf8Codec
    }

    fn decoder(&mut self) -> Self::Decoder {
        Utf8Codec
    }
}

impl Encoder for Utf8Codec {
    type Item = String;
    type Error = Status;

    fn encode(&mut self, item: String, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }
}

impl Decoder for Utf8Codec {
    type Item = String;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<String>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| Status::invalid_argument("the message is not UTF-8"))
    }
}

/// The Echo service: `Say` answers what `work` makes of the request.
/// What `tonic-build` would generate as `EchoServer`, by hand.
#[derive(Clone)]
pub struct Echo<W> {
    work: W,
}

impl<W> NamedService for Echo<W> {
    const NAME: &'static str = "sidejob.example.Echo";
}

impl<W, Fut> Echo<W>
where
    W: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    /// The service, answering each `Say` with `work(message)`.
    pub fn new(work: W) -> Self {
        Echo { work }
    }
}

/// `Say` itself, as tonic's unary helper wants it.
struct Say<W>(W);

impl<W, Fut> UnaryService<String> for Say<W>
where
    W: Fn(String) -> Fut,
    Fut: Future<Output = String> + Send + 'static,
{
    type Response = String;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, Status>> + Send>>;

    fn call(&mut self, request: Request<String>) -> Self::Future {
        let answer = (self.0)(request.into_inner());
        Box::pin(async move { Ok(Response::new(answer.await)) })
    }
}

impl<W, Fut> Service<http::Request<Body>> for Echo<W>
where
    W: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let work = self.work.clone();
        Box::pin(async move {
            if request.uri().path() != SAY {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            Ok(Grpc::new(Utf8Codec).unary(Say(work), request).await)
        })
    }
}

/// Serves `Echo(work)` on `listener` until `shutdown` resolves, every
/// call admitted through `limiter` and waiting in its room when it has
/// one (`LimitLayer::waiting`; with no room it fails fast), in the class
/// its `x-priority` metadata names. Refusals are `GrpcRefusal`'s
/// statuses, with a retry pushback of `retry_after`.
pub async fn serve<W, Fut>(
    listener: tokio::net::TcpListener,
    limiter: Arc<Limiter>,
    work: W,
    retry_after: Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    W: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let refusal = GrpcRefusal::new().retry_after(Some(retry_after));
    Server::builder()
        .layer(
            LimitLayer::waiting(limiter)
                .refuse_with(refusal)
                .classify_by_header("x-priority"),
        )
        .add_service(Echo::new(work))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await
}

/// A client's `Say`: what a generated `EchoClient::say` does.
pub async fn call(channel: Channel, message: &str) -> Result<Response<String>, Status> {
    call_as(channel, message, None).await
}

/// [`call`] with `x-priority` metadata of `priority`, if any: the call's
/// priority class (`sheddable`, `critical_plus`, ...).
pub async fn call_as(
    channel: Channel,
    message: &str,
    priority: Option<&str>,
) -> Result<Response<String>, Status> {
    let mut request = Request::new(message.to_string());
    if let Some(priority) = priority {
        let value = priority
            .parse()
            .map_err(|_| Status::invalid_argument("not a metadata value"))?;
        request.metadata_mut().insert("x-priority", value);
    }
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| Status::unknown(format!("not ready: {e}")))?;
    client
        .unary(
            request,
            http::uri::PathAndQuery::from_static(SAY),
            Utf8Codec,
        )
        .await
}

/// Simulated work: waits on I/O for `ms` milliseconds, then echoes.
fn simulated_work(
    ms: u64,
) -> impl Fn(String) -> Pin<Box<dyn Future<Output = String> + Send>> + Clone {
    move |message| {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            format!("echo: {message}")
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr: SocketAddr = "127.0.0.1:50051".parse()?;
    let mut capacity = 10;
    let mut max_waiters = 20;
    let mut work_ms = 5;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().ok_or("--addr needs a value")?.parse()?,
            "--capacity" => capacity = args.next().ok_or("--capacity needs a value")?.parse()?,
            "--max-waiters" => {
                max_waiters = args.next().ok_or("--max-waiters needs a value")?.parse()?
            }
            "--work-ms" => work_ms = args.next().ok_or("--work-ms needs a value")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(capacity)
            .max_waiters(max_waiters)
            .max_wait(Duration::from_secs(2))
            .build()?,
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "gRPC on http://{} ({SAY}: {capacity} at once, {max_waiters} more wait up to 2 s, RESOURCE_EXHAUSTED past them)",
        listener.local_addr()?
    );
    // On ctrl-c: close the limiter first, so calls still arriving get
    // UNAVAILABLE (and clients go elsewhere) while the server drains.
    let closing = Arc::clone(&limiter);
    let shutdown = async move {
        let _ = tokio::signal::ctrl_c().await;
        closing.close();
    };
    serve(
        listener,
        Arc::clone(&limiter),
        simulated_work(work_ms),
        Duration::from_secs(1),
        shutdown,
    )
    .await?;
    let stats = limiter.stats();
    println!(
        "accepted {} rejected {} waited {} timed out {}",
        stats.accepted, stats.rejected, stats.waited, stats.timed_out
    );
    Ok(())
}
