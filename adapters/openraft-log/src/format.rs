//! The records the adapter writes into the journal, one journal entry
//! each.
//!
//! | offset | size | field | meaning |
//! |---:|---:|---|---|
//! | 0 | 1 | `version` | `1` |
//! | 1 | 1 | `kind` | 1 entry, 2 vote, 3 committed, 4 truncate, 5 purge, 6 state |
//! | 2 | 8 | `index` | little-endian log index: the entry's (entry), the first index removed (truncate), the last index removed (purge); 0 otherwise |
//! | 10 | 2 | `head_len` | little-endian length `H` of the head |
//! | 12 | `H` | head | postcard: the `LogId` (entry, purge), the `Vote` (vote), an `Option<LogId>` (committed), the vote, committed and purged ids (state); empty (truncate) |
//! | 12 + `H` | rest | entry | postcard: the openraft entry (entry records only) |
//!
//! Opening the log reads only the fixed header and the head of each
//! record — the index needs the log id, not the entry — so the entries are
//! never decoded at open. The journal's CRC already covers the bytes;
//! what is checked here is that they are a record of this format: the
//! version, the kind, every length against the bytes present (checked
//! arithmetic), the head's log index against the header's.
//!
//! Serde format: postcard (varint integers, no field names), measured
//! against JSON on the entries openraft writes: smaller and cheaper to
//! encode and decode (docs/PERFORMANCE.md, "Raft log"); bincode's last
//! release is a tombstone of an unmaintained crate.

use openraft::vote::{RaftCommittedLeaderId, RaftVote};
use openraft::LogId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The format version written.
pub const VERSION: u8 = 1;

/// Bytes before the head.
pub const HEADER_SIZE: usize = 12;

const ENTRY: u8 = 1;
const VOTE: u8 = 2;
const COMMITTED: u8 = 3;
const TRUNCATE: u8 = 4;
const PURGE: u8 = 5;
const STATE: u8 = 6;

/// A record, without the entry an entry record carries: log ids of
/// committed leader id `L`, votes of type `V` (openraft's
/// `CommittedLeaderIdOf<C>` and `VoteOf<C>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<L: RaftCommittedLeaderId, V: RaftVote> {
    /// A log entry with this id.
    Entry(LogId<L>),
    /// The vote.
    Vote(V),
    /// The committed log id.
    Committed(Option<LogId<L>>),
    /// Entries at and after this index are gone.
    Truncate(u64),
    /// Entries up to and including this id are gone.
    Purge(LogId<L>),
    /// Everything but the entries, rewritten by a purge so that the
    /// checkpoint can move past older records.
    State {
        /// The vote.
        vote: Option<V>,
        /// The committed id.
        committed: Option<LogId<L>>,
        /// The last purged id.
        purged: Option<LogId<L>>,
    },
}

/// The head of a state record.
#[derive(Serialize, Deserialize)]
#[serde(bound(
    serialize = "L: RaftCommittedLeaderId, V: RaftVote",
    deserialize = "L: RaftCommittedLeaderId, V: RaftVote"
))]
struct StateHead<L: RaftCommittedLeaderId, V: RaftVote> {
    vote: Option<V>,
    committed: Option<LogId<L>>,
    purged: Option<LogId<L>>,
}

