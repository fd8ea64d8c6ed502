//! Recovery: find the end of the log, telling a torn tail from corruption.
//!
//! The scan starts at the redo LSN of the control file and follows records:
//! each must be valid *at the LSN where it is expected*. The first position
//! where that fails ends the scan, and what lies beyond decides its meaning:
//!
//! - Records may be in flight at a crash: up to `logbufs × logbsize` bytes
//!   (the *in-flight window*, the largest any session used, kept in the
//!   control file) written concurrently, some completed, none acknowledged
//!   past the first incomplete one. So valid records *within* the window
//!   after a bad one are leftovers of unacknowledged writes.
//! - If a valid record carrying its own position exists *beyond* the window
//!   (the scan looks at the next `window` bytes past it, which must hold a
//!   record start if the log went on, since a record is at most half a
//!   window), the log went on after the bad record: this is corruption in
//!   the middle of the log.
//!
//! Stale records in recycled segments carry other LSNs and simply end the
//! log; zeros (preallocated space) end it too.

use crate::reader::LogReader;
use crate::{Damage, Error, RecoveryMode, Result};
use iclog::Lsn;

/// How the log ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEnd {
    /// Cleanly: zeros, stale bytes from a recycled segment, no header, or
    /// no segment (read as zeros).
    Clean {
        /// What was found at the end position.
        found: Damage,
    },
    /// A torn record at the head, within the in-flight window: cut off.
    TornTail {
        /// Where the torn record starts (now the end of the log).
        lsn: Lsn,
        /// What the parser found there.
        found: Damage,
    },
}

/// A range of the log [`RecoveryMode::SkipCorrupt`] skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkippedRange {
    /// Where the bad record starts.
    pub from: Lsn,
    /// The next valid record.
    pub to: Lsn,
    /// What was found at `from`.
    pub found: Damage,
}

/// What recovery found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Where the scan started (the checkpoint position).
    pub redo_lsn: Lsn,
    /// The end of the log: appends continue here.
    pub end_lsn: Lsn,
    /// Valid records scanned.
    pub records: u64,
    /// Entries in them.
    pub entries: u64,
    /// How the log ended.
    pub end: LogEnd,
    /// Ranges skipped as corrupt ([`RecoveryMode::SkipCorrupt`] only).
    pub skipped: Vec<SkippedRange>,
    /// Record headers of unacknowledged in-flight writes found past the end
    /// and cleared, so later appends can never chain into them.
    pub cleared: Vec<Lsn>,
}

/// Scans the log from `redo` (read-only). `window` is the in-flight window.
pub fn scan(
    reader: &mut LogReader,
    redo: Lsn,
    mode: RecoveryMode,
    window: u64,
) -> Result<RecoveryReport> {
    let mut report = RecoveryReport {
        redo_lsn: redo,
        end_lsn: redo,
        records: 0,
        entries: 0,
        end: LogEnd::Clean {
            found: Damage::Zeroes,
        },
        skipped: Vec::new(),
        cleared: Vec::new(),
    };
    let mut pos = redo;
    loop {
        let found = match Damage::classify(reader.check(pos)?) {
            Ok(r) => {
                report.records += 1;
                report.entries += r.header.entry_count.get() as u64;
                pos = r.end();
                continue;
            }
            Err(found) => found,
        };
        let bad = found.is_bad_record();
        if let Damage::UnsupportedVersion { found } = found {
            return Err(Error::UnsupportedVersion {
                path: std::path::PathBuf::from(segment_recycler::segment_name(
                    reader.segment_of(pos),
                )),
                found,
            });
        }
        let beyond_from = pos.plus(window.max(1));
        let beyond_to = beyond_from.plus(window.max(1));
        if reader.find_valid(beyond_from, beyond_to)?.is_some() {
            if mode == RecoveryMode::SkipCorrupt {
                let next = reader
                    .find_valid(pos.plus(1), beyond_to)?
                    .expect("a valid record exists beyond the window");
                report.skipped.push(SkippedRange {
                    from: pos,
                    to: next,
                    found,
                });
                pos = next;
                continue;
            }
            return Err(Error::Corruption {
                lsn: pos,
                segment: reader.segment_of(pos),
                found,
            });
        }
        if bad && mode == RecoveryMode::AbsoluteConsistency {
            return Err(Error::Corruption {
                lsn: pos,
                segment: reader.segment_of(pos),
                found,
            });
        }
        report.end = if bad {
            LogEnd::TornTail { lsn: pos, found }
        } else {
            LogEnd::Clean { found }
        };
        report.end_lsn = pos;
        return Ok(report);
    }
}

/// The positions in `[end, end + 2 × window)` where a record header
/// claims its own position: leftovers of unacknowledged in-flight writes
/// that later appends could otherwise chain into.
pub fn in_flight_leftovers(reader: &mut LogReader, end: Lsn, window: u64) -> Result<Vec<Lsn>> {
    let align = reader.alignment();
    let to = end.0 + 2 * window;
    let mut found = Vec::new();
    let mut p = end.0;
    while p < to {
        if reader.claims(Lsn(p))? {
            found.push(Lsn(p));
        }
        p += align;
    }
    Ok(found)
}
