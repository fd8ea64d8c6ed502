//! `raftkv serve`: its arguments and how they become a node's options.

use raftkv::{NodeId, NodeOptions};
use std::path::PathBuf;
use std::time::Duration;

/// `raftkv serve`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// This node's id (from 1).
    #[arg(long)]
    pub(crate) id: NodeId,
    /// Its directory (created at the first start).
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// The address to listen at, `host:port` (clients and peers).
    #[arg(long)]
    pub(crate) listen: String,
    /// A new cluster's seed members: `1=ADDR,2=ADDR,3=ADDR`.
    #[arg(long, default_value = "")]
    pub(crate) peers: String,
    /// Dial a peer at another address than its membership's:
    /// `ID=ADDR,...` (a proxy in front of it, for fault tests).
    #[arg(long, default_value = "")]
    pub(crate) peer_addr: String,
    /// Initialize a new cluster with --peers at this node's first start.
    #[arg(long)]
    pub(crate) init: bool,
    /// The cluster id (16 hex digits; default: derived from --peers).
    #[arg(long)]
    pub(crate) cluster_id: Option<String>,
    /// Build a snapshot after this many log entries (default: by bytes,
    /// once the bytes written since the last reach the store's size
    /// and at least --snapshot-min-mib).
    #[arg(long)]
    pub(crate) snapshot_logs: Option<u64>,
    /// The floor of the snapshot policy by bytes, MiB.
    #[arg(long, default_value_t = 64)]
    pub(crate) snapshot_min_mib: u64,
    /// A client session idle this long (seconds, by the leader's clock
    /// in the log) expires.
    #[arg(long, default_value_t = 600)]
    pub(crate) session_ttl_s: u64,
    /// How old versions are compacted, as etcd's flag: `revision` (keep
    /// the last --auto-compaction-retention revisions, compacting every
    /// --auto-compaction-interval-s) or `periodic` (keep the versions of
    /// the last --auto-compaction-retention, a duration: 1h, 30m, or a
    /// number of hours).
    #[arg(long, default_value = "revision")]
    pub(crate) auto_compaction_mode: String,
    /// What auto-compaction keeps (see --auto-compaction-mode); 0: no
    /// auto-compaction (versions are kept until a client compacts).
    #[arg(long, default_value = "10000")]
    pub(crate) auto_compaction_retention: String,
    /// How often the revision mode compacts, seconds (etcd's five
    /// minutes by default).
    #[arg(long, default_value_t = 300)]
    pub(crate) auto_compaction_interval_s: u64,
    /// Writes waiting for a Raft entry before more are answered 503.
    #[arg(long, default_value_t = raftkv::propose::MAX_PENDING)]
    pub(crate) max_pending_writes: usize,
    /// Client requests served at once before more are answered 503.
    #[arg(long, default_value_t = raftkv::api::MAX_CLIENT_REQUESTS)]
    pub(crate) max_client_requests: usize,
    /// Raft heartbeat interval, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub(crate) heartbeat_ms: u64,
    /// Election timeout, low end, milliseconds (the high end is twice
    /// it); more than the heartbeat interval.
    #[arg(long, default_value_t = 500)]
    pub(crate) election_timeout_ms: u64,
    /// The file holding the secret the cluster's members share (at
    /// least 16 printable characters; `raftkv-tools cluster` makes one as
    /// DIR/peer-secret): sent on this node's Raft RPCs, required on
    /// those it is sent (401/403 without it).
    #[arg(long)]
    pub(crate) peer_secret_file: PathBuf,
    /// How long a membership change or a compaction may take before
    /// it is answered 503 (it may still take effect), seconds.
    #[arg(long, default_value_t = raftkv::api::ADMIN_TIMEOUT.as_secs())]
    pub(crate) admin_timeout_s: u64,
    /// A client connection whose request headers are not complete this
    /// long after it opened or its last answer, or that is idle this
    /// long, is closed; seconds.
    #[arg(long, default_value_t = raftkv::server::HEADER_TIMEOUT.as_secs())]
    pub(crate) connection_timeout_s: u64,
    /// How often the leader writes the remaining time-to-live of long
    /// leases into the log, so that a new leader does not give them
    /// their whole time-to-live again, seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) lease_checkpoint_s: u64,
    /// Free space kept on the directory's filesystem, MiB: below it,
    /// writes that add data are answered 507 (`nospace`), reads and
    /// deletes go on; writes resume at twice it.
    #[arg(long, default_value_t = raftkv::space::DEFAULT_RESERVE >> 20)]
    pub(crate) space_reserve_mib: u64,
    /// Runtime threads: 1 runs the node's async work on one thread
    /// (fewer wake-ups across threads; `cluster` uses it, its nodes
    /// sharing one machine); 0, tokio's default, one per core.
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
}

