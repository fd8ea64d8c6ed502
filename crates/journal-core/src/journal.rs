//! The Journal facade.

use crate::async_commit::{AsyncCommits, CommitFuture, DurableWatch, Forcer};
use crate::control::{Control, ControlFile};
use crate::device::Device;
use crate::index::RecordIndex;
use crate::pins::SegmentPins;
use crate::poison::Poison;
use crate::reader::LogReader;
use crate::recovery::RecoveryReport;
use crate::{Error, Geometry, Metrics, Options, Result};
use iclog::{Lsn, Ring};
use jbd_batch::Batcher;
use journal_sync::atomic::{AtomicBool, Ordering};
use journal_sync::{Mutex, StatCounter};
use journal_vfs::{DirLock, OpenOptions, Vfs};
use segment_recycler::{JournalId, SegmentStore, StartupReport, Worker};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How far [`Journal::force`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceMode {
    /// Start writing the record (do not wait for durability).
    Written,
    /// Return when the record is durable.
    Durable,
}

/// What a checkpoint did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointReport {
    /// The new log tail (redo position).
    pub redo_lsn: Lsn,
    /// Segments recycled: `(old number, new number)`.
    pub recycled: Vec<(u64, u64)>,
    /// Segments removed.
    pub removed: Vec<u64>,
}

/// The error type the batcher hands to every waiter of a failed group.
type SharedError = Arc<Error>;

/// A commit on its way ([`Journal::begin_commit`]). Dropping it without
/// committing is safe: the batcher stops counting it.
pub struct CommitHandle<'j> {
    journal: &'j Journal,
    handle: jbd_batch::Handle<Lsn, SharedError>,
}

impl std::fmt::Debug for CommitHandle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitHandle").finish_non_exhaustive()
    }
}

impl CommitHandle<'_> {
    /// Returns once the record at `lsn` (appended while this was open) is
    /// durable, as [`Journal::commit`] does.
    pub fn commit(self, lsn: Lsn) -> Result<()> {
        self.journal.check()?;
        self.journal.commit_with(self.handle, lsn)
    }
}

pub(crate) struct Inner {
    pub(crate) vfs: Arc<dyn Vfs>,
    pub(crate) dir: PathBuf,
    pub(crate) options: Options,
    pub(crate) geometry: Geometry,
    pub(crate) ring: Arc<Ring<Device>>,
    pub(crate) batcher: Batcher<Lsn, SharedError>,
    pub(crate) store: SegmentStore,
    pub(crate) control: Mutex<ControlFile>,
    pub(crate) poison: Arc<Poison>,
    pub(crate) asyncs: Arc<AsyncCommits>,
    pub(crate) closed: AtomicBool,
    pub(crate) recovery: RecoveryReport,
    pub(crate) startup: StartupReport,
    pub(crate) commits: StatCounter,
    pub(crate) already_durable: StatCounter,
    pub(crate) worker: Mutex<Option<Worker>>,
    /// Segments readers map or will read: never recycled while pinned.
    pub(crate) pins: Arc<SegmentPins>,
    /// Where records start, for reads by position.
    pub(crate) index: Arc<RecordIndex>,
    pub(crate) _lock: DirLock,
}

/// A write-ahead journal in one directory. `Send + Sync`: share it with
/// `Arc`. See the crate docs for the commit path and the failure rules.
pub struct Journal {
    pub(crate) inner: Inner,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// The journal's identity, also in every segment header. A program
    /// that keeps files beside the journal stamps it into them, to tell a
    /// file of another store from its own.
    pub fn id(&self) -> JournalId {
        self.inner.control.lock().current().journal_id
    }

    /// The journal directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The options it was opened with.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// The filesystem it runs on (to open data files to register).
    pub fn vfs(&self) -> &Arc<dyn Vfs> {
        &self.inner.vfs
    }

    /// What recovery found when the journal was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    /// What the segment store found when the journal was opened.
    pub fn startup_report(&self) -> &StartupReport {
        &self.inner.startup
    }

    /// Whether log writes go past the page cache (`O_DIRECT`): asked for
    /// with [`Options::direct_io`] and supported by the filesystem at the
    /// journal's record alignment.
    pub fn direct_io(&self) -> bool {
        self.inner.ring.device().direct_io()
    }

