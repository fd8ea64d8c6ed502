//! Recovery: find the end of the log, telling a torn tail from corruption
//! and from loss, and never ending the log short in silence.
//!
//! The scan starts at the checkpoint's `scan_lsn` and follows records: each
//! must be valid *at the LSN where it is expected*. The first position `P`
//! where that fails (what was found there is a [`Damage`]) is examined:
//!
//! 1. **Did the log go on?** Records may be in flight at a crash: up to
//!    `W` bytes past the durable end (the *in-flight window*: the larger
//!    of `write_ahead` and `logbufs × logbsize`, the largest any session
//!    used, kept in the control file) written and not yet durable, none
//!    acknowledged past the first incomplete one, so valid records
//!    *within* `[P, P + W)` are leftovers of unacknowledged writes. A valid
//!    current record *beyond* it — in `[P + W, P + 2W)`, or near the start
//!    of any existing segment above `P`'s (a deleted or damaged segment in
//!    the middle of the log) — means the log went on: corruption, an error
//!    naming `P` and the next valid record, or in `SkipCorrupt` a reported
//!    skip to it.
//!    Likewise when a valid record within the window was written after the
//!    log was durable past `P` (every record stamps the durable LSN at its
//!    submission): then `P` held a durable record, damaged since, not a
//!    torn in-flight one.
//! 2. **Absolute consistency** refuses any bad record at `P` and any valid
//!    record after it (leftovers are inconsistency too).
//! 3. **Was it durable?** The control file records the durable end of the
//!    log when the checkpoint was written (`end_lsn`). A log ending below it
//!    lost records: an error naming what was found (for example the
//!    segment that no longer exists), in every mode. This is what catches
//!    a fallback to an older control slot whose segments were recycled.
//!
//! Otherwise `P` is the end: torn if a bad record is there, clean if zeros,
//! stale bytes of a recycled file, no header or no segment.
//!
//! The decision per mode is tabled on [`crate::RecoveryMode`].
//!
//! A chained record (one written in parts over consecutive records) whose
//! last part is missing at the end was never acknowledged — a commit of it
//! waits for the last part. Its parts stay below the end; readers never
//! return them (the next record appended does not continue the chain, and
//! that is how a reader knows to drop them).

use crate::reader::LogReader;
use crate::{Control, Damage, Error, RecoveryMode, Result};
use iclog::format::{Chains, Piece};
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
    /// Entries in them (a chained record counts once per part).
    pub entries: u64,
    /// Chained records (written in parts) among them, counted whole.
    pub chained: u64,
    /// How the log ended.
    pub end: LogEnd,
    /// Ranges skipped as corrupt ([`RecoveryMode::SkipCorrupt`] only).
    pub skipped: Vec<SkippedRange>,
    /// Record headers of unacknowledged in-flight writes found past the end
    /// and cleared, so later appends can never chain into them.
    pub cleared: Vec<Lsn>,
    /// The LSN of a chained record the end of the log cut (its last part
    /// never written): an unacknowledged append, dropped like a torn tail.
    pub torn_chain: Option<Lsn>,
}

/// Scans the log from the checkpoint `control` records (read-only), with
/// `window` the in-flight window (at least the control file's). See the
/// module docs for the decision at the end of the log.
pub fn scan(
    reader: &mut LogReader,
    control: &Control,
    mode: RecoveryMode,
    window: u64,
) -> Result<RecoveryReport> {
    scan_noting(reader, control, mode, window, &mut |_| {})
}

/// [`scan`], telling `note` the LSN of every valid record it follows (the
/// journal builds its record index from them).
pub(crate) fn scan_noting(
    reader: &mut LogReader,
    control: &Control,
    mode: RecoveryMode,
    window: u64,
    note: &mut dyn FnMut(Lsn),
) -> Result<RecoveryReport> {
    let window = window.max(1);
    let mut report = RecoveryReport {
        redo_lsn: control.scan_lsn,
        end_lsn: control.scan_lsn,
        records: 0,
        entries: 0,
        chained: 0,
        end: LogEnd::Clean {
            found: Damage::Zeroes,
        },
        skipped: Vec::new(),
        cleared: Vec::new(),
        torn_chain: None,
    };
    let mut pos = control.scan_lsn;
    // Chained records: which one is open at the end (copies nothing).
    let mut chains = Chains::new();
    loop {
        let found = match reader.examine(pos)? {
            Ok(r) => {
                note(pos);
                report.records += 1;
                report.entries += r.header.entry_count.get() as u64;
                chains.feed(&r, |p| {
                    if let Piece::Part { last: true, .. } = p {
                        report.chained += 1;
                    }
                });
                pos = r.end();
                continue;
            }
            Err(found) => found,
        };
        match at_damage(
            reader,
            control,
            mode,
            window,
            pos,
            found,
            &mut chains,
            &mut report,
        )? {
            AtDamage::SkipTo(next) => {
                pos = next;
                chains.reset();
            }
            AtDamage::End => {
                report.end_lsn = pos;
                return Ok(report);
            }
        }
    }
}

/// What the scan does at a position where no valid record is.
enum AtDamage {
    /// Skip-corrupt mode: the damage reaches to this valid record.
    SkipTo(Lsn),
    /// The end of the log (`report.end` says how it ended).
    End,
}

