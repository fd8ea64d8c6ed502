//! One raftkv node: its directory, identity, Raft log, state machine and
//! Raft handle.
//!
//! A node's directory holds
//! - `raftkv.id`: the cluster id and the node id, written (synced, renamed,
//!   directory synced) at the node's first start; a later start with
//!   another cluster's id or another node id is refused;
//! - `log/`: the Raft log, a journal ([`openraft_log::JournalLogStore`]);
//! - `state/`: the state machine ([`crate::StateMachine`]).
//!
//! The calls etcd's services make of a node (ranges, writes,
//! compactions, watches, leases, hashes, status) are in [`kv`].

use crate::machine::{self, StateMachine};
use crate::network::Network;
use crate::space::Space;
use crate::types::{NodeId, Raft};
use journal_core::vfs::{OsVfs, Vfs};
use openraft::async_runtime::WatchReceiver;
use openraft::BasicNode;
use openraft_log::JournalLogStore;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub mod kv;
pub use kv::{CompactLogError, Header, LeaseTimeToLive};

/// The identity file's name.
pub const ID_FILE: &str = "raftkv.id";

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// This node's id (not 0).
    pub id: NodeId,
    /// Its directory.
    pub dir: PathBuf,
    /// The address others reach it at (`host:port`), stored in the
    /// membership.
    pub addr: String,
    /// The seed members of a new cluster, id to address (with this node).
    /// Empty for a node that joins an existing cluster.
    pub peers: BTreeMap<NodeId, String>,
    /// Where to dial some peers instead of their membership addresses (id
    /// to `host:port`): a proxy in front of them, for fault tests.
    pub dial: BTreeMap<NodeId, String>,
    /// Initialize a new cluster with `peers` if this is the node's first
    /// start (never on a restart).
    pub init: bool,
    /// The cluster id; derived from `peers` when `None`.
    pub cluster: Option<u64>,
    /// Heartbeat interval (default 100 ms).
    pub heartbeat: Duration,
    /// Election timeout, low end (default 500 ms; the high end is twice it).
    pub election_timeout: Duration,
    /// Build a snapshot after this many entries since the last one
    /// (openraft's policy; for tests). `None` (the default): by bytes —
    /// once the value bytes applied since the last snapshot reach the
    /// store's size and at least `snapshot_min_bytes`. Either way the log
    /// keeps 1,000 entries behind a snapshot.
    pub snapshot_logs: Option<u64>,
    /// The byte policy's floor (default 64 MiB).
    pub snapshot_min_bytes: u64,
    /// A client session idle this long, by the log's clock, expires
    /// (default 10 minutes). The leader puts it in the log with the log's
    /// clock (which runs by the leaders' monotonic clocks, never faster
    /// than real time), so replicas agree on it; a client that comes back
    /// later starts a new session. Keep it well above the clients' retry
    /// deadline (`raftkv_tools::client::Client`'s is 10 s): a request
    /// retried past it cannot learn whether its first copy was applied —
    /// the client then reports it in doubt and does not resend it under a
    /// new session (see the crate docs, "Sessions and writes in doubt").
    pub session_ttl: Duration,
    /// The leader writes the remaining time-to-live of every lease longer
    /// than this into the log at this interval (default 5 minutes, as
    /// etcd's), so a new leader gives a lease what was left of it rather
    /// than its whole time-to-live ([`crate::lessor`]).
    pub lease_checkpoint_interval: Duration,
    /// How old versions are compacted ([`crate::autocompact`]; etcd's
    /// `--auto-compaction-mode` and `--auto-compaction-retention`).
    /// Default: the last 10,000 revisions kept, compacted every five
    /// minutes; `None`: never (versions are kept until a client compacts).
    pub auto_compaction: Option<crate::autocompact::AutoCompaction>,
    /// Writes waiting for a Raft entry before more are answered `503`
    /// (default [`crate::propose::MAX_PENDING`]).
    pub max_pending_writes: usize,
    /// Client requests (`/kv`, `/members`) served at once before more are
    /// answered `503` (default [`crate::api::MAX_CLIENT_REQUESTS`]); the
    /// Raft RPCs are not counted.
    pub max_client_requests: usize,
    /// The secret the cluster's members share ([`crate::auth`]): sent on
    /// this node's Raft RPCs, and required on those it is sent. `None`
    /// (the default of a node built in a test): no peer is checked.
    /// `raftkv serve` needs one.
    pub peer_secret: Option<crate::auth::PeerSecret>,
    /// Deadlines on the clients' connections (header read, idle).
    pub timeouts: crate::server::Timeouts,
    /// How long a membership change or a `POST /compact` may take before
    /// it is answered `503` (default [`crate::api::ADMIN_TIMEOUT`]); the
    /// change may still take effect.
    pub admin_timeout: Duration,
    /// Free bytes kept on the directory's filesystem: below them, writes
    /// that add data are refused with `507` ([`crate::space`]; default
    /// [`crate::space::DEFAULT_RESERVE`]).
    pub space_reserve: u64,
    /// The filesystem (the real one, or a `SimVfs` in tests).
    pub vfs: Arc<dyn Vfs>,
}

