//! Reading the log back: one entry by its LSN ([`Journal::read_at`]), the
//! entries from an LSN on ([`Journal::read_from`]) or in a range
//! ([`Journal::read_range`]).
//!
//! Every read starts at a record the journal knows to start at or below
//! the LSN it wants — the record index ([`crate::index`]) — and follows
//! records from there, so what a read costs depends on what it reads, not
//! on how long the log is.

use crate::pins::{SegmentPin, SegmentPins};
use crate::reader::{Entry, EntryBytes, LogReader, OpenChain};
use crate::recovery::SkippedRange;
use crate::{Error, Journal, Result};
use iclog::format::Chains;
use iclog::Lsn;
use std::collections::VecDeque;
use std::sync::Arc;

impl Journal {
    /// The entry that [`Journal::append`] returned `lsn` for, read from the
    /// segment files (a chained record reassembled), its record's CRC
    /// checked.
    ///
    /// The cost does not grow with the log: the record index gives a
    /// record start at most 64 KiB below the entry's record, and the read
    /// follows records from there. The entry is a view of a mapped segment
    /// when its segment is sealed, of a `pread` buffer otherwise
    /// ([`EntryBytes`]).
    ///
    /// Errors: [`Error::LsnNotInLog`] below the tail (the redo LSN),
    /// [`Error::LsnNotDurable`] at or past the durable LSN (or for a
    /// chained record whose last part is not durable yet),
    /// [`Error::NotAnEntry`] for an LSN inside the log that no append
    /// returned, [`Error::Corruption`] if the bytes on disk no longer
    /// check.
    pub fn read_at(&self, lsn: Lsn) -> Result<EntryBytes> {
        self.check()?;
        let durable = self.durable_lsn();
        if lsn >= durable {
            return Err(Error::LsnNotDurable { lsn, durable });
        }
        // `lsn` is below the durable LSN, so `lsn + 1` cannot overflow.
        let mut it = self.read_iter(lsn, Some(Lsn(lsn.0 + 1)))?;
        match it.next() {
            Some(Ok((l, bytes))) if l == lsn => Ok(bytes),
            Some(Err(e)) => Err(e),
            _ if it.chains.pending() == Some(lsn) => Err(Error::LsnNotDurable {
                lsn,
                durable: it.end,
            }),
            _ => Err(Error::NotAnEntry { lsn }),
        }
    }

    /// Iterates over the entries with LSN at or after `lsn`, up to the
    /// durable LSN, reading the segment files: `(lsn, bytes)` for replay.
    ///
    /// Reading starts at the record holding `lsn` (found through the record
    /// index, not by scanning from the checkpoint), so it costs what it
    /// reads. Sealed segments are memory-mapped and entries come out as
    /// views of them ([`EntryBytes`], no copy; a chained record is
    /// reassembled into a buffer of its own). A chained record whose last
    /// part is not durable yet is not returned. While the iterator (or any
    /// entry it returned) lives, checkpoints leave the segments it reads
    /// in place.
    pub fn read_from(&self, lsn: Lsn) -> Result<ReadIter> {
        self.read_iter(lsn, None)
    }

    /// Like [`Journal::read_from`], ending before `to`: the entries with
    /// LSN in `from..to` (catching up a replica, say, to a known point).
    pub fn read_range(&self, from: Lsn, to: Lsn) -> Result<ReadIter> {
        self.read_iter(from, Some(to))
    }

    fn read_iter(&self, from: Lsn, to: Option<Lsn>) -> Result<ReadIter> {
        let (start, floor) = self.pinned_start(from, |pins, seg| pins.pin(seg))?;
        Ok(ReadIter::new(
            self.reader(),
            start,
            from,
            to,
            self.durable_lsn(),
            Some(floor),
            self.recovery_report().skipped.clone(),
        ))
    }

    /// Where a read of the entries from `from` starts — a record start at
    /// or below it — with that segment pinned by `pin`, both under the
    /// control lock, so that no checkpoint recycles it in between.
    /// [`Error::LsnNotInLog`] below the tail.
    pub(crate) fn pinned_start<P>(
        &self,
        from: Lsn,
        pin: impl FnOnce(&Arc<SegmentPins>, u64) -> P,
    ) -> Result<(Lsn, P)> {
        self.check()?;
        let control = self.inner.control.lock();
        let c = control.current();
        if from < c.redo_lsn {
            return Err(Error::LsnNotInLog {
                lsn: from,
                tail: c.redo_lsn,
            });
        }
        let start = self.record_floor(from, c.scan_lsn);
        let pinned = pin(&self.inner.pins, self.geometry().segment_of(start));
        Ok((start, pinned))
    }

