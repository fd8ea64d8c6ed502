//! A replicated key-value store: [openraft] with the journal as its Raft
//! log ([`openraft_log::JournalLogStore`]) and [`kvstore`] as its state
//! machine, served over HTTP.
//!
//! # The clients' API (`curl` is enough)
//!
//! | request | answer |
//! |---|---|
//! | `PUT /kv/{key}` with the value as body | `200` once a majority holds the write durably in their logs and the leader applied it |
//! | `GET /kv/{key}` | `200` and the value, linearizable (read index: leadership confirmed by a majority, then the state machine caught up; see below), with its `ETag` (the revision it was last changed at), `x-raftkv-create-revision` and `x-raftkv-version`; `404` if absent |
//! | `GET /kv/{key}?stale=true`, `?revision=R` | the value as applied on this node, without asking anyone; the value at revision `R` (`410` with `x-raftkv-error: compacted` below the compaction) |
//! | `GET /kv?prefix=P` (`&start=K` for the next page), `GET /kv?start=A&end=B` (`end` optional), with `limit=N` (default 1,000, at most 10,000), `stale=true` and `revision=R` | `200` and JSON `{"index", "revision", "kvs": [{"key", "value" (base64), "create_revision", "mod_revision", "version", "lease"}], "next"}`: the keys of the range in order as they were at `revision` (the newest by default), linearizable unless stale; a page stops at `limit` or about 4 MiB, and `next` is where the range goes on. Ask the next pages with `revision=` the first page's: one snapshot of the whole range, until compacted |
//! | `PUT /kv/{key}` with `If-None-Match: *`, `If-Match: *` or `If-Match: "<revision>"` | `200` as above if, when the write is applied, the key is absent, present, or was last changed at that revision; else `412` with `x-raftkv-error: compare-failed`, and nothing written |
//! | `DELETE /kv/{key}` | `200` as for a `PUT` (conditional with the same headers); `400` with `?lease=` (a delete attaches nothing) |
//! | `POST /txn` with JSON `{"compare": [{"key", "expect": "absent" \| "present" \| {"mod_revision": R} \| {"value": base64}}], "success": [{"put": {"key", "value"}} \| {"delete": {"key"}}], "failure": [...]}` | `200` and JSON `{"succeeded", "revision", "retry"}`: if every comparison held, the `success` changes were made, else the `failure` ones — one branch, whole, at one revision; etcd's bounds ([`kv::MAX_TXN_OPS`] a branch, [`kv::MAX_REQUEST_BYTES`], no key changed twice) |
//! | `DELETE /kv?prefix=P`, `DELETE /kv?start=A&end=B` (`end` optional; not empty) | `200` as for a `PUT`: every key of the range removed, in one command of the log |
//! | `GET /watch?prefix=P&from=REV` (or `&after=POS`; `prefix` optional) | `200` and a stream of NDJSON lines, one per change of a key under `P`: `{"pos", "revision", "kind": "put" \| "delete", "key", "value" (base64, puts)}`, every change at or after revision `REV` (or after the change at position `POS`, `revision.sub`; by default from the next revision applied), in order, then the new ones as they are applied; `410` with `{"error": "compacted", "first": C}` if a compaction passed the start (`C`, the compaction's revision, is where a watch may start). A stream that a compaction passes ends with such a line |
//! | `POST /lease` with `{"ttl_s": N}` (1 s to a week) | `200` and `{"id", "ttl_s"}` once granted |
//! | `PUT /kv/{key}?lease=ID` | as a `PUT`, the key attached to the lease (`404` with `x-raftkv-error: lease-not-found` if it is gone, `409` `lease-full` past [`machine::MAX_LEASE_KEYS`] keys); a put without it lets the key go |
//! | `POST /lease/{id}/keepalive` | `200` and `{"id", "ttl_s"}` once renewed for its time-to-live from the request's arrival (the leader's, confirmed by a heartbeat round; not a log entry); `404` if it is gone |
//! | `DELETE /lease/{id}` | `200` once revoked with its keys deleted; `404` if it is gone |
//! | `POST /compact` | `200` once this node built a snapshot of what it applied and purged its Raft log up to it (a member behind it is then sent the snapshot); `503` with `x-raftkv-error: timeout` past the admin deadline (`serve --admin-timeout-s`, 60 s). (Not etcd's compaction of old versions: see "Versions and compaction") |
//! | `GET /status` | JSON: id, pid, cluster, state, leader, term, last log index, applied index, snapshot index, purged index, voters, learners, the error that stopped Raft if one did, on the leader each member's matched index, and `nospace` (the disk-space alarm) |
//! | `GET /metrics` | Prometheus text: proposals, applied index and apply lag, term, leader changes, log flush latency, snapshot durations and sizes, request latency by route ([`metrics`]) |
//! | `POST /members` with `{"op":"add","id":4,"addr":"127.0.0.1:7004"}`, `{"op":"promote","id":4}` or `{"op":"remove","id":3}` | `200` once the change is committed (an added learner has caught up: within 1,000 entries of the leader); `503` with `x-raftkv-error: timeout` past the admin deadline (the change may still take effect) |
//!
//! # etcd's gRPC API
//!
//! The client port also speaks etcd v3's gRPC API — etcd 3.4's KV, Watch,
//! Lease, Cluster and Maintenance services, on HTTP/2 cleartext beside the
//! HTTP/1.1 API (one listener: [`server`]) — and etcd's JSON gateway
//! (`POST /v3/kv/range`, `/v3/lease/grant`, …: [`grpc::gateway`]), over the
//! same calls; so `etcdctl --endpoints=http://…` and etcd's client
//! libraries work with nothing changed but the endpoint. Every answer's
//! header carries etcd's `cluster_id`, `member_id`, `revision` and
//! `raft_term`; errors are etcd's gRPC codes and messages; a follower
//! forwards what needs the leader (never a redirect). The wire types come
//! from the `etcd-api` crate (`.proto` files written to etcd 3.4's
//! interface, compiled at build time without `protoc`). **etcd's Auth
//! service is not served**: its calls answer `Unimplemented` (raftkv has
//! no users or roles; the peers share a secret, [`auth`]). The services
//! ask the node's store through [`grpc::EtcdBackend`]; see [`grpc`] for
//! what each call does here (a member's id is its node id; `Defragment`
//! compacts the Raft log; `Snapshot` streams raftkv's snapshot file).
//!
//! A `200` to a write or a linearizable read carries the header
//! `x-raftkv-index` ([`api::INDEX_HEADER`]): the log index the write was
//! applied in, or the read's read index.
//!
//! # Revisions and compare-and-set
//!
//! Revisions are etcd's ([`kv`]): one store-wide integer; a new store is
//! at revision 1, and every command that changes the store (a put; a
//! delete that deletes something; a transaction with a change; a revoke
//! that deletes keys) takes the next one, its changes numbered within it
//! by a sub-revision. Each key has a `create_revision`, a `mod_revision`
//! (its `ETag`, `"812"`) and a `version`; a delete resets them. A write
//! is answered with the store's revision after it (`x-raftkv-revision`:
//! its own if it changed the store). A conditional write is a
//! transaction of one comparison and one change; a transaction's
//! comparisons are evaluated when its entry is **applied**, against
//! every change before it in the log (those of its own entry included),
//! never at the API, so of two compare-and-sets from one revision at most
//! one wins. A retried request (same request id) is answered as it was
//! decided the first time — its revision, and `412` again if its
//! comparison failed — from the session, which keeps each client's last
//! answer.
//!
//! A write may carry a request id, `?client=C&seq=S` (one request at a
//! time per client): the state machine applies each client's ids once and
//! in increasing order, so a write retried after its leader died is not
//! applied twice (`200 … (a retry: applied before)`). A client's ids form
//! a session, opened by `seq=1` and expired when idle for the session
//! time-to-live (`serve --session-ttl-s`, default 600) by the log's
//! clock, which the leader writes into each entry, so every replica
//! expires the same sessions at the same index and the table stays
//! bounded. The log's clock is no wall clock: a new leader goes on from
//! the clock its log holds, by its own monotonic clock
//! ([`lessor::LogClock`]), so it never runs faster than real time and a
//! leader whose wall clock is ahead expires no session early. A request
//! of a client without a session (expired, or never opened) is `409`
//! with `x-raftkv-error: session-unknown`; one below the session's last
//! number is `409` with `session-stale`; neither is applied.
//!
//! # Sessions and writes in doubt: the client's rule
//!
//! A write without an answer — the connection broke, the request timed
//! out, or a `503` without `Retry-After` — is **in doubt**: it may have
//! been applied. Retried with the same request id it is applied at most
//! once, and the retry learns what became of it. But once its session is
//! gone (`409 session-unknown`, the client idle past the session
//! time-to-live while retrying), no answer can say whether the first copy
//! was applied before the session expired — and the same write sent
//! again under a **new** session would be a new request, applied a second
//! time if the first was. So a client:
//!
//! 1. retries a write in doubt only under its own request id;
//! 2. on `session-unknown` after an attempt in doubt, reports the write's
//!    outcome as unknown to its caller and does **not** send it again; it
//!    opens a new session (a new client id, `seq=1`) for its next writes,
//!    and may read the key to learn what happened;
//! 3. resends a write under a new session only if every attempt was
//!    refused outright (a `409 session-unknown` at the first attempt, a
//!    refused connection, a `307`, a `503` with `Retry-After`): it cannot
//!    have been applied;
//! 4. keeps its retry deadline well below the session time-to-live, so
//!    the case is rare.
//!
//! `raftkv_tools::client::Client` does all four (`ClientError::Unknown`
//! for the second).
//!
//! Keys are 1 to [`MAX_KEY`] bytes, any bytes as etcd's (the HTTP API
//! takes what a URL path carries); values up to [`MAX_VALUE`] bytes
//! (checks: [`check`]). A bad key, a value over the limit, a malformed
//! request id or an unknown member id is
//! `400`. A request that needs the leader and reaches another node is
//! answered `307` with the leader's URL in `Location` (`curl -L` follows
//! it); `503` when there is no leader or no majority answered within 5 s —
//! a write answered `503` that way may or may not take effect: its outcome
//! is unknown, so retry it with the same request id.
//!
//! The request path is bounded. A node serves at most
//! [`api::MAX_CLIENT_REQUESTS`] client requests at once and queues at most
//! [`propose::MAX_PENDING`] writes for the next Raft entry
//! (`--max-client-requests`, `--max-pending-writes`); beyond either, `503`
//! with `Retry-After: 1` at once, and that write was **not** taken. A write
//! whose client went away (it disconnected, or its request timed out)
//! before it was proposed is dropped, never applied. A Raft append
//! carries at most [`network::APPEND_BUDGET`] bytes of entries (one entry
//! at least; the rest is reported to openraft as a partial success and
//! sent next) under a deadline that grows with its body, and the leader
//! reads no more than that from its log per append
//! ([`logstore::BoundedLog`]): a follower far behind is caught up by
//! appends it can take in time, with the leader's memory bounded.
//!
//! A connection is closed when a request's headers are not complete 10
//! s after it opened or its last answer, or when it has been idle for 10
//! s (`serve --connection-timeout-s`; [`server`]).
//!
//! # A full disk
//!
//! Below its free-space reserve (`serve --space-reserve-mib`, 256 MiB),
//! a node answers writes that add data — puts, transactions with a put,
//! lease grants — `507` with `x-raftkv-error: nospace`, and proposes
//! nothing; reads and deletes (of keys, ranges, leases; transactions of
//! deletes) go on, taking from the reserve. Writes are taken again once
//! the free space is back at twice the reserve, with no restart
//! ([`space`], etcd's `NOSPACE` alarm). Without it the Raft log or the
//! store failed on the full disk, openraft stopped its core, and the
//! node exited, to be restarted into the same full disk.
//!
//! # Versions and compaction
//!
//! The store keeps every version of every key, as etcd does, until it is
//! compacted ([`machine`]'s `mvcc.rs`): an index of the keys, small
//! enough to stay in the store's cache at millions of keys, and the
//! versions by revision, appended in revision order. A read at an older
//! revision (`?revision=`, etcd's `Range` with `revision`) follows a
//! key's versions back from the index. A compaction at revision C
//! (etcd's `Compact`, or auto-compaction: `serve --auto-compaction-mode
//! revision|periodic --auto-compaction-retention N`, etcd's meanings,
//! [`autocompact`]; by default the last 10,000 revisions are kept,
//! compacted every five minutes) is a command in the log: reads below C
//! are refused at once (`410`, etcd's "required revision has been
//! compacted"), and the versions C supersedes are removed over the
//! entries that follow, a bounded number an entry — each key's latest
//! version at or below C stays.
//!
//! # Watch
//!
//! The watch history *is* the versions: a watcher reads the changes of
//! its keys from a revision in revision order, from any node, and
//! resumes on any other after the last position it saw (`after=`) —
//! every change exactly once, in order — as long as no compaction passed
//! it (`410`). A node serves the changes it has applied: a follower's
//! stream may lag the leader's. A stream holds no events in memory
//! beyond one page (256): a slow reader only slows its own stream. A
//! node serves at most [`api::MAX_WATCHERS`] streams at once (`503`
//! beyond), and ends them when it stops. Deleting a key that is absent
//! makes no change.
//!
//! # etcd's calls
//!
//! What etcd's gRPC services ask of a node — ranges at a revision,
//! writes with etcd's answers, compactions, watches, leases and `HashKV`
//! — are the node-level calls of [`node::kv`], refused with
//! etcd's errors ([`kv::KvError`]); [`grpc::EtcdBackend`] on [`Node`] is
//! those calls, and the gRPC services and the JSON gateway ask nothing
//! else of the store.
//!
//! # Leases
//!
//! As etcd's: a lease expires when not kept alive for its time-to-live,
//! and the keys attached to it are deleted then (with their watch
//! events), or at once when it is revoked. Time is the leader's, never
//! the state machine's ([`lessor`]):
//!
//! - the leader keeps each lease's deadline by its monotonic clock and,
//!   when one passes, proposes the revoke: an expiry is a command in the
//!   log, applied alike on every replica, on an idle cluster too (a round
//!   of expiries revokes about 10,000 keys);
//! - a keep-alive is answered by the leader from memory once a heartbeat
//!   round confirmed its leadership after the request arrived — not a log
//!   entry — and promises the lease lives its time-to-live from the
//!   request's arrival, whoever leads then;
//! - a new leader extends every lease from its promotion, by its whole
//!   time-to-live, or by its remaining time-to-live as the leader before
//!   checkpointed it into the log (leases longer than
//!   [`NodeOptions::lease_checkpoint_interval`], every that interval; a
//!   keep-alive of a checkpointed lease then goes through the log to clear
//!   the checkpoint). No clock is compared between nodes, so a new leader
//!   whose clock is ahead expires nothing early; clocks are assumed to
//!   run at about the same rate.
//!
//! A lease holds at most [`machine::MAX_LEASE_KEYS`] keys. The lease
//! table is held in memory, as etcd's lessor holds it, with a count of
//! each lease's keys but not the keys: a revoke reads them from the store,
//! in key order, in bounded steps, so memory grows with the leases, not
//! their keys.
//!
//! # Apply is a pure function of the log
//!
//! Every replica writes the same store — the same versions — for the
//! same log: apply reads no clock (time comes in the log), draws no
//! random number, iterates no hash container (whose order differs per
//! process), and does not depend on how openraft groups entries into
//! apply calls (the physical compaction goes entry by entry). A long
//! command — a range delete, alone or in a transaction, a revoke —
//! is applied in steps of about [`machine::STEP_KEYS`] keys, the state
//! lock released and the runtime thread given back between two, so a
//! delete of 200,000 keys does not stop a node's heartbeats; each step
//! commits where it stopped, so a crash, or a snapshot taken between two
//! steps, goes on from exactly there. Readers read at the revision of the
//! last command applied whole: never part of one.
//!
//! # What is durable when a `PUT` returns
//!
//! The entry is in the logs of a majority of the voters, each made durable
//! by its journal's group commit (an fsync'd, checksummed record) before
//! that node answered the leader; and the leader applied it. Applying
//! itself does not wait for a sync: the state machine is rebuilt from the
//! log.
//!
//! # What a linearizable read waits for
//!
//! The leader confirms with a majority that it still leads (a heartbeat
//! round sent after the read arrived: openraft's `ReadPolicy::ReadIndex`),
//! then waits until its state machine applied the read index: openraft's
//! `max(the leader's first entry of its term, its commit index)`. **After
//! a restart** a node that was leader does not lead again in its old term:
//! openraft's leader restore (on by default in 0.10) is turned off, so it
//! stands for election in a new term like any other node. Restored in its
//! old term it could serve stale reads: openraft 0.10 replicates while the
//! leader's own flush runs, so the followers may have committed entries
//! (which the leader acknowledged) that the leader's disk lost in a power
//! cut (`tests/disk_crash.rs`). A leader of a new term needs nothing more:
//! its first entry is that term's blank entry, after every entry committed
//! before it.
//!
//! # Batching
//!
//! Writes that arrive while earlier ones are on their way through Raft are
//! gathered into one log entry ([`propose`]): one log write and flush per
//! entry on every member, so this is what group commit looks like one
//! level up. A lone writer's entry leaves at
//! once.
//!
//! # How a restart recovers
//!
//! The journal recovers the log (entries, vote, committed id) and the
//! store recovers its pages and its own write-ahead log. The store holds
//! the last applied log id in the same transaction as the writes of that
//! batch ([`StateMachine`]), so openraft re-applies exactly the entries
//! after it; the log is purged only below what the store holds durably
//! (a snapshot's applied id, which building the snapshot made durable
//! first; an installed snapshot's, once its store is current): the log's
//! purge waits for it ([`StateMachine::purge_gate`]), since openraft 0.9
//! purged a follower's log without waiting for its snapshot install (kept
//! under 0.10: the gate costs nothing when the store is ahead). A
//! follower too far behind gets a snapshot, installed by an atomic replace
//! of its store. Snapshots are files in the node's directory
//! (`snapshots/`, docs/FORMAT.md): streamed from the store, sent and
//! received as files, installed by a sorted bulk load (leaves written left
//! to right, no log) — a few MiB of memory at any store size — and kept
//! across restarts.
//!
//! # Replacing a member
//!
//! A node's directory holds its vote: a member whose directory is lost
//! must not come back under its old id with an empty one (it could vote
//! twice in a term, and openraft's leader stops on a follower whose log
//! went backwards). Before a node claims an empty directory it asks its
//! `--peers` for their status; if the leader holds a log for it
//! (`matched` in `GET /status`) it refuses to start. The way back is etcd's
//! member replacement: `POST /members` `remove`, start the node empty,
//! `add` it (a learner, caught up by snapshot if the log it needs was
//! purged), `promote`.
//!
//! # The network
//!
//! Raft RPCs are `POST /raft/{append,vote,snapshot}` with postcard bodies
//! ([`network`]), each carrying the secret the cluster's members share
//! ([`auth`], `serve --peer-secret-file`): without it a node answers
//! `401`/`403` before it reads the body. `raftkv-tools cluster` makes one per
//! cluster (`DIR/peer-secret`). The RPCs are on axum (server) and reqwest
//! (client), both on hyper: the
//! well-kept HTTP stack of the tokio ecosystem, so the clients' API and the
//! Raft RPCs share one port and one server. etcd's gRPC API is tonic on
//! the same hyper server (its protobuf compiled by protox, so no `protoc`);
//! the Raft RPCs stay HTTP/1.1 with postcard bodies.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// openraft's storage traits return its large `StorageError`.
#![allow(clippy::result_large_err)]

