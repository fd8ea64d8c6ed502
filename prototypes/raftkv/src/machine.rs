//! The state machine: a [`kvstore::Store`] that applies the committed log.
//!
//! # What is durable, and when
//!
//! Applying does not wait for a sync: the Raft log is the durable record,
//! and a command is acknowledged once a majority holds it durably in their
//! logs. Entries are applied in steps (`step.rs`), each one store
//! transaction that also writes the last applied log id and membership
//! (`m/applied`) — and, when a step stops inside an entry, where in it —
//! so the store's durable state is always the log applied up to one
//! point: after a restart openraft replays exactly the entries after it,
//! and an entry stopped part way goes on from there.
//!
//! # Apply is a pure function of the log
//!
//! `apply.rs`, `step.rs` and the tables they keep (`leases.rs`,
//! `sessions.rs`, `events.rs`) read no clock, draw no random number and
//! iterate no hash container; what they write does not depend on how
//! entries are grouped into apply calls or steps. So every replica's store
//! and watch history are the same, byte for byte, for the same log (and
//! the same `--watch-history`); `tests/determinism.rs` applies one log in
//! three processes and compares them.
//!
//! # Snapshots
//!
//! A snapshot is the store's whole content (clients' keys, request-id
//! table, applied id, and a partial mark if it was taken between two steps
//! of an entry) as of its applied log id. Building one first makes
//! the store durable up to that id, so the log openraft purges after it —
//! never past the snapshot — is always below the store's *durable* applied
//! index; then it streams the store from one consistent iterator (taken
//! under the state lock, so it matches the applied id; read after the lock
//! is released, so applies and reads go on) into a snapshot file
//! (`snapshot.rs`), which is synced and renamed into place. The file is
//! sent as it is, received into a file, and survives a restart.
//! Installing one is an atomic replace: a new store is filled from the
//! received file, chunk by chunk, by a sorted bulk load
//! (`kvstore::Store::bulk_load`: the file holds the keys in order) in a
//! new directory (`sm-<generation>`), made durable, and then the
//! `CURRENT` file is replaced (written, synced, renamed, directory
//! synced) to name it; the old store is removed after.
//! Memory, at any store size: a chunk or two.

use crate::types::{layout, TypeConfig};
use futures_util::StreamExt;
use journal_core::sync::Mutex;
use journal_core::vfs::{OpenOptions, Vfs};
use kvstore::Store;
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod apply;
mod events;
mod files;
use files::{read_current, remove_tree, write_current};
pub(crate) use files::{read_small_file, replace_small_file};
mod leases;
mod record;
mod sessions;
mod snapshot;
mod step;
pub use events::{Change, Event, EventPage, Position, SUGGESTED_RETENTION};
pub use leases::{lease_id, LeaseChange, LeaseInfo, MAX_LEASE_KEYS};
pub use record::KeyMeta;
use sessions::Sessions;
pub use snapshot::{SnapshotFile, SNAPSHOT_DIR};
pub use step::STEP_KEYS;

/// The file naming the current store directory.
pub const CURRENT: &str = "CURRENT";

type Membership = StoredMembershipOf<TypeConfig>;
type Meta = SnapshotMetaOf<TypeConfig>;

/// A snapshot's meta: the last log id it holds and the membership then.
pub type SnapshotMeta = Meta;

/// What `m/applied` holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AppliedState {
    /// The last entry applied whole.
    log_id: Option<LogIdOf<TypeConfig>>,
    membership: Membership,
    /// How far into the entry after `log_id` the store holds, if a step
    /// stopped inside it (`step.rs`).
    partial: Option<Partial>,
}

/// An entry applied in part: a step that stops inside an entry commits
/// this, so the next step — or a replay after a crash — goes on from
/// exactly where it stopped: never a command twice (a comparison
/// evaluated again against its own effects could decide otherwise),
/// never an event twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Partial {
    /// The entry's log index.
    index: u64,
    /// The command in progress: the commands before it are applied.
    sub: u32,
    /// Where in it, if it began (a range delete or a revoke).
    resume: Option<Resume>,
}

