//! The segment store: creation, preallocation, recycling, the durability
//! frontier and the write-path check.

use crate::header::{HeaderCheck, JournalId, SegmentHeader, SEGMENT_HEADER_SIZE};
use crate::name::{parse_name, segment_name, tmp_name, NameKind};
use crate::{Error, RecyclePolicy, StoreConfig};
use journal_sync::{Arc, Condvar, Mutex, MutexGuard, StatCounter};
use journal_vfs::{OpenOptions, Vfs, VfsFile};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod recycle;
mod startup;

pub use recycle::{RecycleReport, FAILPOINT_RECYCLE_BEFORE_DIR_FSYNC};
use startup::{classify, Found};
pub use startup::{scan, DamagedSegment, ScanReport, ScannedSegment, StartupReport};

/// An open segment file. A plain `std` `Arc`: it only shares the handle,
/// it synchronises nothing (and loom's `Arc` cannot hold unsized values).
type File = std::sync::Arc<dyn VfsFile>;

#[derive(Debug)]
struct Seg {
    file: File,
    /// The name (create or rename) is known durable.
    name_durable: bool,
}

#[derive(Debug)]
struct State {
    segs: BTreeMap<u64, Seg>,
    /// Numbers being created or reserved by a recycle in progress.
    creating: BTreeSet<u64>,
    /// The segment the writer is in.
    head: u64,
    /// Every number below this was retired by a recycle (renamed or
    /// removed): never created again, or a late caller would bring back a
    /// file a recycle in progress is about to rename or remove.
    retired_below: u64,
    /// A recycle is in progress (one at a time).
    recycling: bool,
    /// The background worker should exit.
    shutdown: bool,
    /// The last error of the background worker (it retries when the head
    /// moves; the writer's own inline creation reports errors directly).
    worker_error: Option<std::sync::Arc<Error>>,
}

impl State {
    /// The highest segment number at or below which every installed
    /// segment's name is durable.
    fn frontier(&self) -> Option<u64> {
        let mut frontier = None;
        for (&n, s) in &self.segs {
            if !s.name_durable {
                break;
            }
            frontier = Some(n);
        }
        frontier
    }

    fn next_free_number(&self) -> u64 {
        let a = self.segs.keys().next_back().map_or(0, |n| n + 1);
        let b = self.creating.iter().next_back().map_or(0, |n| n + 1);
        a.max(b).max(self.head + 1)
    }
}

#[derive(Debug, Default)]
struct Stats {
    created: StatCounter,
    stalls: StatCounter,
    recycled: StatCounter,
    removed: StatCounter,
    frontier_fallbacks: StatCounter,
    checkpoints: StatCounter,
}

/// A snapshot of the store's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Segments created (zero-filled or fallocated, installed).
    pub created: u64,
    /// Times the writer needed a segment that was not ready and waited for
    /// (or did) its creation: the log outran preallocation.
    pub stalls: u64,
    /// Segments recycled by rename.
    pub recycled: u64,
    /// Old segments removed instead of recycled.
    pub removed: u64,
    /// Write-path checks that found the segment above the frontier and
    /// fsynced the file and the directory themselves.
    pub frontier_fallbacks: u64,
    /// Recycle passes run.
    pub checkpoints: u64,
}

struct Inner {
    vfs: std::sync::Arc<dyn Vfs>,
    dir: PathBuf,
    config: StoreConfig,
    journal_id: JournalId,
    state: Mutex<State>,
    /// Signalled when a segment is installed, a creation ends, the head
    /// moves, or shutdown is asked.
    cv: Condvar,
    stats: Stats,
}