    /// The last failure of the background preallocation worker, if it has
    /// not succeeded since. It retries when the writer enters a new
    /// segment; if the failure persists, the appender that needs the
    /// segment creates it itself, and gets [`Error::NoSpace`] if the disk
    /// is full (the journal stays usable: checkpoint to recycle segments)
    /// or the error, poisoning the journal, if it is anything else. This
    /// is the early warning.
    pub fn preallocation_error(&self) -> Option<Error> {
        self.inner.store.worker_error().map(Error::Segment)
    }

    /// Refuses every call once the journal is poisoned or closed: two
    /// atomic loads in the common case.
    pub(crate) fn check(&self) -> Result<()> {
        self.inner.poison.check()?;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Records `e` as the journal's first failure (if it is the first) and
    /// returns the error every caller sees from now on.
    fn poison(&self, e: Error) -> Error {
        if !matches!(e, Error::Poisoned(_)) && self.inner.poison.check().is_ok() {
            crate::trace::event!(ERROR, error = %e, dir = %self.inner.dir.display(), "journal poisoned");
        }
        let e = self.inner.poison.set(e);
        // Every waiting task learns it at once.
        self.inner.asyncs.wake_all();
        e
    }

    /// Appends a record and returns its LSN. In memory only until
    /// [`Journal::commit`] or [`Journal::force`].
    ///
    /// On a full disk — the segment the record needs next cannot be
    /// created — it returns [`Error::NoSpace`] and appends nothing; the
    /// journal is not poisoned, and appends succeed again once a
    /// [`Journal::checkpoint`] has recycled a segment or space returns.
    ///
    /// A record of any size up to [`Options::max_record_size`] is accepted:
    /// one larger than a log buffer holds is written as a chain of parts
    /// over consecutive buffers and segments (other appends wait for it),
    /// and its LSN is its first part's; committing or forcing that LSN
    /// covers the whole chain.
    pub fn append(&self, record: &[u8]) -> Result<Lsn> {
        self.check()?;
        let max = self.inner.options.max_record();
        if record.len() > max {
            return Err(Error::RecordTooLarge {
                len: record.len(),
                max,
            });
        }
        loop {
            match self.inner.ring.append(record) {
                Ok(lsn) => return Ok(lsn),
                Err(iclog::Error::NoRoom { need }) => self.make_room(need)?,
                Err(e) => return Err(self.poison(ring_error(e))),
            }
        }
    }

    /// Makes every segment file the log needs below `need` ready — the
    /// appender creates what preallocation has not — and raises the ring's
    /// append limit to the end of the ready segments. A full filesystem is
    /// [`Error::NoSpace`], which poisons nothing: no LSN was handed out
    /// for bytes that have nowhere to go. Any other failure poisons, as a
    /// failed segment creation always has.
    fn make_room(&self, need: Lsn) -> Result<()> {
        let g = self.inner.geometry;
        let store = &self.inner.store;
        let from = g.segment_of(self.inner.ring.appended_lsn());
        let last = g.segment_of(Lsn(need.0.saturating_sub(1)));
        for n in from..=last {
            match store.file(n) {
                // A checkpoint retired it after `from` was read: the log
                // is past it already, nothing to prepare.
                Ok(_) | Err(segment_recycler::Error::Retired { .. }) => {}
                Err(e) => {
                    return Err(if crate::space::is_no_space(&e) {
                        Error::NoSpace {
                            segment: n,
                            source: Arc::new(e),
                        }
                    } else {
                        self.poison(Error::Segment(Arc::new(e)))
                    });
                }
            }
        }
        self.inner
            .ring
            .set_append_limit(crate::space::ready_end(store, g, from));
        Ok(())
    }

    /// Returns once the record at `lsn` is durable, group-committed with
    /// concurrent committers through jbd-batch. A committer that builds
    /// its record while others commit should open [`Journal::begin_commit`]
    /// first: then they see it coming and may take it into their group.
    pub fn commit(&self, lsn: Lsn) -> Result<()> {
        self.check()?;
        let handle = self.inner.batcher.start();
        self.commit_with(handle, lsn)
    }

    /// Opens a commit before its record is built and appended: until it is
    /// committed (or dropped), concurrent committers know another one is on
    /// its way and the batcher may let it join their group (jbd's
    /// `t_updates`); a lone committer still never waits.
    pub fn begin_commit(&self) -> Result<CommitHandle<'_>> {
        self.check()?;
        Ok(CommitHandle {
            journal: self,
            handle: self.inner.batcher.start(),
        })
    }

