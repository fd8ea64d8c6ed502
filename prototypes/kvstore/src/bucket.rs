//! A bucket of the hash table: its entries in memory, the chain of pages
//! that holds them on disk, and the serialization between the two.

use crate::page::{self, Kind, Page, PAGE_PAYLOAD, PAGE_SIZE};
use journal_core::Lsn;

/// A bucket's entries (a hash map: inserts are the hot path; scans and
/// page images sort).
pub(crate) type Entries = std::collections::HashMap<Vec<u8>, Vec<u8>>;

/// One bucket.
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    /// Its entries.
    pub entries: Entries,
    /// The pages of its chain as last written (head first; the head is
    /// always page `1 + index`).
    pub chain: Vec<u32>,
    /// The LSN of the last log record applied (its pages' pageLSN).
    pub lsn: Lsn,
    /// Changed since last written home.
    pub dirty: bool,
    /// The checkpoint epoch in which its full image was last logged: the
    /// first change in a newer epoch logs the image again.
    pub image_epoch: u64,
}

/// The bucket's entries as bytes: a count, then `klen u16, vlen u32, key,
/// value` per entry, in key order.
pub(crate) fn serialize(entries: &Entries) -> Vec<u8> {
    let size: usize = entries.iter().map(|(k, v)| 6 + k.len() + v.len()).sum();
    let mut out = Vec::with_capacity(4 + size);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    let mut sorted: Vec<(&Vec<u8>, &Vec<u8>)> = entries.iter().collect();
    sorted.sort_unstable();
    for (k, v) in sorted {
        out.extend_from_slice(&(k.len() as u16).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    out
}

/// The inverse of [`serialize`]; `None` if the bytes are not a bucket.
pub(crate) fn deserialize(b: &[u8]) -> Option<Entries> {
    let count = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
    let mut at = 4;
    // Sized by what the bytes can hold (6 bytes an entry at least), not by
    // the count they claim: a CRC-valid but hostile page says 4 billion.
    let mut out = Entries::with_capacity((count as usize).min(b.len() / 6));
    for _ in 0..count {
        let klen = u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as usize;
        let vlen = u32::from_le_bytes(b.get(at + 2..at + 6)?.try_into().ok()?) as usize;
        at += 6;
        let k = b.get(at..at + klen)?.to_vec();
        let v = b.get(at + klen..at + klen + vlen)?.to_vec();
        at += klen + vlen;
        out.insert(k, v);
    }
    (at == b.len()).then_some(out)
}

/// Pages needed for `len` serialized bytes (at least the head).
pub(crate) fn pages_needed(len: usize) -> usize {
    len.div_ceil(PAGE_PAYLOAD).max(1)
}

/// The page images of serialized `content` over the pages `numbers`
/// (head first; as many as [`pages_needed`]), all stamped with `lsn`.
pub(crate) fn to_pages(numbers: &[u32], lsn: Lsn, content: &[u8]) -> Vec<(u32, Page)> {
    let chunks: Vec<&[u8]> = if content.is_empty() {
        vec![&[][..]]
    } else {
        content.chunks(PAGE_PAYLOAD).collect()
    };
    assert_eq!(chunks.len(), numbers.len(), "one page per chunk");
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let kind = if i == 0 { Kind::Head } else { Kind::Overflow };
            let next = numbers.get(i + 1).copied().unwrap_or(0);
            (numbers[i], page::encode(numbers[i], kind, lsn, next, chunk))
        })
        .collect()
}

/// What a chain of pages holds: entries, the chain, the head's LSN.
pub(crate) type Decoded = (Entries, Vec<u32>, Lsn);

/// Reads the chain starting at `head`, fetching pages with `fetch`; `None`
/// if any page is torn or damaged, or the chain does not hold a bucket.
pub(crate) fn read_chain<'a>(
    head: u32,
    fetch: impl Fn(u32) -> Option<&'a [u8; PAGE_SIZE]>,
    max_pages: usize,
) -> Option<Decoded> {
    let mut content = Vec::new();
    let mut chain = Vec::new();
    let mut number = head;
    let mut lsn = Lsn(0);
    loop {
        let v = page::decode(fetch(number)?, number)?;
        let expected = if chain.is_empty() {
            Kind::Head
        } else {
            Kind::Overflow
        };
        if v.kind != expected || chain.len() >= max_pages {
            return None;
        }
        if chain.is_empty() {
            lsn = v.lsn;
        } else if v.lsn != lsn {
            // Pages of one chain are written together, with one LSN.
            return None;
        }
        chain.push(number);
        content.extend_from_slice(v.payload);
        if v.next == 0 {
            break;
        }
        number = v.next;
    }
    Some((deserialize(&content)?, chain, lsn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_bucket_round_trips_through_a_chain_of_pages() {
        let mut e = Entries::new();
        for i in 0..40u32 {
            e.insert(
                format!("key-{i}").into_bytes(),
                vec![i as u8; 300 + i as usize * 10],
            );
        }
        let bytes = serialize(&e);
        assert_eq!(deserialize(&bytes).as_ref(), Some(&e));
        let n = pages_needed(bytes.len());
        assert!(n > 3);
        let numbers: Vec<u32> = (0..n as u32)
            .map(|i| if i == 0 { 5 } else { 100 + i })
            .collect();
        let pages = to_pages(&numbers, Lsn(42), &bytes);
        let map: BTreeMap<u32, &Page> = pages.iter().map(|(n, p)| (*n, p)).collect();
        let (got, chain, lsn) = read_chain(5, |n| map.get(&n).map(|p| &***p), 100).unwrap();
        assert_eq!((got, chain, lsn), (e.clone(), numbers.clone(), Lsn(42)));
        // An empty bucket is one head page.
        let empty = to_pages(&[9], Lsn(1), &serialize(&Entries::new()));
        assert_eq!(empty.len(), 1);
    }
}