pub mod api;
pub use raftkv_wire::auth;
pub mod autocompact;
pub mod check;
pub mod grpc;
pub mod kv;
pub mod lessor;
pub mod logstore;
pub mod machine;
pub mod metrics;
pub mod network;
pub mod node;
pub mod propose;
pub mod server;
pub mod space;
mod types;

pub use machine::StateMachine;
pub use node::{Node, NodeOptions};
pub use types::{
    Answer, Applied, Batch, Command, Expect, NodeId, Raft, RequestId, ToCompare, TypeConfig,
    Verdict, MAX_CHECKPOINT_LEASES, MAX_KEY, MAX_VALUE,
};

use openraft::async_runtime::WatchReceiver;
use std::future::Future;
use std::sync::Arc;

/// Serves `node`'s API on `listener` until `stop` completes, then shuts
/// the node down (Raft stopped, store and log closed).
///
/// If the node's Raft core stops on its own (a storage error: the log's
/// flush or the state machine failed, which poisons them), the server stops
/// too and this returns the core's error, so `raftkv serve` exits non-zero
/// and a supervisor (`raftkv-tools cluster`'s) restarts it: a node that cannot
/// make progress does not linger answering `503`.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let etcd = Arc::new(grpc::Etcd::new(node.clone(), node.clone()));
    let app = server::Apps {
        http: api::router(node.clone()).merge(grpc::gateway::routes(etcd.clone())),
        grpc: Some(grpc::router_on(etcd)),
    };
    let (fatal_tx, mut fatal_rx) = tokio::sync::oneshot::channel::<String>();
    let mut metrics = node.raft.metrics();
    tokio::spawn(async move {
        loop {
            if let Err(e) = &metrics.borrow_and_update().running_state {
                let _ = fatal_tx.send(e.to_string());
                return;
            }
            // The sender closes at a clean shutdown: nothing to report.
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
    let fatal = Arc::new(journal_core::sync::Mutex::new(None::<String>));
    let seen = fatal.clone();
    let stopping = node.clone();
    let until = async move {
        tokio::select! {
            _ = stop => {}
            r = &mut fatal_rx => {
                if let Ok(e) = r {
                    *seen.lock() = Some(e);
                }
            }
        }
        // Open watch streams end: the graceful shutdown waits for them.
        stopping.stopping.send_replace(true);
    };
    let served = server::run(listener, app, node.timeouts, until)
        .await
        .map_err(|e| e.to_string());
    let stopped = node.shutdown().await;
    if let Some(e) = fatal.lock().take() {
        return Err(format!("node {}: the Raft core stopped: {e}", node.id));
    }
    stopped?;
    served
}
