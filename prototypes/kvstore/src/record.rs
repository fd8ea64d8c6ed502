//! The log record of one transaction: physiological redo, one operation
//! per page change (ARIES; PostgreSQL's heap and btree records).
//!
//! - a leaf change is logged as the cell put or the key removed, so the
//!   log written per put does not grow with the data;
//! - a page's first change after a checkpoint began is logged as the
//!   page's full image after the change (PostgreSQL's full_page_writes):
//!   it repairs a page a crash tore while it was written home;
//! - a leaf split logs the new right page's image, the left page's
//!   truncation at the separator (and the put, if the new cell went left)
//!   and the separator's insertion into the parent (PostgreSQL's nbtree
//!   split record has the same shape); other structural changes (a page
//!   freed or allocated, a branch split or emptied, a root replaced) log
//!   the images of every page they rewrote; meta values are logged when
//!   they change. All of it goes in the transaction's one record: a split
//!   replays whole or not at all.
//!
//! Redo applies a record's operations on a page only if the page's LSN is
//! below the record's (images always apply): idempotent.
//!
//! ```text
//! 0 4 magic "KVT2"   4 2 version   6 2 zero   8 4 operations
//! per operation, 1 kind:
//!   1 image:  4 page, 2 head length, 2 tail length, head, tail
//!   2 put:    4 page, 4 cell length, leaf cell
//!   3 delete: 4 page, 2 key length, key
//!   4 meta:   4 root, 4 end, 4 free-list head
//!   5 truncate: 4 page, 2 key length, key (a leaf's cells from key on go)
//!   6 branch put: 4 page, 4 cell length, branch cell
//! ```

use crate::page::{Page, PageNo, FORMAT_VERSION};
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"KVT2";

/// One operation of a transaction, as the user gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Insert or replace.
    Put(Vec<u8>, Vec<u8>),
    /// Remove (nothing if absent).
    Delete(Vec<u8>),
}

impl Op {
    /// The key it touches.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Put(k, _) | Op::Delete(k) => k,
        }
    }
}

/// One logged page change.
#[derive(Debug, Clone)]
pub(crate) enum LogOp {
    /// The page's image after the change: bytes below and above its hole.
    Image {
        page: PageNo,
        head: Vec<u8>,
        tail: Vec<u8>,
    },
    /// An image to encode, straight from the page (what a transaction
    /// logs; decoding yields [`LogOp::Image`]): no copy of the page's
    /// bytes before the record's.
    Whole(Arc<Page>),
    /// A leaf cell put (replacing the cell of the same key).
    Put { page: PageNo, cell: Vec<u8> },
    /// A leaf key removed.
    Delete { page: PageNo, key: Vec<u8> },
    /// A leaf's cells from `key` on removed (the left half of a split).
    Truncate { page: PageNo, key: Vec<u8> },
    /// A branch cell inserted (a split's separator in the parent).
    BranchPut { page: PageNo, cell: Vec<u8> },
    /// The meta page's new values.
    Meta {
        root: PageNo,
        end: PageNo,
        free_head: PageNo,
    },
}

impl LogOp {
    fn encoded_len(&self) -> usize {
        match self {
            LogOp::Image { head, tail, .. } => 9 + head.len() + tail.len(),
            LogOp::Whole(p) => {
                let (head, tail) = p.image();
                9 + head.len() + tail.len()
            }
            LogOp::Put { cell, .. } | LogOp::BranchPut { cell, .. } => 9 + cell.len(),
            LogOp::Delete { key, .. } | LogOp::Truncate { key, .. } => 7 + key.len(),
            LogOp::Meta { .. } => 13,
        }
    }
}

/// The record's size, before encoding it.
pub(crate) fn encoded_len(ops: &[LogOp]) -> usize {
    12 + ops.iter().map(LogOp::encoded_len).sum::<usize>()
}

