//! raftkv's tooling: what starts, drives, measures and checks `raftkv
//! serve` processes from outside, through the APIs a user has (HTTP,
//! etcd's gRPC) and the signals an operator sends. It shares no code with
//! the server but the wire vocabulary (`raftkv-wire`, `etcd-api`).
//!
//! - [`client`]: a client of the HTTP API that finds the leader and
//!   retries a write safely, under its request id;
//! - [`local`]: a local cluster of `raftkv serve` processes, and the
//!   supervisor that restarts a node that exits (`raftkv-tools cluster`);
//! - [`mod@bench`] and [`compare`]: closed-loop clients, and raftkv beside
//!   etcd in one run, interleaved (`cargo xtask bench-raft`);
//! - [`faults`]: the fault matrix — kills, pauses, partitions, slow and
//!   failing disks, crashes at failpoints — and the soak (`cargo xtask
//!   raft-faults`, `raft-soak`);
//! - [`history`]: the linearizability checker the fault matrix and the
//!   failover tests judge histories with.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod bench;
pub mod client;
pub mod compare;
pub mod faults;
pub mod history;
pub mod local;
