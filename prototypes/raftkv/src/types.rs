//! The Raft type configuration, the commands in the log, and the store's
//! key layout.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node's id in the cluster.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// raftkv's Raft types: [`Batch`]es of commands in the log, [`Applied`] answers,
    /// `u64` node ids, nodes known by their HTTP address, snapshots in
    /// files.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = NodeId,
        Node = openraft::BasicNode,
);

/// The Raft handle of a raftkv node.
pub type Raft = openraft::Raft<TypeConfig, crate::machine::StateMachine>;

/// A client's request id: the client's id and its sequence number. The
/// state machine applies each id once, and a client's ids in increasing
/// order, so a write retried after its leader died is not applied twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestId {
    /// The client's id (any `u64` it chose; a random one is safe).
    pub client: u64,
    /// The request's sequence number among the client's, from 1.
    pub seq: u64,
}

/// A store-wide revision, as etcd's (main, sub) revision: the log index of
/// the entry a change was applied in and the command's position in that
/// entry (0 is the entry's [`Command::Clock`]). Every change advances it;
/// revisions increase but are not dense. Written `index.sub` (`"812.3"`),
/// which is also how HTTP carries it (`ETag`, `If-Match`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Revision {
    /// The log index of the entry.
    pub index: u64,
    /// The command's position in the entry.
    pub sub: u32,
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.index, self.sub)
    }
}

impl std::str::FromStr for Revision {
    type Err = BadInput;

    /// Parses `index.sub`, quoted or not (an HTTP entity tag is quoted).
    fn from_str(s: &str) -> Result<Revision, BadInput> {
        let t = s.trim();
        let t = t
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .unwrap_or(t);
        let (i, sub) = t.split_once('.').ok_or(BadInput::Revision)?;
        Ok(Revision {
            index: i.parse().map_err(|_| BadInput::Revision)?,
            sub: sub.parse().map_err(|_| BadInput::Revision)?,
        })
    }
}

/// What a [`Compare`] expects of its key, as the state machine holds it
/// when the transaction is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expect {
    /// The key is absent (`If-None-Match: *`).
    Absent,
    /// The key is present (`If-Match: *`).
    Present,
    /// The key is present and was last changed at this revision
    /// (`If-Match: "812.3"`).
    ModRevision(Revision),
    /// The key is present and holds this value.
    Value(Vec<u8>),
}

/// One comparison of a [`Command::Txn`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    /// The client's key.
    pub key: Vec<u8>,
    /// What it must be.
    pub expect: Expect,
}

/// A change a [`Command::Txn`] makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// Sets `key` to `value`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The lease it is attached to (it must exist), if any.
        lease: Option<u64>,
    },
    /// Removes `key`.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

/// The most comparisons, and the most changes in each branch, of a
/// transaction.
pub const MAX_TXN_OPS: usize = 64;
/// The most bytes of keys and values a transaction's changes hold.
pub const MAX_TXN_BYTES: usize = 1 << 20;

/// Checks a transaction from a client: keys and values as for single
/// writes, at most [`MAX_TXN_OPS`] comparisons and changes per branch,
/// at most [`MAX_TXN_BYTES`] in all.
pub fn check_txn(
    compares: &[Compare],
    success: &[TxnOp],
    failure: &[TxnOp],
) -> Result<(), BadInput> {
    if compares.len() > MAX_TXN_OPS || success.len() > MAX_TXN_OPS || failure.len() > MAX_TXN_OPS {
        return Err(BadInput::TxnTooLarge);
    }
    let mut bytes = 0usize;
    for c in compares {
        check_key(&c.key)?;
        if let Expect::Value(v) = &c.expect {
            check_value(v)?;
            bytes += v.len();
        }
        bytes += c.key.len();
    }
    for op in success.iter().chain(failure) {
        let (TxnOp::Put { key, .. } | TxnOp::Delete { key }) = op;
        check_key(key)?;
        if let TxnOp::Put { value, .. } = op {
            check_value(value)?;
            bytes += value.len();
        }
        bytes += key.len();
    }
    if bytes > MAX_TXN_BYTES {
        return Err(BadInput::TxnTooLarge);
    }
    Ok(())
}

