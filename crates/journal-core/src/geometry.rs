//! Where log bytes live: the one place that maps an LSN to a segment file
//! and an offset in it.

use iclog::Lsn;
use segment_recycler::DATA_OFFSET;

/// The layout of the log over its segment files, fixed when the journal is
/// created: LSN `l` lives in segment `l / D` at file offset
/// `DATA_OFFSET + l % D`, where `D` = segment size − [`DATA_OFFSET`] is the
/// number of log bytes a segment holds (its first 4 KiB are the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    segment_size: u64,
    alignment: u64,
}

impl Geometry {
    /// The geometry of segments of `segment_size` bytes holding records
    /// aligned to `alignment`. `segment_size` must exceed [`DATA_OFFSET`]
    /// (the journal's options guarantee it).
    pub fn new(segment_size: u64, alignment: u64) -> Self {
        debug_assert!(segment_size > DATA_OFFSET);
        Self {
            segment_size,
            alignment: alignment.max(1),
        }
    }

    /// Bytes per segment file, header included.
    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// Record alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Log bytes per segment (`D`).
    pub fn data_size(&self) -> u64 {
        self.segment_size - DATA_OFFSET
    }

    /// The segment holding `lsn`.
    pub fn segment_of(&self, lsn: Lsn) -> u64 {
        lsn.0 / self.data_size()
    }

    /// The segment holding `lsn` and the file offset of `lsn` in it.
    pub fn locate(&self, lsn: Lsn) -> (u64, u64) {
        let d = self.data_size();
        (lsn.0 / d, DATA_OFFSET + lsn.0 % d)
    }

    /// Log bytes from `lsn` to the end of its segment.
    pub fn room_in_segment(&self, lsn: Lsn) -> u64 {
        self.data_size() - lsn.0 % self.data_size()
    }

    /// The LSN of the first log byte of segment `n`.
    pub fn segment_start(&self, n: u64) -> Lsn {
        Lsn(n * self.data_size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_map_to_segments_past_their_headers() {
        let g = Geometry::new(64 << 10, 512);
        let d = (64 << 10) - DATA_OFFSET;
        assert_eq!(g.data_size(), d);
        assert_eq!(g.locate(Lsn(0)), (0, DATA_OFFSET));
        assert_eq!(g.locate(Lsn(d - 1)), (0, DATA_OFFSET + d - 1));
        assert_eq!(g.locate(Lsn(d)), (1, DATA_OFFSET));
        assert_eq!(g.room_in_segment(Lsn(d - 10)), 10);
        assert_eq!(g.segment_start(3), Lsn(3 * d));
        assert_eq!(g.segment_of(g.segment_start(3)), 3);
    }
}
