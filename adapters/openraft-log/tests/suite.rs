//! openraft's own storage test suite (`openraft::testing::Suite`) against
//! the journal log store, on the real disk, with a small in-memory state
//! machine (the suite checks a log store and a state machine together);
//! then a reopen that must rebuild the same log.

use journal_core::Options;
use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftLogReader, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use openraft_log::{FlushMode, JournalLogStore};
use std::io::Cursor;
use std::sync::{Arc, Mutex};
use tempfile::TempDir;

// The suite's type config: the defaults (String requests and responses, u64
// node ids, tokio).
openraft::declare_raft_types!(
    /// The type config of these tests.
    pub TypeConfig
);

fn options() -> Options {
    Options {
        segment_size: 1 << 20,
        logbsize: 64 << 10,
        ..Options::default()
    }
}

#[derive(Default)]
struct SmState {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    data: Vec<String>,
    snapshot: Option<(SnapshotMeta<u64, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// A state machine that keeps the applied requests in memory.
#[derive(Default, Clone)]
struct MemStateMachine(Arc<Mutex<SmState>>);

impl RaftSnapshotBuilder<TypeConfig> for MemStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let mut st = self.0.lock().unwrap();
        st.snapshots_built += 1;
        let data =
            serde_json::to_vec(&st.data).map_err(|e| StorageIOError::read_state_machine(&e))?;
        let meta = SnapshotMeta {
            last_log_id: st.last_applied,
            last_membership: st.membership.clone(),
            snapshot_id: format!("snapshot-{}", st.snapshots_built),
        };
        st.snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for MemStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let st = self.0.lock().unwrap();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<String>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut st = self.0.lock().unwrap();
        let mut out = Vec::new();
        for e in entries {
            st.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => out.push(String::new()),
                EntryPayload::Normal(d) => {
                    st.data.push(d.clone());
                    out.push(d);
                }
                EntryPayload::Membership(m) => {
                    st.membership = StoredMembership::new(Some(e.log_id), m);
                    out.push(String::new());
                }
            }
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let bytes = snapshot.into_inner();
        let data: Vec<String> = serde_json::from_slice(&bytes)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let mut st = self.0.lock().unwrap();
        st.data = data;
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        st.snapshot = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let st = self.0.lock().unwrap();
        Ok(st.snapshot.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.clone())),
        }))
    }
}

/// Builds log stores whose cache of newest entries holds this many bytes,
/// flushing appends this way.
struct Builder(usize, FlushMode);

impl StoreBuilder<TypeConfig, JournalLogStore<TypeConfig>, MemStateMachine, TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(TempDir, JournalLogStore<TypeConfig>, MemStateMachine), StorageError<u64>> {
        let tmp = tempfile::tempdir().map_err(|e| StorageIOError::write_logs(&e))?;
        let log = JournalLogStore::open(tmp.path().join("raft-log"), options())
            .map_err(|e| StorageIOError::write_logs(&e))?
            .with_cache_bytes(self.0)
            .with_flush_mode(self.1);
        Ok((tmp, log, MemStateMachine::default()))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(Builder(openraft_log::DEFAULT_CACHE_BYTES, FlushMode::Task))
        .expect("openraft's storage suite");
}

/// Appends made durable before `append` returns.
#[test]
fn openraft_storage_suite_passes_with_inline_flushes() {
    Suite::test_all(Builder(
        openraft_log::DEFAULT_CACHE_BYTES,
        FlushMode::Inline,
    ))
    .expect("openraft's storage suite, inline flushes");
}

/// With no cache every entry openraft reads back comes from the journal's
/// segment files (range reads), the entries just appended included.
#[test]
fn openraft_storage_suite_passes_reading_every_entry_from_the_journal() {
    Suite::test_all(Builder(0, FlushMode::Task)).expect("openraft's storage suite, no cache");
}

fn entry(term: u64, index: u64, s: &str) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(openraft::CommittedLeaderId::new(term, 0), index),
        payload: EntryPayload::Normal(s.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_log_has_what_was_written_truncated_and_purged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("raft-log");
    let mut log = JournalLogStore::<TypeConfig>::open(&dir, options()).unwrap();
    let vote = openraft::Vote::new(3, 1);
    log.save_vote(&vote).await.unwrap();
    for i in 1..=40u64 {
        log.blocking_append([entry(1, i, &format!("e{i}"))])
            .await
            .unwrap();
    }
    log.truncate(LogId::new(openraft::CommittedLeaderId::new(1, 0), 31))
        .await
        .unwrap();
    for i in 31..=35u64 {
        log.blocking_append([entry(2, i, &format!("f{i}"))])
            .await
            .unwrap();
    }
    log.purge(LogId::new(openraft::CommittedLeaderId::new(1, 0), 10))
        .await
        .unwrap();
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
        e: [Entry<TypeConfig>; N],
    ) -> Result<(), StorageError<u64>>;
}

impl BlockingAppend for JournalLogStore<TypeConfig> {
    async fn blocking_append<const N: usize>(
        &mut self,
        e: [Entry<TypeConfig>; N],
    ) -> Result<(), StorageError<u64>> {
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
    let id = |i| LogId::new(openraft::CommittedLeaderId::new(1, 0), i);

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