/// A write in the Raft log. (Variants are only ever added at the end:
/// the log holds them by their position.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Sets `key` to `value`.
    Put {
        /// The key (a valid key: [`check_key`]).
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// Removes `key`.
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// The log's clock when the leader proposed the entry, first in every
    /// batch it proposes, and the session time-to-live it runs with: the
    /// state machine expires client sessions by this time, decided in the
    /// log, so every replica expires the same sessions at the same index
    /// (the Raft dissertation, §6.3). No wall clock: a leader goes on from
    /// the clock its log holds when it takes over, by its own monotonic
    /// clock ([`crate::lessor::LogClock`]).
    Clock {
        /// The log's clock, ms (from 0 at the cluster's first leader).
        now_ms: u64,
        /// A session idle this long (by the log's clock) expires.
        session_ttl_ms: u64,
    },
    /// Removes every key from `start` on, before `end` (`None`: to the
    /// last key).
    DeleteRange {
        /// The first key removed, if present.
        start: Vec<u8>,
        /// The first key kept after the range.
        end: Option<Vec<u8>>,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// A transaction, evaluated when it is applied: if every comparison
    /// holds, the `success` changes are made, else the `failure` ones;
    /// either way at the command's one revision, atomically. (A
    /// conditional `PUT` or `DELETE` is a transaction of one comparison
    /// and one change.)
    Txn {
        /// The comparisons, all of which must hold.
        compares: Vec<Compare>,
        /// The changes made if they do, in order.
        success: Vec<TxnOp>,
        /// The changes made if one does not, in order.
        failure: Vec<TxnOp>,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// Grants a lease of `ttl_ms` (by the log's clock); its id is
    /// [`crate::machine::lease_id`] of the command's revision.
    LeaseGrant {
        /// Its time-to-live, ms.
        ttl_ms: u64,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// A keep-alive that must reach the log: the lease's checkpointed
    /// remaining time-to-live is cleared, so a new leader gives it its
    /// whole time-to-live. (A keep-alive of a lease without a checkpoint
    /// is the leader's alone: [`crate::lessor`].)
    LeaseKeepAlive {
        /// The lease.
        lease: u64,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// Ends a lease and deletes its keys: a client's revoke, or the
    /// leader's once the lease expired by its clock.
    LeaseRevoke {
        /// The lease.
        lease: u64,
        /// The client's request id, if it sent one.
        id: Option<RequestId>,
    },
    /// The leader's checkpoint of leases' remaining time-to-live (ms), so
    /// that a new leader gives each what was left rather than its whole
    /// time-to-live (etcd's lease checkpoints). A lease gone since is
    /// passed over.
    LeaseCheckpoint {
        /// (lease, remaining ms), at most [`MAX_CHECKPOINT_LEASES`].
        leases: Vec<(u64, u64)>,
    },
}

/// Leases one [`Command::LeaseCheckpoint`] holds, at most.
pub const MAX_CHECKPOINT_LEASES: usize = 1000;

impl Command {
    /// The client's request id the command carries, if any.
    pub fn request_id(&self) -> Option<RequestId> {
        match self {
            Command::Put { id, .. }
            | Command::Delete { id, .. }
            | Command::DeleteRange { id, .. }
            | Command::Txn { id, .. }
            | Command::LeaseGrant { id, .. }
            | Command::LeaseKeepAlive { id, .. }
            | Command::LeaseRevoke { id, .. } => *id,
            Command::Clock { .. } | Command::LeaseCheckpoint { .. } => None,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Put { key, value, .. } => write!(
                f,
                "put {} ({} bytes)",
                String::from_utf8_lossy(key),
                value.len()
            ),
            Command::Delete { key, .. } => write!(f, "delete {}", String::from_utf8_lossy(key)),
            Command::Clock { now_ms, .. } => write!(f, "clock {now_ms}"),
            Command::DeleteRange { start, .. } => {
                write!(f, "delete from {}", String::from_utf8_lossy(start))
            }
            Command::Txn {
                compares,
                success,
                failure,
                ..
            } => write!(
                f,
                "txn ({} compares, {}/{} changes)",
                compares.len(),
                success.len(),
                failure.len()
            ),
            Command::LeaseGrant { ttl_ms, .. } => write!(f, "grant a lease of {ttl_ms} ms"),
            Command::LeaseKeepAlive { lease, .. } => write!(f, "keep lease {lease:x} alive"),
            Command::LeaseRevoke { lease, .. } => write!(f, "revoke lease {lease:x}"),
            Command::LeaseCheckpoint { leases } => {
                write!(f, "checkpoint {} leases", leases.len())
            }
        }
    }
}

/// The commands of one log entry, applied in order. The leader gathers
/// the writes that arrive while earlier ones are being committed into one
/// entry: each entry costs a log flush on every member, so an entry per
/// write would cost a flush per write.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Batch(pub Vec<Command>);

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            all => write!(f, "{} commands", all.len()),
        }
    }
}

/// What applying one command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Applied (or a clock, which changes only the sessions); a
    /// transaction whose comparisons all held.
    Applied,
    /// A transaction whose comparisons did not all hold: its `failure`
    /// changes (if any) were applied instead.
    CompareFailed,
    /// Its request id is the session's last one: a retry of a request
    /// decided before; nothing changed this time. What was decided then:
    Duplicate {
        /// The revision it was applied at.
        revision: Revision,
        /// Whether its comparisons held (always, for a plain write).
        succeeded: bool,
    },
    /// A lease it names does not exist (never granted, expired or
    /// revoked): nothing applied.
    LeaseNotFound,
    /// A lease it attaches a key to holds its most keys
    /// ([`crate::machine::MAX_LEASE_KEYS`]): nothing applied.
    LeaseFull,
    /// Its client has no session (never opened — a session opens with
    /// sequence number 1 — or expired): not applied. The client starts a
    /// new session under a new id.
    UnknownSession,
    /// Its sequence number is below the session's last: a late copy of a
    /// request the client has moved on from, or a client id used twice.
    /// Not applied.
    Stale,
}