/// Where a range delete or a revoke goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Resume {
    /// The stored key it goes on from (a client key, or an attachment).
    key: Vec<u8>,
    /// Its next event number.
    n: u32,
}

/// Why the state machine failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The store failed.
    Store(kvstore::Error),
    /// The directory's `CURRENT` file, the store's `m/applied` record or a
    /// snapshot is damaged or not raftkv's.
    Corrupt(String),
    /// The store was written by a raftkv whose store format this one does
    /// not read (its format; 1 for a store from before revisions). The
    /// node must be replaced: removed, started empty, added back.
    OldFormat(u32),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Store(e) => write!(f, "state machine store: {e}"),
            Error::Corrupt(what) => write!(f, "state machine: {what}"),
            Error::OldFormat(v) => write!(
                f,
                "state machine: store format {v}; this raftkv reads format {} (replace the member: remove it, start it empty, add it back)",
                layout::FORMAT
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Store(e) => Some(e),
            Error::Corrupt(_) | Error::OldFormat(_) => None,
        }
    }
}

impl From<kvstore::Error> for Error {
    fn from(e: kvstore::Error) -> Self {
        Error::Store(e)
    }
}

impl From<journal_core::VfsError> for Error {
    fn from(e: journal_core::VfsError) -> Self {
        Error::Store(kvstore::Error::from(e))
    }
}

struct State {
    store: Arc<Store>,
    generation: u64,
    applied: AppliedState,
    /// The client sessions (mirrors the `c` keys) and the log's clock.
    sessions: Sessions,
    /// The watch history's count and horizon (mirrors `m/history`).
    history: events::History,
    /// The leases and their keys (mirrors the `l` and `a` keys).
    leases: leases::Leases,
    /// Events the history keeps, about (0: none).
    retention: u64,
    /// The current snapshot and its file.
    snapshot: Option<(Meta, PathBuf)>,
    snapshots_built: u64,
    /// Snapshot files begun receiving (their names).
    received: u64,
    /// Value bytes applied since the last snapshot was built.
    bytes_since_snapshot: u64,
    /// The byte policy's floor (`None`: no snapshot by bytes).
    snapshot_min_bytes: Option<u64>,
    /// A snapshot was asked for and not yet built.
    snapshot_asked: bool,
    /// Where snapshot durations and sizes are counted.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Apply steps taken, and the most work one did.
    steps: ApplyStats,
}

/// How the state machine's apply steps went ([`StateMachine::apply_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Steps taken (each one store transaction, under the state lock).
    pub steps: u64,
    /// The most work one step did: client keys written or deleted, and
    /// history events compacted.
    pub max_step_work: usize,
}

struct Inner {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    options: kvstore::Options,
    state: Mutex<State>,
    /// How far the store is durable: what the Raft log's purge waits for.
    durable: tokio::sync::watch::Sender<Durable>,
    /// Told when a snapshot is due by the byte policy.
    snapshot_due: tokio::sync::Notify,
    /// The last applied index, for watchers waiting for events.
    applied_index: tokio::sync::watch::Sender<u64>,
    /// Told when the lease table changed while a lessor listens.
    lease_changed: tokio::sync::Notify,
}

/// The last log index the store holds durably, or why it never will.
#[derive(Debug, Clone, Default)]
struct Durable {
    applied: Option<u64>,
    failed: Option<String>,
}

/// A page of a range read ([`StateMachine::range`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangePage {
    /// Client keys, their values and revisions, in key order.
    pub pairs: Vec<(Vec<u8>, Vec<u8>, KeyMeta)>,
    /// The first key not in the page, if the range goes on.
    pub next: Option<Vec<u8>>,
    /// The applied index the page reflects.
    pub index: u64,
}

/// The state machine (cheap to clone; clones share it, and its snapshot
/// builder is a clone).
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachine")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

fn store_dir(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("sm-{generation}"))
}

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}

