//! The data file's pages: 4 KiB, each with a CRC and the LSN of the last
//! log record applied to it (ARIES pageLSN).
//!
//! ```text
//! page (every page but 0)          meta page (page 0)
//!  0  4 magic "KVPG"                0  4 magic "KVMT"
//!  4  4 crc32c (this field zero)    4  4 crc32c (this field zero)
//!  8  8 page LSN                    8  2 format version
//! 16  4 page number                10  2 reserved
//! 20  4 next page of the chain     12  4 bucket count
//! 24  2 kind (1 head, 2 overflow)  16 16 journal id
//! 26  2 payload bytes              32  … zero
//! 28  4 reserved
//! 32  … payload
//! ```
//!
//! Bucket `b` is a chain of pages starting at its head page `1 + b`: the
//! bucket's entries, serialized, split over the chain's payloads.

use journal_core::{JournalId, Lsn};

/// Bytes per page.
pub const PAGE_SIZE: usize = 4096;
/// Bytes of a page's header.
pub const PAGE_HEADER: usize = 32;
/// Payload bytes per page.
pub const PAGE_PAYLOAD: usize = PAGE_SIZE - PAGE_HEADER;
/// The format version of the data file and the log records.
pub const FORMAT_VERSION: u16 = 1;

const PAGE_MAGIC: &[u8; 4] = b"KVPG";
const META_MAGIC: &[u8; 4] = b"KVMT";

/// One page's bytes.
pub type Page = Box<[u8; PAGE_SIZE]>;

/// A zeroed page.
pub fn zero_page() -> Page {
    Box::new([0u8; PAGE_SIZE])
}

fn crc(page: &[u8; PAGE_SIZE]) -> u32 {
    let c = crc32c::crc32c(&page[..4]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &page[8..])
}

fn seal(page: &mut [u8; PAGE_SIZE]) {
    let c = crc(page);
    page[4..8].copy_from_slice(&c.to_le_bytes());
}

/// The `N` bytes of `b` at `at` (the caller has checked the length).
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes_at(b, at))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes_at(b, at))
}

/// What kind of page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The first page of a bucket's chain.
    Head,
    /// A further page of a chain.
    Overflow,
}

/// A decoded page: its header fields and payload.
#[derive(Debug, Clone, Copy)]
pub struct PageView<'a> {
    /// Page LSN.
    pub lsn: Lsn,
    /// Next page of the chain (0: none).
    pub next: u32,
    /// Head or overflow.
    pub kind: Kind,
    /// The payload.
    pub payload: &'a [u8],
}

/// Builds a sealed bucket page.
pub fn encode(number: u32, kind: Kind, lsn: Lsn, next: u32, payload: &[u8]) -> Page {
    assert!(payload.len() <= PAGE_PAYLOAD);
    let mut p = zero_page();
    p[..4].copy_from_slice(PAGE_MAGIC);
    p[8..16].copy_from_slice(&lsn.0.to_le_bytes());
    p[16..20].copy_from_slice(&number.to_le_bytes());
    p[20..24].copy_from_slice(&next.to_le_bytes());
    let k: u16 = match kind {
        Kind::Head => 1,
        Kind::Overflow => 2,
    };
    p[24..26].copy_from_slice(&k.to_le_bytes());
    p[26..28].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    p[PAGE_HEADER..PAGE_HEADER + payload.len()].copy_from_slice(payload);
    seal(&mut p);
    p
}

/// Validates page `number`: `None` if its magic, CRC, number or fields are
/// wrong (a torn or damaged page, or one never written).
pub fn decode(page: &[u8; PAGE_SIZE], number: u32) -> Option<PageView<'_>> {
    if &page[..4] != PAGE_MAGIC || u32_at(page, 4) != crc(page) || u32_at(page, 16) != number {
        return None;
    }
    let kind = match u16_at(page, 24) {
        1 => Kind::Head,
        2 => Kind::Overflow,
        _ => return None,
    };
    let len = u16_at(page, 26) as usize;
    if len > PAGE_PAYLOAD {
        return None;
    }
    Some(PageView {
        lsn: Lsn(u64::from_le_bytes(bytes_at(page, 8))),
        next: u32_at(page, 20),
        kind,
        payload: &page[PAGE_HEADER..PAGE_HEADER + len],
    })
}

/// The meta page's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Buckets of the hash table, fixed at creation.
    pub buckets: u32,
    /// The journal the store was created with.
    pub journal_id: JournalId,
}

/// Builds the sealed meta page.
pub fn encode_meta(m: &Meta) -> Page {
    let mut p = zero_page();
    p[..4].copy_from_slice(META_MAGIC);
    p[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    p[12..16].copy_from_slice(&m.buckets.to_le_bytes());
    p[16..32].copy_from_slice(&m.journal_id);
    seal(&mut p);
    p
}

/// Why a meta page was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaCheck {
    /// Valid.
    Valid(Meta),
    /// All zeros: never written.
    Zeroes,
    /// Not a meta page, or damaged.
    Bad,
    /// A newer format.
    Newer(u16),
}

/// The most buckets a store may have ([`crate::Options::buckets`]); a meta
/// page that says more is refused, so nothing is allocated by a count read
/// from disk beyond what a valid store could need.
pub const MAX_BUCKETS: u32 = 1 << 20;

/// Validates the meta page.
pub fn decode_meta(page: &[u8; PAGE_SIZE]) -> MetaCheck {
    if page.iter().all(|&b| b == 0) {
        return MetaCheck::Zeroes;
    }
    if &page[..4] != META_MAGIC || u32_at(page, 4) != crc(page) {
        return MetaCheck::Bad;
    }
    let version = u16_at(page, 8);
    if version != FORMAT_VERSION {
        return MetaCheck::Newer(version);
    }
    let mut journal_id = [0u8; 16];
    journal_id.copy_from_slice(&page[16..32]);
    let buckets = u32_at(page, 12);
    if buckets == 0 || buckets > MAX_BUCKETS {
        return MetaCheck::Bad;
    }
    MetaCheck::Valid(Meta {
        buckets,
        journal_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_every_bit_flip_is_caught() {
        let p = encode(7, Kind::Overflow, Lsn(99), 12, b"payload");
        let v = decode(&p, 7).unwrap();
        assert_eq!(
            (v.lsn, v.next, v.kind, v.payload),
            (Lsn(99), 12, Kind::Overflow, &b"payload"[..])
        );
        assert!(decode(&p, 8).is_none(), "another page's number");
        for bit in [0usize, 37, 64, 130, 8 * 200, 8 * 4095 + 7] {
            let mut q = p.clone();
            q[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&q, 7).is_none(), "bit {bit}");
        }
        let m = Meta {
            buckets: 64,
            journal_id: *b"0123456789abcdef",
        };
        assert_eq!(decode_meta(&encode_meta(&m)), MetaCheck::Valid(m));
        assert_eq!(decode_meta(&zero_page()), MetaCheck::Zeroes);
    }

    #[test]
    fn a_sealed_meta_page_with_an_impossible_bucket_count_is_refused() {
        for buckets in [0, MAX_BUCKETS + 1, u32::MAX] {
            let m = Meta {
                buckets,
                journal_id: [7; 16],
            };
            assert_eq!(decode_meta(&encode_meta(&m)), MetaCheck::Bad, "{buckets}");
        }
    }
}