pub(crate) async fn serve(args: ServeArgs) -> Result<(), String> {
    let ServeArgs {
        id,
        dir,
        listen,
        peers,
        peer_addr,
        init,
        cluster_id,
        snapshot_logs,
        snapshot_min_mib,
        session_ttl_s,
        auto_compaction_mode,
        auto_compaction_retention,
        auto_compaction_interval_s,
        heartbeat_ms,
        election_timeout_ms,
        max_pending_writes,
        max_client_requests,
        peer_secret_file,
        admin_timeout_s,
        connection_timeout_s,
        lease_checkpoint_s,
        space_reserve_mib,
        ..
    } = args;
    let mut o = NodeOptions::new(id, dir, listen.clone());
    o.peers = crate::parse_peers(&peers)?;
    o.dial = crate::parse_peers(&peer_addr).map_err(|e| e.replace("--peers", "--peer-addr"))?;
    o.init = init;
    o.snapshot_logs = snapshot_logs;
    o.snapshot_min_bytes = snapshot_min_mib << 20;
    o.session_ttl = Duration::from_secs(session_ttl_s);
    o.auto_compaction = raftkv::autocompact::AutoCompaction::parse(
        &auto_compaction_mode,
        &auto_compaction_retention,
    )?
    .map(|a| match a {
        raftkv::autocompact::AutoCompaction::Revision { retention, .. } => {
            raftkv::autocompact::AutoCompaction::Revision {
                retention,
                interval: Duration::from_secs(auto_compaction_interval_s.max(1)),
            }
        }
        periodic => periodic,
    });
    o.max_pending_writes = max_pending_writes;
    o.max_client_requests = max_client_requests;
    o.heartbeat = Duration::from_millis(heartbeat_ms);
    o.election_timeout = Duration::from_millis(election_timeout_ms);
    let vfs = journal_core::vfs::OsVfs::new();
    o.peer_secret = Some(raftkv::auth::PeerSecret::from_file(
        &vfs,
        &peer_secret_file,
    )?);
    if admin_timeout_s == 0 || connection_timeout_s == 0 || lease_checkpoint_s == 0 {
        return Err(
            "--admin-timeout-s, --connection-timeout-s and --lease-checkpoint-s must be positive"
                .into(),
        );
    }
    o.lease_checkpoint_interval = Duration::from_secs(lease_checkpoint_s);
    o.admin_timeout = Duration::from_secs(admin_timeout_s);
    o.space_reserve = space_reserve_mib << 20;
    let t = Duration::from_secs(connection_timeout_s);
    o.timeouts = raftkv::server::Timeouts { header: t, idle: t };
    o.cluster = match cluster_id {
        Some(c) => Some(
            u64::from_str_radix(&c, 16).map_err(|_| format!("--cluster-id: {c:?} is not hex"))?,
        ),
        None => None,
    };
    // Failpoints a fault test arms before Raft starts (a crash while a
    // snapshot it is sent at once is installed): `name=actions;...`.
    if let Ok(spec) = std::env::var(raftkv::api::FAILPOINTS_ENV) {
        raftkv::api::arm_failpoints(&spec)?;
    }
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("listen on {listen}: {e}"))?;
    let node = std::sync::Arc::new(
        raftkv::Node::start(o)
            .await
            .map_err(|e| format!("node {id}: {e}"))?,
    );
    println!("raftkv node {id} listening on {listen}");
    raftkv::serve(node, listener, crate::stop_signal()).await
}