/// Loads what a store holds besides clients' keys, once its format is
/// this build's. A store without a format record is new (no `m/applied`
/// either) and gets one, or is format 1.
/// What a store holds besides clients' keys, in memory.
struct Loaded {
    applied: AppliedState,
    sessions: Sessions,
    history: events::History,
    leases: leases::Leases,
}

fn load(store: &Store) -> Result<Loaded, Error> {
    let applied = store.get(layout::APPLIED)?;
    match store.get(layout::FORMAT_KEY)? {
        Some(v) if v == layout::FORMAT.to_le_bytes() => {}
        Some(v) => {
            let v = v.try_into().map(u32::from_le_bytes);
            return Err(v.map_or_else(|_| corrupt("m/format is malformed"), Error::OldFormat));
        }
        None if applied.is_some() => return Err(Error::OldFormat(1)),
        None => {
            let mut txn = store.transaction();
            txn.put(layout::FORMAT_KEY, &layout::FORMAT.to_le_bytes());
            txn.commit_no_wait()?;
        }
    }
    let applied = match applied {
        Some(b) => postcard::from_bytes(&b).map_err(|e| corrupt(format!("m/applied: {e}")))?,
        None => AppliedState::default(),
    };
    let clock = match store.get(layout::CLOCK)? {
        Some(b) => b
            .as_slice()
            .try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| corrupt("m/clock is malformed"))?,
        None => 0,
    };
    let pairs = store.scan(vec![layout::CLIENT]..vec![layout::CLIENT + 1])?;
    let sessions =
        Sessions::load(pairs, clock).ok_or_else(|| corrupt("a session record is malformed"))?;
    let prefix = |p: u8| store.range(vec![p]..vec![p + 1]);
    let leases = leases::Leases::load(prefix(leases::LEASE)?, prefix(leases::ATTACHED)?)?
        .ok_or_else(|| corrupt("a lease record is malformed"))?;
    Ok(Loaded {
        applied,
        sessions,
        history: events::History::load(store)?,
        leases,
    })
}

