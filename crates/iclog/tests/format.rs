//! The record format: round trips, and every corruption class recognised.
#![cfg(not(loom))]

use iclog::format::{
    encode_header, parse_record, record_size, Assembler, Dropped, RecordCheck, Whole, CONTINUED,
    CONTINUES, ENTRY_HEADER_SIZE, HEADER_SIZE, MAGIC,
};
use iclog::{IoFlags, Lsn};

const ALIGN: u64 = 512;
const MAX: usize = 16 * 1024;

/// Builds a record of `entries` at `lsn`, padded to the alignment.
fn record(lsn: Lsn, tail: Lsn, entries: &[&[u8]]) -> Vec<u8> {
    build(lsn, tail, 0, entries)
}

/// A record at `lsn` stamped with `tail` and the chain bits `chain`.
fn build(lsn: Lsn, tail: Lsn, chain: u16, entries: &[&[u8]]) -> Vec<u8> {
    let mut payload = Vec::new();
    for e in entries {
        payload.extend_from_slice(&(e.len() as u32).to_le_bytes());
        payload.extend_from_slice(e);
    }
    let mut out = vec![0u8; record_size(payload.len(), ALIGN) as usize];
    out[HEADER_SIZE..HEADER_SIZE + payload.len()].copy_from_slice(&payload);
    encode_header(
        &mut out,
        lsn,
        tail,
        Lsn(0),
        IoFlags::FUA,
        chain,
        entries.len() as u32,
        &payload,
    );
    out
}

fn sample() -> Vec<u8> {
    record(Lsn(4096), Lsn(512), &[b"alpha", b"", b"gamma-gamma"])
}

#[test]
fn round_trip() {
    let bytes = sample();
    assert_eq!(bytes.len(), 512);
    let RecordCheck::Valid(r) = parse_record(&bytes, Lsn(4096), MAX, ALIGN) else {
        panic!("valid record rejected");
    };
    assert_eq!(
        (r.lsn(), r.tail_lsn(), r.flags(), r.end()),
        (Lsn(4096), Lsn(512), IoFlags::FUA, Lsn(4608))
    );
    let entries: Vec<(Lsn, &[u8])> = r.entries().collect();
    let first = 4096 + HEADER_SIZE as u64;
    assert_eq!(
        entries,
        [
            (Lsn(first), &b"alpha"[..]),
            (Lsn(first + 9), &b""[..]),
            (
                Lsn(first + 9 + ENTRY_HEADER_SIZE as u64),
                &b"gamma-gamma"[..]
            ),
        ]
    );
    // Fixed bytes of the header, as docs/FORMAT.md gives them.
    assert_eq!(&bytes[0..4], b"ICLG");
    assert_eq!(u32::from_le_bytes(bytes[0..4].try_into().unwrap()), MAGIC);
    assert_eq!(&bytes[4..6], &2u16.to_le_bytes());
    assert_eq!(&bytes[8..16], &4096u64.to_le_bytes());
    assert_eq!(&bytes[16..24], &512u64.to_le_bytes());
    assert_eq!(&bytes[28..32], &3u32.to_le_bytes());
}

#[test]
fn every_single_bit_flip_in_header_or_payload_is_detected() {
    let bytes = sample();
    let covered = HEADER_SIZE + 3 * ENTRY_HEADER_SIZE + 5 + 11;
    for byte in 0..covered {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[byte] ^= 1 << bit;
            let check = parse_record(&b, Lsn(4096), MAX, ALIGN);
            assert!(
                !matches!(check, RecordCheck::Valid(_)),
                "flip of byte {byte} bit {bit} passed as valid"
            );
        }
    }
}

#[test]
fn zeroes_are_the_end_of_the_log() {
    assert!(matches!(
        parse_record(&[0u8; 512], Lsn(0), MAX, ALIGN),
        RecordCheck::Zeroes
    ));
    assert!(matches!(
        parse_record(&[0u8; 10], Lsn(0), MAX, ALIGN),
        RecordCheck::Zeroes
    ));
}