/// What applying a batch did, command by command.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Applied {
    /// For each command of the batch, in order.
    pub verdicts: Vec<Verdict>,
}

/// The longest key a client may use, in bytes.
pub const MAX_KEY: usize = kvstore::MAX_KEY - 1;
/// The longest value a client may store, in bytes: 64 KiB, well under
/// kvstore's own limit, so that a batch of them stays a modest Raft entry.
pub const MAX_VALUE: usize = 64 * 1024;

/// Why a key or value is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadInput {
    /// The key is empty.
    EmptyKey,
    /// The key is longer than [`MAX_KEY`].
    KeyTooLong(usize),
    /// The key holds a control character (below 0x20, or 0x7f).
    ControlCharacter,
    /// The value is longer than [`MAX_VALUE`].
    ValueTooLong(usize),
    /// A revision is not `index.sub`.
    Revision,
    /// A transaction has more than [`MAX_TXN_OPS`] comparisons or changes
    /// in a branch, or more than [`MAX_TXN_BYTES`].
    TxnTooLarge,
}

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadInput::EmptyKey => write!(f, "the key is empty"),
            BadInput::KeyTooLong(n) => write!(f, "the key is {n} bytes; at most {MAX_KEY}"),
            BadInput::ControlCharacter => write!(f, "the key holds a control character"),
            BadInput::ValueTooLong(n) => write!(f, "the value is {n} bytes; at most {MAX_VALUE}"),
            BadInput::Revision => write!(f, "a revision is INDEX.SUB (as in an ETag)"),
            BadInput::TxnTooLarge => write!(
                f,
                "a transaction has at most {MAX_TXN_OPS} comparisons and {MAX_TXN_OPS} changes per branch, {MAX_TXN_BYTES} bytes in all"
            ),
        }
    }
}

impl std::error::Error for BadInput {}

/// Checks a client's key: 1 to [`MAX_KEY`] bytes, no control characters.
pub fn check_key(key: &[u8]) -> Result<(), BadInput> {
    if key.is_empty() {
        return Err(BadInput::EmptyKey);
    }
    if key.len() > MAX_KEY {
        return Err(BadInput::KeyTooLong(key.len()));
    }
    if key.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(BadInput::ControlCharacter);
    }
    Ok(())
}

/// Checks a client's value: at most [`MAX_VALUE`] bytes.
pub fn check_value(value: &[u8]) -> Result<(), BadInput> {
    if value.len() > MAX_VALUE {
        return Err(BadInput::ValueTooLong(value.len()));
    }
    Ok(())
}

/// The store's key layout: a client's key `k` is stored as `u` + `k`;
/// the state machine's own keys start with `m` (the applied log id and
/// membership) and `c` (each client's last applied sequence number), so
/// no client key can collide with them.
pub(crate) mod layout {
    /// The prefix of clients' keys.
    pub const USER: u8 = b'u';
    /// The key of the last applied log id and membership.
    pub const APPLIED: &[u8] = b"m/applied";
    /// The prefix of the client sessions (last sequence number and last
    /// activity, by the log's clock).
    pub const CLIENT: u8 = b'c';
    /// The key of the log's clock (the last `Clock` applied, never back).
    pub const CLOCK: &[u8] = b"m/clock";
    /// The key of the store's format (`FORMAT`, a little-endian `u32`).
    pub const FORMAT_KEY: &[u8] = b"m/format";
    /// The format this build writes and reads: 3, client values behind a
    /// revision header (`machine::record`), sessions with their last
    /// answer, leases with their checkpointed remaining time-to-live (no
    /// deadline), the log's clock from 0 (no wall clock), and partial
    /// marks of any command. Formats 1 and 2 are refused.
    pub const FORMAT: u32 = 3;

    /// The stored key of a client's key.
    pub fn user(key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(key.len() + 1);
        k.push(USER);
        k.extend_from_slice(key);
        k
    }

    /// The stored key of a client's last sequence number.
    pub fn client(id: u64) -> Vec<u8> {
        let mut k = vec![CLIENT];
        k.extend_from_slice(&id.to_be_bytes());
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert_eq!(check_key(b""), Err(BadInput::EmptyKey));
        assert_eq!(check_key(b"a\nb"), Err(BadInput::ControlCharacter));
        assert_eq!(check_key(b"a\x7f"), Err(BadInput::ControlCharacter));
        assert_eq!(
            check_key(&vec![b'a'; MAX_KEY + 1]),
            Err(BadInput::KeyTooLong(MAX_KEY + 1))
        );
        assert!(check_key(&vec![b'a'; MAX_KEY]).is_ok());
        assert!(check_key("clé/1".as_bytes()).is_ok());
        assert!(check_value(&vec![0; MAX_VALUE]).is_ok());
        assert_eq!(
            check_value(&vec![0; MAX_VALUE + 1]),
            Err(BadInput::ValueTooLong(MAX_VALUE + 1))
        );
        // The stored key of the longest client key fits the store.
        assert_eq!(layout::user(&vec![b'a'; MAX_KEY]).len(), kvstore::MAX_KEY);
    }
}