impl StateMachine {
    /// Opens the state machine in `dir` (creating it if there is none),
    /// removing what an interrupted snapshot install left behind.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        dir: impl AsRef<Path>,
        options: kvstore::Options,
    ) -> Result<StateMachine, Error> {
        let dir = dir.as_ref().to_path_buf();
        vfs.create_dir_all(&dir)?;
        let generation = match read_current(&*vfs, &dir)? {
            Some(g) => g,
            None => {
                write_current(&*vfs, &dir, 0)?;
                0
            }
        };
        let current = format!("sm-{generation}");
        for name in vfs.read_dir(&dir)? {
            if name.starts_with("sm-") && name != current {
                remove_tree(&*vfs, &dir.join(&name))?;
            }
        }
        let store = Store::open_with(vfs.clone(), store_dir(&dir, generation), options)?;
        let Loaded {
            applied,
            sessions,
            history,
            leases,
        } = load(&store)?;
        let snapshot = snapshot::recover(&*vfs, &dir)?;
        let applied_index = tokio::sync::watch::Sender::new(applied.log_id.map_or(0, |l| l.index));
        let durable = tokio::sync::watch::Sender::new(Durable {
            applied: applied.log_id.map(|l| l.index),
            failed: None,
        });
        Ok(StateMachine {
            inner: Arc::new(Inner {
                vfs,
                dir,
                options,
                durable,
                snapshot_due: tokio::sync::Notify::new(),
                applied_index,
                lease_changed: tokio::sync::Notify::new(),
                state: Mutex::new(State {
                    store: Arc::new(store),
                    generation,
                    applied,
                    sessions,
                    history,
                    leases,
                    retention: 0,
                    snapshot,
                    snapshots_built: 0,
                    received: 0,
                    bytes_since_snapshot: 0,
                    snapshot_min_bytes: None,
                    snapshot_asked: false,
                    metrics: None,
                    steps: ApplyStats::default(),
                }),
            }),
        })
    }

    /// The value of a client's key, as applied here.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.entry(key)?.map(|(v, _)| v))
    }

    /// The value of a client's key and its revisions, as applied here.
    pub fn entry(&self, key: &[u8]) -> Result<Option<(Vec<u8>, KeyMeta)>, Error> {
        let store = self.inner.state.lock().store.clone();
        match store.get(&layout::user(key))? {
            None => Ok(None),
            Some(mut v) => {
                let (meta, _) = record::decode(&v)
                    .ok_or_else(|| corrupt("a client value without its revision header"))?;
                v.drain(..record::HEADER);
                Ok(Some((v, meta)))
            }
        }
    }

    /// A page of client keys from `start` on, before `end` (`None`: to
    /// the last key), read from one snapshot of the store: at most
    /// `limit` pairs and, past the first, about `max_bytes`. Returns the
    /// pairs, the key to continue from if more remain, and the applied
    /// index the page reflects (every entry up to it, none after — but
    /// for part of the next one, while it is applied in steps).
    pub fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<RangePage, Error> {
        let from = layout::user(start);
        let to = end.map_or_else(|| vec![layout::USER + 1], layout::user);
        let (pairs, index) = {
            // Under the lock applies hold: the iterator's snapshot and
            // the applied index agree.
            let st = self.inner.state.lock();
            let index = st.applied.log_id.map_or(0, |l| l.index);
            (st.store.range(from..to)?, index)
        };
        let mut page = RangePage {
            pairs: Vec::new(),
            next: None,
            index,
        };
        let mut bytes = 0;
        for pair in pairs {
            let (k, v) = pair?;
            let key = k.get(1..).unwrap_or_default().to_vec();
            if page.pairs.len() == limit || (bytes >= max_bytes && !page.pairs.is_empty()) {
                page.next = Some(key);
                break;
            }
            let (meta, value) =
                record::decode(&v).ok_or_else(|| corrupt("a client value without its header"))?;
            bytes += key.len() + value.len();
            page.pairs.push((key, value.to_vec(), meta));
        }
        Ok(page)
    }

    /// The byte policy's snapshot was not built (no room for it): the
    /// next entry applied asks again, if the policy still says so.
    pub fn snapshot_declined(&self) {
        self.inner.state.lock().snapshot_asked = false;
    }

    /// The size of the store's data file: about what a snapshot of it
    /// takes on disk.
    pub fn store_bytes(&self) -> u64 {
        let st = self.inner.state.lock();
        u64::from(st.store.cache_stats().file_pages) * kvstore::PAGE_SIZE as u64
    }

    /// Client sessions held (the table the log's clock bounds).
    pub fn sessions(&self) -> usize {
        self.inner.state.lock().sessions.len()
    }

    /// Leases held.
    pub fn leases(&self) -> usize {
        self.inner.state.lock().leases.len()
    }

    /// The last applied log id.
    pub fn applied(&self) -> Option<LogIdOf<TypeConfig>> {
        self.inner.state.lock().applied.log_id
    }

    /// Stops the store's checkpointer, checkpoints it and closes it.
    pub fn close(&self) -> Result<(), Error> {
        let store = self.inner.state.lock().store.clone();
        Ok(store.close()?)
    }

    /// Notes that the store holds everything up to `applied` durably.
    fn mark_durable(&self, applied: Option<LogIdOf<TypeConfig>>) {
        let index = applied.map(|l| l.index);
        self.inner.durable.send_if_modified(|d| {
            let newer = index > d.applied;
            if newer {
                d.applied = index;
            }
            newer
        });
    }

    /// Notes that the store failed (an apply or an install): a purge
    /// waiting for it fails too, rather than holding openraft's core while
    /// the install it waits for never comes.
    fn mark_failed(&self, e: &str) {
        self.inner
            .durable
            .send_modify(|d| d.failed = Some(e.to_string()));
    }

    /// Makes everything applied durable.
    fn sync(&self) -> Result<(), Error> {
        let st = self.inner.state.lock();
        st.store.sync()?;
        self.mark_durable(st.applied.log_id);
        Ok(())
    }

    /// What the Raft log's purge waits for ([`openraft_log::PurgeGate`]):
    /// until the store holds every entry up to the purge durably — synced
    /// now if applied but not yet synced, else once a snapshot install
    /// under way has made it so — or fails with the store's error. A
    /// follower's openraft purges its log up to a snapshot without waiting
    /// for the install; without this a crash between the two leaves a node
    /// that cannot start.
    pub fn purge_gate(&self) -> openraft_log::PurgeGate {
        let sm = self.clone();
        Arc::new(move |upto| {
            let sm = sm.clone();
            Box::pin(async move { sm.durable_through(upto).await })
        })
    }

    async fn durable_through(&self, upto: u64) -> std::io::Result<()> {
        let mut rx = self.inner.durable.subscribe();
        let held = rx.borrow().applied >= Some(upto);
        if !held && self.applied().map(|l| l.index) >= Some(upto) {
            let sm = self.clone();
            tokio::task::spawn_blocking(move || sm.sync())
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?;
        }
        let d = rx
            .wait_for(|d| d.applied >= Some(upto) || d.failed.is_some())
            .await
            .map_err(std::io::Error::other)?;
        match &d.failed {
            Some(e) if d.applied < Some(upto) => Err(std::io::Error::other(format!(
                "the state machine failed before it held index {upto}: {e}"
            ))),
            _ => Ok(()),
        }
    }
}

