//! openraft's own storage test suite (`openraft::testing::Suite`) against
//! the journal log store, on the real disk, with a small in-memory state
//! machine (the suite checks a log store and a state machine together);
//! then a reopen that must rebuild the same log.

use futures_util::StreamExt;
use journal_core::Options;
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf, VoteOf};
use openraft::impls::leader_id_adv::LeaderId;
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, LogId, StorageError, StoredMembership};
use openraft_log::{FlushMode, JournalLogStore};
use std::io;
use std::sync::{Arc, Mutex};
use tempfile::TempDir;

// The suite's type config: the defaults (String requests and responses, u64
// node ids and terms, tokio).
openraft::declare_raft_types!(
    /// The type config of these tests.
    pub TypeConfig
);

type Entry = openraft::alias::EntryOf<TypeConfig>;

fn options() -> Options {
    Options {
        segment_size: 1 << 20,
        logbsize: 64 << 10,
        ..Options::default()
    }
}

#[derive(Default)]
struct SmState {
    last_applied: Option<LogIdOf<TypeConfig>>,
    membership: StoredMembershipOf<TypeConfig>,
    data: Vec<String>,
    snapshot: Option<(SnapshotMetaOf<TypeConfig>, Vec<u8>)>,
    snapshots_built: u64,
}

/// A state machine that keeps the applied requests in memory.
#[derive(Default, Clone)]
struct MemStateMachine(Arc<Mutex<SmState>>);

