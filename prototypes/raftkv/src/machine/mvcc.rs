//! The multi-version layout (store format 4; docs/FORMAT.md).
//!
//! - **The index**: `k` + client key → the key's latest state: its
//!   create revision, the position (revision, sub-revision) of its latest
//!   version, its version count, its lease, and whether that latest
//!   version is a deletion (a tombstone, kept until compacted so that a
//!   read at an older revision still finds the key). No value: about 15
//!   bytes of varints a key beside the key itself, so the index of a
//!   million keys is tens of MiB and stays in the store's cache.
//! - **The versions**: `r` + revision (`u64`, big-endian) + sub-revision
//!   (`u32`, big-endian) → kind (put or delete), the key, its create
//!   revision, version and lease, the position of the key's previous
//!   version (the chain a read at an older revision follows back), and a
//!   put's value. Keys in revision order, so a change appends at the
//!   tree's right edge: sequential pages. The watch history *is* these
//!   records; there is no second copy of a value.
//! - `m/mvcc` → the store's revision, the compaction's revision (reads
//!   below it are refused), the revision whose compaction is done
//!   physically, and where the physical compaction goes on.
//!
//! A current read is the index and one version; a read at revision R
//! follows the chain back from the index to the first version at or
//! below R. A random overwrite at 1 M keys × 1 KiB touches the key's index
//! leaf (cached: the index is small), appends a version at the right
//! edge (about a third of a page a put), and — at the compaction that
//! passes it — deletes the version it superseded, wherever that lies
//! (one random leaf, read and written, as today's overwrite in place).
//!
//! Values are little-endian fixed fields or LEB128 varints; nothing read
//! is trusted: every decode checks its bounds and returns `None` on a
//! malformed value.

use crate::kv::KeyValue;

/// The prefix of the index.
pub(super) const INDEX: u8 = b'k';
/// The prefix of the versions.
pub(super) const RECORD: u8 = b'r';
/// The key of the store's revisions.
pub(super) const MVCC_STATE: &[u8] = b"m/mvcc";

/// Where a change is: its revision (etcd's main revision) and its
/// number among that revision's changes (the sub-revision). Written
/// `revision.sub` (a watch of the HTTP API resumes after one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// The revision.
    pub revision: i64,
    /// The change's number in it, from 0.
    pub sub: u32,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.revision, self.sub)
    }
}

impl std::str::FromStr for Position {
    type Err = String;

    /// Parses `revision.sub`.
    fn from_str(s: &str) -> Result<Position, String> {
        let bad = || format!("{s:?} is not a position REVISION.SUB");
        let (r, sub) = s.trim().split_once('.').ok_or_else(bad)?;
        Ok(Position {
            revision: r.parse().ok().filter(|r| *r >= 0).ok_or_else(bad)?,
            sub: sub.parse().map_err(|_| bad())?,
        })
    }
}

impl Position {
    /// The first position of `revision`.
    pub fn at(revision: i64) -> Position {
        Position { revision, sub: 0 }
    }

    /// The position right after this one.
    pub fn next(self) -> Position {
        match self.sub.checked_add(1) {
            Some(sub) => Position { sub, ..self },
            None => Position::at(self.revision.saturating_add(1)),
        }
    }
}

/// A key's entry in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct IndexEntry {
    /// The create revision of its latest version (0 for a tombstone).
    pub create: i64,
    /// Its latest version's position.
    pub latest: Position,
    /// Its version count (0 for a tombstone).
    pub version: i64,
    /// Its lease (0: none).
    pub lease: i64,
    /// The latest version is a deletion.
    pub tombstone: bool,
}

/// A version as stored, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    /// A put (else a deletion).
    pub put: bool,
    /// The client key.
    pub key: Vec<u8>,
    /// Its create revision (0 for a deletion).
    pub create: i64,
    /// Its version (0 for a deletion).
    pub version: i64,
    /// Its lease (0 for none, and for a deletion).
    pub lease: i64,
    /// The key's previous version, if it had one (it may have been
    /// compacted since).
    pub prev: Option<Position>,
}

