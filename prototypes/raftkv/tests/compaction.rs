//! etcd's compaction on the multi-version store: logical at once (reads
//! below it refused), physical over the entries that follow, a bounded
//! number of versions an entry. What stays below the compaction is each
//! key's latest version at or below it (deleted keys gone, index entries
//! too); a crash at any point of a compaction under way replays to the
//! very store of a run without one.

mod common;

use common::{batch_entry, changes, vs, V};
use journal_core::vfs::{CrashPolicy, SimVfs};
use openraft::storage::RaftSnapshotBuilder;
use raftkv::kv::KvError;
use raftkv::machine::ReadError;
use raftkv::{Command, StateMachine};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

type Entry = openraft::alias::EntryOf<raftkv::TypeConfig>;

/// Keys of the fill, each put [`ROUNDS`] times.
const KEYS: u64 = 300;
const ROUNDS: u64 = 10;

fn options() -> kvstore::Options {
    kvstore::Options {
        checkpoint_interval: None,
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 16 << 10,
            preallocate_ahead: 1,
            ..kvstore::Options::default().journal
        },
        ..kvstore::Options::default()
    }
}

fn open_on(sim: &SimVfs) -> StateMachine {
    StateMachine::open(Arc::new(sim.clone()), "/n/state", options()).unwrap()
}

/// The value of key `k` in round `round`: long enough that the store's
/// log buffers fill and are written (not synced) as the steps commit.
fn value(round: u64, k: u64) -> String {
    format!("{round}.{k}.{}", "v".repeat(96))
}

/// Rounds of puts of every key (a tenth of them deleted after each
/// round), then a compaction at the store's revision after round 7, then
/// entries of a few puts each while it is removed, and the entries of an
/// idle cluster's leader (nothing but `CompactProgress`).
fn log() -> (Vec<Entry>, i64) {
    let mut entries = Vec::new();
    let mut index = 0;
    let mut rev = 1;
    for round in 0..ROUNDS {
        let mut cmds: Vec<Command> = (0..KEYS)
            .map(|k| Command::put(format!("k/{k:03}"), value(round, k), None))
            .collect();
        cmds.extend(
            (0..KEYS / 10).map(|k| Command::delete(format!("k/{:03}", k * 10 + round), None)),
        );
        rev += cmds.len() as i64;
        index += 1;
        entries.push(batch_entry(index, cmds));
        if round == 7 {
            let compact = Command::Compact {
                revision: rev,
                physical: false,
            };
            index += 1;
            entries.push(batch_entry(index, vec![compact]));
        }
    }
    for i in 0..30u64 {
        index += 1;
        let cmds = if i < 10 {
            vec![Command::put(format!("late/{i}"), "x", None)]
        } else {
            vec![Command::CompactProgress]
        };
        entries.push(batch_entry(index, cmds));
    }
    let compacted_at = 1 + 8 * (KEYS + KEYS / 10) as i64;
    (entries, compacted_at)
}

/// The whole store as a snapshot file's bytes.
async fn store_bytes(sm: &mut StateMachine) -> Vec<u8> {
    let mut snap = sm.build_snapshot().await.unwrap();
    snap.snapshot
        .seek(std::io::SeekFrom::Start(0))
        .await
        .unwrap();
    let mut bytes = Vec::new();
    snap.snapshot.read_to_end(&mut bytes).await.unwrap();
    bytes
}