fn sm_err(e: Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// Runs blocking state-machine work off the runtime's async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> std::io::Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(sm_err),
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// A snapshot as openraft takes it: its meta and its file.
pub type Snapshot = SnapshotOf<TypeConfig, SnapshotFile>;

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        let sm = self.clone();
        blocking(move || sm.build()).await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> std::io::Result<(Option<LogIdOf<TypeConfig>>, Membership)> {
        let st = self.inner.state.lock();
        Ok((st.applied.log_id, st.applied.membership.clone()))
    }

    async fn apply<S>(&mut self, entries: S) -> std::io::Result<()>
    where
        S: futures_util::Stream<Item = std::io::Result<EntryResponder<TypeConfig>>> + Unpin + Send,
    {
        // The batch openraft hands over, whole: it is applied at once.
        let mut responders = Vec::new();
        let mut batch = Vec::new();
        let mut entries = entries;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            batch.push(entry);
            responders.push(responder);
        }
        // Inline, not on the blocking pool: applying appends to the
        // store's log without waiting for it (no I/O wait), and the
        // hand-off to a blocking thread and back cost two thread switches
        // per batch on every node. In bounded steps, the runtime thread
        // given back between two (`step.rs`).
        fail::fail_point!("raftkv::apply", |_| std::process::abort());
        // `return(MS)` holds each batch's apply MS ms (without blocking the
        // runtime): the state machine falls behind the commit index.
        #[cfg(feature = "failpoints")]
        if let Some(Some(ms)) = fail::eval("raftkv::apply-delay", |ms| {
            ms.and_then(|ms| ms.parse::<u64>().ok())
        }) {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let applied = self.apply_entries(batch).await;
        if let Err(e) = &applied {
            self.mark_failed(&e.to_string());
        }
        let applied = applied.map_err(sm_err)?;
        fail::fail_point!("raftkv::applied", |_| std::process::abort());
        for (answer, responder) in applied.into_iter().zip(responders) {
            if let Some(r) = responder {
                r.send(answer);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: SnapshotFile,
    ) -> std::io::Result<()> {
        let sm = self.clone();
        let meta = meta.clone();
        let r = blocking(move || sm.install(&meta, snapshot)).await;
        if let Err(e) = &r {
            self.mark_failed(&e.to_string());
        }
        r
    }

    async fn get_current_snapshot(&mut self) -> std::io::Result<Option<Snapshot>> {
        let current = self.inner.state.lock().snapshot.clone();
        let Some((meta, path)) = current else {
            return Ok(None);
        };
        let file = SnapshotFile::open(&*self.inner.vfs, &path).map_err(sm_err)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: file,
        }))
    }
}