impl NodeOptions {
    /// Options for node `id` in `dir` at `addr`, with the defaults.
    pub fn new(id: NodeId, dir: impl Into<PathBuf>, addr: impl Into<String>) -> NodeOptions {
        NodeOptions {
            id,
            dir: dir.into(),
            addr: addr.into(),
            peers: BTreeMap::new(),
            dial: BTreeMap::new(),
            init: false,
            cluster: None,
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(500),
            snapshot_logs: None,
            snapshot_min_bytes: 64 << 20,
            session_ttl: Duration::from_secs(600),
            lease_checkpoint_interval: Duration::from_secs(300),
            auto_compaction: Some(crate::autocompact::AutoCompaction::Revision {
                retention: 10_000,
                interval: crate::autocompact::REVISION_INTERVAL,
            }),
            max_pending_writes: crate::propose::MAX_PENDING,
            max_client_requests: crate::api::MAX_CLIENT_REQUESTS,
            peer_secret: None,
            timeouts: crate::server::Timeouts::default(),
            admin_timeout: crate::api::ADMIN_TIMEOUT,
            space_reserve: crate::space::DEFAULT_RESERVE,
            vfs: Arc::new(OsVfs::new()),
        }
    }
}

/// Why a node could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The options are inconsistent.
    Options(String),
    /// The directory belongs to another cluster or another node.
    WrongDirectory {
        /// The directory.
        dir: PathBuf,
        /// What its identity file says, and what was asked.
        reason: String,
    },
    /// The filesystem failed.
    Io(journal_core::VfsError),
    /// The Raft log failed to open.
    Log(openraft_log::Error),
    /// The state machine failed to open.
    Machine(machine::Error),
    /// openraft refused to start or to initialize.
    Raft(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Options(s) => write!(f, "{s}"),
            Error::WrongDirectory { dir, reason } => write!(f, "{}: {reason}", dir.display()),
            Error::Io(e) => write!(f, "{e}"),
            Error::Log(e) => write!(f, "raft log: {e}"),
            Error::Machine(e) => write!(f, "{e}"),
            Error::Raft(s) => write!(f, "raft: {s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<journal_core::VfsError> for Error {
    fn from(e: journal_core::VfsError) -> Self {
        Error::Io(e)
    }
}

/// The cluster id derived from a seed membership: FNV-1a of `id=addr,`
/// for each member in id order.
pub fn cluster_id(peers: &BTreeMap<NodeId, String>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (id, addr) in peers {
        for b in format!("{id}={addr},").bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Reads the identity file: `(cluster, node)`, `None` if there is none.
fn read_identity(vfs: &dyn Vfs, dir: &Path) -> Result<Option<(u64, NodeId)>, Error> {
    let bad = || Error::WrongDirectory {
        dir: dir.to_path_buf(),
        reason: format!("{ID_FILE} is not a raftkv identity"),
    };
    let buf = match crate::machine::read_small_file(vfs, &dir.join(ID_FILE), 256)? {
        None => return Ok(None),
        Some(None) => return Err(bad()),
        Some(Some(buf)) => buf,
    };
    let text = std::str::from_utf8(&buf).map_err(|_| bad())?;
    let mut lines = text.lines();
    if lines.next() != Some("raftkv 1") {
        return Err(bad());
    }
    let field = |line: Option<&str>, name: &str| {
        line.and_then(|l| l.strip_prefix(name))
            .and_then(|l| l.strip_prefix('='))
            .map(str::to_owned)
    };
    let cluster = field(lines.next(), "cluster")
        .and_then(|c| u64::from_str_radix(&c, 16).ok())
        .ok_or_else(bad)?;
    let node = field(lines.next(), "node")
        .and_then(|n| n.parse().ok())
        .ok_or_else(bad)?;
    Ok(Some((cluster, node)))
}

fn write_identity(vfs: &dyn Vfs, dir: &Path, cluster: u64, node: NodeId) -> Result<(), Error> {
    let text = format!("raftkv 1\ncluster={cluster:016x}\nnode={node}\n");
    Ok(crate::machine::replace_small_file(
        vfs,
        dir,
        ID_FILE,
        text.as_bytes(),
    )?)
}

/// Checks the directory's identity file against this node and cluster, or
/// writes it at the first start (refusing a directory with data but no
/// identity); returns whether this is the first start.
fn claim_directory(vfs: &dyn Vfs, o: &NodeOptions, cluster: u64) -> Result<bool, Error> {
    vfs.create_dir_all(&o.dir)?;
    match read_identity(vfs, &o.dir)? {
        Some((c, n)) if c != cluster || n != o.id => Err(Error::WrongDirectory {
            dir: o.dir.clone(),
            reason: format!(
                "it belongs to node {n} of cluster {c:016x}, not node {} of cluster {cluster:016x}",
                o.id
            ),
        }),
        Some(_) => Ok(false),
        None => {
            if vfs.exists(&o.dir.join("log"))? || vfs.exists(&o.dir.join("state"))? {
                return Err(Error::WrongDirectory {
                    dir: o.dir.clone(),
                    reason: format!("it holds data but no {ID_FILE}"),
                });
            }
            write_identity(vfs, &o.dir, cluster, o.id)?;
            Ok(true)
        }
    }
}

/// Before a node claims an empty directory: asks its peers whether their
/// leader holds a log for this node (`Status::matched`). If so, the node
/// was a member whose directory was wiped: its log and its vote are gone,
/// and it could vote twice in a term it voted in before. It is refused;
/// the way back is a replacement (remove it, then add it as a new member),
/// as etcd refuses a member whose data directory was lost. Peers that do
/// not answer within a second are passed over: a first start of a new
/// cluster, whose peers are not up yet, goes ahead.
async fn refuse_forgotten_member(o: &NodeOptions, cluster: u64) -> Result<(), Error> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .map_err(|e| Error::Options(e.to_string()))?;
    let ours = format!("{cluster:016x}");
    for (id, addr) in o.peers.iter().filter(|(id, _)| **id != o.id) {
        let addr = o.dial.get(id).unwrap_or(addr);
        let Ok(r) = http.get(format!("http://{addr}/status")).send().await else {
            continue;
        };
        let Ok(s) = r.json::<crate::api::Status>().await else {
            continue;
        };
        if s.cluster != ours {
            continue;
        }
        if let Some(index) = s.matched.get(&o.id) {
            return Err(Error::WrongDirectory {
                dir: o.dir.clone(),
                reason: format!(
                    "it is empty, but the leader (node {}) holds node {}'s log up to index {index}: \
                     this node's log and vote are gone. Remove node {} from the cluster \
                     (POST /members {{\"op\":\"remove\",\"id\":{}}}), then add it back as a new member",
                    s.id, o.id, o.id, o.id
                ),
            });
        }
    }
    Ok(())
}

/// The tasks that run beside a node until it stops: the metrics watcher,
/// and, with the byte policy, the one that has openraft build the
/// snapshots the state machine asks for — when there is room for one: a
/// snapshot takes about the store's size, and one that would eat the
/// disk-space reserve is declined (counted; the next entry applied asks
/// again), so the node keeps its log rather than fill its disk.
fn background_tasks(
    o: &NodeOptions,
    (raft, machine): (&Raft, &StateMachine),
    space: &Arc<Space>,
    metrics: &Arc<crate::metrics::Metrics>,
) -> Vec<Arc<tokio::task::AbortHandle>> {
    let snapshotter = o.snapshot_logs.is_none().then(|| {
        machine.snapshot_by_bytes(o.snapshot_min_bytes);
        let (raft, machine) = (raft.clone(), machine.clone());
        let (space, metrics) = (space.clone(), metrics.clone());
        let task = tokio::spawn(async move {
            loop {
                machine.snapshot_due().await;
                if !space.room_for(machine.store_bytes()) {
                    machine.snapshot_declined();
                    metrics.snapshots_declined.inc();
                    continue;
                }
                if raft.trigger().snapshot().await.is_err() {
                    return; // Raft stopped.
                }
            }
        });
        Arc::new(task.abort_handle())
    });
    let watcher = {
        let (mut rx, m, id) = (raft.metrics(), metrics.clone(), o.id);
        let task = tokio::spawn(async move {
            loop {
                m.observe_raft(id, &rx.borrow_and_update());
                if rx.changed().await.is_err() {
                    return; // Raft stopped.
                }
            }
        });
        Arc::new(task.abort_handle())
    };
    [Some(watcher), snapshotter].into_iter().flatten().collect()
}

/// The tasks that act while the node leads: the lessor (lease expiries
/// and checkpoints) and the compactor ([`crate::autocompact`]).
fn leader_tasks(
    o: &NodeOptions,
    (raft, machine): (&Raft, &StateMachine),
    proposer: &crate::propose::Proposer,
    lessor: &Arc<crate::lessor::Lessor>,
) -> Vec<Arc<tokio::task::AbortHandle>> {
    let leasing = tokio::spawn(lessor.clone().run(raft.clone(), proposer.clone(), o.id));
    let compacting = tokio::spawn(crate::autocompact::run(
        raft.clone(),
        proposer.clone(),
        machine.clone(),
        o.id,
        o.auto_compaction,
    ));
    vec![
        Arc::new(leasing.abort_handle()),
        Arc::new(compacting.abort_handle()),
    ]
}

/// openraft's configuration for a node: the options' timeouts and
/// snapshot policy (openraft's by entries, or none: the byte policy
/// triggers snapshots), 1,000 entries kept behind a snapshot.
fn raft_config(o: &NodeOptions, cluster: u64) -> Result<openraft::Config, Error> {
    let hb = o.heartbeat.as_millis() as u64;
    let el = o.election_timeout.as_millis() as u64;
    openraft::Config {
        cluster_name: format!("{cluster:016x}"),
        heartbeat_interval: hb,
        election_timeout_min: el,
        election_timeout_max: el * 2,
        install_snapshot_timeout: 10_000,
        snapshot_policy: match o.snapshot_logs {
            Some(n) => openraft::SnapshotPolicy::LogsSinceLast(n),
            None => openraft::SnapshotPolicy::Never,
        },
        max_in_snapshot_log_to_keep: 1_000,
        // A learner added (`POST /members` `add`) is caught up once its
        // log is within this many entries of the leader's.
        replication_lag_threshold: 1_000,
        // A restarted leader stands for election in a new term; it does
        // not lead again in its old one. openraft 0.10 replicates while
        // the leader's own flush runs, so followers can commit (and the
        // leader acknowledge) entries the leader's disk then loses in a
        // power cut: restored in its old term, it would serve reads below
        // them and write other entries under their log ids
        // (`tests/disk_crash.rs`).
        enable_leader_restore: Some(false),
        ..Default::default()
    }
    .validate()
    .map_err(|e| Error::Options(e.to_string()))
}

/// A running node.
#[derive(Clone)]
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// The cluster id.
    pub cluster: u64,
    /// The Raft handle.
    pub raft: Raft,
    /// The state machine (for reads).
    pub machine: StateMachine,
    /// The Raft log.
    pub log: JournalLogStore<crate::TypeConfig>,
    /// Gathers clients' writes into entries.
    pub proposer: crate::propose::Proposer,
    /// The leases' deadlines while this node leads, and the log's clock.
    pub lessor: Arc<crate::lessor::Lessor>,
    /// Permits for client requests in progress.
    pub client_slots: Arc<tokio::sync::Semaphore>,
    /// What `GET /metrics` serves.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Permits for open watch streams.
    pub watch_slots: Arc<tokio::sync::Semaphore>,
    /// Set once the node stops serving: open watch streams end.
    pub stopping: tokio::sync::watch::Sender<bool>,
    /// The cluster's peer secret, required on Raft RPCs (if any).
    pub peer_secret: Option<crate::auth::PeerSecret>,
    /// Deadlines on the clients' connections.
    pub timeouts: crate::server::Timeouts,
    /// The deadline of membership changes and compactions.
    pub admin_timeout: Duration,
    /// The disk-space alarm.
    pub space: Arc<crate::space::Space>,
    /// Tasks that end with the node: the metrics watcher, and the one that
    /// has openraft build the snapshots the byte policy asks for.
    tasks: Vec<Arc<tokio::task::AbortHandle>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("cluster", &format_args!("{:016x}", self.cluster))
            .finish_non_exhaustive()
    }
}

