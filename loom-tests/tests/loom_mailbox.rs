//! A thread pool's mailbox (`pool/mailbox.rs`): a ring, an overflow for
//! what finds the ring full, and the rules that keep one order per sender
//! across the two, driven through the real protocol on lanes loom can see.
//!
//! Checked in every interleaving:
//!
//! * each envelope is taken exactly once, by one receiver or by two racing
//!   ones (a stealing pool's owner and thief);
//! * one receiver takes each sender's envelopes in the order they were
//!   sent, while a sender's envelopes go to the ring, then to the overflow
//!   (the ring is full), then to the ring again;
//! * a mailbox that reads empty holds nothing once its senders are done.
//!
//! Rule 3 (an envelope taken from the overflow waits while the ring holds
//! an older one) needs a look at the ring that misses an envelope sent
//! before the overflow's: loom's lanes here are locks, whose looks never
//! miss, so a unit test in `pool/mailbox.rs` scripts that stale look.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p
//! loom-tests --release --test loom_mailbox`.
#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;
use sidejob::loom_api::SpillMailbox;

/// Looks `looks` times while the senders run, keeping what it takes (no
/// waiting: loom would explore every spin).
fn take_some(mailbox: &SpillMailbox, looks: usize, out: &Mutex<Vec<(u8, u8)>>) {
    for _ in 0..looks {
        if let Some(envelope) = mailbox.take() {
            out.lock().unwrap().push(envelope);
        }
    }
}

/// Takes what is left once the senders are done: everything, since every
/// send has landed.
fn take_rest(mailbox: &SpillMailbox, out: &Mutex<Vec<(u8, u8)>>) {
    while let Some(envelope) = mailbox.take() {
        out.lock().unwrap().push(envelope);
    }
}

/// Runs `f` with no preemption bound: the model is small (about a
/// hundred interleavings).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = None;
    builder.check(f);
}

/// Sender 0, on a thread of its own, sends its envelopes 0, 1 and 2.
fn send_three(mailbox: &Arc<SpillMailbox>) -> thread::JoinHandle<()> {
    let mailbox = mailbox.clone();
    thread::spawn(move || {
        for sequence in 0..3 {
            mailbox.send((0, sequence));
        }
    })
}

/// Every sender's envelopes in `taken` appear in sequence order.
fn in_order_per_sender(taken: &[(u8, u8)]) -> bool {
    let mut next = [0u8; 4];
    for &(sender, sequence) in taken {
        if next[sender as usize] != sequence {
            return false;
        }
        next[sender as usize] += 1;
    }
    true
}

#[test]
fn one_receiver_takes_each_senders_envelopes_in_order() {
    model(|| {
        // A ring of one: the second envelope finds it full unless the
        // receiver already took the first; the third follows the second
        // to the overflow while that one is pending.
        let mailbox = Arc::new(SpillMailbox::new(1));
        let out = Arc::new(Mutex::new(Vec::new()));
        let sender = send_three(&mailbox);
        take_some(&mailbox, 2, &out);
        sender.join().unwrap();
        take_rest(&mailbox, &out);
        let taken = out.lock().unwrap().clone();
        assert_eq!(taken.len(), 3);
        assert!(in_order_per_sender(&taken), "out of order: {taken:?}");
        assert!(mailbox.is_empty());
        assert_eq!(mailbox.take(), None);
    });
}

#[test]
fn two_receivers_take_each_envelope_once() {
    loom::model(|| {
        let mailbox = Arc::new(SpillMailbox::new(1));
        let out = Arc::new(Mutex::new(Vec::new()));
        let sender = send_three(&mailbox);
        let thief = {
            let (mailbox, out) = (mailbox.clone(), out.clone());
            thread::spawn(move || take_some(&mailbox, 2, &out))
        };
        take_some(&mailbox, 2, &out);
        sender.join().unwrap();
        thief.join().unwrap();
        take_rest(&mailbox, &out);
        let mut taken = out.lock().unwrap().clone();
        taken.sort_unstable();
        assert_eq!(taken, [(0, 0), (0, 1), (0, 2)]);
        assert!(mailbox.is_empty());
    });
}
