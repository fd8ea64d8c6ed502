//! What raftkv's server (`raftkv`) and its tooling (`raftkv-tools`: the
//! client, the benchmarks, the fault matrix) both speak, and nothing
//! else: neither side reaches into the other's code.
//!
//! - [`http`]: the HTTP API's headers and error codes, and the document
//!   `GET /status` answers;
//! - [`Expect`]: what a conditional write expects of its key;
//! - [`limits`]: etcd's request bounds, and the slowest append rate a
//!   follower is assumed to take;
//! - [`auth`]: the secret a cluster's members share.
//!
//! etcd's gRPC API has its own crate (`etcd-api`).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod auth;
pub mod http;
pub mod limits;

use serde::{Deserialize, Serialize};

/// A node's id: a member id of the cluster.
pub type NodeId = u64;

/// What a conditional write of the HTTP API (and the tooling's client)
/// expects of its key when it is applied: each is one etcd comparison
/// (the server's `raftkv::ToCompare`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expect {
    /// The key is absent (`If-None-Match: *`): its create revision is 0.
    Absent,
    /// The key is present (`If-Match: *`): its create revision is above 0.
    Present,
    /// The key was last changed at this revision (`If-Match: "812"`).
    ModRevision(i64),
    /// The key is present and holds this value.
    Value(Vec<u8>),
}
