//! Reading the log by LSN: records across segments, and whole entries
//! (chains reassembled) handed out without copying. Used by recovery,
//! `read_from`, and the inspection tools.
//!
//! # Where the bytes come from
//!
//! A *sealed* segment — one whose every data byte lies below the reader's
//! `sealed_below` bound (the durable end of the log when the reader was
//! made, or everything during recovery, when nothing writes) — is mapped
//! whole with [`VfsFile::map`] (`mmap` on the real filesystem, an
//! in-memory copy on `SimVfs`) and records are parsed in place. Bytes the
//! journal never rewrites are the only ones read through a mapping, and a
//! mapped segment is pinned ([`SegmentPins`]) so a checkpoint does not
//! recycle it while any view of it lives. Everything else (the segment
//! holding the end of the log, a record crossing a segment boundary, a
//! segment file of the wrong size, and every read of the inspection tools
//! of a journal another process has open) is read with `pread` into a
//! read-ahead buffer, shared the same way.
//!
//! Entries come out as [`EntryBytes`]: a range of a mapping or buffer,
//! reference-counted, so handing one out costs an atomic increment. A
//! chain (an entry written in parts, docs/FORMAT.md) comes out as the list
//! of its parts' ranges: [`EntryBytes::parts`] reads them in place, and
//! only dereferencing it as one slice concatenates them (once, cached).

use crate::{Damage, Geometry, Result};
use iclog::format::{parse_record, Chains, Dropped, Piece, Record, RecordCheck, HEADER_SIZE};
use iclog::{Lsn, MAX_LOGBSIZE};
use journal_sync::OnceLock;
use journal_vfs::{Mapping, OpenOptions, Vfs, VfsFile};
use segment_recycler::segment_name;
use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::pins::{SegmentPin, SegmentPins};

/// An entry read back: its LSN and bytes.
pub type Entry = (Lsn, EntryBytes);

/// The largest payload any record can have (a 1 MiB buffer less its header).
pub const MAX_PAYLOAD: usize = MAX_LOGBSIZE - HEADER_SIZE;

const CHUNK: usize = 256 << 10;

/// Bytes entries borrow: a mapped segment (pinned while it lives) or a
/// buffer filled with `pread` (or a reassembled chain).
#[derive(Debug)]
struct Source {
    bytes: Mapping,
    _pin: Option<SegmentPin>,
}

impl Source {
    fn owned(bytes: Vec<u8>) -> Arc<Self> {
        Arc::new(Self {
            bytes: Mapping::from_vec(bytes),
            _pin: None,
        })
    }
}

/// A range of a [`Source`].
#[derive(Debug, Clone)]
struct View {
    src: Arc<Source>,
    start: usize,
    len: usize,
}

impl View {
    fn new(src: &Arc<Source>, bytes: &[u8]) -> Self {
        // `bytes` is a sub-slice of `src`: its offset follows from the
        // addresses (plain integer arithmetic on the pointers).
        let start = bytes.as_ptr() as usize - src.bytes.as_ptr() as usize;
        debug_assert!(start + bytes.len() <= src.bytes.len());
        Self {
            src: src.clone(),
            start,
            len: bytes.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.src.bytes[self.start..self.start + self.len]
    }
}

/// The parts of a chained record, and their concatenation once asked for.
#[derive(Debug)]
struct Chained {
    parts: Vec<View>,
    len: usize,
    joined: OnceLock<Box<[u8]>>,
}

#[derive(Debug, Clone)]
enum Repr {
    One(View),
    Parts(Arc<Chained>),
}

/// The bytes of one entry read from the log: a view into a mapped
/// segment (no copy) or into a read buffer; for a chained record, the list
/// of its parts' views. Dereferences to `[u8]` (a chained record is then
/// concatenated, once; [`EntryBytes::parts`] reads it without copying);
/// cloning is cheap (a reference count). Holding one keeps its segments
/// mapped and pinned against recycling (or its read buffers alive): copy
/// out ([`EntryBytes::into_vec`], or `to_vec` through deref) what you keep
/// long.
#[derive(Clone)]
pub struct EntryBytes {
    repr: Repr,
}

impl EntryBytes {
    /// The entry's bytes in the order written, without copying: one slice,
    /// or one per part of a chained record.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        let (one, many): (Option<&View>, &[View]) = match &self.repr {
            Repr::One(v) => (Some(v), &[]),
            Repr::Parts(c) => (None, &c.parts),
        };
        one.into_iter().chain(many).map(View::bytes)
    }

    /// Whether the entry was written as a chain of parts.
    pub fn is_chained(&self) -> bool {
        matches!(self.repr, Repr::Parts(_))
    }

    /// Whether every byte is read in place from memory-mapped segments.
    pub fn is_mapped(&self) -> bool {
        match &self.repr {
            Repr::One(v) => v.src.bytes.is_mapped(),
            Repr::Parts(c) => c.parts.iter().all(|v| v.src.bytes.is_mapped()),
        }
    }

    /// The bytes as an owned vector (a copy).
    pub fn into_vec(self) -> Vec<u8> {
        self.to_vec()
    }
}

