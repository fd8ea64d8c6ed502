//! openraft's log storage on the journal.
//!
//! [`JournalLogStore`] implements openraft's `RaftLogStorage` (storage v2)
//! for **openraft 0.9.25**, the latest stable release, on a
//! [`journal_core::Journal`]. Every log entry, vote, truncation and purge is
//! one journal record (JSON through serde):
//!
//! - **append**: each entry is appended to the journal; the `LogFlushed`
//!   callback fires when the last of them is durable, from a task awaiting
//!   [`journal_core::Journal::commit_async`] — so openraft's pipeline goes on
//!   meanwhile, and the flushes of concurrent appends share the journal's
//!   group commits.
//! - **vote**: a vote record, durable before `save_vote` returns.
//! - **truncate(log_id)**: a logical truncation record (entries at and after
//!   `log_id.index` are gone), durable before it returns. Replay applies
//!   records in log order, so entries appended after it survive it.
//! - **purge(log_id)**: a purge record, then a *state* record carrying the
//!   vote, the committed id and the last purged id, both durable; then the
//!   journal checkpoints at the oldest LSN still needed (the state record,
//!   or the oldest remaining entry), so segments holding only purged
//!   entries are recycled.
//! - **open**: the journal recovers, and the records from its checkpoint on
//!   are replayed into the in-memory index from log index to `(LogId, LSN)`
//!   and entry, the vote, the committed and the purged ids.
//!
//! Entries are also kept in memory from append until purge (as
//! raft-engine's memtable does): openraft reads entries it has just
//! appended, before they are durable, to replicate them.
#![forbid(unsafe_code)]
// openraft's storage traits return its `StorageError`, large as it is; the
// helpers here return the same.
#![allow(clippy::result_large_err)]

use journal_core::{Journal, Lsn, Options};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{LogId, RaftLogId, RaftTypeConfig, StorageError, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One journal record.
#[derive(Serialize, Deserialize)]
#[serde(bound(
    serialize = "E: Serialize, NID: openraft::NodeId",
    deserialize = "E: DeserializeOwned, NID: openraft::NodeId"
))]
enum Record<E, NID: openraft::NodeId> {
    /// A log entry.
    Entry(E),
    /// The vote.
    Vote(Vote<NID>),
    /// The committed log id.
    Committed(Option<LogId<NID>>),
    /// Entries at and after this index are gone.
    Truncate(u64),
    /// Entries up to and including this id are gone.
    Purge(LogId<NID>),
    /// Everything but the entries, rewritten by a purge so that the
    /// checkpoint can move past older records.
    State {
        vote: Option<Vote<NID>>,
        committed: Option<LogId<NID>>,
        purged: Option<LogId<NID>>,
    },
}

type Nid<C> = <C as RaftTypeConfig>::NodeId;

/// A live entry: its id, the LSN of its record, the entry.
struct Stored<C: RaftTypeConfig> {
    id: LogId<Nid<C>>,
    lsn: Lsn,
    entry: C::Entry,
}

struct State<C: RaftTypeConfig> {
    /// Log index → the live entry there.
    entries: BTreeMap<u64, Stored<C>>,
    vote: Option<Vote<Nid<C>>>,
    committed: Option<LogId<Nid<C>>>,
    purged: Option<LogId<Nid<C>>>,
}

impl<C: RaftTypeConfig> State<C> {
    fn apply(&mut self, lsn: Lsn, r: Record<C::Entry, Nid<C>>) {
        match r {
            Record::Entry(e) => {
                let id = e.get_log_id().clone();
                self.entries.insert(id.index, Stored { id, lsn, entry: e });
            }
            Record::Vote(v) => self.vote = Some(v),
            Record::Committed(c) => self.committed = c,
            Record::Truncate(since) => {
                self.entries.split_off(&since);
            }
            Record::Purge(upto) => {
                self.entries = self.entries.split_off(&(upto.index + 1));
                self.purged = Some(upto);
            }
            Record::State {
                vote,
                committed,
                purged,
            } => {
                self.vote = vote;
                self.committed = committed;
                self.purged = purged;
            }
        }
    }
}

struct Shared<C: RaftTypeConfig> {
    journal: Arc<Journal>,
    state: Mutex<State<C>>,
}

/// openraft's log storage on a journal. Cheap to clone: clones share the
/// journal and the index (the log reader is a clone).
pub struct JournalLogStore<C: RaftTypeConfig> {
    shared: Arc<Shared<C>>,
}

impl<C: RaftTypeConfig> Clone for JournalLogStore<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<C: RaftTypeConfig> Debug for JournalLogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalLogStore")
            .field("dir", &self.shared.journal.dir())
            .finish_non_exhaustive()
    }
}

fn write_err<NID: openraft::NodeId>(e: impl std::error::Error + 'static) -> StorageError<NID> {
    StorageIOError::write_logs(&e).into()
}

