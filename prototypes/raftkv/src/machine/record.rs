//! How a client's key is stored: `u` + key → a 32-byte header, then the
//! value. The header is the key's create revision and its modification
//! revision, each a log index (`u64`) and a position in the entry
//! (`u32`), and the lease it is attached to, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | create revision: log index |
//! | 8..12 | create revision: position |
//! | 12..20 | modification revision: log index |
//! | 20..24 | modification revision: position |
//! | 24..32 | lease id (0: none) |
//! | 32.. | the value |

use crate::types::Revision;
use serde::{Deserialize, Serialize};

/// The bytes of the header before a stored value.
pub const HEADER: usize = 32;

/// A key's revisions, as etcd keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyMeta {
    /// When the key was created (last put while absent).
    pub create: Revision,
    /// When it was last put.
    pub modified: Revision,
    /// The lease it is attached to, if any.
    pub lease: Option<u64>,
}

/// The stored form of `value` with `meta`.
pub(crate) fn encode(meta: KeyMeta, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + value.len());
    for r in [meta.create, meta.modified] {
        v.extend_from_slice(&r.index.to_le_bytes());
        v.extend_from_slice(&r.sub.to_le_bytes());
    }
    v.extend_from_slice(&meta.lease.unwrap_or(0).to_le_bytes());
    v.extend_from_slice(value);
    v
}

/// The header and value of a stored value; `None` if it is shorter than
/// the header.
pub(crate) fn decode(stored: &[u8]) -> Option<(KeyMeta, &[u8])> {
    let rev = |b: &[u8]| -> Option<Revision> {
        Some(Revision {
            index: u64::from_le_bytes(b.get(..8)?.try_into().ok()?),
            sub: u32::from_le_bytes(b.get(8..12)?.try_into().ok()?),
        })
    };
    let lease = u64::from_le_bytes(stored.get(24..32)?.try_into().ok()?);
    let meta = KeyMeta {
        create: rev(stored.get(..12)?)?,
        modified: rev(stored.get(12..24)?)?,
        lease: (lease != 0).then_some(lease),
    };
    Some((meta, stored.get(HEADER..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_short_one_is_refused() {
        let meta = KeyMeta {
            create: Revision { index: 7, sub: 1 },
            modified: Revision {
                index: u64::MAX,
                sub: 1024,
            },
            lease: Some(3),
        };
        let v = encode(meta, b"value");
        assert_eq!(v.len(), HEADER + 5);
        assert_eq!(decode(&v), Some((meta, &b"value"[..])));
        assert_eq!(decode(&v[..HEADER]), Some((meta, &b""[..])));
        assert_eq!(decode(&v[..HEADER - 1]), None);
    }
}