    fn commit_with(&self, handle: jbd_batch::Handle<Lsn, SharedError>, lsn: Lsn) -> Result<()> {
        // A chained record is durable once its last part is.
        let lsn = self.inner.ring.commit_point(lsn);
        // Lock-free checks first: the ring publishes both values.
        if lsn < self.durable_lsn() {
            self.inner.already_durable.incr();
            self.inner.commits.incr();
            return Ok(());
        }
        if lsn >= self.inner.ring.appended_lower_bound() {
            let appended = self.appended_lsn();
            if lsn >= appended {
                return Err(Error::LsnNotAppended { lsn, appended });
            }
        }
        self.stop(handle, lsn)
    }

    fn stop(&self, handle: jbd_batch::Handle<Lsn, SharedError>, lsn: Lsn) -> Result<()> {
        match handle.stop_sync(lsn) {
            Ok(d) => {
                if d == jbd_batch::WaitDecision::AlreadyCommitted {
                    self.inner.already_durable.incr();
                }
                self.inner.commits.incr();
                Ok(())
            }
            Err(e) => Err(self.poison((*e).clone())),
        }
    }

    /// Appends a record and returns once it is durable. The committer holds
    /// a batching handle across its append, so concurrent committers see it
    /// and may join its group.
    pub fn append_durable(&self, record: &[u8]) -> Result<Lsn> {
        self.check()?;
        let handle = self.inner.batcher.start();
        let lsn = self.append(record)?;
        self.stop(handle, self.inner.ring.commit_point(lsn))?;
        Ok(lsn)
    }

    /// Forces the log up to `lsn`: [`ForceMode::Written`] starts the write,
    /// [`ForceMode::Durable`] returns when it is durable. No batching.
    pub fn force(&self, lsn: Lsn, mode: ForceMode) -> Result<()> {
        self.check()?;
        let lsn = self.inner.ring.commit_point(lsn);
        let r = match mode {
            ForceMode::Written => self.inner.ring.start_force(lsn),
            ForceMode::Durable => self.inner.ring.force(lsn),
        };
        r.map_err(|e| match ring_error(e) {
            e @ Error::LsnNotAppended { .. } => e,
            e => self.poison(e),
        })?;
        Ok(())
    }

    /// Forces everything appended so far; returns the durable LSN.
    pub fn force_all(&self) -> Result<Lsn> {
        self.check()?;
        let end = self
            .inner
            .ring
            .force_all()
            .map_err(|e| self.poison(ring_error(e)))?;
        Ok(end)
    }

