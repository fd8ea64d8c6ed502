//! What opening the store finds: a read-only scan of the directory, each
//! segment classified by its header and size, the report.

use super::*;

/// One segment file found by [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedSegment {
    /// Its number (from its name).
    pub number: u64,
    /// Its path.
    pub path: PathBuf,
    /// Its header: valid (with the number it carries), or what is wrong.
    pub header: HeaderCheck,
    /// Its length in bytes.
    pub len: u64,
}

/// A read-only look at a journal directory: segments (with their headers),
/// temporaries and other names. Modifies nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Segments, ascending by number.
    pub segments: Vec<ScannedSegment>,
    /// Leftovers of interrupted creations.
    pub temporaries: Vec<String>,
    /// Other names.
    pub other: Vec<String>,
}

/// Lists and classifies a journal directory without modifying anything.
pub fn scan(vfs: &dyn Vfs, dir: &Path) -> Result<ScanReport, Error> {
    let mut report = ScanReport::default();
    let mut names = vfs.read_dir(dir).map_err(Error::io(None))?;
    names.sort();
    for name in names {
        match parse_name(&name) {
            NameKind::Segment(n) => {
                let path = dir.join(&name);
                let f = vfs
                    .open(&path, OpenOptions::read())
                    .map_err(Error::io(Some(n)))?;
                let mut buf = [0u8; SEGMENT_HEADER_SIZE];
                let got = f.read_at(&mut buf, 0).map_err(Error::io(Some(n)))?;
                let len = f.len().map_err(Error::io(Some(n)))?;
                report.segments.push(ScannedSegment {
                    number: n,
                    path,
                    header: SegmentHeader::check(&buf[..got]),
                    len,
                });
            }
            NameKind::Temporary(_) => report.temporaries.push(name),
            NameKind::Other => report.other.push(name),
        }
    }
    Ok(report)
}

/// What [`SegmentStore::open`] found.
#[derive(Debug, Clone, Default)]
pub struct StartupReport {
    /// Segment numbers found, ascending.
    pub segments: Vec<u64>,
    /// Names in the directory that are not segments (ignored).
    pub ignored: Vec<String>,
    /// Leftovers of interrupted segment creations (removed).
    pub removed_temporaries: Vec<String>,
    /// Missing numbers between the lowest and highest segment.
    pub gaps: Vec<u64>,
    /// Segments whose header was lost (zeros) or carries another number (a
    /// recycle cut short by a crash): their contents are stale; their
    /// header was rewritten.
    pub reinitialized: Vec<u64>,
    /// Damaged segments (bad header magic or checksum, shorter than a
    /// header, the wrong size): not installed. Whether one may be replaced
    /// is for the owner of the log to decide (it must lie outside the live
    /// log); see [`SegmentStore::replace_damaged`].
    pub damaged: Vec<DamagedSegment>,
    /// Damaged segments outside the live log that were removed, to be
    /// created anew when the log reaches them.
    pub replaced: Vec<u64>,
}

/// A segment [`SegmentStore::open`] found damaged.
#[derive(Debug, Clone)]
pub struct DamagedSegment {
    /// Its number.
    pub segment: u64,
    /// What is wrong ([`Error::BadHeader`] or [`Error::SizeMismatch`]).
    pub error: std::sync::Arc<Error>,
}

/// What [`SegmentStore::open`] does with a segment it found.
pub(super) enum Found {
    /// Install it; `stale`: its header was lost or carries another number
    /// (a recycle cut short), so it is rewritten first.
    Usable {
        /// Rewrite the header.
        stale: bool,
    },
    /// Damaged: not installed; reported.
    Damaged(Error),
}

/// Classifies a segment found at open: usable (stale or not), damaged, or
/// an error that stops the open (another journal's segment, another
/// segment size, a newer version).
pub(super) fn classify(
    s: &ScannedSegment,
    config: &StoreConfig,
    journal_id: JournalId,
) -> Result<Found, Error> {
    let n = s.number;
    let stale = match s.header {
        HeaderCheck::Valid(h) => {
            if h.journal_id != journal_id {
                return Err(Error::ForeignSegment {
                    path: s.path.clone(),
                    segment: n,
                });
            }
            if h.segment_size.get() != config.segment_size {
                // Fixed at creation for every segment: a journal
                // made with another size, not damage.
                return Err(Error::SizeMismatch {
                    path: s.path.clone(),
                    expected: config.segment_size,
                    found: h.segment_size.get(),
                });
            }
            // A number other than the name's is a recycle cut short
            // by a crash: an older one, the header rewrite was lost;
            // a later one, the rename was lost. Either way the data
            // is stale (recycled segments lie wholly below a tail
            // that was made durable before the recycle began).
            h.segment_no.get() != n
        }
        HeaderCheck::Zeroes => true,
        HeaderCheck::UnsupportedVersion(v) => {
            return Err(Error::UnsupportedVersion {
                path: s.path.clone(),
                version: v,
            })
        }
        HeaderCheck::BadMagic => {
            return Ok(Found::Damaged(bad(s, "not a segment header (magic)")));
        }
        HeaderCheck::BadCrc => {
            return Ok(Found::Damaged(bad(s, "header checksum mismatch")));
        }
        HeaderCheck::Short => {
            return Ok(Found::Damaged(bad(s, "file shorter than a header")));
        }
    };
    if s.len != config.segment_size {
        return Ok(Found::Damaged(Error::SizeMismatch {
            path: s.path.clone(),
            expected: config.segment_size,
            found: s.len,
        }));
    }
    Ok(Found::Usable { stale })
}

fn bad(s: &ScannedSegment, reason: &'static str) -> Error {
    Error::BadHeader {
        path: s.path.clone(),
        segment: s.number,
        reason,
    }
}