impl<C> JournalLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    /// Opens (or creates) the log in `dir`, recovering the journal and
    /// rebuilding the index from its records.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Self, journal_core::Error> {
        Self::from_journal(Arc::new(Journal::open(dir, options)?))
    }

    /// The log on an open journal (a `SimVfs` one in tests).
    pub fn from_journal(journal: Arc<Journal>) -> Result<Self, journal_core::Error> {
        let mut state = State {
            entries: BTreeMap::new(),
            vote: None,
            committed: None,
            purged: None,
        };
        for r in journal.read_from(journal.redo_lsn())? {
            let (lsn, bytes) = r?;
            let record =
                serde_json::from_slice(&bytes).map_err(|_| journal_core::Error::Corruption {
                    lsn,
                    segment: journal.geometry().segment_of(lsn),
                    found: journal_core::Damage::Zeroes,
                    next_valid: None,
                })?;
            state.apply(lsn, record);
        }
        Ok(Self {
            shared: Arc::new(Shared {
                journal,
                state: Mutex::new(state),
            }),
        })
    }

    /// The journal underneath (for its metrics, or to close it).
    pub fn journal(&self) -> &Arc<Journal> {
        &self.shared.journal
    }

    fn encode(r: &Record<C::Entry, Nid<C>>) -> Result<Vec<u8>, StorageError<Nid<C>>> {
        serde_json::to_vec(r).map_err(write_err)
    }

    /// Appends `r` durably; applies it to the index.
    async fn durable(&self, r: Record<C::Entry, Nid<C>>) -> Result<Lsn, StorageError<Nid<C>>> {
        let bytes = Self::encode(&r)?;
        let j = &self.shared.journal;
        let lsn = j.append(&bytes).map_err(write_err)?;
        self.shared.state.lock().expect("state").apply(lsn, r);
        j.commit_async(lsn).await.map_err(write_err)?;
        Ok(lsn)
    }
}

impl<C> RaftLogReader<C> for JournalLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<Nid<C>>> {
        let st = self.shared.state.lock().expect("state");
        Ok(st
            .entries
            .range(range)
            .map(|(_, s)| s.entry.clone())
            .collect())
    }
}

impl<C> RaftLogStorage<C> for JournalLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<Nid<C>>> {
        let st = self.shared.state.lock().expect("state");
        let last = st.entries.values().next_back().map(|s| s.id.clone());
        Ok(LogState {
            last_purged_log_id: st.purged.clone(),
            last_log_id: last.or_else(|| st.purged.clone()),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<Nid<C>>) -> Result<(), StorageError<Nid<C>>> {
        self.durable(Record::Vote(vote.clone())).await?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<Nid<C>>>, StorageError<Nid<C>>> {
        Ok(self.shared.state.lock().expect("state").vote.clone())
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<Nid<C>>>,
    ) -> Result<(), StorageError<Nid<C>>> {
        // Made durable by the next force; openraft re-derives it otherwise.
        let r = Record::Committed(committed);
        let lsn = self
            .shared
            .journal
            .append(&Self::encode(&r)?)
            .map_err(write_err)?;
        self.shared.state.lock().expect("state").apply(lsn, r);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<Nid<C>>>, StorageError<Nid<C>>> {
        Ok(self.shared.state.lock().expect("state").committed.clone())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<Nid<C>>>
    where
        I: IntoIterator<Item = C::Entry> + Send,
        I::IntoIter: Send,
    {
        let j = self.shared.journal.clone();
        let mut last = None;
        for e in entries {
            let r = Record::Entry(e);
            let lsn = j.append(&Self::encode(&r)?).map_err(write_err)?;
            self.shared.state.lock().expect("state").apply(lsn, r);
            last = Some(lsn);
        }
        let Some(lsn) = last else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        // The callback fires once the last entry is durable; openraft goes
        // on meanwhile, and concurrent flushes share group commits.
        let flush = async move {
            let r = j.commit_async(lsn).await.map_err(std::io::Error::other);
            callback.log_io_completed(r);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(flush);
            }
            Err(_) => {
                std::thread::spawn(move || journal_core::sync::future::block_on(flush));
            }
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<Nid<C>>) -> Result<(), StorageError<Nid<C>>> {
        self.durable(Record::Truncate(log_id.index)).await?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<Nid<C>>) -> Result<(), StorageError<Nid<C>>> {
        self.durable(Record::Purge(log_id)).await?;
        let state = {
            let st = self.shared.state.lock().expect("state");
            Record::State {
                vote: st.vote.clone(),
                committed: st.committed.clone(),
                purged: st.purged.clone(),
            }
        };
        let state_lsn = self.durable(state).await?;
        // Everything older than the state record and the oldest remaining
        // entry is no longer needed: move the tail, recycle segments.
        let redo = {
            let st = self.shared.state.lock().expect("state");
            st.entries
                .values()
                .map(|s| s.lsn)
                .min()
                .map_or(state_lsn, |oldest| oldest.min(state_lsn))
        };
        let j = self.shared.journal.clone();
        if redo > j.redo_lsn() {
            j.checkpoint(redo).map_err(write_err)?;
        }
        Ok(())
    }
}
