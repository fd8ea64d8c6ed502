//! The Raft log under power cuts: the journal on `SimVfs`, a random run of
//! appends, truncations, purges and votes, a crash armed to land in the
//! middle of one of them; after reopening the crash image:
//!
//! - every entry whose flush callback fired (its append returned) and that
//!   no acknowledged truncation or purge removed is there, byte for byte;
//! - nothing an acknowledged truncation removed comes back (every payload
//!   is unique: an entry read back is the live one at its index, or one of
//!   the append the crash cut);
//! - the log state agrees with the entries: consecutive indexes from the
//!   last purged id on, the last log id the last entry's;
//! - the vote is the last acknowledged one, or the one the crash cut.
//!
//! A fixed number of seeds, the same cases on any machine.

use journal_core::vfs::{CrashPolicy, SimVfs, SplitMix64, Vfs};
use journal_core::{Journal, Options};
use openraft::impls::leader_id_adv::LeaderId;
use openraft::storage::RaftLogReader;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{EntryPayload, LogId};
use openraft_log::JournalLogStore;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

openraft::declare_raft_types!(
    /// The type config of these tests.
    pub TypeConfig
);

type Entry = openraft::alias::EntryOf<TypeConfig>;
type Vote = openraft::alias::VoteOf<TypeConfig>;

const SEEDS: u64 = 60;

fn options() -> Options {
    Options {
        segment_size: 64 << 10,
        logbufs: 4,
        logbsize: 16 << 10,
        max_segments: 8,
        background_preallocation: false,
        direct_io: false,
        ..Options::default()
    }
}

fn open(vfs: &SimVfs, cache: usize) -> JournalLogStore<TypeConfig> {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    let j = Journal::open_with(v, Path::new("/raft"), options()).expect("journal opens");
    JournalLogStore::from_journal(Arc::new(j))
        .expect("the raft log opens")
        .with_cache_bytes(cache)
}

fn entry(term: u64, index: u64, payload: String) -> Entry {
    Entry {
        log_id: LogId::new(LeaderId { term, node_id: 0 }, index),
        payload: EntryPayload::Normal(payload),
    }
}

/// What was acknowledged.
#[derive(Clone, Default)]
struct Model {
    entries: BTreeMap<u64, (u64, String)>,
    purged: Option<u64>,
    vote: Option<Vote>,
}

/// An operation, as the model applies it once acknowledged.
#[derive(Clone, Debug)]
enum Op {
    Append(Vec<(u64, u64, String)>),
    Truncate(u64),
    Purge(u64),
    Vote(Vote),
}

impl Model {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Append(es) => {
                for (term, i, p) in es {
                    self.entries.insert(*i, (*term, p.clone()));
                }
            }
            Op::Truncate(since) => {
                self.entries.split_off(since);
            }
            Op::Purge(upto) => {
                self.entries = self.entries.split_off(&(upto + 1));
                self.purged = Some(*upto);
            }
            Op::Vote(v) => self.vote = Some(*v),
        }
    }

    fn next_index(&self) -> u64 {
        self.entries
            .keys()
            .next_back()
            .map_or(self.purged.map_or(1, |p| p + 1), |l| l + 1)
    }
}

async fn perform(log: &mut JournalLogStore<TypeConfig>, op: &Op) {
    match op {
        Op::Append(es) => {
            let entries: Vec<_> = es
                .iter()
                .map(|(t, i, p)| entry(*t, *i, p.clone()))
                .collect();
            log.blocking_append(entries).await.expect("append");
        }
        Op::Truncate(since) => log
            .truncate_after(since.checked_sub(1).map(|last| {
                LogId::new(
                    LeaderId {
                        term: 0,
                        node_id: 0,
                    },
                    last,
                )
            }))
            .await
            .expect("truncate"),
        Op::Purge(upto) => {
            let id = log
                .get_log_reader()
                .await
                .try_get_log_entries(*upto..=*upto)
                .await
                .expect("read the purge point")
                .first()
                .map(|e| e.log_id)
                .unwrap_or_else(|| panic!("the purge point {upto} is live: {:?}", log_debug(log)));
            log.purge(id).await.expect("purge")
        }
        Op::Vote(v) => log.save_vote(v).await.expect("vote"),
    }
}

