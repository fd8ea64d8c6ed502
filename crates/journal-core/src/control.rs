//! The control file: the checkpoint position, written crash-safely.
//!
//! `control` holds two 512-byte slots (docs/FORMAT.md). Each update writes
//! the slot the sequence number selects and fdatasyncs it, so a torn update
//! damages only the slot being written: the reader takes the valid slot with
//! the highest sequence number. The file is created under a temporary name,
//! fsynced, renamed and the directory fsynced.

use crate::{Error, Result};
use iclog::Lsn;
use journal_vfs::{OpenOptions, Vfs, VfsFile};
use segment_recycler::JournalId;
use static_assertions::const_assert_eq;
use std::path::{Path, PathBuf};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The control file's name in the journal directory.
pub const CONTROL_FILE: &str = "control";
/// `JCTL` as a little-endian `u32`.
pub const CONTROL_MAGIC: u32 = u32::from_le_bytes(*b"JCTL");
/// The control file format version.
pub const CONTROL_VERSION: u16 = 1;
/// Bytes per slot.
pub const SLOT_SIZE: usize = 512;

/// One slot of the control file.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
struct Slot {
    magic: U32,
    version: U16,
    reserved0: U16,
    seq: U64,
    journal_id: JournalId,
    segment_size: U64,
    redo_lsn: U64,
    scan_lsn: U64,
    alignment: U32,
    inflight_window: U32,
    end_lsn: U64,
    reserved1: [u8; 4],
    crc: U32,
}

const_assert_eq!(std::mem::size_of::<Slot>(), 80);
/// Bytes of a slot covered by its CRC (the CRC is the last 4 of the 80).
const CRC_COVERED: usize = 76;

/// The contents of the control file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// Update counter; the higher valid slot wins.
    pub seq: u64,
    /// The journal's identity (also in every segment header).
    pub journal_id: JournalId,
    /// Segment size, fixed at creation.
    pub segment_size: u64,
    /// The checkpoint position the user gave: replay starts at entries at
    /// or after it.
    pub redo_lsn: Lsn,
    /// The start of the record holding `redo_lsn`: recovery scans from
    /// here, and no segment holding bytes at or after it is recycled.
    pub scan_lsn: Lsn,
    /// Record alignment, fixed at creation.
    pub alignment: u64,
    /// The largest in-flight window any session used: recovery looks this
    /// far past a bad record for valid ones.
    pub inflight_window: u64,
    /// The durable end of the log when this slot was written (zero: not
    /// known). Everything below it was durable, so a recovery that finds
    /// the log ending earlier knows records were lost, not torn.
    pub end_lsn: Lsn,
}

impl Control {
    fn encode(&self) -> [u8; SLOT_SIZE] {
        let mut s = Slot {
            magic: U32::new(CONTROL_MAGIC),
            version: U16::new(CONTROL_VERSION),
            reserved0: U16::new(0),
            seq: U64::new(self.seq),
            journal_id: self.journal_id,
            segment_size: U64::new(self.segment_size),
            redo_lsn: U64::new(self.redo_lsn.0),
            scan_lsn: U64::new(self.scan_lsn.0),
            alignment: U32::new(self.alignment as u32),
            inflight_window: U32::new(self.inflight_window as u32),
            end_lsn: U64::new(self.end_lsn.0),
            reserved1: [0; 4],
            crc: U32::new(0),
        };
        s.crc = U32::new(crc32c::crc32c(&s.as_bytes()[..CRC_COVERED]));
        let mut out = [0u8; SLOT_SIZE];
        out[..80].copy_from_slice(s.as_bytes());
        out
    }

    /// Decodes one slot: `Ok(None)` when it is not a valid slot.
    fn decode(buf: &[u8], path: &Path) -> Result<Option<Control>> {
        let Ok((s, _)) = Slot::read_from_prefix(buf) else {
            return Ok(None);
        };
        if s.magic.get() != CONTROL_MAGIC
            || crc32c::crc32c(&s.as_bytes()[..CRC_COVERED]) != s.crc.get()
        {
            return Ok(None);
        }
        if s.version.get() != CONTROL_VERSION {
            return Err(Error::UnsupportedVersion {
                path: path.to_path_buf(),
                found: s.version.get(),
            });
        }
        let c = Control {
            seq: s.seq.get(),
            journal_id: s.journal_id,
            segment_size: s.segment_size.get(),
            redo_lsn: Lsn(s.redo_lsn.get()),
            scan_lsn: Lsn(s.scan_lsn.get()),
            alignment: s.alignment.get() as u64,
            inflight_window: s.inflight_window.get() as u64,
            end_lsn: Lsn(s.end_lsn.get()),
        };
        match c.impossible() {
            Some(reason) => Err(Error::NotAJournal {
                path: path.to_path_buf(),
                reason,
            }),
            None => Ok(Some(c)),
        }
    }

