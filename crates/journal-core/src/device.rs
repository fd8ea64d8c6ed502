//! The log device: iclog's `LogDevice` on segment files.
//!
//! Maps a record's LSN to segment `lsn / D` at offset `4096 + lsn % D`
//! (`D` = data bytes per segment). A record crossing a segment boundary is
//! two writes (XFS's "split"): PREFLUSH is issued once, before the first
//! half; FUA applies to both halves. Before its first write into a segment
//! the device runs the recycler's write-path check, so no commit becomes
//! durable in a segment whose name could vanish.
//!
//! Flags become syscalls with the fewest syncs:
//! - PREFLUSH: fdatasync every segment with completed writes not yet
//!   durable, and join the data-file flush a checkpoint started (or run it
//!   here), before the write. When the only such segment is the one being
//!   written with FUA, PREFLUSH + FUA is one `pwrite` + one `fdatasync`.
//! - FUA: `pwrite` + `fdatasync` ([`SyncMethod::Fdatasync`]),
//!   `pwritev2(RWF_DSYNC)` ([`SyncMethod::Dsync`]), or `pwrite` + `fsync`
//!   ([`SyncMethod::Fsync`]).
//! - Neither: `pwrite`; the segment is remembered as needing a flush.

use crate::index::RecordIndex;
use crate::{Error, Geometry, SyncMethod};
use iclog::{IoFlags, LogDevice, Lsn};
use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::{Condvar, Mutex, StatCounter};
use journal_vfs::{VfsError, VfsFile};
use segment_recycler::SegmentStore;
use std::collections::BTreeMap;
use std::sync::Arc;

type File = Arc<dyn VfsFile>;

/// Segments with completed writes not yet durable, each with the
/// generation of its last such write. Generations come from one counter
/// that only grows, so a sync that began before a write completed can
/// never match that write's generation — not even after the segment's
/// entry was removed and made again. (Counting per entry from zero, an
/// entry removed by one flush and re-made by a write restarted at 1, and
/// a second, concurrent flush whose snapshot held 1 from before removed
/// it: a write no sync had covered was forgotten, and the next flush
/// declared it durable. Found by the crash campaign on two cores.)
#[derive(Debug, Default)]
struct Unsynced {
    /// The last generation handed out.
    next: u64,
    /// Segment → generation of its last completed unsynced write.
    segs: BTreeMap<u64, u64>,
}

impl Unsynced {
    /// A write to `seg` completed, not durable yet.
    fn mark(&mut self, seg: u64) {
        self.next += 1;
        self.segs.insert(seg, self.next);
    }

    /// What a flush about to begin must sync: (segment, generation).
    fn snapshot(&self) -> Vec<(u64, u64)> {
        self.segs.iter().map(|(&k, &v)| (k, v)).collect()
    }

    /// The generation of `seg`'s last completed unsynced write, if any.
    fn generation(&self, seg: u64) -> Option<u64> {
        self.segs.get(&seg).copied()
    }

    /// A sync of `seg` that began when its generation was `generation` is
    /// done: forget the segment unless a write completed since.
    fn clear_if_unchanged(&mut self, seg: u64, generation: u64) {
        if self.generation(seg) == Some(generation) {
            self.segs.remove(&seg);
        }
    }

    /// A flush that synced the segments of `snapshot` (but `skip`) is
    /// done: forget those with no write completed since it began.
    fn clear_covered(&mut self, snapshot: &[(u64, u64)], skip: Option<u64>) {
        for &(seg, generation) in snapshot {
            if Some(seg) != skip {
                self.clear_if_unchanged(seg, generation);
            }
        }
    }
}

/// Sync counters of the device, by kind.
#[derive(Debug, Default)]
pub(crate) struct DeviceStats {
    /// fdatasync / fsync calls on log segments.
    pub log_syncs: StatCounter,
    /// FUA writes done as RWF_DSYNC writes.
    pub dsync_writes: StatCounter,
    /// fdatasync calls on registered data files (tail moves).
    pub data_preflushes: StatCounter,
    /// Records split across two segments.
    pub splits: StatCounter,
}

