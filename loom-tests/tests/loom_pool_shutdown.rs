//! The admission/shutdown race: a caller that took a unit just as shutdown
//! began is either handled by its worker or refused with `Shutdown`, never
//! lost, and the worker's drain always ends; and once `is_closed` answers
//! true, every shard refuses.
#![cfg(loom)]

use std::collections::VecDeque;

use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::sync::{Arc, Mutex};
use loom::thread;
use sidejob::loom_api::Table;
use sidejob::Error;

enum Envelope {
    Request(usize),
    Wake,
}

/// The worker loop of `worker.rs`, over a mailbox loom can see: handle and
/// release every request; after each envelope, exit once drained. Where the
/// real worker blocks in `recv`, this one yields.
fn worker(table: &Table, shard: usize, mailbox: &Mutex<VecDeque<Envelope>>, handled: &AtomicUsize) {
    loop {
        let envelope = mailbox.lock().unwrap().pop_front();
        match envelope {
            Some(Envelope::Request(taken_from)) => {
                assert_eq!(
                    taken_from, shard,
                    "a request reaches its own shard's worker"
                );
                handled.fetch_add(1, SeqCst);
                table.release(shard);
            }
            Some(Envelope::Wake) => {}
            None => {
                thread::yield_now();
                continue;
            }
        }
        if table.drained(shard) {
            return;
        }
    }
}

#[test]
fn a_unit_taken_as_shutdown_begins_is_handled_or_refused() {
    loom::model(|| {
        let table = Arc::new(Table::new(1, 1));
        let mailbox = Arc::new(Mutex::new(VecDeque::new()));
        let handled = Arc::new(AtomicUsize::new(0));

        let caller = {
            let (table, mailbox) = (table.clone(), mailbox.clone());
            thread::spawn(move || match table.acquire_at(0) {
                Ok(shard) => {
                    mailbox.lock().unwrap().push_back(Envelope::Request(shard));
                    true
                }
                Err(Error::Shutdown) => false,
                Err(other) => panic!("unexpected {other}"),
            })
        };
        let stopper = {
            let (table, mailbox) = (table.clone(), mailbox.clone());
            thread::spawn(move || {
                table.close();
                mailbox.lock().unwrap().push_back(Envelope::Wake);
            })
        };

        worker(&table, 0, &mailbox, &handled);
        let admitted = caller.join().unwrap();
        stopper.join().unwrap();

        assert_eq!(
            handled.load(SeqCst),
            usize::from(admitted),
            "handled exactly once iff admitted"
        );
        assert_eq!(table.usage(), 0);
        assert_eq!(table.acquire_at(0), Err(Error::Shutdown));
    });
}

#[test]
fn two_callers_on_two_shards_race_shutdown() {
    loom::model(|| {
        let table = Arc::new(Table::new(2, 2));
        let mailboxes: Arc<[Mutex<VecDeque<Envelope>>; 2]> =
            Arc::new([Mutex::new(VecDeque::new()), Mutex::new(VecDeque::new())]);
        let handled = Arc::new(AtomicUsize::new(0));

        let callers: Vec<_> = (0..2)
            .map(|start| {
                let (table, mailboxes) = (table.clone(), mailboxes.clone());
                thread::spawn(move || match table.acquire_at(start) {
                    Ok(shard) => {
                        mailboxes[shard]
                            .lock()
                            .unwrap()
                            .push_back(Envelope::Request(shard));
                        1
                    }
                    Err(Error::Shutdown) => 0,
                    Err(other) => panic!("unexpected {other}"),
                })
            })
            .collect();

        table.close();
        for mailbox in mailboxes.iter() {
            mailbox.lock().unwrap().push_back(Envelope::Wake);
        }
        // One worker thread per shard would exceed loom's thread budget;
        // drain the shards in turn on this thread instead.
        worker(&table, 0, &mailboxes[0], &handled);
        worker(&table, 1, &mailboxes[1], &handled);

        let admitted: usize = callers.into_iter().map(|c| c.join().unwrap()).sum();
        assert_eq!(handled.load(SeqCst), admitted);
        assert_eq!(table.usage(), 0);
    });
}

/// `is_closed` (the front-ends' `is_shutdown`) answers true only once the
/// close has reached every shard: a caller that saw it true and then tries
/// each shard is refused by all of them, while the close runs on another
/// thread. (It once answered true as the close began: a request sent after
/// `is_shutdown()` could still be admitted on a shard not closed yet.)
#[test]
fn closed_means_every_shard_refuses() {
    loom::model(|| {
        let table = Arc::new(Table::new(4, 2));
        let closer = {
            let table = table.clone();
            thread::spawn(move || table.close())
        };
        if table.is_closed() {
            for shard in 0..2 {
                assert_eq!(table.acquire_only(shard), Err(Error::Shutdown));
            }
        }
        closer.join().unwrap();
        assert!(table.is_closed());
    });
}
