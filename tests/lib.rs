//! Shared helpers of the integration scenarios: small journal options,
//! self-describing record payloads, and a model of what was acknowledged.
#![forbid(unsafe_code)]

use journal_core::vfs::{SimVfs, SplitMix64, Vfs};
use journal_core::{Journal, Lsn, Options};
use std::path::PathBuf;
use std::sync::Arc;

/// Options sized for tests: 64 KiB segments, 4 × 16 KiB buffers, so a few
/// hundred records cross many segments and recycle them.
pub fn small_options() -> Options {
    Options {
        segment_size: 64 << 10,
        logbufs: 4,
        logbsize: 16 << 10,
        max_segments: 8,
        ..Options::default()
    }
}

/// The journal directory used on SimVfs.
pub fn sim_dir() -> PathBuf {
    PathBuf::from("/journal")
}

/// Opens a journal on a SimVfs.
pub fn open_sim(vfs: &SimVfs, options: Options) -> journal_core::Result<Journal> {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    Journal::open_with(v, sim_dir(), options)
}

/// A record payload that describes itself: writer, sequence number, length
/// and a checksum over a pattern derived from them, so a reader can tell a
/// record that was appended from bytes that never were.
pub fn payload(writer: u8, seq: u32, len: usize) -> Vec<u8> {
    let len = len.max(13);
    let mut p = vec![0u8; len];
    p[0] = writer;
    p[1..5].copy_from_slice(&seq.to_le_bytes());
    p[5..9].copy_from_slice(&(len as u32).to_le_bytes());
    let mut rng = SplitMix64::new(((writer as u64) << 32) | seq as u64);
    rng.fill(&mut p[13..]);
    let sum = crc32c::crc32c(&p[13..]);
    p[9..13].copy_from_slice(&sum.to_le_bytes());
    p
}

/// Whether `p` is a payload [`payload`] produced (then returns its writer
/// and sequence number): its header names its own length, and its CRC32C
/// matches its pattern. Garbage — torn sectors, stale bytes, a cut or
/// spliced record — does not pass; and an acknowledged record is compared
/// byte for byte besides ([`verify`]).
pub fn check_payload(p: &[u8]) -> Option<(u8, u32)> {
    if p.len() < 13 {
        return None;
    }
    let writer = p[0];
    let seq = u32::from_le_bytes(p[1..5].try_into().ok()?);
    let len = u32::from_le_bytes(p[5..9].try_into().ok()?) as usize;
    let sum = u32::from_le_bytes(p[9..13].try_into().ok()?);
    (len == p.len() && sum == crc32c::crc32c(&p[13..])).then_some((writer, seq))
}

/// Reads every entry from the tail to the durable end.
pub fn replay(j: &Journal) -> Vec<(Lsn, Vec<u8>)> {
    j.read_from(j.redo_lsn())
        .expect("read_from the tail")
        .map(|r| r.map(|(l, b)| (l, b.to_vec())))
        .collect::<Result<Vec<_>, _>>()
        .expect("replay")
}

/// Checks a recovered journal against what was acknowledged: every
/// acknowledged record at or after the tail is there, at its LSN, byte for
/// byte; every entry read is a payload that was appended. The payloads may
/// be owned or shared (`Vec<u8>`, `Arc<[u8]>`).
pub fn verify<P: AsRef<[u8]>>(j: &Journal, acked: &[(Lsn, P)], context: &str) {
    let redo = j.redo_lsn();
    let want: std::collections::HashMap<Lsn, &[u8]> = acked
        .iter()
        .filter(|(l, _)| *l >= redo)
        .map(|(l, b)| (*l, b.as_ref()))
        .collect();
    // Read in place: no entry is copied.
    let mut found = std::collections::HashSet::new();
    for r in j.read_from(redo).expect("read_from the tail") {
        let (lsn, bytes) = r.unwrap_or_else(|e| panic!("{context}: replay: {e}"));
        match want.get(&lsn) {
            // Byte-equal to what was acknowledged (so a payload too).
            Some(w) => {
                assert!(
                    &bytes[..] == *w,
                    "{context}: acknowledged record at {lsn} differs"
                );
                found.insert(lsn);
            }
            None => assert!(
                check_payload(&bytes).is_some(),
                "{context}: entry at {lsn} was never appended ({} bytes)",
                bytes.len()
            ),
        }
    }
    if let Some(lsn) = acked
        .iter()
        .map(|(l, _)| *l)
        .find(|l| *l >= redo && !found.contains(l))
    {
        panic!(
            "{context}: acknowledged record at {lsn} lost (redo {redo}, recovered end {}, report {:?})",
            j.durable_lsn(),
            j.recovery_report()
        );
    }
}
