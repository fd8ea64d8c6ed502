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
        SnapshotData = crate::machine::SnapshotFile,
);

/// The Raft handle of a raftkv node.
pub type Raft = openraft::Raft<TypeConfig>;

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

/// A write in the Raft log.
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
    /// The leader's clock when it proposed the entry, first in every
    /// batch it proposes, and the session time-to-live it runs with: the
    /// state machine expires client sessions by this time, decided in the
    /// log, so every replica expires the same sessions at the same index
    /// (the Raft dissertation, §6.3).
    Clock {
        /// Milliseconds since the Unix epoch, on the leader.
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
        }
    }
}

/// The commands of one log entry, applied in order. The leader gathers
/// the writes that arrive while earlier ones are being committed into one
/// entry: openraft 0.9 makes each entry durable on the leader before it
/// takes the next, so an entry per write would cost a log flush per write.
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
    /// Applied (or a clock, which changes only the sessions).
    Applied,
    /// Its request id is the session's last one: a retry of a request
    /// applied before; nothing changed this time.
    Duplicate,
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
}

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadInput::EmptyKey => write!(f, "the key is empty"),
            BadInput::KeyTooLong(n) => write!(f, "the key is {n} bytes; at most {MAX_KEY}"),
            BadInput::ControlCharacter => write!(f, "the key holds a control character"),
            BadInput::ValueTooLong(n) => write!(f, "the value is {n} bytes; at most {MAX_VALUE}"),
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
    /// The key of the log's clock (the last `Clock` applied).
    pub const CLOCK: &[u8] = b"m/clock";

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
