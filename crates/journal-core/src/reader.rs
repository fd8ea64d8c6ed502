//! Reading the log by LSN: records across segments, with a read-ahead
//! buffer. Used by recovery, `read_from`, and the inspection tools.

use crate::{Damage, Geometry, Result};
use iclog::format::{parse_record, Record, RecordCheck};
use iclog::{Lsn, MAX_LOGBSIZE};
use journal_vfs::{OpenOptions, Vfs, VfsFile};
use segment_recycler::segment_name;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An entry read back: its LSN and bytes.
pub type Entry = (Lsn, Vec<u8>);

/// The largest payload any record can have (a 1 MiB buffer less its header).
pub const MAX_PAYLOAD: usize = MAX_LOGBSIZE - iclog::format::HEADER_SIZE;

const CHUNK: usize = 256 << 10;

/// Reads log bytes by LSN from the segment files of a directory, opened
/// read-only. A missing segment reads as zeros (the end of the log).
pub struct LogReader {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    geometry: Geometry,
    files: HashMap<u64, Option<Box<dyn VfsFile>>>,
    /// Bytes of the log starting at `buf_lsn`.
    buf: Vec<u8>,
    buf_lsn: Lsn,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl LogReader {
    /// A reader of the journal in `dir` with the given geometry.
    pub fn new(vfs: Arc<dyn Vfs>, dir: &Path, geometry: Geometry) -> Self {
        Self {
            vfs,
            dir: dir.to_path_buf(),
            geometry,
            files: HashMap::new(),
            buf: Vec::new(),
            buf_lsn: Lsn(0),
        }
    }

    /// The layout of the log it reads.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The record alignment.
    pub fn alignment(&self) -> u64 {
        self.geometry.alignment()
    }

    /// The segment holding `lsn`.
    pub fn segment_of(&self, lsn: Lsn) -> u64 {
        self.geometry.segment_of(lsn)
    }

    /// Forgets cached bytes and handles (after the files changed).
    pub fn invalidate(&mut self) {
        self.buf.clear();
        self.files.clear();
    }

    fn file(&mut self, seg: u64) -> Result<Option<&dyn VfsFile>> {
        if !self.files.contains_key(&seg) {
            let path = self.dir.join(segment_name(seg));
            let f = if self.vfs.exists(&path)? {
                Some(self.vfs.open(&path, OpenOptions::read())?)
            } else {
                None
            };
            self.files.insert(seg, f);
        }
        Ok(self.files[&seg].as_deref())
    }

    /// Whether segment `seg` exists.
    pub fn segment_exists(&mut self, seg: u64) -> Result<bool> {
        Ok(self.file(seg)?.is_some())
    }

    /// The numbers of the segment files in the directory, ascending.
    pub fn segment_numbers(&self) -> Result<Vec<u64>> {
        let mut v: Vec<u64> = self
            .vfs
            .read_dir(&self.dir)?
            .iter()
            .filter_map(|name| match segment_recycler::parse_name(name) {
                segment_recycler::NameKind::Segment(n) => Some(n),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// Fills `out` with the log bytes at `lsn` (zeros where no segment or
    /// past a segment's end).
    pub fn read(&mut self, lsn: Lsn, out: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < out.len() {
            let at = lsn.plus(done as u64);
            let (seg, offset) = self.geometry.locate(at);
            let n = (self.geometry.room_in_segment(at) as usize).min(out.len() - done);
            let dst = &mut out[done..done + n];
            match self.file(seg)? {
                Some(f) => {
                    let mut got = 0;
                    while got < n {
                        let r = f.read_at(&mut dst[got..], offset + got as u64)?;
                        if r == 0 {
                            break;
                        }
                        got += r;
                    }
                    dst[got..].fill(0);
                }
                None => dst.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// The bytes at `lsn`, at least `len` of them, from the read-ahead buffer.
    fn bytes(&mut self, lsn: Lsn, len: usize) -> Result<&[u8]> {
        let have =
            lsn >= self.buf_lsn && lsn.0 + len as u64 <= self.buf_lsn.0 + self.buf.len() as u64;
        if !have {
            let want = len.max(CHUNK);
            let mut buf = std::mem::take(&mut self.buf);
            buf.resize(want, 0);
            self.read(lsn, &mut buf)?;
            self.buf = buf;
            self.buf_lsn = lsn;
        }
        let start = (lsn.0 - self.buf_lsn.0) as usize;
        Ok(&self.buf[start..])
    }

    /// Parses what is at `lsn` as a record expected there. The returned
    /// check borrows the reader's buffer.
    pub fn check(&mut self, lsn: Lsn) -> Result<RecordCheck<'_>> {
        let align = self.alignment();
        // Read the header first, then as much as its length field asks.
        let header = self.bytes(lsn, iclog::format::HEADER_SIZE)?;
        let claimed = match iclog::format::peek_header(header) {
            Some(h) if (h.len.get() as usize) <= MAX_PAYLOAD => h.len.get() as usize,
            _ => 0,
        };
        let need = iclog::format::HEADER_SIZE + claimed;
        let bytes = self.bytes(lsn, need)?;
        Ok(parse_record(bytes, lsn, MAX_PAYLOAD, align))
    }

    /// The record at `lsn` if it is valid, or what was found instead
    /// ([`Damage::classify`] with this reader's geometry).
    pub fn examine(&mut self, lsn: Lsn) -> Result<std::result::Result<Record<'_>, Damage>> {
        let geometry = self.geometry;
        let segment = geometry.segment_of(lsn);
        if !self.segment_exists(segment)? {
            return Ok(Err(Damage::NoSegment { segment }));
        }
        Ok(Damage::classify(self.check(lsn)?, lsn, geometry))
    }

    /// Whether a record header claiming exactly `lsn` starts at `lsn` (magic
    /// and LSN only; no checksum).
    pub fn claims(&mut self, lsn: Lsn) -> Result<bool> {
        let b = self.bytes(lsn, iclog::format::HEADER_SIZE)?;
        Ok(iclog::format::peek_header(b).is_some_and(|h| h.lsn.get() == lsn.0))
    }

    /// The first LSN in `[from, to)` (stepping by the alignment) where a
    /// valid record with that LSN starts.
    pub fn find_valid(&mut self, from: Lsn, to: Lsn) -> Result<Option<Lsn>> {
        let align = self.alignment();
        let mut p = iclog::format::align_up(from.0, align);
        while p < to.0 {
            if self.claims(Lsn(p))? && matches!(self.check(Lsn(p))?, RecordCheck::Valid(_)) {
                return Ok(Some(Lsn(p)));
            }
            p += align;
        }
        Ok(None)
    }

    /// The record at `lsn`: its entries and its end if it is valid, or
    /// what was found instead.
    pub fn record(&mut self, lsn: Lsn) -> Result<std::result::Result<(Vec<Entry>, Lsn), Damage>> {
        Ok(self
            .examine(lsn)?
            .map(|r| (r.entries().map(|(l, b)| (l, b.to_vec())).collect(), r.end())))
    }
}
