//! The Raft log as openraft sees it: the journal's log store
//! ([`JournalLogStore`]), with replication's reads bounded by bytes.
//!
//! openraft reads a lagging follower's next append with
//! `limited_get_log_entries(start, end)`, `end - start` up to
//! `max_payload_entries` (300). The journal's store reads them all; an
//! entry holds up to [`crate::propose::MAX_BATCH_BYTES`] (4 MiB) of
//! values, so one read could hold a gigabyte. Here that read stops once
//! the entries read reach [`crate::network::APPEND_BUDGET`] (at least one
//! entry): the leader holds about one append's worth per follower, at any
//! lag, and the network sends what it read in one append.

use crate::network::{entry_bytes, APPEND_BUDGET};
use crate::types::TypeConfig;
use openraft::alias::{LogIdOf, VoteOf};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft_log::JournalLogStore;
use std::fmt::Debug;
use std::ops::RangeBounds;

/// Entries read at once while a bounded read goes on: the overshoot past
/// the budget is at most this many entries.
const READ_STEP: u64 = 4;

/// The journal's log store, with replication's reads bounded by bytes
/// (cheap to clone: a handle).
#[derive(Clone)]
pub struct BoundedLog {
    inner: JournalLogStore<TypeConfig>,
    budget: usize,
}

impl BoundedLog {
    /// `inner`, its replication reads bounded by [`APPEND_BUDGET`].
    pub fn new(inner: JournalLogStore<TypeConfig>) -> BoundedLog {
        BoundedLog {
            inner,
            budget: APPEND_BUDGET,
        }
    }

    /// The same, bounded by `budget` bytes instead (tests).
    pub fn with_budget(self, budget: usize) -> BoundedLog {
        BoundedLog { budget, ..self }
    }
}

impl RaftLogReader<TypeConfig> for BoundedLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> std::io::Result<Vec<openraft::alias::EntryOf<TypeConfig>>> {
        self.inner.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> std::io::Result<Option<VoteOf<TypeConfig>>> {
        self.inner.read_vote().await
    }

    /// The entries from `start`, a few at a time, until they reach the
    /// byte budget or `end` (at least one, if the log holds `start`).
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> std::io::Result<Vec<openraft::alias::EntryOf<TypeConfig>>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut next = start;
        while next < end && (out.is_empty() || bytes < self.budget) {
            let to = next.saturating_add(READ_STEP).min(end);
            let got = self.inner.try_get_log_entries(next..to).await?;
            if got.is_empty() {
                break;
            }
            for e in got {
                if !out.is_empty() && bytes.saturating_add(entry_bytes(&e)) > self.budget {
                    return Ok(out);
                }
                bytes = bytes.saturating_add(entry_bytes(&e));
                next = e.log_id.index.saturating_add(1);
                out.push(e);
            }
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for BoundedLog {
    type LogReader = BoundedLog;

    async fn get_log_state(&mut self) -> std::io::Result<LogState<TypeConfig>> {
        self.inner.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> BoundedLog {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<TypeConfig>) -> std::io::Result<()> {
        self.inner.save_vote(vote).await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogIdOf<TypeConfig>>,
    ) -> std::io::Result<()> {
        self.inner.save_committed(committed).await
    }

    async fn read_committed(&mut self) -> std::io::Result<Option<LogIdOf<TypeConfig>>> {
        self.inner.read_committed().await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> std::io::Result<()>
    where
        I: IntoIterator<Item = openraft::alias::EntryOf<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        self.inner.append(entries, callback).await
    }

    async fn truncate_after(&mut self, last: Option<LogIdOf<TypeConfig>>) -> std::io::Result<()> {
        self.inner.truncate_after(last).await
    }

    async fn purge(&mut self, log_id: LogIdOf<TypeConfig>) -> std::io::Result<()> {
        self.inner.purge(log_id).await
    }
}