/// The options' cluster id (given, or derived from `--peers`), once the
/// options that name this node are consistent.
fn checked_cluster(o: &NodeOptions) -> Result<u64, Error> {
    if o.id == 0 {
        return Err(Error::Options("node ids start at 1".into()));
    }
    if o.init && o.peers.get(&o.id) != Some(&o.addr) {
        return Err(Error::Options(format!(
            "--init needs this node ({}={}) among --peers",
            o.id, o.addr
        )));
    }
    match (o.cluster, o.peers.is_empty()) {
        (Some(c), _) => Ok(c),
        (None, false) => Ok(cluster_id(&o.peers)),
        (None, true) => Err(Error::Options(
            "a node without --peers needs --cluster-id".into(),
        )),
    }
}

impl Node {
    /// Opens the node's directory (creating it on the first start),
    /// recovers its log and state machine, starts Raft, and initializes a
    /// new cluster if asked and this is the first start.
    pub async fn start(o: NodeOptions) -> Result<Node, Error> {
        let cluster = checked_cluster(&o)?;
        let vfs = o.vfs.clone();
        if read_identity(&*vfs, &o.dir)?.is_none() {
            refuse_forgotten_member(&o, cluster).await?;
        }
        let first_start = claim_directory(&*vfs, &o, cluster)?;
        let journal = journal_core::Journal::open_with(
            vfs.clone(),
            o.dir.join("log"),
            journal_core::Options::default(),
        )
        .map_err(|e| Error::Log(openraft_log::Error::Journal(e)))?;
        // openraft 0.10 replicates while the leader's append is flushed:
        // the journal's forcer flushes, and the core is told when it is
        // done (openraft 0.9 awaited each flush, and flushing inline saved
        // the hand-off).
        let log = JournalLogStore::from_journal(Arc::new(journal))
            .map_err(Error::Log)?
            .with_flush_mode(openraft_log::FlushMode::Task);
        // Full-page images (the default, named because it matters): three
        // members share a disk whose flushes bound the Raft log, and the
        // double write's two syncs per batch added flushes per put (0.29
        // against 0.13 at 64 clients, 1 M keys; docs/PERFORMANCE.md).
        let store_options = kvstore::Options {
            torn_pages: kvstore::TornPages::FullPageImages,
            ..kvstore::Options::default()
        };
        let machine = StateMachine::open(vfs.clone(), o.dir.join("state"), store_options)
            .map_err(Error::Machine)?;
        let metrics =
            Arc::new(crate::metrics::Metrics::new().map_err(|e| Error::Options(e.to_string()))?);
        machine.set_metrics(metrics.clone());
        let flushes = metrics.clone();
        let log = log
            .with_purge_gate(machine.purge_gate())
            .with_flush_observer(Arc::new(move |d| {
                flushes.log_flush.observe(d.as_secs_f64())
            }));
        let config = raft_config(&o, cluster)?;
        let network = Network::new(cluster, o.peer_secret.as_ref(), o.dial.clone())
            .map_err(|e| Error::Raft(e.to_string()))?
            .with_metrics(metrics.clone());
        let raft = Raft::new(
            o.id,
            Arc::new(config),
            network,
            crate::logstore::BoundedLog::new(log.clone()),
            machine.clone(),
        )
        .await
        .map_err(|e| Error::Raft(e.to_string()))?;
        if o.init && first_start {
            let members: BTreeMap<NodeId, BasicNode> = o
                .peers
                .iter()
                .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
                .collect();
            raft.initialize(members)
                .await
                .map_err(|e| Error::Raft(e.to_string()))?;
        }
        let lessor = Arc::new(crate::lessor::Lessor::new(
            machine.clone(),
            o.lease_checkpoint_interval,
        ));
        let proposer = crate::propose::Proposer::start(
            raft.clone(),
            o.max_pending_writes,
            (lessor.clock(), machine.clone()),
            o.session_ttl,
            metrics.clone(),
        );
        let space = Arc::new(Space::new(vfs.clone(), o.dir.clone(), o.space_reserve));
        let mut tasks = background_tasks(&o, (&raft, &machine), &space, &metrics);
        tasks.extend(leader_tasks(&o, (&raft, &machine), &proposer, &lessor));
        Ok(Node {
            id: o.id,
            cluster,
            raft,
            machine,
            log,
            proposer,
            lessor,
            client_slots: Arc::new(tokio::sync::Semaphore::new(o.max_client_requests.max(1))),
            metrics,
            watch_slots: Arc::new(tokio::sync::Semaphore::new(crate::api::MAX_WATCHERS)),
            stopping: tokio::sync::watch::Sender::new(false),
            peer_secret: o.peer_secret,
            timeouts: o.timeouts,
            admin_timeout: o.admin_timeout,
            space,
            tasks,
        })
    }

    /// Stops Raft, then closes the state machine and the log.
    pub async fn shutdown(&self) -> Result<(), String> {
        for t in &self.tasks {
            t.abort();
        }
        self.raft.shutdown().await.map_err(|e| e.to_string())?;
        self.machine.close().map_err(|e| e.to_string())?;
        self.log.journal().close().map_err(|e| e.to_string())?;
        Ok(())
    }
}