impl Record {
    /// The version as etcd's `KeyValue` at `at`, with `value`.
    pub fn kv(&self, at: Position, value: &[u8]) -> KeyValue {
        KeyValue {
            key: self.key.clone(),
            create_revision: self.create,
            mod_revision: at.revision,
            version: self.version,
            value: value.to_vec(),
            lease: self.lease,
        }
    }
}

/// The stored key of `key`'s index entry.
pub(super) fn index_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(INDEX);
    k.extend_from_slice(key);
    k
}

/// The stored key of the version at `p`.
pub(super) fn record_key(p: Position) -> Vec<u8> {
    let mut k = Vec::with_capacity(13);
    k.push(RECORD);
    k.extend_from_slice(&(p.revision as u64).to_be_bytes());
    k.extend_from_slice(&p.sub.to_be_bytes());
    k
}

/// The position a version's stored key names; `None` if malformed.
pub(super) fn record_position(k: &[u8]) -> Option<Position> {
    if k.len() != 13 || k[0] != RECORD {
        return None;
    }
    let revision = i64::try_from(u64::from_be_bytes(k[1..9].try_into().ok()?)).ok()?;
    Some(Position {
        revision,
        sub: u32::from_be_bytes(k[9..13].try_into().ok()?),
    })
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A cursor over a stored value.
struct Reader<'a> {
    v: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.v.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// A varint that fits an `i64`.
    fn int(&mut self) -> Option<i64> {
        i64::try_from(self.varint()?).ok()
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let b = self.v.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(b)
    }

    fn rest(&self) -> &'a [u8] {
        self.v.get(self.at..).unwrap_or_default()
    }
}

/// An index entry's stored value.
pub(super) fn encode_index(e: &IndexEntry) -> Vec<u8> {
    let mut v = Vec::with_capacity(20);
    v.push(u8::from(e.tombstone));
    for x in [e.create, e.latest.revision] {
        put_varint(&mut v, x as u64);
    }
    put_varint(&mut v, u64::from(e.latest.sub));
    for x in [e.version, e.lease] {
        put_varint(&mut v, x as u64);
    }
    v
}

/// An index entry from its stored value; `None` if malformed.
pub(super) fn decode_index(v: &[u8]) -> Option<IndexEntry> {
    let mut r = Reader { v, at: 0 };
    let tombstone = match r.byte()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let e = IndexEntry {
        tombstone,
        create: r.int()?,
        latest: Position {
            revision: r.int()?,
            sub: u32::try_from(r.varint()?).ok()?,
        },
        version: r.int()?,
        lease: r.int()?,
    };
    r.rest().is_empty().then_some(e)
}

/// A version's stored value: the record, then the value.
pub(super) fn encode_record(rec: &Record, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(32 + rec.key.len() + value.len());
    v.push(u8::from(rec.put));
    put_varint(&mut v, rec.key.len() as u64);
    v.extend_from_slice(&rec.key);
    for x in [rec.create, rec.version, rec.lease] {
        put_varint(&mut v, x as u64);
    }
    match rec.prev {
        None => v.push(0),
        Some(p) => {
            v.push(1);
            put_varint(&mut v, p.revision as u64);
            put_varint(&mut v, u64::from(p.sub));
        }
    }
    v.extend_from_slice(value);
    v
}

/// A version from its stored value, and the value; `None` if malformed
/// (a deletion with a value, a key not a client's).
pub(super) fn decode_record(v: &[u8]) -> Option<(Record, &[u8])> {
    let mut r = Reader { v, at: 0 };
    let put = match r.byte()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let len = usize::try_from(r.varint()?).ok()?;
    let key = r.bytes(len)?.to_vec();
    crate::check::check_key(&key).ok()?;
    let (create, version, lease) = (r.int()?, r.int()?, r.int()?);
    let prev = match r.byte()? {
        0 => None,
        1 => Some(Position {
            revision: r.int()?,
            sub: u32::try_from(r.varint()?).ok()?,
        }),
        _ => return None,
    };
    let value = r.rest();
    if !put && (!value.is_empty() || create != 0 || version != 0 || lease != 0) {
        return None;
    }
    let rec = Record {
        put,
        key,
        create,
        version,
        lease,
        prev,
    };
    Some((rec, value))
}

