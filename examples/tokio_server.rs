//! A tokio TCP server that bounds its connection tasks with a `Supervisor`.
//!
//! Each accepted connection needs a unit from `sup.reserve()`; the guard
//! moves into the connection's task and its drop frees the unit. When all
//! units are taken the server answers `busy` at once and closes, instead of
//! piling up tasks. The example runs a few clients against itself on
//! 127.0.0.1 (an OS-chosen port), prints what happened, and exits.
//!
//! Run with `cargo run --example tokio_server`.

use std::time::Duration;

use sidejob::{Error, Supervisor};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// At most this many connections are served at once.
const CAPACITY: usize = 2;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Never hang: the whole demo has a few seconds.
    tokio::time::timeout(Duration::from_secs(10), demo()).await??;
    Ok(())
}

async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let sup = Supervisor::builder()
        .name("conn")
        .capacity(CAPACITY)
        .build()?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("server on {addr}, at most {CAPACITY} connections at once");

    let server = tokio::spawn(serve(listener, sup.clone()));

    // Two clients take both units and hold their connections open.
    let mut first = Client::connect(addr).await?;
    let mut second = Client::connect(addr).await?;
    println!("client 1: {}", first.greeting);
    println!("client 2: {}", second.greeting);
    let alive: Vec<String> = sup
        .which_children()
        .iter()
        .map(|id| id.to_string())
        .collect();
    println!("children alive: {}", alive.join(", "));

    // Two more are turned away at once.
    for n in 3..=4 {
        let client = Client::connect(addr).await?;
        println!("client {n}: {}", client.greeting);
        assert_eq!(client.greeting, "busy");
    }

    // The first two finish; their tasks end and give the units back.
    println!("client 1 asks: {}", first.ask("ping").await?);
    println!("client 2 asks: {}", second.ask("ping").await?);
    drop((first, second));
    let idle = {
        let sup = sup.clone();
        tokio::task::spawn_blocking(move || sup.wait_idle(Duration::from_secs(5))).await?
    };
    assert!(idle, "connection tasks did not end");
    println!("children alive after they closed: {}", sup.usage());

    // And a new client is served again.
    let mut fifth = Client::connect(addr).await?;
    println!("client 5: {}", fifth.greeting);
    println!("client 5 asks: {}", fifth.ask("ping").await?);
    drop(fifth);

    server.abort();
    sup.wait_idle(Duration::from_secs(5));
    let stats = sup.stats();
    println!(
        "served {} connections, refused {} as busy, {} still open",
        stats.accepted,
        stats.rejected,
        sup.usage()
    );
    assert_eq!((stats.accepted, stats.rejected), (3, 2));
    Ok(())
}

/// Accepts connections forever; each gets a task under a guard, or `busy`.
async fn serve(listener: TcpListener, sup: Supervisor) -> std::io::Result<()> {
    loop {
        let (mut stream, _) = listener.accept().await?;
        match sup.reserve() {
            Ok(guard) => {
                tokio::spawn(async move {
                    // The unit is held for as long as this task runs.
                    let id = guard.id();
                    if let Err(err) = handle(stream, id).await {
                        eprintln!("connection {id}: {err}");
                    }
                    drop(guard);
                });
            }
            Err(Error::Overload) => {
                // Shed the connection at once: nothing queues.
                let _ = stream.write_all(b"busy\n").await;
            }
            Err(other) => return Err(std::io::Error::other(other)),
        }
    }
}

/// Greets, then answers every line until the client closes.
async fn handle(stream: TcpStream, id: sidejob::ChildId) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("welcome, you are child {id}\n").as_bytes())
        .await?;
    let mut lines = BufReader::new(read).lines();
    while let Some(line) = lines.next_line().await? {
        write
            .write_all(format!("{id} says pong to {line}\n").as_bytes())
            .await?;
    }
    Ok(())
}

/// A line-based client: reads the greeting on connect.
struct Client {
    greeting: String,
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> std::io::Result<Client> {
        let (read, write) = TcpStream::connect(addr).await?.into_split();
        let mut lines = BufReader::new(read).lines();
        let greeting = lines.next_line().await?.unwrap_or_default();
        Ok(Client {
            greeting,
            lines,
            write,
        })
    }

    async fn ask(&mut self, question: &str) -> std::io::Result<String> {
        self.write
            .write_all(format!("{question}\n").as_bytes())
            .await?;
        Ok(self.lines.next_line().await?.unwrap_or_default())
    }
}
