//! openraft's log storage on the journal.
//!
//! [`JournalLogStore`] implements openraft's `RaftLogStorage` (storage v2)
//! for **openraft 0.10.0-alpha.37** on a [`journal_core::Journal`]. The entries live
//! in the journal's segment files and are read back from there; memory
//! holds only an index and a bounded cache, as raft-engine does for TiKV.
//!
//! # What is in memory, what is on disk
//!
//! - **On disk**, one journal record per entry, vote, committed id,
//!   truncation and purge ([`mod@format`]: a fixed header — version, kind, log
//!   index — then the log id and the entry in postcard).
//! - **In memory**: the index from log index to the LSN of the entry's
//!   record (8 bytes an entry, in a ring buffer) and the leader ids, kept
//!   once per run of entries with the same leader; the vote, the committed
//!   and the last purged id; and a cache of the newest entries, bounded by
//!   their encoded bytes ([`DEFAULT_CACHE_BYTES`], [`JournalLogStore::with_cache_bytes`]):
//!   openraft reads the entries it has just appended, before they are
//!   durable, to replicate them. The index is 8 bytes an entry, whatever
//!   its size (8 MiB for 1,000,000 entries, by arithmetic); measured, the
//!   process's anonymous memory grew by 10 MiB from 10,000 to 1,000,000
//!   entries of 1 KiB (docs/PERFORMANCE.md, "The Raft log").
//!
//! # Operations
//!
//! - **append**: each entry is appended to the journal, indexed and
//!   cached; the `IOFlushed` callback fires when the last of them is
//!   durable, from a task awaiting [`journal_core::Journal::commit_async`]
//!   — openraft's pipeline goes on meanwhile, and the flushes of concurrent
//!   appends share the journal's group commits — or, with
//!   [`FlushMode::Inline`], once `append` itself committed.
//! - **read** (`try_get_log_entries`): cached entries are cloned; the rest
//!   are read from the journal, a run of consecutive entries with one range
//!   read ([`journal_core::Journal::read_range`], which starts at the first
//!   entry's record rather than scanning the log), and decoded.
//! - **vote**: a vote record, durable before `save_vote` returns.
//! - **truncate_after(log_id)**: a logical truncation record (entries
//!   after `log_id`, or all of them for `None`, are gone), durable before
//!   it returns. Replay
//!   applies records in log order, so entries appended after it survive it.
//! - **purge(log_id)**: once the [`PurgeGate`], if any, says the state
//!   machine holds the entries durably: a purge record, then a *state*
//!   record carrying the vote, the committed id and the last purged id,
//!   both durable; then the
//!   journal checkpoints at the oldest LSN still needed (the state record,
//!   or the oldest remaining entry), so segments holding only purged
//!   entries are recycled.
//! - **open**: the journal recovers, and the records from its checkpoint on
//!   are replayed into the index — reading each entry's header and log id,
//!   never decoding an entry.
//!
//! # Configure openraft with leader restore off
//!
//! openraft 0.10 replicates entries while the leader's own append and
//! flush run (with [`FlushMode::Task`], the default, the flush is not even
//! on the append's path), so the followers can commit an entry that the
//! leader's disk then loses in a power cut. openraft's leader restore (`Config::enable_leader_restore`,
//! on by default) brings a restarted leader back in its old term, with a
//! log that lacks that entry. It serves reads below the entry and writes
//! other entries under the same log ids. Set it to `Some(false)`, as raftkv
//! does: the restarted node then stands for election in a new term
//! (raftkv's `tests/disk_crash.rs` shows the loss with it on).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod format;
mod index;

