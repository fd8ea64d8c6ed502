//! Opening a journal, in four steps: lock the directory; read (or create)
//! the control file; open the segment store and recover the log; start
//! the ring, the batcher and the preallocator.

use crate::async_commit::AsyncCommits;
use crate::control::{read_control, Control, ControlFile};
use crate::device::{Device, DirectFiles};
use crate::index::RecordIndex;
use crate::journal::{ring_error, Inner};
use crate::pins::SegmentPins;
use crate::poison::Poison;
use crate::reader::LogReader;
use crate::recovery::{self, RecoveryReport};
use crate::{Error, Geometry, Journal, Options, Result};
use iclog::{Lsn, Ring};
use jbd_batch::Batcher;
use journal_sync::atomic::AtomicBool;
use journal_sync::{Mutex, StatCounter};
use journal_vfs::{DirLock, OsVfs, Vfs};
use segment_recycler::{JournalId, SegmentStore, StartupReport};
use std::path::Path;
use std::sync::Arc;

impl Journal {
    /// Opens the journal in `dir` on the real filesystem, creating it if
    /// `options.create_if_missing`; recovers it otherwise.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Journal> {
        Self::open_with(Arc::new(OsVfs::new()), dir, options)
    }

    /// Like [`Journal::open`], on any filesystem (a `SimVfs` in tests).
    ///
    /// Opening is four steps: make sure the directory exists and lock it;
    /// read (or create) the control file; open the segment store and
    /// recover the log; start the ring, the batcher and the preallocator.
    pub fn open_with(
        vfs: Arc<dyn Vfs>,
        dir: impl AsRef<Path>,
        options: Options,
    ) -> Result<Journal> {
        options.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let lock = lock_dir(&*vfs, &dir, &options)?;
        let mut control = open_control(&*vfs, &dir, &options)?;
        let c = control.current();
        let geometry = Geometry::new(c.segment_size, c.alignment);
        let (store, mut startup) =
            SegmentStore::open(vfs.clone(), &dir, options.store(), c.journal_id)?;
        let index = Arc::new(RecordIndex::default());
        let recovery = recover(&vfs, &dir, &options, geometry, &store, &mut control, &index)?;
        trace_recovery(&dir, &recovery);
        replace_damaged(&store, &mut startup, geometry, &recovery)?;
        let (head_seg, _) = geometry.locate(recovery.end_lsn);
        store.set_head(head_seg);
        let worker = start_preallocation(&store, &options)?;
        let direct = if options.direct_io {
            DirectFiles::probe(vfs.clone(), &store, geometry, head_seg)?
        } else {
            None
        };
        let device = Device::new(
            store.clone(),
            geometry,
            options.sync_method,
            head_seg,
            direct,
            index.clone(),
        );
        let ring = Arc::new(
            Ring::new(options.iclog(), device, recovery.end_lsn, c.redo_lsn)
                .map_err(Error::from)?,
        );
        // The log is laid out only into segment files that are ready
        // (crate::space); appends raise the limit as segments are made.
        ring.set_append_limit(crate::space::ready_end(&store, geometry, head_seg));
        // Waiters on the durable LSN (tasks, followers) are woken by the
        // ring, from every path that advances it, outside its lock.
        let asyncs = Arc::new(AsyncCommits::default());
        let a2 = asyncs.clone();
        if ring
            .set_durable_hook(Box::new(move |durable| a2.wake_durable(durable)))
            .is_err()
        {
            unreachable!("a new ring has no durable hook");
        }
        let r2 = ring.clone();
        let shared = |e| Arc::new(ring_error(e));
        let batcher = if options.commits_in_flight > 1 {
            // A commit in two stages: the group's record is written, the
            // next group may start (its write overlaps this flush), then a
            // cache flush, shared by every group written before it began.
            // A lone commit has nothing to overlap: one FUA write, its
            // write and flush back to back in the device.
            Batcher::staged(options.batch(), move |lsn: Lsn, stage| {
                if stage.alone() {
                    return r2.force(lsn).map_err(shared);
                }
                r2.write_out(lsn).map_err(shared)?;
                stage.written();
                r2.force(lsn).map_err(shared)
            })
        } else {
            // One commit at a time: one FUA write (pwrite + fdatasync).
            Batcher::new(options.batch(), move |lsn: Lsn| {
                r2.force(lsn).map_err(shared)
            })
        };
        Ok(Journal {
            inner: Inner {
                vfs,
                dir,
                options,
                geometry,
                ring,
                batcher,
                store,
                control: Mutex::new(control),
                poison: Arc::new(Poison::default()),
                asyncs,
                closed: AtomicBool::new(false),
                recovery,
                startup,
                commits: StatCounter::new(),
                already_durable: StatCounter::new(),
                worker: Mutex::new(worker),
                pins: Arc::new(SegmentPins::default()),
                index,
                _lock: lock,
            },
        })
    }
}

fn new_journal_id() -> JournalId {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut rng = journal_vfs::SplitMix64::new(nanos ^ ((std::process::id() as u64) << 32));
    let mut id = [0u8; 16];
    rng.fill(&mut id);
    id
}

/// Segments ahead of the writer: the background worker, or prepared here.
/// A full disk does not stop an open: the journal recovers, reads and
/// checkpoints, and appends get NoSpace until there is room.
fn start_preallocation(
    store: &SegmentStore,
    options: &Options,
) -> Result<Option<segment_recycler::Worker>> {
    if options.background_preallocation {
        return Ok(Some(store.start_worker()?));
    }
    match store.prepare_ahead() {
        Err(e) if !crate::space::is_no_space(&e) => Err(e.into()),
        _ => Ok(None),
    }
}

