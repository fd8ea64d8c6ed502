//! Read-only inspection of a journal directory: the control file, the
//! segment files, recovery's verdict and the records one by one — what
//! `journal dump`, `verify` and `stat` show, for any tool that must look at
//! a journal without opening it for writing.
//!
//! [`Inspector::open`] opens every file read-only. It takes the directory
//! lock only when it is free, for as long as the inspector lives: then no
//! writer can change the segments, and they are read in place through
//! memory mappings ([`Inspector::exclusive`]). When a live writer holds the
//! lock it reads with `pread` instead, never blocking the writer, and what
//! it reports is a snapshot that may end mid-flight.
//!
//! Nothing read is trusted: the control file is checked (CRC, version, and
//! a geometry any journal could have written), records are validated at
//! the LSN where they are expected, and whatever fails is a typed error or
//! a [`Damage`] in the report.

use crate::control::{read_control, Control};
use crate::reader::LogReader;
use crate::recovery::{self, RecoveryReport};
use crate::{Damage, Error, Geometry, RecoveryMode, Result};
use iclog::format::{Chains, Piece};
use iclog::{IoFlags, Lsn};
use journal_vfs::{DirLock, OsVfs, Vfs};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use segment_recycler::{HeaderCheck, ScanReport, ScannedSegment, SegmentHeader};

/// A journal directory opened read-only.
pub struct Inspector {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    control: Control,
    reader: LogReader,
    /// Held when it was free: the segments are then mapped.
    lock: Option<DirLock>,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("dir", &self.dir)
            .field("exclusive", &self.exclusive())
            .finish_non_exhaustive()
    }
}

impl Inspector {
    /// Opens the journal in `dir` on the real filesystem, read-only.
    pub fn open(dir: impl AsRef<Path>) -> Result<Inspector> {
        Self::open_with(Arc::new(OsVfs::new()), dir)
    }

    /// Like [`Inspector::open`], on any filesystem.
    ///
    /// Errors: [`Error::NotFound`] without the directory,
    /// [`Error::NotAJournal`] without a control file or with one no
    /// journal could have written, [`Error::UnsupportedVersion`].
    pub fn open_with(vfs: Arc<dyn Vfs>, dir: impl AsRef<Path>) -> Result<Inspector> {
        let dir = dir.as_ref().to_path_buf();
        if !vfs.exists(&dir)? {
            return Err(Error::NotFound { dir });
        }
        let Some(control) = read_control(&*vfs, &dir)? else {
            return Err(Error::NotAJournal {
                path: dir,
                reason: "no control file",
            });
        };
        let geometry = Geometry::new(control.segment_size, control.alignment);
        // Only an unlocked journal may be mapped: nothing writes it while
        // the lock is held. A live one is read with pread.
        let lock = vfs.lock_dir(&dir).ok();
        let reader = match lock {
            Some(_) => LogReader::mapping(vfs.clone(), &dir, geometry, Lsn(u64::MAX), None),
            None => LogReader::new(vfs.clone(), &dir, geometry),
        };
        Ok(Inspector {
            dir,
            vfs,
            control,
            reader,
            lock,
        })
    }

    /// The journal directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The control file's current slot.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The layout of the log over its segment files.
    pub fn geometry(&self) -> Geometry {
        self.reader.geometry()
    }

    /// Whether this inspector holds the directory lock (no writer can run;
    /// segments are mapped), rather than reading a journal a writer has
    /// open.
    pub fn exclusive(&self) -> bool {
        self.lock.is_some()
    }

    /// The segment files: numbers, headers, sizes; temporaries and other
    /// names in the directory.
    pub fn segments(&self) -> Result<ScanReport> {
        Ok(segment_recycler::scan(&*self.vfs, &self.dir)?)
    }

    /// What recovery in `mode` would find, from the checkpoint: the end of
    /// the log, torn tails, corruption (as an error, or as skipped ranges
    /// in [`RecoveryMode::SkipCorrupt`]), loss. Nothing is written.
    pub fn scan(&mut self, mode: RecoveryMode) -> Result<RecoveryReport> {
        let c = self.control;
        recovery::scan(&mut self.reader, &c, mode, c.inflight_window)
    }

    /// The records from the checkpoint's scan position on, each with its
    /// entries, those that end after `from`; the iterator stops at the
    /// first position where no valid record is ([`Records::end`]).
    pub fn records(&mut self, from: Lsn) -> Records<'_> {
        let pos = self.control.scan_lsn;
        Records {
            reader: &mut self.reader,
            pos,
            from,
            chains: Chains::new(),
            chain: None,
            end: None,
            failed: false,
        }
    }
}