#[test]
fn garbage_is_bad_magic() {
    let mut b = sample();
    b[..4].copy_from_slice(b"XXXX");
    assert!(matches!(
        parse_record(&b, Lsn(4096), MAX, ALIGN),
        RecordCheck::BadMagic { .. }
    ));
}

#[test]
fn a_stale_record_is_an_lsn_mismatch() {
    // The same bytes read at another position: left from a recycled file.
    let b = sample();
    match parse_record(&b, Lsn(4096 + (1 << 24)), MAX, ALIGN) {
        RecordCheck::LsnMismatch { found } => assert_eq!(found, Lsn(4096)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn truncation_is_reported() {
    let b = sample();
    assert!(matches!(
        parse_record(&b[..HEADER_SIZE + 4], Lsn(4096), MAX, ALIGN),
        RecordCheck::Truncated { .. }
    ));
    assert!(matches!(
        parse_record(&b[..20], Lsn(4096), MAX, ALIGN),
        RecordCheck::Truncated { .. }
    ));
    // A length beyond any buffer is reported the same way, before the CRC.
    assert!(matches!(
        parse_record(&b, Lsn(4096), 8, ALIGN),
        RecordCheck::Truncated { .. }
    ));
}

#[test]
fn a_torn_payload_is_a_crc_mismatch() {
    let mut b = record(Lsn(0), Lsn(0), &[&[9u8; 1400]]);
    assert_eq!(b.len(), 1536);
    b[1024..1536].fill(0); // the last sector never made it
    assert!(matches!(
        parse_record(&b, Lsn(0), MAX, ALIGN),
        RecordCheck::CrcMismatch { .. }
    ));
}

#[test]
fn a_newer_version_is_refused_once_its_crc_holds() {
    let mut b = sample();
    b[4..6].copy_from_slice(&3u16.to_le_bytes());
    // A record a newer writer made: its CRC covers the version.
    let len = u32::from_le_bytes(b[24..28].try_into().unwrap()) as usize;
    let mut h = b[..HEADER_SIZE].to_vec();
    h[32..36].fill(0);
    let mut crc = crc32c::crc32c(&h);
    crc = crc32c::crc32c_append(crc, &b[HEADER_SIZE..HEADER_SIZE + len]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        parse_record(&b, Lsn(4096), MAX, ALIGN),
        RecordCheck::UnsupportedVersion { found: 3 }
    ));
}

#[test]
fn a_flipped_version_bit_is_corruption_not_a_newer_format() {
    let mut b = sample();
    b[4] ^= 0x02;
    assert!(matches!(
        parse_record(&b, Lsn(4096), MAX, ALIGN),
        RecordCheck::CrcMismatch { .. }
    ));
}

#[test]
fn version_1_records_are_still_read() {
    let mut b = sample();
    b[4..6].copy_from_slice(&1u16.to_le_bytes());
    let len = u32::from_le_bytes(b[24..28].try_into().unwrap()) as usize;
    let mut h = b[..HEADER_SIZE].to_vec();
    h[32..36].fill(0);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h), &b[HEADER_SIZE..HEADER_SIZE + len]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        parse_record(&b, Lsn(4096), MAX, ALIGN),
        RecordCheck::Valid(_)
    ));
}

/// A record at `lsn` with the given entries and chain bits.
fn chained(lsn: Lsn, chain: u16, entries: &[&[u8]]) -> Vec<u8> {
    build(lsn, Lsn(0), chain, entries)
}

/// Whole entries, what each record dropped, and the chain left open.
type Assembled = (Vec<(Lsn, Vec<u8>)>, Vec<Dropped>, Option<Lsn>);

/// Feeds records in order; returns the whole entries and what was dropped.
fn assemble(recs: &[Vec<u8>], start: Lsn) -> Assembled {
    let mut a = Assembler::new();
    let (mut out, mut dropped) = (Vec::new(), Vec::new());
    let mut at = start;
    for b in recs {
        let RecordCheck::Valid(r) = parse_record(b, at, MAX, ALIGN) else {
            panic!("invalid record at {at}");
        };
        dropped.push(a.feed(&r, |w| match w {
            Whole::Single(l, b) => out.push((l, b.to_vec())),
            Whole::Chained(l, b) => out.push((l, b)),
        }));
        at = r.end();
    }
    (out, dropped, a.pending())
}