impl Deref for EntryBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.repr {
            Repr::One(v) => v.bytes(),
            Repr::Parts(c) => c.joined.get_or_init(|| {
                let mut all = Vec::with_capacity(c.len);
                for p in &c.parts {
                    all.extend_from_slice(p.bytes());
                }
                all.into_boxed_slice()
            }),
        }
    }
}

impl AsRef<[u8]> for EntryBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for EntryBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = match &self.repr {
            Repr::One(v) => v.len,
            Repr::Parts(c) => c.len,
        };
        f.debug_struct("EntryBytes")
            .field("len", &len)
            .field("chained", &self.is_chained())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl PartialEq for EntryBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}
impl Eq for EntryBytes {}
impl PartialEq<[u8]> for EntryBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}
impl PartialEq<&[u8]> for EntryBytes {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}
impl PartialEq<Vec<u8>> for EntryBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}
impl<const N: usize> PartialEq<[u8; N]> for EntryBytes {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == other[..]
    }
}
impl<const N: usize> PartialEq<&[u8; N]> for EntryBytes {
    fn eq(&self, other: &&[u8; N]) -> bool {
        **self == other[..]
    }
}
impl From<EntryBytes> for Vec<u8> {
    fn from(e: EntryBytes) -> Self {
        e.to_vec()
    }
}

/// A segment file as the reader sees it.
enum Seg {
    /// No such file.
    Missing,
    /// Read with `pread`.
    Read(Box<dyn VfsFile>),
    /// Mapped whole (sealed, full size).
    Mapped(Arc<Source>),
}

/// Reads log bytes by LSN from the segment files of a directory, opened
/// read-only. A missing segment reads as zeros (the end of the log).
pub struct LogReader {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    geometry: Geometry,
    segs: HashMap<u64, Seg>,
    /// Segments whose data lies wholly below this are mapped.
    sealed_below: Lsn,
    /// Where mapped segments are pinned (none: nothing recycles meanwhile).
    pins: Option<Arc<SegmentPins>>,
    /// The read-ahead buffer: log bytes starting at `buf_lsn`.
    buf: Arc<Source>,
    buf_lsn: Lsn,
    /// The source of the last record parsed (what [`LogReader::check`]
    /// borrows).
    cur: Arc<Source>,
    /// Read-ahead stops here (the durable end, for a reader following the
    /// log: what lies past it is not worth copying yet).
    read_end: Lsn,
}

impl fmt::Debug for LogReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogReader")
            .field("dir", &self.dir)
            .field("sealed_below", &self.sealed_below)
            .finish_non_exhaustive()
    }
}