/// What one entry of a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryRole {
    /// A whole entry.
    Whole,
    /// Part `part` (from 0) of the chained record at `chain`.
    Part {
        /// The chained record's LSN (its first part's).
        chain: Lsn,
        /// Which part.
        part: u32,
    },
    /// A part of a chain begun before where reading started.
    PartOfEarlier,
}

/// One entry of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// Its LSN.
    pub lsn: Lsn,
    /// Its length.
    pub len: usize,
    /// Whole, or a part of a chain.
    pub role: EntryRole,
    /// Its first (up to 16) bytes.
    pub head: Vec<u8>,
}

/// A chained record completed by a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainInfo {
    /// Its LSN.
    pub lsn: Lsn,
    /// Its length, all parts.
    pub len: u64,
    /// How many parts.
    pub parts: u32,
}

/// One valid log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    /// Its LSN.
    pub lsn: Lsn,
    /// Payload bytes.
    pub len: u32,
    /// Bytes it takes in the log, padding included.
    pub size: u64,
    /// The I/O flags it was written with.
    pub flags: IoFlags,
    /// Entries in it.
    pub entry_count: u32,
    /// Its first entry continues the previous record's last.
    pub continued: bool,
    /// Its last entry continues in the next record.
    pub continues: bool,
    /// The log tail stamped into it.
    pub tail: Lsn,
    /// Its entries.
    pub entries: Vec<EntryInfo>,
    /// The chained record its first entry completed, if any.
    pub completed_chain: Option<ChainInfo>,
}

impl RecordInfo {
    /// Where the next record starts.
    pub fn end(&self) -> Lsn {
        Lsn(self.lsn.0.saturating_add(self.size))
    }
}

/// The records of [`Inspector::records`].
pub struct Records<'a> {
    reader: &'a mut LogReader,
    pos: Lsn,
    from: Lsn,
    chains: Chains,
    /// The chain being read: its LSN, bytes so far, parts so far.
    chain: Option<(Lsn, u64, u32)>,
    end: Option<(Lsn, Damage)>,
    /// A read failed (the error was returned): nothing more.
    failed: bool,
}

impl std::fmt::Debug for Records<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl Records<'_> {
    /// Once the iterator ended: where, and what was found there instead of
    /// a valid record.
    pub fn end(&self) -> Option<&(Lsn, Damage)> {
        self.end.as_ref()
    }

    fn next_record(&mut self) -> Result<Option<RecordInfo>> {
        let r = match self.reader.examine(self.pos)? {
            Ok(r) => r,
            Err(found) => {
                self.end = Some((self.pos, found));
                return Ok(None);
            }
        };
        let mut roles = Vec::with_capacity(r.header.entry_count.get() as usize);
        let mut completed = None;
        let chain = &mut self.chain;
        self.chains.feed(&r, |p| match p {
            Piece::Whole(..) => roles.push(EntryRole::Whole),
            Piece::Orphan(_) => roles.push(EntryRole::PartOfEarlier),
            Piece::Part { first, bytes, last } => {
                let (len, parts) = chain.map_or((0, 0), |(_, l, k)| (l, k));
                let c = (first, len.saturating_add(bytes.len() as u64), parts + 1);
                *chain = (!last).then_some(c);
                if last {
                    completed = Some(ChainInfo {
                        lsn: c.0,
                        len: c.1,
                        parts: c.2,
                    });
                }
                roles.push(EntryRole::Part {
                    chain: first,
                    part: parts,
                });
            }
            // A chain this record does not continue was cut by a crash.
            Piece::Abandoned(_) => *chain = None,
        });
        let entries = r
            .entries()
            .zip(roles)
            .map(|((lsn, b), role)| EntryInfo {
                lsn,
                len: b.len(),
                role,
                head: b[..b.len().min(16)].to_vec(),
            })
            .collect();
        Ok(Some(RecordInfo {
            lsn: r.lsn(),
            len: r.header.len.get(),
            size: r.size,
            flags: r.flags(),
            entry_count: r.header.entry_count.get(),
            continued: r.continued(),
            continues: r.continues(),
            tail: r.tail_lsn(),
            entries,
            completed_chain: completed,
        }))
    }
}

impl Iterator for Records<'_> {
    type Item = Result<RecordInfo>;

    fn next(&mut self) -> Option<Result<RecordInfo>> {
        loop {
            if self.end.is_some() || self.failed {
                return None;
            }
            match self.next_record() {
                Ok(Some(r)) => {
                    self.pos = r.end();
                    if r.end() > self.from {
                        return Some(Ok(r));
                    }
                }
                Ok(None) => return None,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
