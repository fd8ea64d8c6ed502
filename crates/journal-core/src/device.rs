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

use crate::SyncMethod;
use iclog::{DeviceError, IoFlags, LogDevice, Lsn};
use journal_sync::{Condvar, Mutex, StatCounter};
use journal_vfs::{VfsError, VfsFile};
use segment_recycler::{SegmentStore, DATA_OFFSET};
use std::collections::BTreeMap;
use std::sync::Arc;

type File = Arc<dyn VfsFile>;

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
    data_size: u64,
    sync_method: SyncMethod,
    /// Segments with completed writes not yet durable, with a generation
    /// bumped by every such write (so a flush only clears what it covered).
    unsynced: Mutex<BTreeMap<u64, u64>>,
    /// Files the user registered: flushed before the log write that follows
    /// a tail move.
    data_files: Mutex<Vec<File>>,
    /// The flush the next PREFLUSH write must wait for, if any.
    pending_data_flush: Mutex<Option<Arc<DataFlush>>>,
    /// The highest segment the writer has entered (to wake the preallocator
    /// once per segment).
    head: Mutex<u64>,
    pub(crate) stats: DeviceStats,
}

fn derr(e: impl Into<crate::Error>) -> DeviceError {
    DeviceError::new(e.into())
}

impl Device {
    pub(crate) fn new(store: SegmentStore, sync_method: SyncMethod, head: u64) -> Self {
        let data_size = store.config().data_size();
        Self {
            store,
            data_size,
            sync_method,
            unsynced: Mutex::new(BTreeMap::new()),
            data_files: Mutex::new(Vec::new()),
            pending_data_flush: Mutex::new(None),
            head: Mutex::new(head),
            stats: DeviceStats::default(),
        }
    }

    /// Segment and file offset of `lsn`.
    pub(crate) fn locate(&self, lsn: Lsn) -> (u64, u64) {
        (lsn.0 / self.data_size, DATA_OFFSET + lsn.0 % self.data_size)
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
        // The thread runs to completion on its own; nobody joins it, both
        // waiters wait on the flush's condvar.
        drop(journal_sync::thread::spawn(move || {
            let mut result = Ok(());
            for f in files {
                if let Err(e) = f.sync_data() {
                    result = Err(Arc::new(e));
                    break;
                }
            }
            *f2.result.lock() = Some(result);
            f2.done.notify_all();
        }));
        *self.pending_data_flush.lock() = Some(flush.clone());
        Some(flush)
    }

    fn sync_file(&self, f: &File) -> Result<(), VfsError> {
        self.stats.log_syncs.incr();
        match self.sync_method {
            SyncMethod::Fsync => f.sync_all(),
            _ => f.sync_data(),
        }
    }

    /// fdatasyncs every segment with completed unsynced writes, except
    /// `skip` (which the caller will sync with its own write).
    fn flush_log(&self, skip: Option<u64>) -> Result<(), DeviceError> {
        let snapshot: Vec<(u64, u64)> =
            self.unsynced.lock().iter().map(|(&k, &v)| (k, v)).collect();
        for &(seg, _) in &snapshot {
            if Some(seg) == skip {
                continue;
            }
            // A segment recycled or removed since holds only records below
            // the checkpoint: nothing there needs flushing any more.
            if let Some(f) = self.store.existing(seg) {
                self.sync_file(&f).map_err(derr)?;
            }
        }
        let mut u = self.unsynced.lock();
        for (seg, generation) in snapshot {
            if Some(seg) != skip && u.get(&seg) == Some(&generation) {
                u.remove(&seg);
            }
        }
        Ok(())
    }

    fn mark_unsynced(&self, seg: u64) {
        *self.unsynced.lock().entry(seg).or_default() += 1;
    }

    /// The segment `seg`, ready for writing: created if needed, name made
    /// durable, preallocator told where the head is.
    fn segment_for_write(&self, seg: u64) -> Result<File, DeviceError> {
        {
            let mut head = self.head.lock();
            if seg > *head {
                *head = seg;
                self.store.set_head(seg);
            }
        }
        let f = self.store.file(seg).map_err(derr)?;
        self.store.make_name_durable(seg).map_err(derr)?;
        Ok(f)
    }
}

impl LogDevice for Device {
    fn write(&self, lsn: Lsn, bytes: &[u8], flags: IoFlags) -> Result<(), DeviceError> {
        let (seg, off) = self.locate(lsn);
        let room = (self.data_size - lsn.0 % self.data_size) as usize;
        let mut pieces: Vec<(u64, u64, &[u8])> = vec![(seg, off, &bytes[..bytes.len().min(room)])];
        if bytes.len() > room {
            pieces.push((seg + 1, DATA_OFFSET, &bytes[room..]));
            self.stats.splits.incr();
        }
        let files = pieces
            .iter()
            .map(|p| self.segment_for_write(p.0))
            .collect::<Result<Vec<_>, _>>()?;
        let fua = flags.contains(IoFlags::FUA);
        // When the only unsynced segment is the one the (single) FUA write
        // syncs anyway, PREFLUSH + FUA is one pwrite + one fdatasync.
        let folds_into_write = |s: u64| {
            fua && pieces.len() == 1 && self.sync_method != SyncMethod::Dsync && s == pieces[0].0
        };
        if flags.contains(IoFlags::PREFLUSH) {
            let pending = self.pending_data_flush.lock().take();
            let data = pending.map(|f| f.wait());
            let skip = pieces.first().map(|p| p.0).filter(|&s| folds_into_write(s));
            let log = self.flush_log(skip);
            if let Some(r) = data {
                r.map_err(|e| DeviceError::new(crate::Error::Io(e)))?;
            }
            log?;
        }
        for ((seg, off, chunk), f) in pieces.iter().zip(&files) {
            if fua && self.sync_method == SyncMethod::Dsync {
                f.write_at_fua(chunk, *off).map_err(derr)?;
                self.stats.dsync_writes.incr();
                continue;
            }
            let generation = self.unsynced.lock().get(seg).copied();
            f.write_at(chunk, *off).map_err(derr)?;
            if fua {
                self.sync_file(f).map_err(derr)?;
                // The sync covered every write to it completed before it
                // began; a write completing meanwhile bumped the generation.
                let mut u = self.unsynced.lock();
                if generation.is_some() && u.get(seg).copied() == generation {
                    u.remove(seg);
                }
            } else {
                self.mark_unsynced(*seg);
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.flush_log(None)
    }
}

/// iclog owns its device as a `Box<dyn LogDevice>`; the journal keeps an
/// `Arc` to the same device for registration and statistics.
pub(crate) struct SharedDevice(pub(crate) Arc<Device>);

impl LogDevice for SharedDevice {
    fn write(&self, lsn: Lsn, bytes: &[u8], flags: IoFlags) -> Result<(), DeviceError> {
        self.0.write(lsn, bytes, flags)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.0.flush()
    }
}
