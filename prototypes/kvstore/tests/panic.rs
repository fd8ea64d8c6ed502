//! A panic while a transaction is applied (failpoint
//! `kvstore::apply-before-log`: the transaction's pages changed and pinned,
//! its record not appended) poisons the store with the panic's message,
//! rolls the transaction back and tells every committer: none sleeps
//! forever, checkpoint and close return, and after a crash everything
//! acknowledged before it is there. Needs the `failpoints` feature.

mod common;

use common::{options, sim_open};
use journal_core::vfs::{CrashPolicy, SimVfs};
use kvstore::Error;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

fn key(t: u32, i: u32) -> Vec<u8> {
    format!("t{t}-k{i:03}").into_bytes()
}

#[test]
fn a_panic_while_applying_poisons_the_store_and_wakes_every_committer() {
    let _scenario = fail::FailScenario::setup();
    let vfs = SimVfs::new();
    let s = Arc::new(sim_open(&vfs, options(64)).unwrap());
    for i in 0..100 {
        s.put(&key(99, i), b"before").unwrap();
    }
    fail::cfg("kvstore::apply-before-log", "1*panic(injected)").unwrap();
    // Eight committers: one meets the panic, the others are queued behind
    // it or come after; each must get an answer.
    let (tx, rx) = mpsc::channel();
    for t in 0..8u32 {
        let (s, tx) = (s.clone(), tx.clone());
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            let mut err = None;
            for i in 0..50 {
                match s.put(&key(t, i), b"v") {
                    Ok(_) => acked.push(i),
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            let _ = tx.send((t, acked, err));
        });
    }
    drop(tx);
    let mut acked = Vec::new();
    let mut panicked = 0;
    for _ in 0..8 {
        let (t, a, err) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a committer never got an answer");
        let err = err.expect("a committer's puts all succeeded after the panic");
        if matches!(&err, Error::Panicked { message } if message.contains("injected")) {
            panicked += 1;
        } else {
            panic!("an error that is not the poison: {err}");
        }
        acked.extend(a.into_iter().map(|i| key(t, i)));
    }
    assert_eq!(panicked, 8, "every committer answered with the panic");
    assert!(matches!(s.put(b"after", b"x"), Err(Error::Panicked { .. })));
    assert!(s.checkpoint().is_err());
    assert!(s.close().is_err());
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    drop(s);
    let s = sim_open(&image, options(64)).unwrap();
    for k in &acked {
        assert_eq!(s.get(k).unwrap().as_deref(), Some(&b"v"[..]));
    }
    for i in 0..100 {
        assert_eq!(s.get(&key(99, i)).unwrap().as_deref(), Some(&b"before"[..]));
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}
