//! A small closed-loop HTTP load client for `scripts/load.sh`: latency per
//! status, so the admitted requests' percentiles are their own.
//!
//! `--connections` tasks each send `GET` requests one after another over a
//! keep-alive connection (hyper-util's client, so at most that many
//! connections) until `--duration` has passed; each request is timed from
//! send to the last byte of the body, and filed under its status. wrk keeps
//! one histogram for every response, so with a limit in front its
//! percentiles mix sub-millisecond refusals with admitted requests; here
//! the admitted (`200`) requests have a histogram of their own.
//!
//! ```text
//! cargo run --release --example load_client -- \
//!     --url http://127.0.0.1:3000/work --connections 128 --duration 5
//! ```
//!
//! Prints a human summary on stderr and one machine-readable line on
//! stdout:
//!
//! ```text
//! RESULT rps=… sent=… ok=… r429=… r503=… other=… errors=… refused_share=… ok_p50_ms=… ok_p99_ms=… refused_p50_ms=… refused_p99_ms=…
//! ```
//!
//! Loopback only, bounded in time: every request has a 10 s timeout (an
//! error), and the run ends at most 15 s after `--duration`.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What one connection's task saw: latencies in microseconds, per status.
#[derive(Default)]
struct Tally {
    ok: Vec<u64>,
    refused: Vec<u64>,
    r429: u64,
    r503: u64,
    other: u64,
    errors: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.ok.extend(other.ok);
        self.refused.extend(other.refused);
        self.r429 += other.r429;
        self.r503 += other.r503;
        self.other += other.other;
        self.errors += other.errors;
    }

    fn sent(&self) -> u64 {
        self.ok.len() as u64 + self.r429 + self.r503 + self.other + self.errors
    }
}

/// One connection: requests back to back until `deadline`.
async fn connection(client: HttpClient, uri: Uri, deadline: Instant) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < deadline {
        let request = Request::get(uri.clone())
            .body(Empty::new())
            .expect("a GET with an empty body");
        let started = Instant::now();
        let answered = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = client.request(request).await?;
            let status = response.status();
            // Read the whole body: an admitted request ends with its body.
            response.into_body().collect().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(status)
        })
        .await;
        let micros = started.elapsed().as_micros() as u64;
        match answered {
            Ok(Ok(StatusCode::OK)) => tally.ok.push(micros),
            Ok(Ok(StatusCode::TOO_MANY_REQUESTS)) => {
                tally.r429 += 1;
                tally.refused.push(micros);
            }
            Ok(Ok(StatusCode::SERVICE_UNAVAILABLE)) => {
                tally.r503 += 1;
                tally.refused.push(micros);
            }
            Ok(Ok(_)) => tally.other += 1,
            Ok(Err(_)) | Err(_) => tally.errors += 1,
        }
    }
    tally
}

/// The `p` quantile (0..=1) of sorted `values`, nearest rank, in ms.
fn quantile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = "http://127.0.0.1:3000/work".to_string();
    let mut connections = 128usize;
    let mut duration = 5u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--url" => url = args.next().ok_or("--url needs a value")?,
            "--connections" => {
                connections = args.next().ok_or("--connections needs a value")?.parse()?
            }
            "--duration" => duration = args.next().ok_or("--duration needs a value")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let uri: Uri = url.parse()?;
    if !matches!(uri.host(), Some("127.0.0.1" | "localhost" | "[::1]")) {
        return Err(format!("{url}: loopback only").into());
    }
    if connections == 0 || duration == 0 {
        return Err("--connections and --duration must be at least 1".into());
    }

    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build_http();
    let began = Instant::now();
    let deadline = began + Duration::from_secs(duration);
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(connection(client.clone(), uri.clone(), deadline)))
        .collect();
    let mut tally = Tally::default();
    let all = async {
        for task in tasks {
            if let Ok(t) = task.await {
                tally.merge(t);
            }
        }
    };
    // Each task ends within REQUEST_TIMEOUT of the deadline; this bounds
    // the run even if one does not.
    tokio::time::timeout(Duration::from_secs(duration + 15), all)
        .await
        .map_err(|_| "the run did not end in time")?;
    let elapsed = began.elapsed().as_secs_f64();

    tally.ok.sort_unstable();
    tally.refused.sort_unstable();
    let sent = tally.sent();
    let refused = tally.r429 + tally.r503;
    let share = if sent > 0 {
        refused as f64 / sent as f64
    } else {
        0.0
    };
    let (ok_p50, ok_p99) = (quantile_ms(&tally.ok, 0.50), quantile_ms(&tally.ok, 0.99));
    let (ref_p50, ref_p99) = (
        quantile_ms(&tally.refused, 0.50),
        quantile_ms(&tally.refused, 0.99),
    );
    eprintln!(
        "{url}: {sent} requests in {elapsed:.1} s over {connections} connections: {} ok, {} 429, {} 503, {} other, {} errors; admitted p50 {ok_p50:.2} ms p99 {ok_p99:.2} ms; refused p50 {ref_p50:.2} ms p99 {ref_p99:.2} ms",
        tally.ok.len(),
        tally.r429,
        tally.r503,
        tally.other,
        tally.errors
    );
    println!(
        "RESULT rps={:.0} sent={sent} ok={} r429={} r503={} other={} errors={} refused_share={share:.4} ok_p50_ms={ok_p50:.2} ok_p99_ms={ok_p99:.2} refused_p50_ms={ref_p50:.2} refused_p99_ms={ref_p99:.2}",
        sent as f64 / elapsed,
        tally.ok.len(),
        tally.r429,
        tally.r503,
        tally.other,
        tally.errors,
    );
    Ok(())
}