    /// What makes a slot whose CRC holds impossible for any journal to have
    /// written: its geometry out of the ranges `Options` allows, or LSNs or
    /// an update counter no log reaches (so that arithmetic on them cannot
    /// overflow).
    fn impossible(&self) -> Option<&'static str> {
        let s = self.segment_size;
        if !s.is_power_of_two() || !(64 << 10..=1 << 30).contains(&s) {
            return Some("control file: segment_size is not a power of two from 64 KiB to 1 GiB");
        }
        if !self.alignment.is_power_of_two() || self.alignment > iclog::MAX_ALIGNMENT {
            return Some("control file: alignment is not a power of two from 1 to 4096");
        }
        if [self.redo_lsn, self.scan_lsn, self.end_lsn]
            .iter()
            .any(|l| l.0 > MAX_LSN)
        {
            return Some("control file: an LSN beyond 2^62");
        }
        if self.scan_lsn > self.redo_lsn {
            return Some("control file: scan_lsn is above redo_lsn");
        }
        // One update per checkpoint: no journal counts to 2^62, and the
        // next update's `seq + 1` must not wrap to a slot that loses.
        if self.seq > MAX_LSN {
            return Some("control file: an update counter beyond 2^62");
        }
        None
    }
}

/// The largest LSN a control file may hold: 2^62, 4 EiB of log — far
/// beyond any journal, and far enough below `u64::MAX` that positions
/// computed from it do not overflow.
pub const MAX_LSN: u64 = 1 << 62;

/// The path of the control file of `dir`.
pub fn control_path(dir: &Path) -> PathBuf {
    dir.join(CONTROL_FILE)
}

/// Reads the control file, read-only. `Ok(None)` if there is none.
pub fn read_control(vfs: &dyn Vfs, dir: &Path) -> Result<Option<Control>> {
    let path = control_path(dir);
    if !vfs.exists(&path)? {
        return Ok(None);
    }
    let f = vfs.open(&path, OpenOptions::read())?;
    let mut buf = vec![0u8; 2 * SLOT_SIZE];
    let n = f.read_at(&mut buf, 0)?;
    let a = Control::decode(&buf[..n.min(SLOT_SIZE)], &path)?;
    let b = if n > SLOT_SIZE {
        Control::decode(&buf[SLOT_SIZE..n], &path)?
    } else {
        None
    };
    match (a, b) {
        (Some(a), Some(b)) => Ok(Some(if a.seq >= b.seq { a } else { b })),
        (Some(c), None) | (None, Some(c)) => Ok(Some(c)),
        (None, None) => Err(Error::NotAJournal {
            path,
            reason: "control file has no valid slot",
        }),
    }
}

/// An open control file, for updates.
#[derive(Debug)]
pub(crate) struct ControlFile {
    file: Box<dyn VfsFile>,
    current: Control,
}

impl ControlFile {
    /// Creates the control file of a new journal, durably (name included).
    pub(crate) fn create(
        vfs: &dyn Vfs,
        dir: &Path,
        first: Control,
        mode: u32,
    ) -> Result<ControlFile> {
        let tmp = dir.join(format!("{CONTROL_FILE}.tmp"));
        if vfs.exists(&tmp)? {
            vfs.remove_file(&tmp)?;
        }
        let f = vfs.open(&tmp, OpenOptions::create_new().mode(mode))?;
        f.write_at(&first.encode(), 0)?;
        f.write_at(&[0u8; SLOT_SIZE], SLOT_SIZE as u64)?;
        f.sync_all()?;
        drop(f);
        let path = control_path(dir);
        vfs.rename(&tmp, &path)?;
        vfs.sync_dir(dir)?;
        Self::open(vfs, dir, first)
    }

    /// Opens the existing control file whose contents are `current`.
    pub(crate) fn open(vfs: &dyn Vfs, dir: &Path, current: Control) -> Result<ControlFile> {
        let file = vfs.open(&control_path(dir), OpenOptions::write())?;
        Ok(ControlFile { file, current })
    }

    /// The contents last written.
    pub(crate) fn current(&self) -> Control {
        self.current
    }

    /// Writes `update` (with the next sequence number) into the other slot
    /// and makes it durable.
    pub(crate) fn write(&mut self, mut update: Control) -> Result<()> {
        // At most 2^62 + 1: `impossible` refuses a larger one at open.
        update.seq = self.current.seq + 1;
        let slot = (update.seq % 2) * SLOT_SIZE as u64;
        self.file.write_at(&update.encode(), slot)?;
        self.file.sync_data()?;
        self.current = update;
        Ok(())
    }
}
