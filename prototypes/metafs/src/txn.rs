//! The transaction record: one journal record per committed transaction.
//!
//! Physical journaling, as jbd2 does it: a transaction logs the full image
//! of every metadata block it changed (inode-table, bitmap, directory and
//! indirect blocks), and the numbers of the metadata blocks it freed
//! (*revokes*). Replay writes the images home in log order, skipping an
//! image of a block that a transaction at or after it revoked — the block
//! may hold file data by then.
//!
//! ```text
//! offset size field
//!      0    4 magic "MTXN"
//!      4    2 version (1)
//!      6    2 reserved
//!      8    8 transaction id (increasing)
//!     16    4 n: block images
//!     20    4 r: revoked blocks
//!     24    …  n × (block number u32, 4096 bytes of image)
//!      …    …  r × block number u32
//! ```
//!
//! The journal checksums and frames the record; a transaction is in the
//! log whole or not at all.

use crate::layout::{u32_at, u64_at, BLOCK};
use crate::{Error, Result};

/// `"MTXN"` as a little-endian u32.
pub const TXN_MAGIC: u32 = u32::from_le_bytes(*b"MTXN");

/// A decoded transaction record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    /// Its id.
    pub tid: u64,
    /// (block, image) pairs.
    pub blocks: Vec<(u32, Vec<u8>)>,
    /// Revoked blocks.
    pub revoked: Vec<u32>,
}

/// The length of the record of `blocks` block images and `revoked`
/// revokes.
pub fn encoded_len(blocks: usize, revoked: usize) -> usize {
    24 + blocks * (4 + BLOCK) + revoked * 4
}

/// Encodes a transaction from its block images and revokes.
pub fn encode<'a>(
    tid: u64,
    blocks: impl ExactSizeIterator<Item = (u32, &'a [u8])>,
    revoked: &[u32],
) -> Vec<u8> {
    let n = blocks.len();
    let mut out = Vec::with_capacity(encoded_len(n, revoked.len()));
    out.extend_from_slice(&TXN_MAGIC.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&tid.to_le_bytes());
    out.extend_from_slice(&(n as u32).to_le_bytes());
    out.extend_from_slice(&(revoked.len() as u32).to_le_bytes());
    for (b, img) in blocks {
        debug_assert_eq!(img.len(), BLOCK);
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(img);
    }
    for r in revoked {
        out.extend_from_slice(&r.to_le_bytes());
    }
    out
}

/// Decodes a transaction record.
pub fn decode(b: &[u8]) -> Result<Txn> {
    let bad = |why: &str| Error::Corrupt(format!("transaction record: {why}"));
    if b.len() < 24 || b[0..4] != TXN_MAGIC.to_le_bytes() {
        return Err(bad("no magic"));
    }
    if u16::from_le_bytes([b[4], b[5]]) != 1 {
        return Err(bad("unknown version"));
    }
    let tid = u64_at(b, 8);
    let n = u32_at(b, 16) as usize;
    let r = u32_at(b, 20) as usize;
    if b.len() != 24 + n * (4 + BLOCK) + r * 4 {
        return Err(bad("length does not match its counts"));
    }
    let mut at = 24;
    let mut blocks = Vec::with_capacity(n);
    for _ in 0..n {
        let no = u32_at(b, at);
        blocks.push((no, b[at + 4..at + 4 + BLOCK].to_vec()));
        at += 4 + BLOCK;
    }
    let revoked = (0..r).map(|i| u32_at(b, at + 4 * i)).collect();
    Ok(Txn {
        tid,
        blocks,
        revoked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_malformed_ones_are_typed_errors() {
        let a = vec![1u8; BLOCK];
        let b = vec![2u8; BLOCK];
        let rec = encode(7, [(10u32, &a[..]), (11, &b[..])].into_iter(), &[12, 13]);
        let t = decode(&rec).unwrap();
        assert_eq!(t.tid, 7);
        assert_eq!(t.blocks, vec![(10, a), (11, b)]);
        assert_eq!(t.revoked, vec![12, 13]);
        for bad in [&rec[..rec.len() - 1], &rec[..10], &[0u8; 24][..]] {
            assert!(matches!(decode(bad), Err(Error::Corrupt(_))));
        }
        let mut newer = rec.clone();
        newer[4] = 2;
        assert!(matches!(decode(&newer), Err(Error::Corrupt(_))));
    }
}
