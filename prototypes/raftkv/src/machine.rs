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
//! `apply.rs`, `txn.rs`, `compact.rs`, `step.rs` and the tables they
//! keep (`leases.rs`, `sessions.rs`) read no clock, draw no random number
//! and iterate no hash container; what they write does not depend on how
//! entries are grouped into apply calls or steps. So every replica's store
//! — its versions, which are the watch history — is the same, byte for
//! byte, for the same log; `tests/determinism.rs` applies one log in
//! three processes and compares them.
//!
//! # The multi-version store
//!
//! `mvcc.rs` has the layout (an index of keys, versions by revision),
//! `view.rs` reads at a revision, `txn.rs` applies etcd's requests,
//! `compact.rs` removes what a compaction supersedes, `reads.rs` serves
//! readers and watchers.
//!
//! # Snapshots
//!
//! A snapshot is the store's whole content (the index and the versions,
//! the sessions, the leases, the applied id, and a partial mark if it was
//! taken between two steps of an entry) as of its applied log id. Building one first makes
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
//! new directory (`sm-<generation>`), made durable; the received file is
//! renamed into place as the current snapshot (directory synced); only
//! then is the `CURRENT` file replaced (written, synced, renamed,
//! directory synced) to name the new store, and only after that may the
//! log be purged up to it: at any crash point the current snapshot covers
//! the applied id, as openraft requires at start (it purges the log up to
//! the applied id when the log ends below it). A crash before `CURRENT`
//! names the new store leaves the old store with a newer current
//! snapshot, which openraft installs again at start. The old store is
//! removed after.
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
mod compact;
mod files;
use files::{read_current, remove_tree, write_current};
pub(crate) use files::{read_small_file, replace_small_file};
mod leases;
mod mvcc;
mod reads;
mod sessions;
mod snapshot;
mod step;
mod txn;
mod view;
mod writer;
pub use compact::COMPACT_PER_ENTRY;
pub use leases::{lease_id, LeaseChange, LeaseInfo, MAX_LEASE_KEYS};
pub use mvcc::Position;
pub use reads::{EventPage, RangePage, ReadError, Revisions};
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

/// Where a range delete (alone or in a transaction) or a revoke goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Resume {
    /// The path to the range delete: its request's index in each branch
    /// the transaction runs, outermost first (empty: the command is the
    /// range delete, or a revoke).
    path: Vec<u32>,
    /// The stored key it goes on from (an index key, or an attachment).
    key: Vec<u8>,
    /// Changes the command made so far: its next sub-revision (0: it has
    /// not taken its revision yet).
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
    /// The store's revisions (mirrors `m/mvcc`).
    mvcc: mvcc::MvccState,
    /// The revision readers read at: the last command applied whole
    /// (below the store's while a command's steps are under way).
    readable: i64,
    /// The leases and their keys (mirrors the `l` and `a` keys).
    leases: leases::Leases,
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
    /// The most work one step did: versions written, index entries and
    /// attachments walked, versions compacted.
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
    /// The last applied index.
    applied_index: tokio::sync::watch::Sender<u64>,
    /// The store's revisions, for watchers and compactions waiting.
    revisions: tokio::sync::watch::Sender<reads::Revisions>,
    /// Told when the lease table changed while a lessor listens.
    lease_changed: tokio::sync::Notify,
}

/// The last log index the store holds durably, or why it never will.
#[derive(Debug, Clone, Default)]
struct Durable {
    applied: Option<u64>,
    failed: Option<String>,
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

/// What a store holds besides the index and the versions, in memory.
struct Loaded {
    applied: AppliedState,
    sessions: Sessions,
    mvcc: mvcc::MvccState,
    readable: i64,
    leases: leases::Leases,
}

/// Loads what a store holds besides the index and the versions, once its
/// format is this build's. A store without a format record is new (no
/// `m/applied` either) and gets one, or is format 1.
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
    let mvcc = match store.get(mvcc::MVCC_STATE)? {
        None => mvcc::MvccState::default(),
        Some(v) => mvcc::MvccState::decode(&v).ok_or_else(|| corrupt("m/mvcc is malformed"))?,
    };
    // A command stopped after it took its revision: readers stay below.
    let taken = applied
        .partial
        .as_ref()
        .and_then(|p| p.resume.as_ref())
        .is_some_and(|r| r.n > 0);
    let readable = if taken { mvcc.rev - 1 } else { mvcc.rev };
    Ok(Loaded {
        applied,
        sessions,
        mvcc,
        readable,
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
            mvcc,
            readable,
            leases,
        } = load(&store)?;
        let snapshot = snapshot::recover(&*vfs, &dir)?;
        let applied_index = tokio::sync::watch::Sender::new(applied.log_id.map_or(0, |l| l.index));
        let revisions = tokio::sync::watch::Sender::new(reads::Revisions {
            current: readable,
            compact: mvcc.compact,
            physical: mvcc.physical,
        });
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
                revisions,
                lease_changed: tokio::sync::Notify::new(),
                state: Mutex::new(State {
                    store: Arc::new(store),
                    generation,
                    applied,
                    sessions,
                    mvcc,
                    readable,
                    leases,
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