#[test]
fn an_assembler_joins_parts_and_drops_what_can_never_be_whole() {
    // first part (after an entry) · middle · last part (and an entry after).
    let r0 = chained(Lsn(0), CONTINUES, &[b"one", b"AB"]);
    let r1 = chained(Lsn(512), CONTINUED | CONTINUES, &[b"CD"]);
    let r2 = chained(Lsn(1024), CONTINUED, &[b"EF", b"two"]);
    let (out, dropped, pending) = assemble(&[r0.clone(), r1.clone(), r2], Lsn(0));
    let first = Lsn(HEADER_SIZE as u64 + 4 + 3);
    assert_eq!(
        out,
        [
            (Lsn(HEADER_SIZE as u64), b"one".to_vec()),
            (first, b"ABCDEF".to_vec()),
            (Lsn(1024 + HEADER_SIZE as u64 + 6), b"two".to_vec()),
        ]
    );
    assert!(dropped.iter().all(|d| *d == Dropped::default()));
    assert_eq!(pending, None);
    // Cut after the middle part: the chain stays open, nothing of it is out.
    let (out, _, pending) = assemble(&[r0.clone(), r1.clone()], Lsn(0));
    assert_eq!(out.len(), 1);
    assert_eq!(pending, Some(first));
    // A record after it that does not continue it: the chain was abandoned.
    let fresh = chained(Lsn(1024), 0, &[b"new"]);
    let (out, dropped, pending) = assemble(&[r0, r1.clone(), fresh], Lsn(0));
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].1, b"new");
    assert_eq!(dropped[2].abandoned, Some(first));
    assert_eq!(pending, None);
    // Reading from the middle of a chain: the orphan parts are dropped.
    let r2 = chained(Lsn(1024), CONTINUED, &[b"EF", b"two"]);
    let (out, dropped, _) = assemble(&[r1, r2], Lsn(512));
    assert_eq!(out, [(Lsn(1024 + HEADER_SIZE as u64 + 6), b"two".to_vec())]);
    assert!(dropped.iter().all(|d| d.orphan));
}

/// A record whose CRC vouches for entries that do not tile its payload —
/// a length running past it, one cut short, bytes left over, a count
/// that does not match — is rejected whole (`BadEntries`), so none of its
/// entries is ever read.
#[test]
fn entries_that_do_not_tile_the_payload_make_a_bad_record() {
    let good: Vec<u8> = [
        &5u32.to_le_bytes()[..],
        b"alpha",
        &3u32.to_le_bytes(),
        b"xyz",
    ]
    .concat();
    let cases: [(&str, Vec<u8>, u32); 5] = [
        (
            "a length past the payload",
            [&99u32.to_le_bytes()[..], b"alpha"].concat(),
            1,
        ),
        (
            "a length cut short",
            [&1u32.to_le_bytes()[..], b"alpha"].concat(),
            1,
        ),
        ("bytes left over", [&good[..], &[7, 7]].concat(), 2),
        ("too few entries claimed", good.clone(), 1),
        ("too many entries claimed", good.clone(), 3),
    ];
    // A record at 4096 with `count` claimed over `payload`, CRC sealed.
    let sealed = |payload: &[u8], count: u32| {
        let mut out = vec![0u8; record_size(payload.len(), ALIGN) as usize];
        out[HEADER_SIZE..HEADER_SIZE + payload.len()].copy_from_slice(payload);
        encode_header(
            &mut out,
            Lsn(4096),
            Lsn(0),
            Lsn(0),
            IoFlags::FUA,
            0,
            count,
            payload,
        );
        out
    };
    for (what, payload, count) in cases {
        assert!(
            matches!(
                parse_record(&sealed(&payload, count), Lsn(4096), MAX, ALIGN),
                RecordCheck::BadEntries { claimed } if claimed == count
            ),
            "{what}"
        );
    }
    assert!(matches!(
        parse_record(&sealed(&good, 2), Lsn(4096), MAX, ALIGN),
        RecordCheck::Valid(_)
    ));
}