use crate::format::Record;
use crate::index::{Cache, LogIndex};
use journal_core::sync::Mutex;
use journal_core::{ForceMode, Journal, Lsn, Options};
use openraft::alias::{CommittedLeaderIdOf, LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::RaftTypeConfig;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

/// The default bound of the cache of newest entries: 4 MiB of encoded
/// entries.
pub const DEFAULT_CACHE_BYTES: usize = 4 << 20;

/// How [`RaftLogStorage::append`] makes its entries durable before it
/// fires openraft's `IOFlushed` callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushMode {
    /// A task awaits [`Journal::commit_async`]: the journal's forcer thread
    /// forces, and no thread of the caller's runtime ever waits for the
    /// disk. The default.
    #[default]
    Task,
    /// `append` commits ([`Journal::commit`]) before it returns, blocking
    /// its thread for the flush. Under openraft 0.9, whose core awaited
    /// each append's flush before its next step, this saved the hand-off
    /// to the forcer thread and back (two thread switches a flush, 23%
    /// more puts/s for raftkv's lone client). openraft 0.10 replicates
    /// while the flush runs, so blocking the core for it costs that
    /// overlap. The price either way: other tasks on the same runtime
    /// thread wait for the flush too.
    Inline,
}

/// What a purge waits for before it removes entries
/// ([`JournalLogStore::with_purge_gate`]): called with the last index the
/// purge removes, it resolves once the state machine holds every entry up
/// to it durably, or with the error that means it never will.
///
/// openraft 0.9 did not wait for that itself: a follower that installs a
/// snapshot queued the install to its state machine and purged its log up
/// to the snapshot at once (`Command::PurgeLog` had no condition). A crash
/// between the two leaves a log purged past what the state machine holds,
/// with a committed index above it, and openraft cannot start on it: it
/// must re-apply entries that are gone ("Failed to get log entries").
pub type PurgeGate = Arc<
    dyn Fn(u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send>>
        + Send
        + Sync,
>;

/// A record of this log's type config.
type Rec<C> = Record<CommittedLeaderIdOf<C>, VoteOf<C>>;

/// Told how long each append took to become durable
/// ([`JournalLogStore::with_flush_observer`]): from the flush's request to
/// its completion, group commit included — what etcd's
/// `wal_fsync_duration_seconds` measures for its WAL.
pub type FlushObserver = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

struct State<C: RaftTypeConfig> {
    flush: FlushMode,
    observer: Option<FlushObserver>,
    gate: Option<PurgeGate>,
    index: LogIndex<CommittedLeaderIdOf<C>>,
    cache: Cache<C::Entry>,
    vote: Option<VoteOf<C>>,
    committed: Option<LogIdOf<C>>,
    purged: Option<LogIdOf<C>>,
}

impl<C: RaftTypeConfig> State<C> {
    /// Applies a record read back or just appended at `lsn` (the entry
    /// itself, with its encoded size, when there is one to cache).
    fn apply(
        &mut self,
        lsn: Lsn,
        r: Rec<C>,
        entry: Option<(C::Entry, usize)>,
    ) -> Result<(), format::Error> {
        match r {
            Record::Entry(id) => {
                self.index.push(&id, lsn)?;
                if let Some((e, size)) = entry {
                    self.cache.insert(id.index, e, size);
                }
            }
            Record::Vote(v) => self.vote = Some(v),
            Record::Committed(c) => self.committed = c,
            Record::Truncate(since) => {
                self.index.truncate(since);
                self.cache.truncate(since);
            }
            Record::Purge(upto) => {
                self.index.purge(upto.index);
                self.cache.purge(upto.index);
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
        Ok(())
    }
}

struct Shared<C: RaftTypeConfig> {
    journal: Arc<Journal>,
    state: Mutex<State<C>>,
}

/// openraft's log storage on a journal. Cheap to clone: clones share the
/// journal, the index and the cache (the log reader is a clone).
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

/// An error as openraft's storage traits take it.
fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

/// Why the log could not be opened or read.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The journal failed (recovery, a read).
    Journal(journal_core::Error),
    /// A record the journal returned whole (its CRC held) is not one this
    /// adapter wrote, or breaks the log's order: another program's
    /// journal, or a newer format.
    BadRecord {
        /// The record's LSN.
        lsn: Lsn,
        /// What is wrong with it.
        error: format::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Journal(e) => write!(f, "{e}"),
            Error::BadRecord { lsn, error } => write!(f, "raft log record at LSN {lsn}: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Journal(e) => Some(e),
            Error::BadRecord { error, .. } => Some(error),
        }
    }
}

impl From<journal_core::Error> for Error {
    fn from(e: journal_core::Error) -> Self {
        Error::Journal(e)
    }
}

impl<C> JournalLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    /// Opens (or creates) the log in `dir`, recovering the journal and
    /// rebuilding the index from its records.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Self, Error> {
        Self::from_journal(Arc::new(Journal::open(dir, options)?))
    }

    /// The log on an open journal (a `SimVfs` one in tests).
    pub fn from_journal(journal: Arc<Journal>) -> Result<Self, Error> {
        let mut state = State {
            flush: FlushMode::Task,
            observer: None,
            gate: None,
            index: LogIndex::default(),
            cache: Cache::new(DEFAULT_CACHE_BYTES),
            vote: None,
            committed: None,
            purged: None,
        };
        for r in journal.read_from(journal.redo_lsn())? {
            let (lsn, bytes) = r?;
            let bad = |error| Error::BadRecord { lsn, error };
            let record = Record::decode_header(&bytes).map_err(bad)?;
            state.apply(lsn, record, None).map_err(bad)?;
        }
        Ok(Self {
            shared: Arc::new(Shared {
                journal,
                state: Mutex::new(state),
            }),
        })
    }

    /// Bounds the cache of newest entries at `bytes` of encoded entries.
    pub fn with_cache_bytes(self, bytes: usize) -> Self {
        self.shared.state.lock().cache.set_limit(bytes);
        self
    }

    /// Sets how appends are made durable ([`FlushMode`]).
    pub fn with_flush_mode(self, mode: FlushMode) -> Self {
        self.shared.state.lock().flush = mode;
        self
    }

    /// Calls `observer` with the duration of every append's flush.
    pub fn with_flush_observer(self, observer: FlushObserver) -> Self {
        self.shared.state.lock().observer = Some(observer);
        self
    }

    /// Makes every purge wait for `gate` before it removes entries (see
    /// [`PurgeGate`]); a gate that fails fails the purge.
    pub fn with_purge_gate(self, gate: PurgeGate) -> Self {
        self.shared.state.lock().gate = Some(gate);
        self
    }

    /// The journal underneath (for its metrics, or to close it).
    pub fn journal(&self) -> &Arc<Journal> {
        &self.shared.journal
    }

    /// Entries indexed (live, not purged or truncated) and entries cached.
    pub fn counts(&self) -> (u64, usize) {
        let st = self.shared.state.lock();
        (st.index.len(), st.cache.len())
    }

    /// Appends `r` durably; applies it to the index.
    async fn durable(&self, r: Rec<C>) -> std::io::Result<Lsn> {
        let bytes = r.encode_without_entry().map_err(io_err)?;
        let j = &self.shared.journal;
        let lsn = j.append(&bytes).map_err(io_err)?;
        self.shared
            .state
            .lock()
            .apply(lsn, r, None)
            .map_err(io_err)?;
        j.commit_async(lsn).await.map_err(io_err)?;
        Ok(lsn)
    }

    /// Appends `entries` (in memory until the journal makes them durable);
    /// returns the LSN of the last one's record, if any.
    fn append_entries(
        &self,
        entries: impl IntoIterator<Item = C::Entry>,
    ) -> std::io::Result<Option<Lsn>> {
        let j = &self.shared.journal;
        let mut last = None;
        for e in entries {
            let id = e.log_id();
            let bytes = format::encode_entry(&id, &e).map_err(io_err)?;
            let lsn = j.append(&bytes).map_err(io_err)?;
            let size = bytes.len();
            self.shared
                .state
                .lock()
                .apply(lsn, Record::Entry(id), Some((e, size)))
                .map_err(io_err)?;
            last = Some(lsn);
        }
        Ok(last)
    }

    /// Reads the entries `first..end` (all indexed) from the cache and the
    /// journal.
    fn read_entries(&self, first: u64, end: u64) -> std::io::Result<Vec<C::Entry>> {
        let mut out = Vec::with_capacity(end.saturating_sub(first).min(4096) as usize);
        let mut next = first;
        while next < end {
            // Cached entries, and the run of uncached ones after them.
            let (missing, run_end) = {
                let st = self.shared.state.lock();
                while next < end {
                    match st.cache.get(next) {
                        Some(e) => out.push(e.clone()),
                        None => break,
                    }
                    next += 1;
                }
                let mut lsns = Vec::new();
                let mut i = next;
                while i < end && st.cache.get(i).is_none() {
                    match st.index.lsn(i) {
                        Some(l) => lsns.push(l),
                        None => break,
                    }
                    i += 1;
                }
                (lsns, i)
            };
            if missing.is_empty() {
                // Done, or the next entry is neither cached nor indexed
                // (purged or truncated since): what was read is returned.
                break;
            }
            self.read_run(&missing, &mut out)?;
            next = run_end;
        }
        Ok(out)
    }

    /// Reads the entries at `lsns` (ascending: entries of higher index were
    /// appended later) with one range read, skipping the records between
    /// them (votes, truncated entries).
    fn read_run(&self, lsns: &[Lsn], out: &mut Vec<C::Entry>) -> std::io::Result<()> {
        let j = &self.shared.journal;
        let (Some(&first), Some(&last)) = (lsns.first(), lsns.last()) else {
            return Ok(());
        };
        if last >= j.durable_lsn() {
            // Evicted from the cache before it was durable (a batch larger
            // than the cache): make it durable, then read it.
            j.force(last, ForceMode::Durable).map_err(io_err)?;
        }
        let mut want = lsns.iter().copied().peekable();
        for r in j.read_range(first, Lsn(last.0 + 1)).map_err(io_err)? {
            let (lsn, bytes) = r.map_err(io_err)?;
            if want.peek() != Some(&lsn) {
                continue;
            }
            want.next();
            let e: C::Entry = format::decode_entry(&bytes)
                .map_err(|error| io_err(Error::BadRecord { lsn, error }))?;
            out.push(e);
        }
        match want.next() {
            None => Ok(()),
            Some(lsn) => Err(io_err(journal_core::Error::NotAnEntry { lsn })),
        }
    }
}