/// A data-file flush started early on another thread (by a checkpoint).
/// Both the log write that carries the following PREFLUSH and the
/// checkpoint itself wait for it: whoever comes first, neither goes on
/// before the data files are stable.
pub(crate) struct DataFlush {
    result: Mutex<Option<Result<(), Arc<VfsError>>>>,
    done: Condvar,
}

impl DataFlush {
    /// Waits until the flush has finished; returns its result.
    pub(crate) fn wait(&self) -> Result<(), Arc<VfsError>> {
        let mut r = self.result.lock();
        loop {
            if let Some(result) = &*r {
                return result.clone();
            }
            r = self.done.wait(r);
        }
    }
}

pub(crate) struct Device {
    store: SegmentStore,
    geometry: Geometry,
    sync_method: SyncMethod,
    /// Segments with completed writes not yet durable, with a generation
    /// bumped by every such write (so a flush only clears what it covered).
    unsynced: Mutex<Unsynced>,
    /// Files the user registered: flushed before the log write that follows
    /// a tail move.
    data_files: Mutex<Vec<File>>,
    /// The flush the next PREFLUSH write must wait for, if any.
    pending_data_flush: Mutex<Option<Arc<DataFlush>>>,
    /// The highest segment the writer has entered (to wake the preallocator
    /// once per segment).
    head: Mutex<u64>,
    /// Direct-I/O handles of the segments being written, when the log is
    /// written past the page cache.
    direct: Option<DirectFiles>,
    /// Where records start, for reads by position: every record written is
    /// noted before its write.
    index: Arc<RecordIndex>,
    pub(crate) stats: DeviceStats,
}

/// The log's own `O_DIRECT` handles on the segments it writes (the store's
/// handles stay buffered: preallocation, headers and readers use them).
/// Only the segment being written and the one before it are kept open: the
/// writer never goes back, and a recycled segment comes back under a new
/// number, opened anew.
pub(crate) struct DirectFiles {
    vfs: Arc<dyn journal_vfs::Vfs>,
    open: Mutex<BTreeMap<u64, File>>,
    /// A direct write was refused after all: the log went back to the page
    /// cache for good.
    refused: AtomicBool,
}

impl DirectFiles {
    /// Direct I/O for the log of `store`, if its filesystem supports it at
    /// an alignment that every log write meets: records aligned to the
    /// journal's alignment (segment headers and data areas are whole 4 KiB
    /// blocks), buffers aligned to [`iclog::BUFFER_ALIGN`] in memory. Asks
    /// the head segment `head`; `None` means write through the page cache.
    pub(crate) fn probe(
        vfs: Arc<dyn journal_vfs::Vfs>,
        store: &SegmentStore,
        geometry: Geometry,
        head: u64,
    ) -> Result<Option<DirectFiles>, Error> {
        let f = store.file(head)?;
        let Some(a) = f.direct_io_alignment()? else {
            return Ok(None);
        };
        let a = u64::from(a);
        if a > iclog::BUFFER_ALIGN as u64
            || !geometry.alignment().is_multiple_of(a)
            || !segment_recycler::DATA_OFFSET.is_multiple_of(a)
        {
            return Ok(None);
        }
        let direct = DirectFiles {
            vfs,
            open: Mutex::new(BTreeMap::new()),
            refused: AtomicBool::new(false),
        };
        // The filesystem may still refuse O_DIRECT at open (it said it
        // could; trust, but verify once).
        Ok(direct.handle(store, head).is_ok().then_some(direct))
    }

    /// The direct handle of segment `seg`.
    fn handle(&self, store: &SegmentStore, seg: u64) -> Result<File, VfsError> {
        let mut open = self.open.lock();
        if let Some(f) = open.get(&seg) {
            return Ok(f.clone());
        }
        let f: File = Arc::from(self.vfs.open(
            &store.path(seg),
            journal_vfs::OpenOptions {
                direct: true,
                ..journal_vfs::OpenOptions::write()
            },
        )?);
        open.retain(|&n, _| n + 1 >= seg);
        open.insert(seg, f.clone());
        Ok(f)
    }
}

impl Device {
    pub(crate) fn new(
        store: SegmentStore,
        geometry: Geometry,
        sync_method: SyncMethod,
        head: u64,
        direct: Option<DirectFiles>,
        index: Arc<RecordIndex>,
    ) -> Self {
        Self {
            store,
            geometry,
            sync_method,
            unsynced: Mutex::new(Unsynced::default()),
            data_files: Mutex::new(Vec::new()),
            pending_data_flush: Mutex::new(None),
            head: Mutex::new(head),
            direct,
            index,
            stats: DeviceStats::default(),
        }
    }

