//! Log space: how far the log may be laid out, and what a full filesystem
//! looks like.
//!
//! The ring begins no buffer that reaches past its append limit, which the
//! journal keeps at the end of the segment files that are ready
//! ([`ready_end`]). So no log write ever needs a file that is not there:
//! when the filesystem is full, the append that would need the next
//! segment fails with [`crate::Error::NoSpace`] before it is given an LSN,
//! and nothing acknowledged, written or buffered is in doubt.

use crate::Geometry;
use iclog::Lsn;
use segment_recycler::SegmentStore;

/// The end of the run of ready segments from segment `from` on: the LSN
/// below which every byte has a segment file to go to.
pub(crate) fn ready_end(store: &SegmentStore, g: Geometry, from: u64) -> Lsn {
    let mut n = from;
    while store.existing(n).is_some() {
        n += 1;
    }
    g.segment_start(n)
}

/// Whether a segment store error is the filesystem being full (ENOSPC,
/// or the user's quota: EDQUOT).
pub(crate) fn is_no_space(e: &segment_recycler::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        segment_recycler::Error::Io { source, .. } => {
            matches!(
                source.kind(),
                ErrorKind::StorageFull | ErrorKind::QuotaExceeded
            )
        }
        _ => false,
    }
}