impl RaftSnapshotBuilder<TypeConfig> for MemStateMachine {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<TypeConfig, Vec<u8>>> {
        let mut st = self.0.lock().unwrap();
        st.snapshots_built += 1;
        let data = serde_json::to_vec(&st.data).map_err(io::Error::other)?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: st.last_applied,
            last_membership: st.membership.clone(),
        };
        st.snapshot = Some((meta.clone(), data.clone()));
        Ok(SnapshotOf::<TypeConfig, Vec<u8>> {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for MemStateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> io::Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>)> {
        let st = self.0.lock().unwrap();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: futures_util::Stream<Item = io::Result<openraft::storage::EntryResponder<TypeConfig>>>
            + Unpin
            + Send,
    {
        while let Some(item) = entries.next().await {
            let (e, responder) = item?;
            let out = {
                let mut st = self.0.lock().unwrap();
                st.last_applied = Some(e.log_id);
                match e.payload {
                    EntryPayload::Blank => String::new(),
                    EntryPayload::Normal(d) => {
                        st.data.push(d.clone());
                        d
                    }
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(e.log_id), m);
                        String::new()
                    }
                }
            };
            if let Some(r) = responder {
                r.send(out);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        bytes: Vec<u8>,
    ) -> io::Result<()> {
        let data: Vec<String> = serde_json::from_slice(&bytes).map_err(io::Error::other)?;
        let mut st = self.0.lock().unwrap();
        st.data = data;
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        st.snapshot = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>> {
        let st = self.0.lock().unwrap();
        Ok(st
            .snapshot
            .as_ref()
            .map(|(meta, data)| SnapshotOf::<TypeConfig, Vec<u8>> {
                meta: meta.clone(),
                snapshot: data.clone(),
            }))
    }
}

/// Builds log stores whose cache of newest entries holds this many bytes,
/// flushing appends this way.
struct Builder(usize, FlushMode);

impl StoreBuilder<TypeConfig, JournalLogStore<TypeConfig>, MemStateMachine, TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(TempDir, JournalLogStore<TypeConfig>, MemStateMachine), StorageError<TypeConfig>>
    {
        let err =
            |e: io::Error| StorageError::from_io_error(ErrorSubject::Logs, ErrorVerb::Write, e);
        let tmp = tempfile::tempdir().map_err(err)?;
        let log = JournalLogStore::open(tmp.path().join("raft-log"), options())
            .map_err(|e| err(io::Error::other(e)))?
            .with_cache_bytes(self.0)
            .with_flush_mode(self.1);
        Ok((tmp, log, MemStateMachine::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() {
    Suite::test_all(Builder(openraft_log::DEFAULT_CACHE_BYTES, FlushMode::Task))
        .await
        .expect("openraft's storage suite");
}

/// Appends made durable before `append` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes_with_inline_flushes() {
    Suite::test_all(Builder(
        openraft_log::DEFAULT_CACHE_BYTES,
        FlushMode::Inline,
    ))
    .await
    .expect("openraft's storage suite, inline flushes");
}

/// With no cache every entry openraft reads back comes from the journal's
/// segment files (range reads), the entries just appended included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes_reading_every_entry_from_the_journal() {
    Suite::test_all(Builder(0, FlushMode::Task))
        .await
        .expect("openraft's storage suite, no cache");
}

fn id(term: u64, index: u64) -> LogIdOf<TypeConfig> {
    LogId::new(LeaderId { term, node_id: 0 }, index)
}

fn entry(term: u64, index: u64, s: &str) -> Entry {
    Entry {
        log_id: id(term, index),
        payload: EntryPayload::Normal(s.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_log_has_what_was_written_truncated_and_purged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("raft-log");
    let mut log = JournalLogStore::<TypeConfig>::open(&dir, options()).unwrap();
    let vote: VoteOf<TypeConfig> = openraft::Vote::new(3, 1);
    log.save_vote(&vote).await.unwrap();
    for i in 1..=40u64 {
        log.blocking_append([entry(1, i, &format!("e{i}"))])
            .await
            .unwrap();
    }
    log.truncate_after(Some(id(1, 30))).await.unwrap();
    for i in 31..=35u64 {
        log.blocking_append([entry(2, i, &format!("f{i}"))])
            .await
            .unwrap();
    }
    log.purge(id(1, 10)).await.unwrap();
    let redo = log.journal().redo_lsn();
    assert!(redo.0 > 0, "the purge moved the journal's tail");
    drop(log);

    let mut log = JournalLogStore::<TypeConfig>::open(&dir, options()).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.unwrap().index, 10);
    assert_eq!(state.last_log_id.unwrap().index, 35);
    let entries = log.try_get_log_entries(11..=35).await.unwrap();
    let got: Vec<String> = entries
        .iter()
        .map(|e| match &e.payload {
            EntryPayload::Normal(s) => s.clone(),
            _ => panic!("a normal entry"),
        })
        .collect();
    let want: Vec<String> = (11..=30)
        .map(|i| format!("e{i}"))
        .chain((31..=35).map(|i| format!("f{i}")))
        .collect();
    assert_eq!(got, want);
}

/// Appends and awaits the flush callback, for tests.
trait BlockingAppend {
    async fn blocking_append<const N: usize>(
        &mut self,
        e: [Entry; N],
    ) -> Result<(), StorageError<TypeConfig>>;
}

impl BlockingAppend for JournalLogStore<TypeConfig> {
    async fn blocking_append<const N: usize>(
        &mut self,
        e: [Entry; N],
    ) -> Result<(), StorageError<TypeConfig>> {
        openraft::storage::RaftLogStorageExt::blocking_append(self, e).await
    }
}

/// A purge waits for its gate: until the gate opens the entries stay, and
/// a gate that fails fails the purge and removes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waits_for_its_gate_and_a_failing_gate_removes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let gate: openraft_log::PurgeGate = Arc::new(move |upto| {
        let mut rx = open_rx.clone();
        let entered = entered_tx.clone();
        Box::pin(async move {
            if upto > 20 {
                return Err(std::io::Error::other("the state machine failed"));
            }
            let _ = entered.send(upto);
            rx.wait_for(|open| *open)
                .await
                .map(|_| ())
                .map_err(std::io::Error::other)
        })
    });
    let log = JournalLogStore::<TypeConfig>::open(tmp.path().join("log"), options())
        .unwrap()
        .with_purge_gate(gate);
    let mut writer = log.clone();
    for i in 1..=30u64 {
        writer
            .blocking_append([entry(1, i, &format!("e{i}"))])
            .await
            .unwrap();
    }
    let id = |i| id(1, i);

    let mut failing = log.clone();
    assert!(failing.purge(id(25)).await.is_err(), "the gate failed it");
    let mut purger = log.clone();
    let purge = tokio::spawn(async move { purger.purge(id(10)).await });
    assert_eq!(entered.recv().await, Some(10), "the purge asked its gate");
    let mut reader = log.clone();
    let state = reader.get_log_state().await.unwrap();
    assert_eq!(
        state.last_purged_log_id, None,
        "nothing purged before the gate opens"
    );
    assert_eq!(reader.try_get_log_entries(1..=30).await.unwrap().len(), 30);
    assert!(!purge.is_finished());

    open_tx.send(true).unwrap();
    purge.await.unwrap().unwrap();
    let state = reader.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(10));
    assert_eq!(reader.try_get_log_entries(1..=30).await.unwrap().len(), 20);
}