/// The segment files of one journal directory. Cheap to clone.
#[derive(Clone)]
pub struct SegmentStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SegmentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentStore")
            .field("dir", &self.inner.dir)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl SegmentStore {
    /// Opens the segments of `dir` (which must exist), creating nothing.
    ///
    /// Removes leftovers of interrupted creations, validates every header
    /// against `journal_id` and `config.segment_size`, rewrites headers that
    /// were lost or not yet rewritten after a recycle, and fsyncs the
    /// directory once so every name found is durable (a previous process
    /// may have been killed between a rename and its directory fsync).
    pub fn open(
        vfs: std::sync::Arc<dyn Vfs>,
        dir: &Path,
        config: StoreConfig,
        journal_id: JournalId,
    ) -> Result<(SegmentStore, StartupReport), Error> {
        config.validate().map_err(Error::Config)?;
        let found = scan(&*vfs, dir)?;
        let mut report = StartupReport {
            ignored: found.other.clone(),
            ..StartupReport::default()
        };
        for t in &found.temporaries {
            vfs.remove_file(&dir.join(t)).map_err(Error::io(None))?;
            report.removed_temporaries.push(t.clone());
        }
        let mut segs = BTreeMap::new();
        for s in &found.segments {
            let n = s.number;
            let stale = match classify(s, &config, journal_id)? {
                Found::Usable { stale } => stale,
                Found::Damaged(error) => {
                    report.damaged.push(DamagedSegment {
                        segment: n,
                        error: std::sync::Arc::new(error),
                    });
                    continue;
                }
            };
            let file: File = vfs
                .open(&s.path, OpenOptions::write())
                .map_err(Error::io(Some(n)))?
                .into();
            if stale {
                let h = SegmentHeader::new(n, config.segment_size, journal_id);
                file.write_at(&h.to_bytes(), 0)
                    .map_err(Error::io(Some(n)))?;
                file.sync_data().map_err(Error::io(Some(n)))?;
                report.reinitialized.push(n);
            }
            segs.insert(
                n,
                Seg {
                    file,
                    name_durable: true,
                },
            );
        }
        vfs.sync_dir(dir).map_err(Error::io(None))?;
        report.segments = segs.keys().copied().collect();
        if let (Some(&lo), Some(&hi)) = (segs.keys().next(), segs.keys().next_back()) {
            report.gaps = (lo..hi).filter(|n| !segs.contains_key(n)).collect();
        }
        let head = segs.keys().next().copied().unwrap_or(0);
        let store = SegmentStore {
            inner: Arc::new(Inner {
                vfs,
                dir: dir.to_path_buf(),
                config,
                journal_id,
                state: Mutex::new(State {
                    segs,
                    creating: BTreeSet::new(),
                    head,
                    retired_below: 0,
                    recycling: false,
                    shutdown: false,
                    worker_error: None,
                }),
                cv: Condvar::new(),
                stats: Stats::default(),
            }),
        };
        Ok((store, report))
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// The journal directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The path of segment `n`.
    pub fn path(&self, n: u64) -> PathBuf {
        self.inner.dir.join(segment_name(n))
    }

    /// Installed segment numbers, ascending.
    pub fn segments(&self) -> Vec<u64> {
        self.inner.state.lock().segs.keys().copied().collect()
    }

    /// The durability frontier: the highest segment number at or below
    /// which every installed segment's name is known durable.
    pub fn frontier(&self) -> Option<u64> {
        self.inner.state.lock().frontier()
    }

    /// The segment being written, as last reported by [`SegmentStore::set_head`].
    pub fn head(&self) -> u64 {
        self.inner.state.lock().head
    }

    /// Removes damaged segment `n` (one [`StartupReport::damaged`] named),
    /// durably: the caller has established that it lies outside the live
    /// log, so nothing in it is needed. Its number is created anew when
    /// the log reaches it.
    pub fn replace_damaged(&self, n: u64) -> Result<(), Error> {
        let path = self.path(n);
        let st = self.inner.state.lock();
        if st.segs.contains_key(&n) || st.creating.contains(&n) {
            return Err(Error::NotInstalled { segment: n });
        }
        drop(st);
        let vfs = &self.inner.vfs;
        vfs.remove_file(&path).map_err(Error::io(Some(n)))?;
        vfs.sync_dir(&self.inner.dir).map_err(Error::io(Some(n)))?;
        Ok(())
    }

    /// The last error of the background preallocation worker, if it has
    /// not succeeded since (it retries when the head moves).
    pub fn worker_error(&self) -> Option<std::sync::Arc<Error>> {
        self.inner.state.lock().worker_error.clone()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> StoreStats {
        let s = &self.inner.stats;
        StoreStats {
            created: s.created.get(),
            stalls: s.stalls.get(),
            recycled: s.recycled.get(),
            removed: s.removed.get(),
            frontier_fallbacks: s.frontier_fallbacks.get(),
            checkpoints: s.checkpoints.get(),
        }
    }

    /// An installed segment, for reading. Never creates.
    pub fn existing(&self, n: u64) -> Option<File> {
        self.inner.state.lock().segs.get(&n).map(|s| s.file.clone())
    }

    /// Segment `n`, for writing: created right here if it is not ready (a
    /// counted stall — the log outran preallocation), or waited for if the
    /// worker or a recycle is preparing it. [`Error::Retired`] if a recycle
    /// has retired `n` (then nothing is created).
    pub fn file(&self, n: u64) -> Result<File, Error> {
        let mut st = self.inner.state.lock();
        let mut stalled = false;
        loop {
            if let Some(s) = st.segs.get(&n) {
                return Ok(s.file.clone());
            }
            if n < st.retired_below {
                return Err(Error::Retired { segment: n });
            }
            if !stalled {
                stalled = true;
                self.inner.stats.stalls.incr();
            }
            if st.creating.contains(&n) {
                st = self.inner.cv.wait(st);
                continue;
            }
            st.creating.insert(n);
            drop(st);
            self.create(n)?;
            st = self.inner.state.lock();
        }
    }

    /// The write-path check: before the first durable write into segment
    /// `n`, make sure its name is durable. Nothing to do at or below the
    /// frontier; above it, fsync the file and the directory right here (a
    /// counted fallback), which makes every name operation completed so far
    /// durable.
    pub fn make_name_durable(&self, n: u64) -> Result<(), Error> {
        let st = self.inner.state.lock();
        let Some(seg) = st.segs.get(&n) else {
            return Err(Error::NotInstalled { segment: n });
        };
        if seg.name_durable || st.frontier().is_some_and(|f| n <= f) {
            return Ok(());
        }
        let file = seg.file.clone();
        // Every name installed now will be durable after the directory fsync.
        let covered: Vec<u64> = st
            .segs
            .iter()
            .filter(|(_, s)| !s.name_durable)
            .map(|(&k, _)| k)
            .collect();
        drop(st);
        self.inner.stats.frontier_fallbacks.incr();
        file.sync_all().map_err(Error::io(Some(n)))?;
        self.inner
            .vfs
            .sync_dir(&self.inner.dir)
            .map_err(Error::io(Some(n)))?;
        let mut st = self.inner.state.lock();
        for k in covered {
            if let Some(s) = st.segs.get_mut(&k) {
                s.name_durable = true;
            }
        }
        Ok(())
    }

    /// The writer moved into segment `n`: segments up to
    /// `n + preallocate_ahead` should be made ready (by the worker, or by
    /// [`SegmentStore::prepare_ahead`]).
    pub fn set_head(&self, n: u64) {
        let mut st = self.inner.state.lock();
        if n > st.head || st.segs.is_empty() {
            st.head = n;
            st.worker_error = None;
            drop(st);
            self.inner.cv.notify_all();
        }
    }

    /// Creates every missing segment from the head to head +
    /// `preallocate_ahead`, in this thread. The worker calls this; callers
    /// without a worker call it themselves outside the commit path.
    pub fn prepare_ahead(&self) -> Result<(), Error> {
        loop {
            let job = self.reserve_missing(&mut self.inner.state.lock());
            match job {
                Some(n) => self.create(n)?,
                None => return Ok(()),
            }
        }
    }

    /// Reserves the lowest number in the preallocation window that is
    /// neither installed nor being prepared.
    fn reserve_missing(&self, st: &mut State) -> Option<u64> {
        let ahead = self.inner.config.preallocate_ahead;
        let n = (st.head.max(st.retired_below)..=st.head + ahead)
            .find(|n| !st.segs.contains_key(n) && !st.creating.contains(n))?;
        st.creating.insert(n);
        Some(n)
    }

    /// Creates segment `n` (reserved in `creating` by the caller): under a
    /// temporary name, preallocated, header written, fsynced, renamed into
    /// place, directory fsynced. Installs it with a durable name.
    fn create(&self, n: u64) -> Result<(), Error> {
        let result = self.create_files(n);
        let mut st = self.inner.state.lock();
        st.creating.remove(&n);
        if let Ok(file) = &result {
            st.segs.insert(
                n,
                Seg {
                    file: file.clone(),
                    name_durable: true,
                },
            );
            self.inner.stats.created.incr();
        }
        drop(st);
        self.inner.cv.notify_all();
        result.map(|_| ())
    }

    fn create_files(&self, n: u64) -> Result<File, Error> {
        let vfs = &self.inner.vfs;
        let cfg = &self.inner.config;
        let io = Error::io(Some(n));
        let tmp = self.inner.dir.join(tmp_name(n));
        let path = self.path(n);
        if vfs.exists(&tmp).map_err(Error::io(Some(n)))? {
            vfs.remove_file(&tmp).map_err(Error::io(Some(n)))?;
        }
        let file = vfs
            .open(&tmp, OpenOptions::create_new().mode(cfg.file_mode))
            .map_err(io)?;
        let header = SegmentHeader::new(n, cfg.segment_size, self.inner.journal_id);
        let done = (|| {
            file.preallocate(0, cfg.segment_size, cfg.prealloc)?;
            file.write_at(&header.to_bytes(), 0)?;
            file.sync_all()?;
            vfs.rename(&tmp, &path)?;
            vfs.sync_dir(&self.inner.dir)
        })();
        if let Err(e) = done {
            // Best effort: a leftover temporary is removed at the next open.
            let _ = vfs.remove_file(&tmp);
            return Err(Error::Io {
                segment: Some(n),
                source: e,
            });
        }
        drop(file);
        let file: File = vfs
            .open(&path, OpenOptions::write())
            .map_err(Error::io(Some(n)))?
            .into();
        Ok(file)
    }

    /// Starts the background preallocation worker: it keeps segments up to
    /// head + `preallocate_ahead` ready, woken by [`SegmentStore::set_head`].
    /// The worker stops when the returned guard is dropped. Fails (an
    /// [`Error::Io`] of [`journal_vfs::Op::Spawn`]) if the thread cannot be
    /// started.
    pub fn start_worker(&self) -> Result<Worker, Error> {
        let store = self.clone();
        let handle = journal_sync::thread::Builder::new()
            .name("segment-preallocator".into())
            .spawn(move || store.worker_loop())
            .map_err(|e| {
                Error::io(None)(journal_vfs::VfsError::new(
                    journal_vfs::Op::Spawn,
                    &self.inner.dir,
                    e,
                ))
            })?;
        Ok(Worker {
            store: self.clone(),
            handle: Some(handle),
        })
    }

    fn worker_loop(&self) {
        let mut st = self.inner.state.lock();
        loop {
            if st.shutdown {
                return;
            }
            let job = if st.worker_error.is_none() {
                self.reserve_missing(&mut st)
            } else {
                None
            };
            let Some(n) = job else {
                st = self.inner.cv.wait(st);
                continue;
            };
            drop(st);
            let result = self.create(n);
            st = self.inner.state.lock();
            if let Err(e) = result {
                // Retried when the head moves; the writer's inline creation
                // reports the error to the committer if it persists.
                st.worker_error = Some(std::sync::Arc::new(e));
            }
        }
    }
}

/// The background preallocation worker; stops and joins when dropped.
#[derive(Debug)]
pub struct Worker {
    store: SegmentStore,
    handle: Option<journal_sync::thread::JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.store.inner.state.lock().shutdown = true;
        self.store.inner.cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
