//! Extended attribute blocks: an inode's attributes, all of them, as one
//! run of bytes laid over a chain of blocks (the inode's `xattr` field
//! names the first). They are metadata: journaled like inode-table and
//! directory blocks, so an attribute change is as crash-safe as a rename.
//!
//! A block of the chain:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `MXAT` |
//! | 4 | 4 | the next block of the chain (0: this is the last) |
//! | 8 | 2 | bytes of the run in this block (1..=[`PAYLOAD`]) |
//! | 10 | 2 | reserved |
//! | 12 | 4084 | those bytes |
//!
//! The run is the attributes one after the other, each:
//!
//! | size | field |
//! |---:|---|
//! | 1 | name length (1..=255) |
//! | 4 | value length (0..=[`VALUE_MAX`]) |
//! | n | the full name, namespace and all (`user.mime_type`) |
//! | v | the value |
//!
//! An inode with no attributes has no chain. A chain has at most
//! [`MAX_CHAIN`] blocks, so an inode holds up to about 128 KiB of names and
//! values: one value of Linux's largest (64 KiB) and more beside it.

use super::{u16_at, u32_at, BLOCK};
use crate::{Error, Result};

/// `"MXAT"` read as a little-endian u32.
pub const XATTR_MAGIC: u32 = u32::from_le_bytes(*b"MXAT");
/// The bytes of the run a block carries.
pub const PAYLOAD: usize = BLOCK - 12;
/// The longest chain.
pub const MAX_CHAIN: usize = 32;
/// The longest name, namespace included (Linux's `XATTR_NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// The largest value (Linux's `XATTR_SIZE_MAX`).
pub const VALUE_MAX: usize = 65536;

/// One attribute: its full name and its value.
pub type Xattr = (Vec<u8>, Vec<u8>);

/// The bytes an attribute takes in the run.
pub fn entry_len(name: &[u8], value: &[u8]) -> usize {
    5 + name.len() + value.len()
}

/// The run of `attrs`.
pub fn encode(attrs: &[Xattr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(attrs.iter().map(|(n, v)| entry_len(n, v)).sum());
    for (name, value) in attrs {
        out.push(name.len() as u8);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(value);
    }
    out
}

/// The attributes of a run, checked: lengths in bounds, no name empty,
/// none twice.
pub fn decode(run: &[u8]) -> Result<Vec<Xattr>> {
    let bad = |why: String| Error::Corrupt(format!("extended attributes: {why}"));
    let mut out: Vec<Xattr> = Vec::new();
    let mut at = 0usize;
    while at < run.len() {
        if run.len() - at < 5 {
            return Err(bad(format!("a header cut short at byte {at}")));
        }
        let n = run[at] as usize;
        let v = u32_at(run, at + 1) as usize;
        if n == 0 || v > VALUE_MAX || run.len() - at - 5 < n + v {
            return Err(bad(format!(
                "an attribute at byte {at}: name {n}, value {v} bytes"
            )));
        }
        let name = run[at + 5..at + 5 + n].to_vec();
        if out.iter().any(|(o, _)| *o == name) {
            return Err(bad(format!("{:?} twice", String::from_utf8_lossy(&name))));
        }
        out.push((name, run[at + 5 + n..at + 5 + n + v].to_vec()));
        at += 5 + n + v;
    }
    Ok(out)
}

/// A chain block's (next block, bytes it carries), checked.
pub fn header(block: &[u8]) -> Result<(u32, usize)> {
    let used = u16_at(block, 8) as usize;
    if u32_at(block, 0) != XATTR_MAGIC || used == 0 || used > PAYLOAD {
        return Err(Error::Corrupt(format!(
            "an extended attribute block with magic {:#x}, {used} bytes",
            u32_at(block, 0)
        )));
    }
    Ok((u32_at(block, 4), used))
}

/// The bytes a checked chain block carries.
pub fn payload(block: &[u8], used: usize) -> &[u8] {
    &block[12..12 + used]
}

/// Makes `block` a chain block carrying `part` (1..=[`PAYLOAD`] bytes),
/// followed by `next`.
pub fn fill(block: &mut [u8], next: u32, part: &[u8]) {
    block[..BLOCK].fill(0);
    block[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
    block[4..8].copy_from_slice(&next.to_le_bytes());
    block[8..10].copy_from_slice(&(part.len() as u16).to_le_bytes());
    block[12..12 + part.len()].copy_from_slice(part);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_round_trips_and_a_damaged_one_is_refused() {
        let attrs = vec![
            (b"user.a".to_vec(), b"1".to_vec()),
            (b"trusted.empty".to_vec(), Vec::new()),
            (b"user.big".to_vec(), vec![7u8; VALUE_MAX]),
        ];
        let run = encode(&attrs);
        assert_eq!(run.len(), attrs.iter().map(|(n, v)| entry_len(n, v)).sum());
        assert_eq!(decode(&run).unwrap(), attrs);
        assert!(decode(&[]).unwrap().is_empty());
        for cut in [1, 4, 7, run.len() - 1] {
            assert!(
                matches!(decode(&run[..cut]), Err(Error::Corrupt(_))),
                "{cut}"
            );
        }
        let mut zero_name = run.clone();
        zero_name[0] = 0;
        assert!(decode(&zero_name).is_err());
        let mut huge = run.clone();
        huge[1..5].copy_from_slice(&(VALUE_MAX as u32 + 1).to_le_bytes());
        assert!(decode(&huge).is_err());
        let twice = encode(&[attrs[0].clone(), attrs[0].clone()]);
        assert!(decode(&twice).is_err());
    }

    #[test]
    fn chain_blocks_round_trip_and_refuse_what_is_not_one() {
        let mut b = vec![0u8; BLOCK];
        fill(&mut b, 77, &[5u8; PAYLOAD]);
        assert_eq!(header(&b).unwrap(), (77, PAYLOAD));
        assert_eq!(payload(&b, PAYLOAD), &[5u8; PAYLOAD][..]);
        let mut wrong = b.clone();
        wrong[0] ^= 1;
        assert!(header(&wrong).is_err());
        let mut long = b.clone();
        long[8..10].copy_from_slice(&(PAYLOAD as u16 + 1).to_le_bytes());
        assert!(header(&long).is_err());
        let mut empty = b;
        empty[8..10].copy_from_slice(&0u16.to_le_bytes());
        assert!(header(&empty).is_err());
    }
}
