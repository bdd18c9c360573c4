//! Scratch: round trips of several contenders, interleaved, for ratios and perf.
use sidejob::{AsyncPool, AsyncWorker, Error, Pool};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

struct Echo;
impl AsyncWorker for Echo {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    async fn handle_call(&mut self, n: u64) -> u64 {
        n
    }
    async fn handle_cast(&mut self, n: u64) {
        black_box(n);
    }
}

type Actors = Arc<[mpsc::Sender<(u64, oneshot::Sender<u64>)>]>;

fn actors(rt: &Runtime) -> Actors {
    (0..2)
        .map(|_| {
            let (tx, mut rx) = mpsc::channel::<(u64, oneshot::Sender<u64>)>(32);
            rt.spawn(async move {
                while let Some((n, r)) = rx.recv().await {
                    let _ = r.send(n);
                }
            });
            tx
        })
        .collect::<Vec<_>>()
        .into()
}

fn pool(rt: &Runtime, steal: Option<bool>) -> AsyncPool<Echo> {
    let _g = rt.enter();
    let mut b = Pool::builder();
    b.capacity(64).workers(2);
    if let Some(s) = steal {
        b.steal(s);
    }
    b.build_async(|_| Echo).unwrap()
}

fn run(
    rt: &Runtime,
    tasks: u64,
    calls: u64,
    which: &str,
    a: &Actors,
    pools: &[AsyncPool<Echo>],
) -> f64 {
    let per = calls / tasks;
    let a = a.clone();
    let pools = pools.to_vec();
    let which = which.to_string();
    rt.block_on(async move {
        let start = Instant::now();
        let hs: Vec<_> = (0..tasks)
            .map(|t| {
                let a = a.clone();
                let pools = pools.clone();
                let which = which.clone();
                tokio::spawn(async move {
                    match which.as_str() {
                        "actor" => {
                            for i in 0..per {
                                let (tx, rx) = oneshot::channel();
                                a[t as usize % 2].send((i, tx)).await.unwrap();
                                black_box(rx.await.unwrap());
                            }
                        }
                        w => {
                            let p = &pools[match w {
                                "own" => 0,
                                "steal" => 1,
                                _ => 2,
                            }];
                            for i in 0..per {
                                loop {
                                    match p.call_async(i).await {
                                        Ok(r) => {
                                            black_box(r);
                                            break;
                                        }
                                        Err(Error::Overload) => tokio::task::yield_now().await,
                                        Err(e) => panic!("{e}"),
                                    }
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.await.unwrap();
        }
        start.elapsed().as_nanos() as f64 / (per * tasks) as f64
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let only = std::env::var("WHICH").ok();
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .map(|t| t.parse().unwrap())
        .unwrap_or(15);
    let rt = if std::env::var("CT").is_ok() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let a = actors(&rt);
    let pools = [
        pool(&rt, Some(false)),
        pool(&rt, Some(true)),
        pool(&rt, None),
    ];
    let names = ["actor", "own", "steal", "default"];
    if let Some(w) = only {
        let tasks: u64 = std::env::var("TASKS")
            .ok()
            .map(|t| t.parse().unwrap())
            .unwrap_or(1);
        if let Ok(n) = std::env::var("N") {
            let n: u64 = n.parse().unwrap();
            run(&rt, tasks, n, &w, &a, &pools);
            println!("done {n}");
            return;
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            run(&rt, tasks, 100_000, &w, &a, &pools);
        }
        return;
    }
    for tasks in [1u64, 64] {
        let calls = if tasks == 1 { 20_000 } else { 100_000 };
        let mut t: Vec<Vec<f64>> = vec![Vec::new(); 4];
        let mut r: Vec<Vec<f64>> = vec![Vec::new(); 4];
        for _ in 0..rounds {
            let act = run(&rt, tasks, calls, "actor", &a, &pools);
            t[0].push(act);
            for k in 1..4 {
                let x = run(&rt, tasks, calls, names[k], &a, &pools);
                t[k].push(x);
                r[k].push(x / act);
            }
        }
        print!("tasks={tasks:>2}:");
        for k in 0..4 {
            print!("  {} {:.0} ns", names[k], median(t[k].clone()));
            if k > 0 {
                print!(" ({:.2}x)", median(r[k].clone()));
            }
        }
        println!();
    }
}
