//! The state machine's apply rate under random overwrites: `KEYS` keys of
//! `SIZE` bytes loaded, then overwrites of random keys in entries of
//! `BATCH` puts for `SECONDS`, a compaction at the store's revision less
//! `RETENTION` every `EVERY` entries (0: none) — the multi-version store's
//! steady state, versions written and removed. Prints the load time,
//! puts/s, CPU per put, peak RSS, the data file, and the index's and the
//! versions' stored bytes. The last argument is the store's cache, MiB.
//!
//! ```sh
//! cargo run --release -p raftkv --example apply_rate -- 1000000 1024 256 60 10000 40 /work/benchtmp 64
//! ```

use journal_core::vfs::{OsVfs, SplitMix64, Vfs};
use openraft::impls::leader_id_adv::LeaderId;
use openraft::{EntryPayload, LogId};
type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;
use raftkv::{Batch, Command, StateMachine};
use std::sync::Arc;
use std::time::Instant;

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// User and system CPU seconds of this process.
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn entry(index: u64, cmds: Vec<Command>) -> Entry {
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ),
        payload: EntryPayload::Normal(Batch(cmds)),
    }
}

fn key(i: u64) -> String {
    format!("key-{i:010}")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (keys, size, batch, seconds) = (arg(1, 100_000), arg(2, 1024), arg(3, 256), arg(4, 20));
    let (retention, every) = (arg(5, 10_000) as i64, arg(6, 40));
    let base = args.get(7).cloned().unwrap_or_else(|| "/tmp".into());
    let options = kvstore::Options {
        cache_bytes: arg(8, 64) as usize * 1024 * 1024,
        torn_pages: kvstore::TornPages::FullPageImages,
        ..kvstore::Options::default()
    };
    let tmp = tempfile::tempdir_in(base).expect("a temporary directory");
    let vfs: Arc<dyn Vfs> = Arc::new(OsVfs::new());
    let dir = tmp.path().join("sm");
    let sm = StateMachine::open(vfs.clone(), &dir, options).expect("open");
    let t = Instant::now();
    let mut index = 0;
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
        index += 1;
        let cmds = chunk
            .iter()
            .map(|&i| Command::put(key(i), vec![(i % 251) as u8; size as usize], None))
            .collect();
        sm.apply_all([entry(index, cmds)]).await.expect("apply");
    }
    let load_s = t.elapsed().as_secs_f64();
    let mut rng = SplitMix64::new(7);
    let (t, cpu0) = (Instant::now(), cpu_s());
    let mut puts = 0u64;
    while t.elapsed().as_secs() < seconds {
        index += 1;
        let mut cmds: Vec<Command> = (0..batch)
            .map(|_| {
                let i = rng.next_u64() % keys;
                Command::put(key(i), vec![(index % 251) as u8; size as usize], None)
            })
            .collect();
        if every > 0 && index % every == 0 {
            let revision = sm.revisions().current - retention;
            if revision > sm.revisions().compact {
                cmds.push(Command::Compact {
                    revision,
                    physical: false,
                });
            }
        }
        sm.apply_all([entry(index, cmds)]).await.expect("apply");
        puts += batch;
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_s() - cpu0;
    let r = sm.revisions();
    let data = std::fs::metadata(dir.join("sm-0").join(kvstore::DATA_FILE)).map_or(0, |m| m.len());
    sm.close().expect("close");
    drop(sm);
    // What the store holds, by prefix: count and stored bytes.
    let store = kvstore::Store::open(dir.join("sm-0"), Default::default()).expect("reopen");
    let mut held = std::collections::BTreeMap::<u8, (u64, u64)>::new();
    for pair in store.range(..).expect("scan") {
        let (k, v) = pair.expect("pair");
        let e = held.entry(k[0]).or_default();
        e.0 += 1;
        e.1 += (k.len() + v.len()) as u64;
    }
    store.close().expect("close");
    println!(
        "keys {keys} x {size} B: load {load_s:.1} s; overwrites in entries of {batch}: \
         {:.0} puts/s, {:.0} us CPU/put, {puts} puts in {secs:.1} s; revisions {r:?}; \
         peak RSS {} MiB; data file {} MiB",
        puts as f64 / secs,
        cpu * 1e6 / puts as f64,
        status_kib("VmHWM") / 1024,
        data >> 20,
    );
    for (p, (n, bytes)) in held {
        println!(
            "  '{}': {n} pairs, {} MiB, {:.1} B a pair",
            p as char,
            bytes >> 20,
            bytes as f64 / n.max(1) as f64
        );
    }
}
