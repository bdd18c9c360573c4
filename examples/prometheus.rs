//! Serves `/metrics` for Prometheus: a limited axum route with a waiting
//! room, a `Reporter` exporting the limiter's figures every second
//! (`sidejob_waiting`, `sidejob_waited_total`, ... included), the tower
//! layer's hold-time histogram (`sidejob_hold_seconds`), and two health
//! alarms (usage near the capacity, requests queueing).
//!
//! ```text
//! cargo run --release --features tower,metrics --example prometheus -- [--addr 127.0.0.1:3000] [--self-test]
//! curl http://127.0.0.1:3000/metrics
//! ```
//!
//! `--self-test` sends a few requests to itself on loopback, prints the
//! page and exits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;
use sidejob::observe::{Alarm, AlarmState, Reporter, Watched};
use sidejob::tower::LimitLayer;
use sidejob::{Error, Limiter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr: SocketAddr = "127.0.0.1:3000".parse()?;
    let mut self_test = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().ok_or("--addr needs a value")?.parse()?,
            "--self-test" => self_test = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if self_test {
        addr = "127.0.0.1:0".parse()?;
    }

    // Install the recorder first: the reporter and the layer register
    // their handles with the recorder in force when they are built.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    // 16 at once, 32 more may wait up to 2 s.
    let limiter = Arc::new(
        Limiter::builder()
            .name("api")
            .capacity(16)
            .max_waiters(32)
            .max_wait(Duration::from_secs(2))
            .build()?,
    );
    let alarm = Alarm::builder()
        .name("near_capacity")
        .threshold(12)
        .raise_after(Duration::from_secs(30))
        .on_change(|event| match event.state {
            AlarmState::Raised => eprintln!(
                "alarm {}: usage {} above {}",
                event.name, event.value, event.threshold
            ),
            AlarmState::Clear => eprintln!("alarm {} cleared", event.name),
        })
        .build()?;
    // Anyone waiting for 10 s on end: a standing queue, not a burst.
    let queueing = Alarm::builder()
        .watch(Watched::Waiting)
        .threshold(0)
        .raise_after(Duration::from_secs(10))
        .build()?;
    // The limiter's name labels its series.
    let reporter = Reporter::builder()
        .alarm(alarm)
        .alarm(queueing)
        .build(&limiter)?
        .spawn()?;

    let layer = LimitLayer::waiting(Arc::clone(&limiter))
        .record_time()
        .on_overload(|error: Error| {
            let status = match error {
                Error::Overload => StatusCode::TOO_MANY_REQUESTS, // the room is full
                _ => StatusCode::SERVICE_UNAVAILABLE,             // waited 2 s
            };
            (status, [(header::RETRY_AFTER, "1")]).into_response()
        });
    let app = Router::new()
        .route(
            "/work",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                "done\n"
            })
            .layer(layer),
        )
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        );

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("metrics on http://{addr}/metrics, limited work on http://{addr}/work");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    if self_test {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for _ in 0..5 {
            stream
                .write_all(b"GET /work HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .await?;
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await?;
        }
        // Stopping the reporter exports a last report before the page is read.
        let last = reporter.stop();
        println!("last report: {last:?}\n");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut page = String::new();
        stream.read_to_string(&mut page).await?;
        println!("{page}");
        server.abort();
        return Ok(());
    }
    server.await??;
    drop(reporter);
    Ok(())
}