/// `range` as `first..end` of log indexes.
fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let first = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (first, end)
}

impl<C> RaftLogReader<C> for JournalLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> std::io::Result<Vec<C::Entry>> {
        let (first, end) = bounds(&range);
        let (first, end) = {
            let st = self.shared.state.lock();
            match (st.index.first(), st.index.last()) {
                (Some(lo), Some(hi)) => (first.max(lo), end.min(hi + 1)),
                _ => return Ok(Vec::new()),
            }
        };
        if first >= end {
            return Ok(Vec::new());
        }
        self.read_entries(first, end)
    }

    async fn read_vote(&mut self) -> std::io::Result<Option<VoteOf<C>>> {
        Ok(self.shared.state.lock().vote.clone())
    }
}

impl<C> RaftLogStorage<C> for JournalLogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    type LogReader = Self;

    async fn get_log_state(&mut self) -> std::io::Result<LogState<C>> {
        let st = self.shared.state.lock();
        let last = st.index.last().and_then(|i| st.index.log_id(i));
        Ok(LogState {
            last_purged_log_id: st.purged.clone(),
            last_log_id: last.or_else(|| st.purged.clone()),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> std::io::Result<()> {
        self.durable(Record::Vote(vote.clone())).await?;
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> std::io::Result<()> {
        // Made durable by the next force; openraft re-derives it otherwise.
        let r = Record::Committed(committed);
        let bytes = r.encode_without_entry().map_err(io_err)?;
        let lsn = self.shared.journal.append(&bytes).map_err(io_err)?;
        self.shared
            .state
            .lock()
            .apply(lsn, r, None)
            .map_err(io_err)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> std::io::Result<Option<LogIdOf<C>>> {
        Ok(self.shared.state.lock().committed.clone())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> std::io::Result<()>
    where
        I: IntoIterator<Item = C::Entry> + Send,
        I::IntoIter: Send,
    {
        crash_point("openraft-log::append");
        let Some(lsn) = self.append_entries(entries)? else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let (mode, observer) = {
            let st = self.shared.state.lock();
            (st.flush, st.observer.clone())
        };
        let began = std::time::Instant::now();
        let observe = move || {
            if let Some(o) = &observer {
                o(began.elapsed());
            }
        };
        if mode == FlushMode::Inline {
            let r = flush_fault().and_then(|delay| {
                if let Some(d) = delay {
                    std::thread::sleep(d);
                }
                self.shared
                    .journal
                    .commit(lsn)
                    .map_err(std::io::Error::other)
            });
            observe();
            crash_point("openraft-log::flushed");
            callback.io_completed(r);
            return Ok(());
        }
        // The callback fires once the last entry is durable; openraft goes
        // on meanwhile, and concurrent flushes share group commits.
        let j = self.shared.journal.clone();
        let flush = async move {
            let r = async {
                if let Some(d) = flush_fault()? {
                    delay(d).await;
                }
                j.commit_async(lsn).await.map_err(std::io::Error::other)
            }
            .await;
            observe();
            crash_point("openraft-log::flushed");
            callback.io_completed(r);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(flush);
            }
            Err(_) => {
                std::thread::Builder::new()
                    .name("openraft-log-flush".into())
                    .spawn(move || journal_core::sync::future::block_on(flush))
                    .map_err(io_err)?;
            }
        }
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogIdOf<C>>) -> std::io::Result<()> {
        // Entries from `since` on are gone (all of them for `None`).
        let since = match last {
            Some(id) => id.index.checked_add(1).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "truncate after u64::MAX")
            })?,
            None => 0,
        };
        self.durable(Record::Truncate(since)).await?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> std::io::Result<()> {
        let gate = self.shared.state.lock().gate.clone();
        if let Some(gate) = gate {
            gate(log_id.index).await.map_err(io_err)?;
        }
        self.durable(Record::Purge(log_id)).await?;
        let state = {
            let st = self.shared.state.lock();
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
            let st = self.shared.state.lock();
            st.index
                .first()
                .and_then(|i| st.index.lsn(i))
                .map_or(state_lsn, |oldest| oldest.min(state_lsn))
        };
        let j = self.shared.journal.clone();
        if redo > j.redo_lsn() {
            j.checkpoint(redo).map_err(io_err)?;
        }
        Ok(())
    }
}

/// Failpoint `name` (feature `failpoints`): its `return` action aborts the
/// process, as a crash would (a panic in a tokio task is caught, so it
/// would be none). Without the feature, nothing.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
fn crash_point(name: &str) {
    fail::fail_point!(name, |_| std::process::abort());
}

/// Failpoint `openraft-log::flush` (feature `failpoints`), before a flush:
/// `return(eio)` and `return(enospc)` fail it with that error,
/// `return(<ms>)` delays it by that many milliseconds (the runtime's other
/// tasks go on), `sleep(ms)` holds the flushing thread that long, and a
/// bare `return` aborts the process. `Err`: fail the flush with it, the
/// journal untouched; `Ok(Some(d))`: flush after `d`, as a slow disk
/// would.
fn flush_fault() -> std::io::Result<Option<std::time::Duration>> {
    fail::fail_point!("openraft-log::flush", |arg| match arg.as_deref() {
        Some("eio") => Err(std::io::Error::from_raw_os_error(5)),
        Some("enospc") => Err(std::io::Error::from_raw_os_error(28)),
        Some(ms) => match ms.parse::<u64>() {
            Ok(ms) => Ok(Some(std::time::Duration::from_millis(ms))),
            Err(_) => std::process::abort(),
        },
        None => std::process::abort(),
    });
    Ok(None)
}

/// Waits `d`: on a tokio timer inside a runtime, else by sleeping this
/// thread (the flush thread spawned outside any runtime).
async fn delay(d: std::time::Duration) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::time::sleep(d).await;
    } else {
        std::thread::sleep(d);
    }
}