/// The stored versions below `below` (read from the closed store's
/// directory): revision to the key's name.
fn versions_below(sim: &SimVfs, below: i64) -> BTreeMap<i64, String> {
    let store =
        kvstore::Store::open_with(Arc::new(sim.clone()), "/n/state/sm-0", options()).unwrap();
    let mut out = BTreeMap::new();
    for pair in store.prefix(b"r").unwrap() {
        let (k, v) = pair.unwrap();
        let rev = i64::from_be_bytes(k[1..9].try_into().unwrap());
        if rev < below {
            // The key's bytes follow the kind and a one-byte length.
            let len = v[1] as usize;
            out.insert(rev, String::from_utf8(v[2..2 + len].to_vec()).unwrap());
        }
    }
    store.close().unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_keeps_each_keys_latest_version_and_removes_the_rest() {
    let sim = SimVfs::new();
    let sm = open_on(&sim);
    let (log, at) = log();
    // Up to the compaction's entry: applied at once, removed in part
    // (a bounded number of versions an entry).
    let out = sm.apply_all(log[..9].to_vec()).await.unwrap();
    let r = sm.revisions();
    assert_eq!(r.compact, at);
    assert!(r.physical < at, "{r:?}");
    let rest = sm.apply_all(log[9..].to_vec()).await.unwrap();
    assert!(out
        .iter()
        .chain(&rest)
        .all(|a| vs(a).iter().all(|v| *v == V::Applied)));
    let r = sm.revisions();
    assert_eq!((r.compact, r.physical), (at, at), "{r:?}");
    // Logical: below it refused; at it, every key as it was.
    let refused = sm.get_at(b"k/001", at - 1);
    assert!(matches!(
        refused,
        Err(ReadError::Kv(KvError::Compacted { .. }))
    ));
    let mut live = BTreeMap::new();
    for k in 0..KEYS {
        let key = format!("k/{k:03}");
        if let Some(kv) = sm.get_at(key.as_bytes(), at).unwrap() {
            // Round 7 put every key; the tenth it then deleted are gone.
            assert_eq!(kv.value, value(7, k).into_bytes());
            live.insert(kv.mod_revision, key);
        }
    }
    assert_eq!(live.len() as u64, KEYS - KEYS / 10);
    // Every change from the compaction on is still there: the deletion
    // at it, rounds 8 and 9, the ten late puts.
    assert_eq!(
        changes(&sm, at).len() as u64,
        1 + 2 * (KEYS + KEYS / 10) + 10
    );
    // Physical: below it, exactly each live key's latest version.
    sm.close().unwrap();
    drop(sm);
    assert_eq!(versions_below(&sim, at), live);
}

/// A crash at any point while a compaction is under way (the store keeps
/// any prefix of what the steps wrote) replays, from the applied id the
/// reopened store reports, to the very store of a run without a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_point_of_a_compaction_replays_to_the_same_store() {
    let (log, at) = log();
    let mut reference = open_on(&SimVfs::new());
    reference.apply_all(log.clone()).await.unwrap();
    let want = store_bytes(&mut reference).await;
    // The first rounds applied and closed once; each run starts there
    // (round 7's entry and the compaction's follow).
    let first = 7;
    let base = SimVfs::new();
    let sm = open_on(&base);
    sm.apply_all(log[..first].to_vec()).await.unwrap();
    sm.close().unwrap();
    drop(sm);
    let (mut crashes, mut under_way) = (0, 0);
    for call in 1..4000 {
        let sim = base.crash(CrashPolicy::ProcessOnly);
        let sm = open_on(&sim);
        let policy = match call % 3 {
            0 => CrashPolicy::TornSectors { seed: call },
            _ => CrashPolicy::ProcessOnly,
        };
        sim.arm_crash(call, policy);
        sm.apply_all(log[first..].to_vec()).await.unwrap();
        let Some(image) = sim.take_crash() else {
            break;
        };
        drop(sm);
        crashes += 1;
        let mut after = open_on(&image);
        let r = after.revisions();
        if r.compact == at && r.physical < at {
            under_way += 1;
        }
        let applied = after.applied().map_or(0, |l| l.index) as usize;
        after.apply_all(log[applied..].to_vec()).await.unwrap();
        let got = store_bytes(&mut after).await;
        assert!(got == want, "crash at call {call}: the store differs");
    }
    eprintln!("{crashes} crashes, {under_way} with the compaction under way");
    assert!(
        crashes > 10 && under_way > 2,
        "{crashes} crashes, {under_way} under way"
    );
}
