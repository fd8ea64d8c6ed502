//! What raftkv's server (`raftkv`) and its tooling (`raftkv-tools`: the
//! client, the benchmarks, the fault matrix) both speak, and nothing
//! else: neither side reaches into the other's code.
//!
//! - [`http`]: the HTTP API's headers and error codes, and the document
//!   `GET /status` answers;
//! - [`Expect`]: what a conditional write expects of its key;
//! - [`limits`]: etcd's request bounds, and the slowest append rate a
//!   follower is assumed to take;
//! - [`auth`]: the secret a cluster's members share;
//! - [`prefix_end`]: etcd's `range_end` for a key prefix;
//! - [`read_small_file`]: a small file read whole (the peer secret, the
//!   server's identity and `CURRENT` files).
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

/// The `range_end` of every key that starts with `prefix` (etcd's
/// `--prefix`): `prefix` with its last byte below 0xff incremented and
/// what follows dropped; `[0]` (every key from `prefix` on) if every byte
/// is 0xff or it is empty.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Reads a small file whole: `None` if it does not exist, `Some(None)` if
/// it is longer than `max` bytes (not the file expected there).
pub fn read_small_file(
    vfs: &dyn journal_core::vfs::Vfs,
    path: &std::path::Path,
    max: u64,
) -> Result<Option<Option<Vec<u8>>>, journal_core::VfsError> {
    if !vfs.exists(path)? {
        return Ok(None);
    }
    let f = vfs.open(path, journal_core::vfs::OpenOptions::read())?;
    let len = f.len()?;
    if len > max {
        return Ok(Some(None));
    }
    let Ok(len) = usize::try_from(len) else {
        return Ok(Some(None));
    };
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, 0)?;
    Ok(Some(Some(buf)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_its_last_byte_below_0xff_incremented() {
        assert_eq!(prefix_end(b"abc"), b"abd");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