/// One seed: returns the kind of operation the crash cut, if it came.
async fn run(seed: u64) -> Option<&'static str> {
    let mut rng = SplitMix64::new(seed);
    let vfs = SimVfs::new();
    let mut log = open(&vfs, [0, 1 << 10, 1 << 20][seed as usize % 3]);
    let policy = if seed.is_multiple_of(2) {
        CrashPolicy::DropUnsynced
    } else {
        CrashPolicy::TornSectors { seed }
    };
    vfs.arm_crash(1 + rng.below(250), policy);
    let mut model = Model::default();
    let (mut term, mut vote_term) = (1u64, 1u64);
    let mut cut = None;
    for n in 0..80u64 {
        let next = model.next_index();
        let live = model
            .entries
            .keys()
            .next()
            .copied()
            .zip(model.entries.keys().next_back().copied());
        let op = match (rng.below(10), live) {
            (0..=4, _) | (5..=7, None) => {
                let k = 1 + rng.below(4);
                Op::Append(
                    (0..k)
                        .map(|i| {
                            let size = 20 + rng.below(3000) as usize;
                            let mut p = format!("s{seed}-op{n}-e{i}-");
                            p.extend(std::iter::repeat_n('x', size));
                            (term, next + i, p)
                        })
                        .collect(),
                )
            }
            (5 | 6, Some((first, last))) => {
                term += 1;
                Op::Truncate(rng.range(first, last))
            }
            (7, Some((first, last))) => Op::Purge(rng.range(first, last)),
            _ => {
                vote_term += 1;
                Op::Vote(Vote::new(vote_term, seed % 3))
            }
        };
        perform(&mut log, &op).await;
        if vfs.crash_captured() {
            cut = Some(op);
            break;
        }
        model.apply(&op);
    }
    let image = vfs.take_crash()?;
    drop(log);
    let mut log = open(&image, 0);
    check(&mut log, &model, cut.as_ref(), seed).await;
    // And once more after writing on the recovered log: appends go on
    // from its last entry.
    let state = log.get_log_state().await.unwrap();
    let next = state.last_log_id.map_or(1, |l| l.index + 1);
    log.blocking_append([entry(term + 1, next, "after".into())])
        .await
        .unwrap();
    let got = log.try_get_log_entries(next..=next).await.unwrap();
    assert_eq!(got.len(), 1, "seed {seed}: the append after recovery");
    Some(match cut {
        Some(Op::Append(_)) => "append",
        Some(Op::Truncate(_)) => "truncate",
        Some(Op::Purge(_)) => "purge",
        Some(Op::Vote(_)) => "vote",
        None => "none",
    })
}

async fn check(log: &mut JournalLogStore<TypeConfig>, model: &Model, cut: Option<&Op>, seed: u64) {
    let state = log.get_log_state().await.unwrap();
    let purged = state.last_purged_log_id.map(|l| l.index);
    assert!(
        purged >= model.purged,
        "seed {seed}: purge went back: {purged:?} < {:?}",
        model.purged
    );
    let first = purged.map_or(0, |p| p + 1);
    let entries = log.try_get_log_entries(first..).await.unwrap();
    // Consecutive indexes; the state's last id is the last entry's.
    for w in entries.windows(2) {
        assert_eq!(
            w[0].log_id.index + 1,
            w[1].log_id.index,
            "seed {seed}: a gap"
        );
    }
    let last = entries
        .last()
        .map(|e| e.log_id)
        .or(state.last_purged_log_id);
    assert_eq!(state.last_log_id, last, "seed {seed}: log state vs entries");
    let cut_payloads: Vec<&str> = match cut {
        Some(Op::Append(es)) => es.iter().map(|(_, _, p)| p.as_str()).collect(),
        _ => Vec::new(),
    };
    let got: BTreeMap<u64, String> = entries
        .iter()
        .map(|e| match &e.payload {
            EntryPayload::Normal(p) => (e.log_id.index, p.clone()),
            other => panic!("seed {seed}: unexpected payload {other:?}"),
        })
        .collect();
    for (i, p) in &got {
        let live = model.entries.get(i).is_some_and(|(_, q)| q == p);
        assert!(
            live || cut_payloads.contains(&p.as_str()),
            "seed {seed}: entry {i} is neither live nor of the cut append (truncated or never written)"
        );
    }
    for (i, (_, p)) in &model.entries {
        // The cut truncation or purge may have landed.
        let may_be_gone = match cut {
            Some(Op::Truncate(since)) => i >= since,
            Some(Op::Purge(upto)) => i <= upto,
            _ => false,
        };
        if may_be_gone && !got.contains_key(i) {
            continue;
        }
        assert_eq!(
            got.get(i),
            Some(p),
            "seed {seed}: acknowledged entry {i} lost"
        );
    }
    let vote = log.read_vote().await.unwrap();
    let cut_vote = match cut {
        Some(Op::Vote(v)) => Some(*v),
        _ => None,
    };
    assert!(
        vote == model.vote || (cut_vote.is_some() && vote == cut_vote),
        "seed {seed}: vote {vote:?}, acknowledged {:?}",
        model.vote
    );
}

#[test]
fn every_acknowledged_entry_survives_a_crash_and_nothing_truncated_returns() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut cuts: BTreeMap<&str, u64> = BTreeMap::new();
    for seed in 0..SEEDS {
        if let Some(kind) = rt.block_on(run(seed)) {
            *cuts.entry(kind).or_default() += 1;
        }
    }
    eprintln!("crashes cut: {cuts:?}");
    // The crashes landed inside each kind of operation that writes.
    for kind in ["append", "truncate", "purge"] {
        assert!(
            cuts.get(kind).copied().unwrap_or(0) > 0,
            "no crash cut a {kind}: {cuts:?}"
        );
    }
}

fn log_debug(log: &JournalLogStore<TypeConfig>) -> String {
    format!(
        "{:?} durable {:?}",
        log.counts(),
        log.journal().durable_lsn()
    )
}
