//! What the Raft log costs in memory and at open, by the number of
//! entries: appends N entries of 1 KiB (in batches of 64, each batch's
//! flush awaited, as openraft's pipeline would), then reports the
//! process's anonymous resident memory (`RssAnon`: heap and stacks, not
//! the mapped segment files), closes the log, reopens it and reports the
//! open time and `RssAnon` again, as JSON on stdout; and what encoding
//! and decoding one such entry costs in postcard (the record format) and
//! in JSON (what the adapter used before).
//!
//! `cargo run --release -p openraft-log --example footprint -- 1000000 [DIR]`
//!
//! Run each count in a process of its own: memory freed is not always
//! returned to the system, so the figure of a second run in the same
//! process would include the first's.

use journal_core::Options;
use openraft::impls::leader_id_adv::LeaderId;
use openraft::storage::RaftLogReader;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{EntryPayload, LogId};
use openraft_log::JournalLogStore;
use std::time::Instant;

openraft::declare_raft_types!(
    /// String entries, u64 node ids.
    pub TypeConfig
);

type Entry = openraft::alias::EntryOf<TypeConfig>;

/// `RssAnon` of this process, KiB.
fn rss_anon_kib() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no RssAnon in /proc/self/status".to_string())
}

fn options(entries: u64) -> Options {
    let defaults = Options::default();
    Options {
        // Room for the whole log: nothing is purged here.
        max_segments: entries * 1100 / defaults.segment_size + 8,
        ..defaults
    }
}

async fn run(entries: u64, dir: &std::path::Path) -> Result<serde_json::Value, String> {
    let e = |s: &dyn std::fmt::Display| s.to_string();
    let before = rss_anon_kib()?;
    let mut log = JournalLogStore::<TypeConfig>::open(dir, options(entries)).map_err(|x| e(&x))?;
    let payload = "x".repeat(1024);
    let t = Instant::now();
    let mut index = 1;
    while index <= entries {
        let batch: Vec<_> = (index..(index + 64).min(entries + 1))
            .map(|i| Entry {
                log_id: LogId::new(
                    LeaderId {
                        term: 1,
                        node_id: 0,
                    },
                    i,
                ),
                payload: EntryPayload::Normal(payload.clone()),
            })
            .collect();
        index += batch.len() as u64;
        log.blocking_append(batch).await.map_err(|x| e(&x))?;
    }
    let append_s = t.elapsed().as_secs_f64();
    let after_append = rss_anon_kib()?;
    let (indexed, cached) = log.counts();
    log.journal().close().map_err(|x| e(&x))?;
    drop(log);
    let t = Instant::now();
    let mut log = JournalLogStore::<TypeConfig>::open(dir, options(entries)).map_err(|x| e(&x))?;
    let open_s = t.elapsed().as_secs_f64();
    let after_open = rss_anon_kib()?;
    // The oldest and the newest entries read back from the journal.
    let first = log.try_get_log_entries(1..=1).await.map_err(|x| e(&x))?;
    let last = log
        .try_get_log_entries(entries..=entries)
        .await
        .map_err(|x| e(&x))?;
    if first.len() != 1 || last.len() != 1 {
        return Err("the reopened log lost entries".into());
    }
    let state = log.get_log_state().await.map_err(|x| e(&x))?;
    if state.last_log_id.map(|l| l.index) != Some(entries) {
        return Err(format!("last log id {:?}", state.last_log_id));
    }
    Ok(serde_json::json!({
        "entries": entries, "entry_bytes": 1024,
        "rss_anon_kib_before": before,
        "rss_anon_kib_after_append": after_append,
        "rss_anon_kib_after_reopen": after_open,
        "indexed": indexed, "cached_after_append": cached,
        "append_s": append_s, "open_s": open_s,
    }))
}

/// The serde formats considered for records, on this example's entries:
/// bytes per entry and ns to encode and to decode one (100,000 each).
fn codecs() -> Result<serde_json::Value, String> {
    let entry = Entry {
        log_id: LogId::new(
            LeaderId {
                term: 7,
                node_id: 3,
            },
            123_456,
        ),
        payload: EntryPayload::Normal("x".repeat(1024)),
    };
    let n = 100_000u32;
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        t.elapsed().as_nanos() as f64 / f64::from(n)
    };
    let pc = postcard::to_allocvec(&entry).map_err(|e| e.to_string())?;
    let js = serde_json::to_vec(&entry).map_err(|e| e.to_string())?;
    let pc_enc = time(&mut || drop(std::hint::black_box(postcard::to_allocvec(&entry))));
    let js_enc = time(&mut || drop(std::hint::black_box(serde_json::to_vec(&entry))));
    let pc_dec = time(&mut || {
        let e: Result<Entry, _> = postcard::from_bytes(&pc);
        drop(std::hint::black_box(e));
    });
    let js_dec = time(&mut || {
        let e: Result<Entry, _> = serde_json::from_slice(&js);
        drop(std::hint::black_box(e));
    });
    Ok(serde_json::json!({
        "postcard": {"bytes": pc.len(), "encode_ns": pc_enc, "decode_ns": pc_dec},
        "json": {"bytes": js.len(), "encode_ns": js_enc, "decode_ns": js_dec},
    }))
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let entries: u64 = args
        .next()
        .unwrap_or_else(|| "10000".into())
        .parse()
        .map_err(|e| format!("entries: {e}"))?;
    let tmp = match args.next() {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut r = rt.block_on(run(entries, &tmp.path().join("raft-log")))?;
    r["codecs"] = codecs()?;
    println!("{r}");
    Ok(())
}