/// The store's revisions, as `m/mvcc` holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MvccState {
    /// The store's revision: the last change's (1 for a new store).
    pub rev: i64,
    /// The compaction's revision: reads below it are refused (0: none).
    pub compact: i64,
    /// The compaction whose removals are done (physically).
    pub physical: i64,
    /// The next version the physical compaction looks at.
    pub cursor: Position,
}

impl Default for MvccState {
    fn default() -> Self {
        MvccState {
            rev: 1,
            compact: 0,
            physical: 0,
            cursor: Position::default(),
        }
    }
}

impl MvccState {
    /// The stored form: four `u64` and a `u32`, little-endian.
    pub fn encode(&self) -> [u8; 36] {
        let mut v = [0u8; 36];
        let fields = [self.rev, self.compact, self.physical, self.cursor.revision];
        for (i, x) in fields.into_iter().enumerate() {
            v[i * 8..i * 8 + 8].copy_from_slice(&(x as u64).to_le_bytes());
        }
        v[32..].copy_from_slice(&self.cursor.sub.to_le_bytes());
        v
    }

    /// From the stored form; `None` if malformed or inconsistent.
    pub fn decode(v: &[u8]) -> Option<MvccState> {
        let v: &[u8; 36] = v.try_into().ok()?;
        let int = |i: usize| {
            let x = u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().ok()?);
            i64::try_from(x).ok()
        };
        let s = MvccState {
            rev: int(0)?,
            compact: int(1)?,
            physical: int(2)?,
            cursor: Position {
                revision: int(3)?,
                sub: u32::from_le_bytes(v[32..].try_into().ok()?),
            },
        };
        let ok = s.rev >= 1 && s.compact <= s.rev && s.physical <= s.compact;
        ok.then_some(s)
    }
}

/// Whether a stored `k` or `r` pair is well formed (a snapshot's check).
pub(super) fn valid(k: &[u8], v: &[u8]) -> bool {
    match k.first() {
        Some(&INDEX) => crate::check::check_key(&k[1..]).is_ok() && decode_index(v).is_some(),
        Some(&RECORD) => record_position(k).is_some() && decode_record(v).is_some(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_versions_and_the_state_round_trip_and_damage_is_refused() {
        let e = IndexEntry {
            create: 7,
            latest: Position {
                revision: 1 << 40,
                sub: 3,
            },
            version: 12,
            lease: i64::MAX,
            tombstone: false,
        };
        assert_eq!(decode_index(&encode_index(&e)), Some(e));
        let mut bad = encode_index(&e);
        bad.push(0);
        assert_eq!(decode_index(&bad), None);
        assert_eq!(decode_index(&[2, 0, 0, 0, 0, 0]), None);
        let rec = Record {
            put: true,
            key: b"a\0b".to_vec(),
            create: 7,
            version: 2,
            lease: 0,
            prev: Some(Position {
                revision: 9,
                sub: 0,
            }),
        };
        let v = encode_record(&rec, b"value");
        assert_eq!(decode_record(&v), Some((rec.clone(), &b"value"[..])));
        // Truncated inside the key; a deletion with a value.
        assert_eq!(decode_record(&v[..3]), None);
        let del = Record {
            put: false,
            create: 0,
            version: 0,
            prev: None,
            ..rec.clone()
        };
        assert!(decode_record(&encode_record(&del, b"")).is_some());
        assert_eq!(decode_record(&encode_record(&del, b"x")), None);
        // A varint that never ends.
        assert_eq!(
            decode_index(&[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        let p = Position {
            revision: 5,
            sub: 2,
        };
        assert_eq!(record_position(&record_key(p)), Some(p));
        assert!(record_key(p) < record_key(p.next()));
        assert!(record_key(Position::at(255)) < record_key(Position::at(256)));
        assert_eq!("5.2".parse::<Position>(), Ok(p));
        assert!("5".parse::<Position>().is_err());
        let s = MvccState {
            rev: 10,
            compact: 4,
            physical: 3,
            cursor: p,
        };
        assert_eq!(MvccState::decode(&s.encode()), Some(s));
        let wrong = MvccState { compact: 11, ..s };
        assert_eq!(MvccState::decode(&wrong.encode()), None);
    }
}
