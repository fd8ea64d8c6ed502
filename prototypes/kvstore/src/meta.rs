//! The meta page, kept twice (pages 0 and 1, written alternately by
//! checkpoints; the valid copy with the higher sequence wins, so a torn
//! meta write loses nothing): the journal's id, and where the tree and the
//! free list are as of the checkpoint. The log's meta operations carry
//! every change since.

use crate::page::{u16_at, u32_at, Page, PageNo, FIRST_PAGE, FORMAT_VERSION, PAGE_SIZE};
use journal_core::JournalId;

const META_MAGIC: &[u8; 4] = b"KVM2";
/// The meta page's magic in format 1 (the hash-bucket store).
const OLD_META_MAGIC: &[u8; 4] = b"KVMT";

/// The meta page's contents: where the tree and the free list are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// The journal the store was created with.
    pub journal_id: JournalId,
    /// Written at every checkpoint; the valid copy with the higher one
    /// wins.
    pub sequence: u64,
    /// The tree's root page.
    pub root: PageNo,
    /// Pages in use: every page number below is the tree's, a free page
    /// or a meta page.
    pub end: PageNo,
    /// The first free page (0: none).
    pub free_head: PageNo,
}

/// Builds a sealed meta page.
pub fn encode_meta(m: &Meta) -> Box<[u8; PAGE_SIZE]> {
    let mut b = Box::new([0u8; PAGE_SIZE]);
    b[..4].copy_from_slice(META_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[16..32].copy_from_slice(&m.journal_id);
    b[32..40].copy_from_slice(&m.sequence.to_le_bytes());
    b[40..44].copy_from_slice(&m.root.to_le_bytes());
    b[44..48].copy_from_slice(&m.end.to_le_bytes());
    b[48..52].copy_from_slice(&m.free_head.to_le_bytes());
    let c = Page::crc_of(&b);
    b[4..8].copy_from_slice(&c.to_le_bytes());
    b
}

/// What a meta page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaCheck {
    /// Valid.
    Valid(Meta),
    /// All zeros: never written.
    Zeroes,
    /// Not a meta page, or damaged.
    Bad,
    /// Another format version.
    Version(u16),
}

/// Validates a meta page.
pub fn decode_meta(bytes: &[u8; PAGE_SIZE]) -> MetaCheck {
    if bytes.iter().all(|&b| b == 0) {
        return MetaCheck::Zeroes;
    }
    if &bytes[..4] == OLD_META_MAGIC {
        return MetaCheck::Version(u16_at(bytes, 8));
    }
    if &bytes[..4] != META_MAGIC || u32_at(bytes, 4) != Page::crc_of(bytes) {
        return MetaCheck::Bad;
    }
    let version = u16_at(bytes, 8);
    if version != FORMAT_VERSION {
        return MetaCheck::Version(version);
    }
    let mut journal_id = [0u8; 16];
    journal_id.copy_from_slice(&bytes[16..32]);
    let m = Meta {
        journal_id,
        sequence: u64::from_le_bytes(bytes[32..40].try_into().unwrap_or([0; 8])),
        root: u32_at(bytes, 40),
        end: u32_at(bytes, 44),
        free_head: u32_at(bytes, 48),
    };
    let inside = |p: PageNo| (FIRST_PAGE..m.end).contains(&p);
    // A sequence no store reaches (one per checkpoint) is damage.
    if !inside(m.root) || (m.free_head != 0 && !inside(m.free_head)) || m.sequence > 1 << 62 {
        return MetaCheck::Bad;
    }
    MetaCheck::Valid(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_refuses_the_old_format_and_wild_pointers() {
        let m = Meta {
            journal_id: *b"0123456789abcdef",
            sequence: 4,
            root: 2,
            end: 10,
            free_head: 9,
        };
        assert_eq!(decode_meta(&encode_meta(&m)), MetaCheck::Valid(m));
        let wild = Meta { root: 10, ..m };
        assert_eq!(decode_meta(&encode_meta(&wild)), MetaCheck::Bad);
        let mut old = [0u8; PAGE_SIZE];
        old[..4].copy_from_slice(b"KVMT");
        old[8] = 1;
        assert_eq!(decode_meta(&old), MetaCheck::Version(1));
        assert_eq!(decode_meta(&[0; PAGE_SIZE]), MetaCheck::Zeroes);
    }
}