    /// A future that resolves once the record at `lsn` is durable (or with
    /// the error that poisoned or closed the journal). It does not block a
    /// thread: the task's waker is registered with the journal, and the
    /// journal's forcer commits on behalf of every waiting task through
    /// the batcher, so tasks share groups with each other and with
    /// committer threads. Dropping it is safe and loses nothing.
    pub fn commit_async(&self, lsn: Lsn) -> CommitFuture<'_> {
        CommitFuture::new(self, self.inner.ring.commit_point(lsn), true)
    }

    /// Appends a record and resolves once it is durable: the async
    /// [`Journal::append_durable`].
    pub async fn append_durable_async(&self, record: &[u8]) -> Result<Lsn> {
        let lsn = self.append(record)?;
        self.commit_async(lsn).await?;
        Ok(lsn)
    }

    /// Lets tasks wait for the durable LSN to pass a position, without
    /// forcing anything.
    pub fn durable_lsn_watch(&self) -> DurableWatch<'_> {
        DurableWatch { journal: self }
    }

    /// The LSN a commit of the record at `lsn` must make durable: `lsn`, or
    /// the last part of a chained record.
    pub(crate) fn commit_point(&self, lsn: Lsn) -> Lsn {
        self.inner.ring.commit_point(lsn)
    }

    /// The durable LSN read under the ring's lock (see `CommitFuture`).
    pub(crate) fn durable_lsn_locked(&self) -> Lsn {
        self.inner.ring.durable_lsn_locked()
    }

    /// Counts a commit that returned Ok (metrics).
    pub(crate) fn count_commit(&self) {
        self.inner.commits.incr();
    }

    pub(crate) fn asyncs(&self) -> &Arc<AsyncCommits> {
        &self.inner.asyncs
    }

    pub(crate) fn forcer(&self) -> Forcer {
        Forcer {
            batcher: self.inner.batcher.clone(),
            poison: self.inner.poison.clone(),
        }
    }

    /// Every record below this LSN is durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.inner.ring.durable_lsn()
    }

    /// The end of everything appended so far.
    pub fn appended_lsn(&self) -> Lsn {
        self.inner.ring.appended_lsn()
    }

    /// The log tail: recovery starts here.
    pub fn redo_lsn(&self) -> Lsn {
        self.inner.control.lock().current().redo_lsn
    }

    /// Registers a data file (opened read-only through the journal's
    /// filesystem): it is fdatasynced before the first durable log write
    /// after each checkpoint, so data pages written before a checkpoint are
    /// stable before the log forgets the records that describe them.
    pub fn register_data_file(&self, path: impl AsRef<Path>) -> Result<()> {
        self.check()?;
        let f = self.inner.vfs.open(path.as_ref(), OpenOptions::read())?;
        self.inner.ring.device().register_data_file(f.into());
        Ok(())
    }

    /// Moves the log tail to `redo`: records below it are no longer needed
    /// once the data files are stable. The data-file flush starts at once
    /// on another thread and is joined by the next durable log write, which
    /// carries NEED_FLUSH (or here, if nothing is waiting to be written).
    /// Then the new tail is written to the control file and segments wholly
    /// below it are recycled.
    pub fn checkpoint(&self, redo: Lsn) -> Result<CheckpointReport> {
        self.check()?;
        let mut control = self.inner.control.lock();
        let current = control.current();
        let appended = self.appended_lsn();
        if redo > appended {
            return Err(Error::LsnNotAppended {
                lsn: redo,
                appended,
            });
        }
        if redo < current.redo_lsn {
            return Err(Error::LsnNotInLog {
                lsn: redo,
                tail: current.redo_lsn,
            });
        }
        let ring = &self.inner.ring;
        let device = ring.device();
        let result = (|| {
            let flush = device.start_data_flush();
            if ring.durable_lsn() < appended {
                ring.note_tail_moved(redo);
                ring.force_all().map_err(ring_error)?;
            }
            // The forced write waited for the flush before writing; whether
            // or not there was one, the checkpoint waits for it too.
            if let Some(f) = flush {
                f.wait().map_err(Error::Io)?;
            }
            ring.note_tail_flushed(redo);
            let scan = self.record_start(current.scan_lsn, redo)?;
            control.write(Control {
                redo_lsn: redo,
                scan_lsn: scan,
                end_lsn: ring.durable_lsn().max(current.end_lsn),
                ..current
            })?;
            self.inner.index.forget_below(scan);
            // Segments a reader maps (or will read) stay until it is done;
            // a follower's stay too, unless it lags past its limit and
            // holds segments this checkpoint would recycle.
            let g = self.inner.geometry;
            let mut redo_seg = g.segment_of(scan);
            let durable = ring.durable_lsn();
            let limit = self.inner.options.follow_lag_limit;
            let lagging = |seg: u64| {
                seg < redo_seg && durable.0.saturating_sub(g.segment_start(seg).0) > limit
            };
            if let Some(pinned) = self.inner.pins.lowest_revoking(lagging) {
                redo_seg = redo_seg.min(pinned);
            }
            let r = self.inner.store.recycle(redo_seg)?;
            crate::trace::event!(
                DEBUG,
                redo = redo.0,
                recycled = r.recycled.len(),
                removed = r.removed.len(),
                "checkpoint"
            );
            Ok(CheckpointReport {
                redo_lsn: redo,
                recycled: r.recycled,
                removed: r.removed,
            })
        })();
        result.map_err(|e| self.poison(e))
    }

    /// The start of the (durable) record holding `lsn`, found by following
    /// records from `from`; the end of the log if `lsn` is at or past it.
    fn record_start(&self, from: Lsn, lsn: Lsn) -> Result<Lsn> {
        if lsn == self.durable_lsn() {
            // The durable LSN is the end of a record: nothing to scan.
            return Ok(lsn);
        }
        let mut reader = self.reader();
        // Start at the greatest record start the index knows at or below
        // `lsn` (never below `from`): the walk reads at most one index
        // stride of records, however much log the checkpoint moves past —
        // not every segment since the last checkpoint.
        let mut pos = match self.inner.index.floor(lsn) {
            Some(f) if f > from => f,
            _ => from,
        };
        while let Ok(end) = reader.record_end(pos)? {
            if lsn < end {
                break;
            }
            pos = end;
        }
        Ok(pos)
    }

    /// A read-only reader of this journal's segment files, mapping the
    /// segments wholly below the durable LSN (bytes never rewritten) and
    /// pinning them against recycling.
    pub(crate) fn reader(&self) -> LogReader {
        LogReader::mapping(
            self.inner.vfs.clone(),
            &self.inner.dir,
            self.inner.geometry,
            self.durable_lsn(),
            Some(self.inner.pins.clone()),
        )
    }

    /// The layout of the log over its segment files.
    pub fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> Metrics {
        let b = self.inner.batcher.stats();
        let r = self.inner.ring.stats();
        let s = self.inner.store.stats();
        let v = self.inner.vfs.counters();
        let d = &self.inner.ring.device().stats;
        Metrics {
            commits: self.inner.commits.get(),
            groups: b.groups,
            avg_group_size: b.avg_group_size(),
            group_sizes: b.group_sizes,
            commits_already_durable: self.inner.already_durable.get(),
            log_syncs: d.log_syncs.get(),
            dsync_writes: d.dsync_writes.get(),
            data_preflushes: d.data_preflushes.get(),
            dir_fsyncs: v.dir_fsyncs,
            frontier_fallbacks: s.frontier_fallbacks,
            device_syncs: v.syncs(),
            bytes_written: r.bytes_written,
            padding_bytes: r.padding_bytes,
            split_records: d.splits.get(),
            log_writes: r.writes,
            log_writes_fua: r.writes_fua,
            log_writes_preflush: r.writes_preflush,
            log_bare_flushes: r.bare_flushes,
            noiclog_waits: r.noiclog_waits,
            batch_waits_skipped_lone: b.skipped_lone,
            batch_waits_skipped_last_writer: b.skipped_last_writer,
            batch_waits_taken: b.waits_taken,
            batch_wait_ns: b.wait_ns,
            avg_commit_ns: b.avg_commit_ns,
            prealloc_stalls: s.stalls,
            segments_created: s.created,
            segments_recycled: s.recycled,
            segments_removed: s.removed,
            checkpoints: s.checkpoints,
        }
    }

    /// The segment store (segments, frontier).
    pub fn segments(&self) -> Vec<u64> {
        self.inner.store.segments()
    }

    /// The durability frontier of the segment store.
    pub fn frontier(&self) -> Option<u64> {
        self.inner.store.frontier()
    }

    /// Forces everything appended, records the durable end in the control
    /// file (so a later recovery can tell a lost record from a torn one),
    /// stops the preallocation worker, and closes the journal (the directory lock is released on drop). Later
    /// calls return [`Error::Closed`].
    pub fn close(&self) -> Result<Lsn> {
        self.check()?;
        let end = self.force_all()?;
        // Record the durable end: a recovery that later finds the log
        // ending below it knows records were lost, not torn.
        let mut control = self.inner.control.lock();
        let c = control.current();
        if end > c.end_lsn {
            control
                .write(Control { end_lsn: end, ..c })
                .map_err(|e| self.poison(e))?;
        }
        drop(control);
        self.inner.closed.store(true, Ordering::Release);
        self.inner.asyncs.shut_down();
        self.inner.worker.lock().take();
        Ok(end)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // Stop the forcer (it holds the ring) and wake every waiter.
        self.inner.asyncs.shut_down();
    }
}

/// The facade's error for a ring error: the device's own error comes back
/// unchanged (the ring is generic over it).
pub(crate) fn ring_error(e: iclog::Error<Error>) -> Error {
    match e {
        iclog::Error::EntryTooLarge { len, max } => Error::RecordTooLarge { len, max },
        iclog::Error::LsnNotAppended { lsn, appended } => Error::LsnNotAppended { lsn, appended },
        // Only `Ring::append` says NoRoom, and `Journal::append` makes the
        // room; were it to reach here, it is log space not there yet.
        iclog::Error::NoRoom { need } => Error::LsnNotAppended {
            lsn: need,
            appended: need,
        },
        iclog::Error::Poisoned(e) => e,
    }
}