/// Why bytes are not a record of this format.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than the header or its head length says.
    Short {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A version this build does not read.
    Version(u8),
    /// An unknown kind.
    Kind(u8),
    /// The head or the entry does not decode.
    Decode(postcard::Error),
    /// A head longer than the header's 16-bit length can say (encoding).
    HeadTooLong(usize),
    /// The head's log index is not the header's.
    IndexMismatch {
        /// In the header.
        header: u64,
        /// In the head.
        head: u64,
    },
    /// An entry that does not follow the last one (log indexes are
    /// consecutive; openraft truncates before it overwrites).
    Gap {
        /// The index expected next.
        expected: u64,
        /// The entry's.
        got: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Short { need, have } => write!(f, "{have} bytes, {need} needed"),
            Error::Version(v) => write!(f, "format version {v} is not {VERSION}"),
            Error::Kind(k) => write!(f, "unknown record kind {k}"),
            Error::Decode(e) => write!(f, "does not decode: {e}"),
            Error::HeadTooLong(n) => write!(f, "a head of {n} bytes"),
            Error::IndexMismatch { header, head } => {
                write!(f, "header says index {header}, head says {head}")
            }
            Error::Gap { expected, got } => {
                write!(f, "entry {got} where entry {expected} comes next")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Decode(e) => Some(e),
            _ => None,
        }
    }
}

fn frame(kind: u8, index: u64, head: &[u8], entry: &[u8]) -> Result<Vec<u8>, Error> {
    let head_len = u16::try_from(head.len()).map_err(|_| Error::HeadTooLong(head.len()))?;
    let mut out = Vec::with_capacity(HEADER_SIZE + head.len() + entry.len());
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&head_len.to_le_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(entry);
    Ok(out)
}

fn to_vec<T: Serialize>(v: &T) -> Result<Vec<u8>, Error> {
    postcard::to_allocvec(v).map_err(Error::Decode)
}

fn from_bytes<T: DeserializeOwned>(b: &[u8]) -> Result<T, Error> {
    postcard::from_bytes(b).map_err(Error::Decode)
}

/// An entry record: the header, the log id, the entry.
pub fn encode_entry<L: RaftCommittedLeaderId, E: Serialize>(
    id: &LogId<L>,
    entry: &E,
) -> Result<Vec<u8>, Error> {
    frame(ENTRY, id.index, &to_vec(id)?, &to_vec(entry)?)
}

/// The entry of an entry record.
pub fn decode_entry<E: DeserializeOwned>(bytes: &[u8]) -> Result<E, Error> {
    let p = split(bytes)?;
    if p.kind != ENTRY {
        return Err(Error::Kind(p.kind));
    }
    from_bytes(p.rest)
}

/// A record's fields, every length checked.
struct Parts<'a> {
    kind: u8,
    index: u64,
    head: &'a [u8],
    /// The entry, for an entry record.
    rest: &'a [u8],
}

fn split(bytes: &[u8]) -> Result<Parts<'_>, Error> {
    let short = |need| Error::Short {
        need,
        have: bytes.len(),
    };
    let (header, body) = bytes
        .split_first_chunk::<HEADER_SIZE>()
        .ok_or(short(HEADER_SIZE))?;
    if header[0] != VERSION {
        return Err(Error::Version(header[0]));
    }
    let mut index = [0u8; 8];
    index.copy_from_slice(&header[2..10]);
    let head_len = usize::from(u16::from_le_bytes([header[10], header[11]]));
    if body.len() < head_len {
        return Err(short(HEADER_SIZE + head_len));
    }
    let (head, rest) = body.split_at(head_len);
    Ok(Parts {
        kind: header[1],
        index: u64::from_le_bytes(index),
        head,
        rest,
    })
}

impl<L: RaftCommittedLeaderId, V: RaftVote> Record<L, V> {
    /// The record's bytes; for an entry record use [`encode_entry`].
    pub fn encode_without_entry(&self) -> Result<Vec<u8>, Error> {
        match self {
            Record::Entry(id) => frame(ENTRY, id.index, &to_vec(id)?, &[]),
            Record::Vote(v) => frame(VOTE, 0, &to_vec(v)?, &[]),
            Record::Committed(c) => frame(COMMITTED, 0, &to_vec(c)?, &[]),
            Record::Truncate(since) => frame(TRUNCATE, *since, &[], &[]),
            Record::Purge(upto) => frame(PURGE, upto.index, &to_vec(upto)?, &[]),
            Record::State {
                vote,
                committed,
                purged,
            } => {
                let head = StateHead {
                    vote: vote.clone(),
                    committed: committed.clone(),
                    purged: purged.clone(),
                };
                frame(STATE, 0, &to_vec(&head)?, &[])
            }
        }
    }

