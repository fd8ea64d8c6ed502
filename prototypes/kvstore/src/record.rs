//! The log record of one transaction: per bucket it touches, the bucket's
//! full image when this is its first change since a checkpoint began, and
//! the operations. Replay is idempotent: an operation applies only to a
//! bucket whose pageLSN is below the record's LSN.
//!
//! The image is the bucket's whole content (serialized entries) with its
//! pageLSN: its pages are a pure function of that, so it restores torn
//! pages as page bytes would, without logging their free space (as
//! PostgreSQL leaves the free "hole" of a page out of its images).
//!
//! ```text
//! 0 4 magic "KVTX"   4 2 version   6 2 sections
//! per section: 4 bucket, 1 has image, 4 operations,
//!              [image: 8 pageLSN, 4 length, serialized entries],
//!              operations × (1 kind: 1 put, 2 delete; 2 key length;
//!                            4 value length; key; value)
//! ```

use crate::page::FORMAT_VERSION;
use journal_core::Lsn;

const MAGIC: &[u8; 4] = b"KVTX";

/// One operation.
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

/// A transaction's changes to one bucket.
#[derive(Debug)]
pub(crate) struct Section {
    pub bucket: u32,
    /// The bucket's full image before these operations (its pageLSN and
    /// serialized entries), if this is its first change in the epoch.
    pub image: Option<(Lsn, Vec<u8>)>,
    pub ops: Vec<Op>,
}

/// The record's size, before encoding it.
pub(crate) fn encoded_len(sections: &[Section]) -> usize {
    8 + sections
        .iter()
        .map(|s| {
            9 + s.image.as_ref().map_or(0, |(_, b)| 12 + b.len())
                + s.ops
                    .iter()
                    .map(|o| {
                        7 + match o {
                            Op::Put(k, v) => k.len() + v.len(),
                            Op::Delete(k) => k.len(),
                        }
                    })
                    .sum::<usize>()
        })
        .sum::<usize>()
}

/// Encodes a transaction.
pub(crate) fn encode(sections: &[Section]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(sections));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(sections.len() as u16).to_le_bytes());
    for s in sections {
        out.extend_from_slice(&s.bucket.to_le_bytes());
        out.push(u8::from(s.image.is_some()));
        out.extend_from_slice(&(s.ops.len() as u32).to_le_bytes());
        if let Some((lsn, bytes)) = &s.image {
            out.extend_from_slice(&lsn.0.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
        for o in &s.ops {
            let (kind, k, v): (u8, &[u8], &[u8]) = match o {
                Op::Put(k, v) => (1, k, v),
                Op::Delete(k) => (2, k, &[]),
            };
            out.push(kind);
            out.extend_from_slice(&(k.len() as u16).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
    }
    out
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undecodable {
    /// Not a transaction record, or cut short.
    Malformed,
    /// A newer format.
    Newer(u16),
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Undecodable> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or(Undecodable::Malformed)?;
        self.at += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Undecodable> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, Undecodable> {
        self.array().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, Undecodable> {
        self.array().map(u32::from_le_bytes)
    }
}

/// Decodes a transaction record.
pub(crate) fn decode(b: &[u8]) -> Result<Vec<Section>, Undecodable> {
    let mut c = Cursor { b, at: 0 };
    if c.take(4)? != MAGIC {
        return Err(Undecodable::Malformed);
    }
    let version = c.u16()?;
    if version != FORMAT_VERSION {
        return Err(Undecodable::Newer(version));
    }
    let n = c.u16()?;
    // A section takes at least 9 bytes: the capacity is bounded by the
    // record's length, not by a count read from it.
    let mut sections = Vec::with_capacity((n as usize).min(b.len() / 9));
    for _ in 0..n {
        let bucket = c.u32()?;
        let has_image = c.take(1)?[0];
        let ops = c.u32()?;
        let image = match has_image {
            0 => None,
            1 => {
                let lsn = Lsn(u64::from_le_bytes(c.array()?));
                let len = c.u32()? as usize;
                Some((lsn, c.take(len)?.to_vec()))
            }
            _ => return Err(Undecodable::Malformed),
        };
        let mut list = Vec::with_capacity(ops.min(1 << 16) as usize);
        for _ in 0..ops {
            let kind = c.take(1)?[0];
            let klen = c.u16()? as usize;
            let vlen = c.u32()? as usize;
            let k = c.take(klen)?.to_vec();
            let v = c.take(vlen)?.to_vec();
            list.push(match kind {
                1 => Op::Put(k, v),
                2 => Op::Delete(k),
                _ => return Err(Undecodable::Malformed),
            });
        }
        sections.push(Section {
            bucket,
            image,
            ops: list,
        });
    }
    if c.at != b.len() {
        return Err(Undecodable::Malformed);
    }
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let s = vec![
            Section {
                bucket: 3,
                image: Some((Lsn(7), b"image".to_vec())),
                ops: vec![
                    Op::Put(b"k".to_vec(), b"v".to_vec()),
                    Op::Delete(b"z".to_vec()),
                ],
            },
            Section {
                bucket: 9,
                image: None,
                ops: vec![Op::Put(vec![1; 1024], vec![2; 65536])],
            },
        ];
        let b = encode(&s);
        assert_eq!(b.len(), encoded_len(&s));
        let d = decode(&b).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].bucket, d[0].image.is_some(), &d[0].ops),
            (3, true, &s[0].ops)
        );
        assert_eq!(d[0].image, s[0].image);
        assert_eq!((d[1].bucket, &d[1].ops), (9, &s[1].ops));
        assert_eq!(
            decode(&b[..b.len() - 1]).unwrap_err(),
            Undecodable::Malformed
        );
    }
}