    /// A record start at or below `lsn` and at or above `scan` (the
    /// checkpoint's scan position, itself a record start at or below
    /// every LSN still in the log): the closest the index knows.
    pub(crate) fn record_floor(&self, lsn: Lsn, scan: Lsn) -> Lsn {
        self.inner
            .index
            .floor(lsn)
            .map_or(scan, |start| start.max(scan))
    }
}

/// Iterator of [`Journal::read_from`] and [`Journal::read_range`]:
/// `(lsn, bytes)` of each entry.
pub struct ReadIter {
    reader: LogReader,
    /// The record to parse next.
    pos: Lsn,
    from: Lsn,
    /// Entries at or after this are not returned.
    to: Option<Lsn>,
    /// Records are parsed up to here (the durable LSN when made).
    pub(crate) end: Lsn,
    pending: VecDeque<Entry>,
    /// Follows chained records, and the parts of the one being read.
    pub(crate) chains: Chains,
    open: OpenChain,
    /// An error was returned, or the range's end passed: nothing more.
    done: bool,
    /// Corrupt ranges recovery skipped ([`crate::RecoveryMode::SkipCorrupt`]).
    skipped: Vec<SkippedRange>,
    /// Holds every segment from the start up against recycling (a
    /// follower holds its own, revocable pin instead).
    _floor: Option<SegmentPin>,
}

impl std::fmt::Debug for ReadIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadIter")
            .field("pos", &self.pos)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl ReadIter {
    /// Reads with `reader` from the record starting at `pos`, returning
    /// entries in `from..to`, parsing records below `end`.
    pub(crate) fn new(
        reader: LogReader,
        pos: Lsn,
        from: Lsn,
        to: Option<Lsn>,
        end: Lsn,
        floor: Option<SegmentPin>,
        skipped: Vec<SkippedRange>,
    ) -> Self {
        Self {
            reader,
            pos,
            from,
            to,
            end,
            pending: VecDeque::new(),
            chains: Chains::new(),
            open: OpenChain::default(),
            done: false,
            skipped,
            _floor: floor,
        }
    }

    /// The start of the record it parses next.
    pub(crate) fn position(&self) -> Lsn {
        self.pos
    }

    /// The log is durable up to `end` now: go on reading to there (a
    /// follower; its reader reads with `pread` only).
    pub(crate) fn extend(&mut self, end: Lsn) {
        if end > self.end {
            self.end = end;
            let seg = self.reader.segment_of(self.pos);
            self.reader.refresh(seg, end);
        }
    }

    /// Whether the range's end has been passed.
    fn past_the_range(&self) -> bool {
        self.to.is_some_and(|to| {
            self.pos >= to && self.chains.pending().is_none_or(|first| first >= to)
        })
    }
}

impl Iterator for ReadIter {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                if e.0 < self.from {
                    continue;
                }
                if self.to.is_some_and(|to| e.0 >= to) {
                    // Entries come out in LSN order: the rest are past it too.
                    self.done = true;
                    self.pending.clear();
                    return None;
                }
                return Some(Ok(e));
            }
            // A chain still open at the end is not durable as a whole (or
            // was cut by a crash): none of it is returned.
            if self.done || self.pos >= self.end || self.past_the_range() {
                return None;
            }
            if let Some(s) = self.skipped.iter().find(|s| s.from == self.pos) {
                self.pos = s.to;
                self.chains.reset();
                self.open.clear();
                continue;
            }
            match self.reader.entries(
                self.pos,
                &mut self.chains,
                &mut self.open,
                &mut self.pending,
            ) {
                Ok(Ok((next, _dropped))) => {
                    // Dropped parts (a chain a crash cut, before the
                    // recovered end; parts of a chain begun before the
                    // start) were never whole records: nothing lost.
                    self.pos = next;
                }
                Ok(Err(found)) => {
                    // Below the durable LSN every record must be valid.
                    self.done = true;
                    return Some(Err(Error::Corruption {
                        lsn: self.pos,
                        segment: self.reader.segment_of(self.pos),
                        found,
                        next_valid: None,
                    }));
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