    /// The record in `bytes`, without decoding an entry record's entry.
    pub fn decode_header(bytes: &[u8]) -> Result<Self, Error> {
        let Parts {
            kind, index, head, ..
        } = split(bytes)?;
        let checked = |id: LogId<L>| {
            if id.index == index {
                Ok(id)
            } else {
                Err(Error::IndexMismatch {
                    header: index,
                    head: id.index,
                })
            }
        };
        Ok(match kind {
            ENTRY => Record::Entry(checked(from_bytes(head)?)?),
            VOTE => Record::Vote(from_bytes(head)?),
            COMMITTED => Record::Committed(from_bytes(head)?),
            TRUNCATE => Record::Truncate(index),
            PURGE => Record::Purge(checked(from_bytes(head)?)?),
            STATE => {
                let h: StateHead<L, V> = from_bytes(head)?;
                Record::State {
                    vote: h.vote,
                    committed: h.committed,
                    purged: h.purged,
                }
            }
            k => return Err(Error::Kind(k)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::impls::leader_id_adv::LeaderId;
    use openraft::impls::Vote;

    type Leader = LeaderId<u64, u64>;
    type Rec = Record<Leader, Vote<Leader>>;

    fn id(term: u64, index: u64) -> LogId<Leader> {
        LogId::new(LeaderId { term, node_id: 1 }, index)
    }

    fn vote(term: u64, node_id: u64) -> Vote<Leader> {
        Vote::new(term, node_id)
    }

    #[test]
    fn records_round_trip() {
        let records = [
            Record::Entry(id(2, 7)),
            Record::Vote(vote(3, 1)),
            Record::Committed(Some(id(2, 5))),
            Record::Committed(None),
            Record::Truncate(9),
            Record::Purge(id(1, 3)),
            Record::State {
                vote: Some(vote(3, 2)),
                committed: None,
                purged: Some(id(1, 3)),
            },
        ];
        for r in records {
            let b = r.encode_without_entry().unwrap();
            assert_eq!(Rec::decode_header(&b).unwrap(), r);
        }
        let b = encode_entry(&id(4, 11), &"payload".to_string()).unwrap();
        assert_eq!(Rec::decode_header(&b).unwrap(), Record::Entry(id(4, 11)));
        assert_eq!(decode_entry::<String>(&b).unwrap(), "payload");
    }

    #[test]
    fn bytes_that_are_no_record_are_typed_errors() {
        let good = encode_entry(&id(4, 11), &"payload".to_string()).unwrap();
        let dec = |b: &[u8]| Rec::decode_header(b);
        for n in 0..HEADER_SIZE {
            assert!(matches!(dec(&good[..n]), Err(Error::Short { .. })));
        }
        let mut b = good.clone();
        b[0] = 2;
        assert!(matches!(dec(&b), Err(Error::Version(2))));
        let mut b = good.clone();
        b[1] = 99;
        assert!(matches!(dec(&b), Err(Error::Kind(99))));
        let mut b = good.clone();
        b[10..12].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(dec(&b), Err(Error::Short { .. })));
        let mut b = good.clone();
        b[2] ^= 1;
        assert!(matches!(dec(&b), Err(Error::IndexMismatch { .. })));
        // Every truncation and every single-byte change decodes or is an
        // error, never a panic.
        for n in 0..good.len() {
            let _ = dec(&good[..n]);
            let _ = decode_entry::<String>(&good[..n]);
            for v in [0u8, 0x7f, 0x80, 0xff] {
                let mut b = good.clone();
                b[n] = v;
                let _ = dec(&b);
                let _ = decode_entry::<String>(&b);
            }
        }
    }
}