    pub(crate) fn register_data_file(&self, f: File) {
        self.data_files.lock().push(f);
    }

    /// Starts flushing the registered data files on another thread; the
    /// next PREFLUSH log write waits for it, and so does the caller, with
    /// [`DataFlush::wait`] on the returned flush.
    pub(crate) fn start_data_flush(&self) -> Option<Arc<DataFlush>> {
        let files: Vec<File> = self.data_files.lock().clone();
        if files.is_empty() {
            return None;
        }
        let flush = Arc::new(DataFlush {
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        self.stats.data_preflushes.add(files.len() as u64);
        let f2 = flush.clone();
        let run = move || {
            let mut result = Ok(());
            for f in files {
                if let Err(e) = f.sync_data() {
                    result = Err(Arc::new(e));
                    break;
                }
            }
            *f2.result.lock() = Some(result);
            f2.done.notify_all();
        };
        // The thread runs to completion on its own; nobody joins it, both
        // waiters wait on the flush's condvar. A thread that cannot be
        // started leaves the flush to be done here, at once.
        let slot = journal_sync::Arc::new(Mutex::new(Some(run)));
        let s2 = slot.clone();
        let spawned = journal_sync::thread::Builder::new()
            .name("journal-data-flush".into())
            .spawn(move || {
                let run = s2.lock().take();
                if let Some(run) = run {
                    run();
                }
            });
        if spawned.is_err() {
            let run = slot.lock().take();
            if let Some(run) = run {
                run();
            }
        }
        *self.pending_data_flush.lock() = Some(flush.clone());
        Some(flush)
    }

    fn sync_file(&self, f: &File) -> Result<(), VfsError> {
        self.stats.log_syncs.incr();
        #[cfg(feature = "tracing")]
        let started = std::time::Instant::now();
        let r = match self.sync_method {
            SyncMethod::Fsync => f.sync_all(),
            _ => f.sync_data(),
        };
        #[cfg(feature = "tracing")]
        if started.elapsed() > crate::trace::SLOW_SYNC {
            crate::trace::event!(
                WARN,
                path = %f.path().display(),
                ms = started.elapsed().as_millis() as u64,
                "slow log sync"
            );
        }
        r
    }

    /// fdatasyncs every segment with completed unsynced writes, except
    /// `skip` (which the caller will sync with its own write).
    fn flush_log(&self, skip: Option<u64>) -> Result<(), Error> {
        let snapshot = self.unsynced.lock().snapshot();
        for &(seg, _) in &snapshot {
            if Some(seg) == skip {
                continue;
            }
            // A segment recycled or removed since holds only records below
            // the checkpoint: nothing there needs flushing any more.
            if let Some(f) = self.store.existing(seg) {
                self.sync_file(&f)?;
            }
        }
        self.unsynced.lock().clear_covered(&snapshot, skip);
        Ok(())
    }

    fn mark_unsynced(&self, seg: u64) {
        self.unsynced.lock().mark(seg);
    }

    /// Whether log writes go past the page cache.
    pub(crate) fn direct_io(&self) -> bool {
        self.direct_files().is_some()
    }

    /// The direct handles, unless direct I/O is off or was refused.
    fn direct_files(&self) -> Option<&DirectFiles> {
        self.direct
            .as_ref()
            .filter(|d| !d.refused.load(Ordering::Acquire))
    }

    /// The segment `seg`, ready for writing: created if needed, name made
    /// durable, preallocator told where the head is. The handle log writes
    /// go through: the direct one when the log is written past the page
    /// cache.
    fn segment_for_write(&self, seg: u64) -> Result<File, Error> {
        {
            let mut head = self.head.lock();
            if seg > *head {
                *head = seg;
                self.store.set_head(seg);
            }
        }
        let f = self.store.file(seg)?;
        self.store.make_name_durable(seg)?;
        match self.direct_files() {
            Some(d) => Ok(d.handle(&self.store, seg)?),
            None => Ok(f),
        }
    }
}

impl LogDevice for Device {
    type Error = Error;

    fn write(&self, lsn: Lsn, bytes: &[u8], flags: IoFlags) -> Result<(), Error> {
        // Before the write: whatever becomes durable is findable.
        self.index.note(lsn);
        // At most two pieces: a record is never larger than a segment's
        // data area (the options guarantee it), so it crosses at most one
        // boundary. No allocation on the write path.
        let (seg, off) = self.geometry.locate(lsn);
        let room = self.geometry.room_in_segment(lsn) as usize;
        let (first, rest) = bytes.split_at(bytes.len().min(room));
        let first = (seg, off, first, self.segment_for_write(seg)?);
        let second = if rest.is_empty() {
            None
        } else {
            self.stats.splits.incr();
            let (next, next_off) = self.geometry.locate(self.geometry.segment_start(seg + 1));
            Some((next, next_off, rest, self.segment_for_write(next)?))
        };
        let fua = flags.contains(IoFlags::FUA);
        if flags.contains(IoFlags::PREFLUSH) {
            // When the only unsynced segment is the one the (single) FUA
            // write syncs anyway, PREFLUSH + FUA is one pwrite + one
            // fdatasync.
            let folds_into_write = fua && second.is_none() && self.sync_method != SyncMethod::Dsync;
            let pending = self.pending_data_flush.lock().take();
            let data = pending.map(|f| f.wait());
            let log = self.flush_log(folds_into_write.then_some(seg));
            if let Some(r) = data {
                r.map_err(Error::Io)?;
            }
            log?;
        }
        for (seg, off, chunk, f) in std::iter::once(first).chain(second) {
            self.write_piece(seg, off, chunk, &f, fua)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), Error> {
        self.flush_log(None)
    }
}

impl Device {
    /// Writes `chunk` at `off` through `f` (with RWF_DSYNC when `dsync`). A
    /// filesystem that said it takes direct I/O may still refuse a direct
    /// write (EINVAL, checked before any byte moves): then direct I/O is
    /// off for good and the write goes through the store's buffered handle
    /// of the same file.
    fn write_through(
        &self,
        seg: u64,
        f: &File,
        chunk: &[u8],
        off: u64,
        dsync: bool,
    ) -> Result<(), Error> {
        let write = |f: &File| {
            if dsync {
                f.write_at_fua(chunk, off)
            } else {
                f.write_at(chunk, off)
            }
        };
        match write(f) {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput && self.direct_io() => {
                if let Some(d) = &self.direct {
                    d.refused.store(true, Ordering::Release);
                }
                Ok(write(&self.store.file(seg)?)?)
            }
            r => Ok(r?),
        }
    }

    /// Writes one piece of a record into segment `seg`, durable on return
    /// when `fua`.
    fn write_piece(
        &self,
        seg: u64,
        off: u64,
        chunk: &[u8],
        f: &File,
        fua: bool,
    ) -> Result<(), Error> {
        if fua && self.sync_method == SyncMethod::Dsync {
            self.write_through(seg, f, chunk, off, true)?;
            self.stats.dsync_writes.incr();
            return Ok(());
        }
        let generation = self.unsynced.lock().generation(seg);
        self.write_through(seg, f, chunk, off, false)?;
        if fua {
            self.sync_file(f)?;
            // The sync covered every write to it completed before it
            // began; a write completing meanwhile bumped the generation.
            if let Some(g) = generation {
                self.unsynced.lock().clear_if_unchanged(seg, g);
            }
        } else {
            self.mark_unsynced(seg);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Unsynced;

    /// Two flushes overlap; the first clears a segment, a write to it
    /// completes, then the second (whose snapshot predates the write)
    /// finishes: the write must still be owed a sync.
    #[test]
    fn a_flush_never_clears_a_write_that_completed_after_it_began() {
        let mut u = Unsynced::default();
        u.mark(154);
        let (a, b) = (u.snapshot(), u.snapshot());
        u.clear_covered(&a, None);
        assert!(u.segs.is_empty());
        u.mark(154); // completes after both flushes began
        u.clear_covered(&b, None);
        assert!(u.segs.contains_key(&154), "the write was forgotten");
        let c = u.snapshot();
        u.clear_covered(&c, None);
        assert!(u.segs.is_empty());
    }
}