/// The decision at the first position `pos` where no valid record is
/// (`found`): corruption (an error, or a skip), loss (an error), or the end
/// of the log — torn or clean (the module docs and `RecoveryMode`'s table).
#[allow(clippy::too_many_arguments)]
fn at_damage(
    reader: &mut LogReader,
    control: &Control,
    mode: RecoveryMode,
    window: u64,
    pos: Lsn,
    found: Damage,
    chains: &mut Chains,
    report: &mut RecoveryReport,
) -> Result<AtDamage> {
    let segment = reader.segment_of(pos);
    if let Damage::UnsupportedVersion { found } = found {
        // A record whose CRC holds, written by a newer format.
        return Err(Error::UnsupportedVersion {
            path: std::path::PathBuf::from(segment_recycler::segment_name(segment)),
            found,
        });
    }
    // Did the log go on past this point? A valid record beyond the
    // in-flight window, or one written after this one was durable
    // (vouching that the damage here is no torn in-flight write): then
    // this is no end, and the damage reaches to the next valid record.
    let continued = match beyond_the_window(reader, pos, window)? {
        Some(beyond) => Some(beyond),
        None => vouched_durable(reader, pos, window)?,
    };
    if let Some(c) = continued {
        let next = reader.find_valid(pos.plus(1), c.plus(1))?.unwrap_or(c);
        if mode == RecoveryMode::SkipCorrupt {
            report.skipped.push(SkippedRange {
                from: pos,
                to: next,
                found,
            });
            return Ok(AtDamage::SkipTo(next));
        }
        return Err(Error::Corruption {
            lsn: pos,
            segment,
            found,
            next_valid: Some(next),
        });
    }
    if mode == RecoveryMode::AbsoluteConsistency {
        // Any bad record, and any valid record after the end (the
        // leftovers of unacknowledged writes), is an inconsistency.
        let leftover = reader.find_valid(pos.plus(1), pos.plus(window))?;
        if found.is_bad_record() || leftover.is_some() {
            return Err(Error::Corruption {
                lsn: pos,
                segment,
                found,
                next_valid: leftover,
            });
        }
    }
    if pos < control.end_lsn {
        // Everything below `end_lsn` was durable when the checkpoint
        // was written: this end is a loss, not a tear.
        return Err(Error::LogEndsEarly {
            end: pos,
            checkpoint_end: control.end_lsn,
            found,
        });
    }
    if let Some(first) = chains.pending() {
        if mode == RecoveryMode::AbsoluteConsistency {
            return Err(Error::Corruption {
                lsn: first,
                segment: reader.segment_of(first),
                found: Damage::ChainCut { first },
                next_valid: None,
            });
        }
        report.torn_chain = Some(first);
    }
    report.end = if found.is_bad_record() {
        LogEnd::TornTail { lsn: pos, found }
    } else {
        LogEnd::Clean { found }
    };
    Ok(AtDamage::End)
}

/// A valid record in `(end, end + W)` that was written when the log was
/// already durable past `end` (its `durable_lsn` stamp): then whatever
/// is at `end` had been durable, and its damage is corruption, not a torn
/// in-flight write.
fn vouched_durable(reader: &mut LogReader, end: Lsn, window: u64) -> Result<Option<Lsn>> {
    let to = end.plus(window);
    let mut from = end.plus(1);
    while let Some(q) = reader.find_valid(from, to)? {
        if let Ok(r) = reader.examine(q)? {
            if r.durable_lsn() > end {
                return Ok(Some(q));
            }
        }
        from = q.plus(1);
    }
    Ok(None)
}

/// The first valid current record past the in-flight window after `end`:
/// in `[end + W, end + 2W)`, or near the start of any existing segment
/// above `end`'s (a segment the log reached holds a record start within
/// its first `W / 2` bytes, since a record is at most half a window, and
/// within its data area, since a record is at most that). Each segment is
/// searched within its own data area only: the next one, if it exists, is
/// searched in turn.
fn beyond_the_window(reader: &mut LogReader, end: Lsn, window: u64) -> Result<Option<Lsn>> {
    let from = end.plus(window);
    if let Some(l) = reader.find_valid(from, from.plus(window))? {
        return Ok(Some(l));
    }
    let g = reader.geometry();
    let here = g.segment_of(end);
    for seg in reader.segment_numbers()? {
        if seg <= here {
            continue;
        }
        let start = g.segment_start(seg);
        let to = start.plus(window.min(g.data_size()));
        if from.max(start) < to {
            if let Some(l) = reader.find_valid(from.max(start), to)? {
                return Ok(Some(l));
            }
        }
    }
    Ok(None)
}

/// The positions in `[end, end + 2 × window)` where a record header
/// claims its own position: leftovers of unacknowledged in-flight writes
/// that later appends could otherwise chain into.
pub fn in_flight_leftovers(reader: &mut LogReader, end: Lsn, window: u64) -> Result<Vec<Lsn>> {
    let align = reader.alignment();
    let to = end.plus(2 * window);
    let mut found = Vec::new();
    let mut p = end;
    while let Some(c) = reader.next_claimant(p, to)? {
        found.push(c);
        p = Lsn(c.0.saturating_add(align));
    }
    Ok(found)
}
