//! Where records start: a sparse, in-memory index that lets a read find
//! the record holding an entry without scanning the log from the
//! checkpoint.
//!
//! An entry's LSN lies inside its record (record LSN + 48-byte header +
//! the entry's offset in the payload), and records follow each other with
//! no gaps, so a reader that knows *any* record start at or below an LSN
//! reaches the record holding it by following record lengths. The index
//! keeps, for every [`STRIDE`]-byte stretch of LSN space, the lowest record
//! start inside it: the journal's device notes every record it writes
//! (before the write, so the index covers whatever becomes durable), and
//! recovery notes every record its scan validates. A lookup takes the
//! greatest noted start at or below the LSN; from there a read parses at
//! most `STRIDE + logbsize` bytes of records (a record is at most one
//! buffer, 1 MiB) before it reaches the one it wants — a cost that does not
//! grow with the log. The index costs one map entry per `STRIDE` bytes of
//! live log (about 16,000 per GiB).
//!
//! Headers are only ever parsed at positions reached this way — a record
//! start the writer or recovery vouched for, then the ends of valid
//! records after it — never by probing positions for something that
//! looks like a header. A payload can therefore never pass for a header,
//! whatever bytes it holds: an entry's bytes are only ever read as the
//! payload of the record that contains them.
//!
//! The index lives in memory only and is rebuilt by recovery at open;
//! nothing of it is on disk (docs/FORMAT.md, "Finding a record").

use iclog::Lsn;
use journal_sync::Mutex;
use std::collections::BTreeMap;

/// The stretch of LSN space one index entry covers.
pub const STRIDE: u64 = 64 << 10;

/// The lowest record start noted in each [`STRIDE`]-byte stretch of the
/// log.
#[derive(Debug, Default)]
pub(crate) struct RecordIndex {
    /// Stretch number (`lsn / STRIDE`) → the lowest record start noted in it.
    starts: Mutex<BTreeMap<u64, u64>>,
}

impl RecordIndex {
    /// Notes that a record starts at `lsn`.
    pub(crate) fn note(&self, lsn: Lsn) {
        let mut starts = self.starts.lock();
        starts
            .entry(lsn.0 / STRIDE)
            .and_modify(|s| *s = (*s).min(lsn.0))
            .or_insert(lsn.0);
    }

    /// The greatest noted record start at or below `lsn`.
    pub(crate) fn floor(&self, lsn: Lsn) -> Option<Lsn> {
        let starts = self.starts.lock();
        let mut below = starts.range(..=lsn.0 / STRIDE).rev();
        below
            .find(|&(_, &start)| start <= lsn.0)
            .map(|(_, &start)| Lsn(start))
    }

    /// Forgets the starts below `lsn` except the greatest of them, so that
    /// every LSN at or above `lsn` still has its floor (after a checkpoint
    /// moved the scan position to `lsn`).
    pub(crate) fn forget_below(&self, lsn: Lsn) {
        let mut starts = self.starts.lock();
        let keep = starts
            .range(..=lsn.0 / STRIDE)
            .rev()
            .find(|&(_, &start)| start <= lsn.0)
            .map(|(&k, _)| k);
        if let Some(keep) = keep {
            let rest = starts.split_off(&keep);
            *starts = rest;
        }
    }

    /// Entries held (for tests and the memory figure in the docs).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.starts.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_is_the_greatest_start_at_or_below() {
        let ix = RecordIndex::default();
        assert_eq!(ix.floor(Lsn(10)), None);
        for l in [0, 512, 1024, STRIDE - 512, STRIDE + 1024, 3 * STRIDE + 512] {
            ix.note(Lsn(l));
        }
        // One entry per stretch: the lowest start in it.
        assert_eq!(ix.len(), 3);
        assert_eq!(ix.floor(Lsn(0)), Some(Lsn(0)));
        assert_eq!(ix.floor(Lsn(700)), Some(Lsn(0)));
        // Inside stretch 1, below its lowest start: stretch 0's start.
        assert_eq!(ix.floor(Lsn(STRIDE)), Some(Lsn(0)));
        assert_eq!(ix.floor(Lsn(STRIDE + 1024)), Some(Lsn(STRIDE + 1024)));
        // Stretch 2 holds no start: stretch 1's.
        assert_eq!(ix.floor(Lsn(2 * STRIDE + 7)), Some(Lsn(STRIDE + 1024)));
        assert_eq!(ix.floor(Lsn(u64::MAX)), Some(Lsn(3 * STRIDE + 512)));
    }

    #[test]
    fn notes_out_of_order_keep_the_lowest_start() {
        let ix = RecordIndex::default();
        ix.note(Lsn(STRIDE + 4096));
        ix.note(Lsn(STRIDE + 512));
        ix.note(Lsn(STRIDE + 2048));
        assert_eq!(ix.floor(Lsn(STRIDE + 1000)), Some(Lsn(STRIDE + 512)));
        assert_eq!(ix.floor(Lsn(STRIDE + 100)), None);
    }

    #[test]
    fn forgetting_keeps_the_floor_of_the_new_scan_position() {
        let ix = RecordIndex::default();
        for k in 0..10 {
            ix.note(Lsn(k * STRIDE + 512));
        }
        ix.forget_below(Lsn(4 * STRIDE + 100));
        // Stretch 4's start (4·STRIDE + 512) is above the position: the
        // floor of the position is stretch 3's, which stays.
        assert_eq!(ix.len(), 7);
        assert_eq!(ix.floor(Lsn(4 * STRIDE + 100)), Some(Lsn(3 * STRIDE + 512)));
        assert_eq!(ix.floor(Lsn(STRIDE)), None);
    }
}
