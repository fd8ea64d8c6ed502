//! The `tracing` feature: a journal's life — recovery at open, a
//! checkpoint, the failure that poisons it — reaches a subscriber as
//! events. `cargo test -p journal-core --features tracing` (run by
//! `cargo xtask ci`).
#![cfg(feature = "tracing")]

use journal_core::vfs::{Fault, Op, SimVfs, Vfs};
use journal_core::{Journal, Options};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Collects `level message` of every event.
#[derive(Default, Clone)]
struct Collect(Arc<Mutex<Vec<String>>>);

impl Subscriber for Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        struct Message(String);
        impl Visit for Message {
            fn record_debug(&mut self, f: &Field, v: &dyn Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        e.record(&mut m);
        let target = e.metadata().target();
        let line = format!("{} {target} {}", e.metadata().level(), m.0);
        self.0.lock().unwrap().push(line);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn recovery_checkpoints_and_poisoning_are_events() {
    let collect = Collect::default();
    tracing::subscriber::with_default(collect.clone(), || {
        let vfs = SimVfs::new();
        let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
        let options = Options {
            segment_size: 64 << 10,
            logbsize: 16 << 10,
            direct_io: false,
            ..Options::default()
        };
        let j = Journal::open_with(v, "/j", options).unwrap();
        let lsn = j.append_durable(b"one").unwrap();
        j.checkpoint(lsn).unwrap();
        vfs.inject(Fault::eio(Op::SyncData, 1));
        vfs.inject(Fault::eio(Op::FuaWrite, 1));
        j.append_durable(b"two").unwrap_err();
        j.append_durable(b"three").unwrap_err();
    });
    let events = collect.0.lock().unwrap().clone();
    let has = |s: &str| events.iter().any(|e| e.contains(s));
    assert!(has("INFO journal_core journal recovered"), "{events:?}");
    assert!(has("DEBUG journal_core checkpoint"), "{events:?}");
    let poisoned = events
        .iter()
        .filter(|e| e.contains("journal poisoned"))
        .count();
    assert_eq!(poisoned, 1, "the poisoning is reported once: {events:?}");
}