impl LogReader {
    /// A reader of the journal in `dir` with the given geometry that maps
    /// nothing: every read is a `pread` (for a journal another process may
    /// be writing).
    pub fn new(vfs: Arc<dyn Vfs>, dir: &Path, geometry: Geometry) -> Self {
        let empty = Source::owned(Vec::new());
        Self {
            vfs,
            dir: dir.to_path_buf(),
            geometry,
            segs: HashMap::new(),
            sealed_below: Lsn(0),
            pins: None,
            buf: empty.clone(),
            buf_lsn: Lsn(0),
            cur: empty,
            read_end: Lsn(u64::MAX),
        }
    }

    /// A reader that maps every segment whose data lies wholly below
    /// `sealed_below`, pinning each in `pins` while any view of it lives.
    /// The caller guarantees nothing below `sealed_below` is rewritten
    /// while the reader or its entries live, except by recycling a
    /// segment, which the pins hold off (pass `None` only when nothing
    /// recycles: recovery, or a directory this process holds locked).
    pub fn mapping(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        geometry: Geometry,
        sealed_below: Lsn,
        pins: Option<Arc<SegmentPins>>,
    ) -> Self {
        Self {
            sealed_below,
            pins,
            ..Self::new(vfs, dir, geometry)
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

    /// The log is durable further: bytes past the old durable end are read
    /// afresh (the read-ahead buffer may hold them as they were), segments
    /// that did not exist are looked for again, and segments below
    /// `from_seg` are let go (with their pins). Handles of the others are
    /// kept, so a reader following the log opens each segment once.
    pub(crate) fn refresh(&mut self, from_seg: u64, read_end: Lsn) {
        self.read_end = read_end;
        self.segs
            .retain(|&n, s| n >= from_seg && !matches!(s, Seg::Missing));
        self.buf = Source::owned(Vec::new());
        self.cur = self.buf.clone();
    }

    fn seg(&mut self, n: u64) -> Result<&Seg> {
        if !self.segs.contains_key(&n) {
            let path = self.dir.join(segment_name(n));
            let s = if !self.vfs.exists(&path)? {
                Seg::Missing
            } else {
                let f = self.vfs.open(&path, OpenOptions::read())?;
                let sealed = self.geometry.segment_start(n + 1) <= self.sealed_below;
                if sealed && f.len()? == self.geometry.segment_size() {
                    // Pin first: from here on no checkpoint recycles it.
                    let pin = self.pins.as_ref().map(|p| p.pin(n));
                    let bytes = f.map()?;
                    if bytes.len() as u64 == self.geometry.segment_size() {
                        Seg::Mapped(Arc::new(Source { bytes, _pin: pin }))
                    } else {
                        Seg::Read(f)
                    }
                } else {
                    Seg::Read(f)
                }
            };
            self.segs.insert(n, s);
        }
        Ok(&self.segs[&n])
    }

    /// Whether segment `seg` exists.
    pub fn segment_exists(&mut self, seg: u64) -> Result<bool> {
        Ok(!matches!(self.seg(seg)?, Seg::Missing))
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
            match self.seg(seg)? {
                Seg::Mapped(m) => {
                    let o = offset as usize;
                    dst.copy_from_slice(&m.bytes[o..o + n]);
                }
                Seg::Read(f) => {
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
                Seg::Missing => dst.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// The bytes at `lsn`, at least `len` of them: `(source, offset)`. In
    /// place from a mapped segment when they lie inside one, else from the
    /// read-ahead buffer (refilled when it does not hold them).
    fn view(&mut self, lsn: Lsn, len: usize) -> Result<(Arc<Source>, usize)> {
        let (seg, offset) = self.geometry.locate(lsn);
        if (len as u64) <= self.geometry.room_in_segment(lsn) {
            if let Seg::Mapped(m) = self.seg(seg)? {
                return Ok((m.clone(), offset as usize));
            }
        }
        let have = lsn >= self.buf_lsn
            && lsn.0 + len as u64 <= self.buf_lsn.0 + self.buf.bytes.len() as u64;
        if !have {
            let ahead = CHUNK.min(self.read_end.0.saturating_sub(lsn.0) as usize);
            let mut buf = self.spare_buffer();
            buf.resize(len.max(ahead), 0);
            self.read(lsn, &mut buf)?;
            self.buf = Source::owned(buf);
            self.buf_lsn = lsn;
        }
        Ok((self.buf.clone(), (lsn.0 - self.buf_lsn.0) as usize))
    }

    /// The read-ahead buffer's memory for its next fill, if no entry
    /// still borrows it (else a new one): no allocation and no zeroing per
    /// refill, since [`LogReader::read`] writes every byte it is given.
    fn spare_buffer(&mut self) -> Vec<u8> {
        let empty = Source::owned(Vec::new());
        if Arc::ptr_eq(&self.cur, &self.buf) {
            self.cur = empty.clone();
        }
        let old = std::mem::replace(&mut self.buf, empty);
        Arc::try_unwrap(old)
            .ok()
            .and_then(|s| s.bytes.into_vec())
            .unwrap_or_default()
    }

    /// The bytes of the record expected at `lsn`: its header, and as many
    /// bytes as its length field asks (when plausible).
    fn view_record(&mut self, lsn: Lsn) -> Result<(Arc<Source>, usize)> {
        let (src, off) = self.view(lsn, HEADER_SIZE)?;
        let claimed = match iclog::format::peek_header(&src.bytes[off..]) {
            Some(h) if (h.len.get() as usize) <= MAX_PAYLOAD => h.len.get() as usize,
            _ => 0,
        };
        if src.bytes.len() - off >= HEADER_SIZE + claimed {
            return Ok((src, off));
        }
        self.view(lsn, HEADER_SIZE + claimed)
    }

    /// Parses what is at `lsn` as a record expected there. The returned
    /// check borrows the reader.
    pub fn check(&mut self, lsn: Lsn) -> Result<RecordCheck<'_>> {
        let align = self.alignment();
        let (src, off) = self.view_record(lsn)?;
        self.cur = src;
        Ok(parse_record(
            &self.cur.bytes[off..],
            lsn,
            MAX_PAYLOAD,
            align,
        ))
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

    /// The first LSN in `[from, to)` (stepping by the alignment) where a
    /// valid record with that LSN starts.
    pub fn find_valid(&mut self, from: Lsn, to: Lsn) -> Result<Option<Lsn>> {
        let align = self.alignment();
        let mut p = Lsn(iclog::format::align_up(from.0, align));
        while let Some(c) = self.next_claimant(p, to)? {
            if matches!(self.check(c)?, RecordCheck::Valid(_)) {
                return Ok(Some(c));
            }
            p = Lsn(c.0.saturating_add(align));
        }
        Ok(None)
    }

    /// The first position in `[from, to)` (`from` aligned, stepping by the
    /// alignment) where a record header claims that position as its LSN —
    /// valid or not. One view serves every position it holds whole headers
    /// for, each looked at in place: scanning a window costs a compare per
    /// position, not a segment lookup; missing segments are stepped over.
    pub fn next_claimant(&mut self, from: Lsn, to: Lsn) -> Result<Option<Lsn>> {
        let align = self.alignment();
        let mut p = from.0;
        while p < to.0 {
            p = self.skip_missing(p)?;
            if p >= to.0 {
                break;
            }
            let (src, off) = self.view(Lsn(p), HEADER_SIZE)?;
            let held = (src.bytes.len() - off).saturating_sub(HEADER_SIZE) as u64;
            let end = to.0.min(p.saturating_add(held).saturating_add(1));
            let mut q = p;
            while q < end {
                let at = off + (q - p) as usize;
                if align == 1 {
                    // Byte by byte (alignment 1): jump to the next place the
                    // magic starts; a header is parsed only there.
                    let last = off + (end - p) as usize;
                    match find_magic(&src.bytes, at, last) {
                        Some(i) => q = p + (i - off) as u64,
                        None => {
                            q = end;
                            continue;
                        }
                    }
                }
                let at = off + (q - p) as usize;
                if src.bytes[at..at + 4] == MAGIC_BYTES
                    && iclog::format::peek_header(&src.bytes[at..])
                        .is_some_and(|h| h.lsn.get() == q)
                {
                    return Ok(Some(Lsn(q)));
                }
                q = q.saturating_add(align);
            }
            p = q.max(p.saturating_add(align));
        }
        Ok(None)
    }

    /// `p`, or, when `p` falls in a segment that does not exist (it reads
    /// as zeros: nothing there claims a position), the start of the next
    /// segment that does — or `u64::MAX` past the last — so that scans
    /// past the end of the log step over missing segments a segment at a
    /// time. Segment data areas start on whole blocks, so an aligned
    /// position stays aligned.
    pub fn skip_missing(&mut self, p: u64) -> Result<u64> {
        let g = self.geometry;
        let (seg, _) = g.locate(Lsn(p));
        if !matches!(self.seg(seg)?, Seg::Missing) {
            return Ok(p);
        }
        // The directory lists the segments that exist, in order.
        let next = self.segment_numbers()?.into_iter().find(|&n| n > seg);
        Ok(next.map_or(u64::MAX, |n| g.segment_start(n).0))
    }

    /// The end of the valid record at `lsn`, or what was found instead.
    pub fn record_end(&mut self, lsn: Lsn) -> Result<std::result::Result<Lsn, Damage>> {
        Ok(self.examine(lsn)?.map(|r| r.end()))
    }

    /// Feeds the record at `lsn` to `chains` and pushes the whole entries
    /// it completes onto `out`, without copying (`open` collects the views
    /// of the chain being read). Returns the record's end and what was
    /// dropped, or what was found instead of a valid record.
    pub fn entries(
        &mut self,
        lsn: Lsn,
        chains: &mut Chains,
        open: &mut OpenChain,
        out: &mut impl Extend<Entry>,
    ) -> Result<std::result::Result<(Lsn, Dropped), Damage>> {
        let geometry = self.geometry;
        let segment = geometry.segment_of(lsn);
        if !self.segment_exists(segment)? {
            return Ok(Err(Damage::NoSegment { segment }));
        }
        let (src, off) = self.view_record(lsn)?;
        let check = parse_record(&src.bytes[off..], lsn, MAX_PAYLOAD, geometry.alignment());
        let record = match Damage::classify(check, lsn, geometry) {
            Ok(r) => r,
            Err(d) => return Ok(Err(d)),
        };
        let dropped = chains.feed(&record, |p| match p {
            Piece::Whole(l, b) => out.extend(std::iter::once((
                l,
                EntryBytes {
                    repr: Repr::One(View::new(&src, b)),
                },
            ))),
            Piece::Part { first, bytes, last } => {
                open.0.push(View::new(&src, bytes));
                if last {
                    let parts = std::mem::take(&mut open.0);
                    let len = parts.iter().map(|v| v.len).sum();
                    out.extend(std::iter::once((
                        first,
                        EntryBytes {
                            repr: Repr::Parts(Arc::new(Chained {
                                parts,
                                len,
                                joined: OnceLock::new(),
                            })),
                        },
                    )));
                }
            }
            Piece::Abandoned(_) => open.0.clear(),
            Piece::Orphan(_) => {}
        });
        Ok(Ok((record.end(), dropped)))
    }
}

/// The views of the parts of a chained record being read, kept between
/// calls of [`LogReader::entries`] (opaque).
#[derive(Debug, Default)]
pub struct OpenChain(Vec<View>);

impl OpenChain {
    /// Forgets the parts collected (the reader skipped ahead).
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// A record header's first four bytes.
const MAGIC_BYTES: [u8; 4] = iclog::format::MAGIC.to_le_bytes();

/// The first index in `[from, to)` where `bytes` holds [`MAGIC_BYTES`]
/// (the caller guarantees the three bytes past `to` exist).
fn find_magic(bytes: &[u8], from: usize, to: usize) -> Option<usize> {
    bytes
        .get(from..to.checked_add(3)?)?
        .windows(4)
        .position(|w| w == MAGIC_BYTES)
        .map(|i| from + i)
}