fn encode_image(out: &mut Vec<u8>, page: PageNo, head: &[u8], tail: &[u8]) {
    out.push(1);
    out.extend_from_slice(&page.to_le_bytes());
    out.extend_from_slice(&(head.len() as u16).to_le_bytes());
    out.extend_from_slice(&(tail.len() as u16).to_le_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(tail);
}

/// Encodes a transaction's record.
#[cfg(test)]
pub(crate) fn encode(ops: &[LogOp]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(ops, &mut out);
    out
}

/// Encodes a transaction's record into `out` (cleared first), so a
/// writer can reuse one buffer.
pub(crate) fn encode_into(ops: &[LogOp], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(encoded_len(ops));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            LogOp::Image { page, head, tail } => encode_image(out, *page, head, tail),
            LogOp::Whole(p) => {
                let (head, tail) = p.image();
                encode_image(out, p.number(), head, tail);
            }
            LogOp::Put { page, cell } | LogOp::BranchPut { page, cell } => {
                out.push(if matches!(op, LogOp::Put { .. }) {
                    2
                } else {
                    6
                });
                out.extend_from_slice(&page.to_le_bytes());
                out.extend_from_slice(&(cell.len() as u32).to_le_bytes());
                out.extend_from_slice(cell);
            }
            LogOp::Delete { page, key } | LogOp::Truncate { page, key } => {
                out.push(if matches!(op, LogOp::Delete { .. }) {
                    3
                } else {
                    5
                });
                out.extend_from_slice(&page.to_le_bytes());
                out.extend_from_slice(&(key.len() as u16).to_le_bytes());
                out.extend_from_slice(key);
            }
            LogOp::Meta {
                root,
                end,
                free_head,
            } => {
                out.push(4);
                for v in [root, end, free_head] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undecodable {
    /// Not a transaction record, or cut short.
    Malformed,
    /// Another format version.
    Version(u16),
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Undecodable> {
        let end = self.at.checked_add(n).ok_or(Undecodable::Malformed)?;
        let s = self.b.get(self.at..end).ok_or(Undecodable::Malformed)?;
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, Undecodable> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, Undecodable> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Decodes a transaction record.
pub(crate) fn decode(b: &[u8]) -> Result<Vec<LogOp>, Undecodable> {
    let mut c = Cursor { b, at: 0 };
    let magic = c.take(4)?;
    let version = c.u16()?;
    if magic != MAGIC {
        // Format 1's records ("KVTX") name their version too.
        return Err(if magic == b"KVTX" {
            Undecodable::Version(version)
        } else {
            Undecodable::Malformed
        });
    }
    if version != FORMAT_VERSION {
        return Err(Undecodable::Version(version));
    }
    c.take(2)?;
    let n = c.u32()? as usize;
    // An operation takes at least 7 bytes: the capacity is bounded by the
    // record's length, not by the count read from it.
    let mut ops = Vec::with_capacity(n.min(b.len() / 7));
    for _ in 0..n {
        let kind = c.take(1)?[0];
        ops.push(match kind {
            1 => {
                let page = c.u32()?;
                let h = c.u16()? as usize;
                let t = c.u16()? as usize;
                LogOp::Image {
                    page,
                    head: c.take(h)?.to_vec(),
                    tail: c.take(t)?.to_vec(),
                }
            }
            2 | 6 => {
                let page = c.u32()?;
                let len = c.u32()? as usize;
                let cell = c.take(len)?.to_vec();
                if kind == 2 {
                    LogOp::Put { page, cell }
                } else {
                    LogOp::BranchPut { page, cell }
                }
            }
            3 | 5 => {
                let page = c.u32()?;
                let len = c.u16()? as usize;
                let key = c.take(len)?.to_vec();
                if kind == 3 {
                    LogOp::Delete { page, key }
                } else {
                    LogOp::Truncate { page, key }
                }
            }
            4 => LogOp::Meta {
                root: c.u32()?,
                end: c.u32()?,
                free_head: c.u32()?,
            },
            _ => return Err(Undecodable::Malformed),
        });
    }
    if c.at != b.len() {
        return Err(Undecodable::Malformed);
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_cut_record_is_malformed() {
        let ops = vec![
            LogOp::Image {
                page: 3,
                head: vec![1; 40],
                tail: vec![2; 100],
            },
            LogOp::Put {
                page: 9,
                cell: vec![7; 30],
            },
            LogOp::Delete {
                page: 9,
                key: b"k".to_vec(),
            },
            LogOp::Meta {
                root: 3,
                end: 12,
                free_head: 0,
            },
            LogOp::Truncate {
                page: 4,
                key: b"m".to_vec(),
            },
            LogOp::BranchPut {
                page: 5,
                cell: vec![1; 9],
            },
        ];
        let b = encode(&ops);
        assert_eq!(b.len(), encoded_len(&ops));
        assert_eq!(format!("{:?}", decode(&b).unwrap()), format!("{ops:?}"));
        // A page's image encoded from the page reads back as its image.
        let mut page = Page::new(6, crate::page::Kind::Overflow);
        page.set_link(8);
        let (head, tail) = page.image();
        let image = LogOp::Image {
            page: 6,
            head: head.to_vec(),
            tail: tail.to_vec(),
        };
        assert_eq!(encode(&[LogOp::Whole(Arc::new(page))]), encode(&[image]));
        for cut in [0, 5, 11, b.len() - 1] {
            assert!(decode(&b[..cut]).is_err(), "{cut}");
        }
        let mut old = b.clone();
        old[..4].copy_from_slice(b"KVTX");
        old[4..6].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(decode(&old).unwrap_err(), Undecodable::Version(1));
    }
}