/// Step 1 of opening: the directory exists (created, and its creation made
/// durable, if asked) and is locked against other opens.
fn lock_dir(vfs: &dyn Vfs, dir: &Path, options: &Options) -> Result<DirLock> {
    if !vfs.exists(dir)? {
        if !options.create_if_missing {
            return Err(Error::NotFound {
                dir: dir.to_path_buf(),
            });
        }
        vfs.create_dir_all(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            vfs.sync_dir(parent)?;
        }
    }
    vfs.lock_dir(dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Error::Locked {
                dir: dir.to_path_buf(),
            }
        } else {
            e.into()
        }
    })
}

/// Step 2: the control file, checked against the options, or a new one
/// for a new journal (refused where segment files exist without one).
fn open_control(vfs: &dyn Vfs, dir: &Path, options: &Options) -> Result<ControlFile> {
    if let Some(c) = read_control(vfs, dir)? {
        for (option, on_disk, given) in [
            ("segment_size", c.segment_size, options.segment_size),
            ("alignment", c.alignment, options.alignment),
        ] {
            if on_disk != given {
                return Err(Error::OptionMismatch {
                    option,
                    on_disk,
                    given,
                });
            }
        }
        return ControlFile::open(vfs, dir, c);
    }
    if !options.create_if_missing {
        return Err(Error::NotAJournal {
            path: dir.to_path_buf(),
            reason: "no control file",
        });
    }
    let found = segment_recycler::scan(vfs, dir)?;
    if let Some(s) = found.segments.first() {
        return Err(Error::NotAJournal {
            path: s.path.clone(),
            reason: "segment files without a control file",
        });
    }
    let first = Control {
        seq: 0,
        journal_id: new_journal_id(),
        segment_size: options.segment_size,
        redo_lsn: Lsn(0),
        scan_lsn: Lsn(0),
        alignment: options.alignment,
        inflight_window: options.inflight_window(),
        end_lsn: Lsn(0),
    };
    ControlFile::create(vfs, dir, first, options.file_mode)
}

/// Step 3: scan the log from the checkpoint, clear the headers of
/// unacknowledged in-flight records found past its end (durably, so later
/// appends can never chain into them), and widen the in-flight window
/// kept in the control file if this session's is larger.
fn recover(
    vfs: &Arc<dyn Vfs>,
    dir: &Path,
    options: &Options,
    geometry: Geometry,
    store: &SegmentStore,
    control: &mut ControlFile,
    index: &RecordIndex,
) -> Result<RecoveryReport> {
    let c = control.current();
    let window = c.inflight_window.max(options.inflight_window());
    // Nothing writes the log during recovery: every segment may be mapped
    // (and no checkpoint runs, so no pins are needed).
    let mut reader = LogReader::mapping(vfs.clone(), dir, geometry, Lsn(u64::MAX), None);
    let mut report =
        recovery::scan_noting(&mut reader, &c, options.recovery_mode, window, &mut |lsn| {
            index.note(lsn)
        })?;
    let leftovers = recovery::in_flight_leftovers(&mut reader, report.end_lsn, window)?;
    // Unmap before writing into the files.
    drop(reader);
    let mut touched = std::collections::BTreeSet::new();
    for lsn in &leftovers {
        // A header may cross into the next segment (alignment below 64):
        // each file gets its own piece, none is written past its end.
        let mut at = *lsn;
        let mut left = iclog::format::HEADER_SIZE as u64;
        while left > 0 {
            let (seg, off) = geometry.locate(at);
            let n = left.min(geometry.room_in_segment(at));
            if let Some(f) = store.existing(seg) {
                f.write_at(&[0u8; iclog::format::HEADER_SIZE][..n as usize], off)?;
                touched.insert(seg);
            }
            at = at.plus(n);
            left -= n;
        }
    }
    for seg in touched {
        if let Some(f) = store.existing(seg) {
            f.sync_data()?;
        }
    }
    report.cleared = leftovers;
    if window > c.inflight_window {
        control.write(Control {
            inflight_window: window,
            ..c
        })?;
    }
    Ok(report)
}

/// After recovery: damaged segments (bad header, wrong size) outside the
/// live log hold nothing needed — recovery found no current record in any
/// segment above the end — and are removed, to be created anew; one inside
/// the live log is an error naming it.
fn replace_damaged(
    store: &SegmentStore,
    startup: &mut StartupReport,
    geometry: Geometry,
    recovery: &RecoveryReport,
) -> Result<()> {
    let (first, end) = (recovery.redo_lsn, recovery.end_lsn);
    let live = |n: u64| {
        end > first
            && (geometry.segment_of(first)..=geometry.segment_of(Lsn(end.0 - 1))).contains(&n)
    };
    for d in &startup.damaged {
        if live(d.segment) {
            return Err(Error::Segment(d.error.clone()));
        }
    }
    for d in &startup.damaged {
        store.replace_damaged(d.segment)?;
        startup.replaced.push(d.segment);
    }
    Ok(())
}

/// The `tracing` event for what recovery found (nothing without the
/// feature).
fn trace_recovery(dir: &Path, recovery: &RecoveryReport) {
    let _ = (dir, recovery);
    crate::trace::event!(
        INFO,
        dir = %dir.display(),
        redo = recovery.redo_lsn.0,
        end = recovery.end_lsn.0,
        records = recovery.records,
        ended = ?recovery.end,
        skipped = recovery.skipped.len(),
        torn_chain = ?recovery.torn_chain,
        "journal recovered"
    );
}
