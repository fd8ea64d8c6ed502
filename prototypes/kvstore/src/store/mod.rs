//! The store: open and recover, transactions, reads, checkpoints.

use crate::bucket::{self, Bucket};
use crate::page::{self, Meta, MetaCheck, Page, PAGE_SIZE};
use crate::record::{self, Op, Section, Undecodable};
use crate::{Error, Result, MAX_KEY, MAX_VALUE};
use journal_core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use journal_core::sync::{thread, Condvar, Deadline, Mutex, MutexGuard};
use journal_core::vfs::{OpenOptions, OsVfs, Vfs, VfsFile};
use journal_core::{Journal, Lsn, RecoveryReport};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod recovery;
mod write;

use recovery::{apply_op, check_dir, create_data_file, read_page, recover};

/// The journal directory inside a store directory.
pub const WAL_DIR: &str = "wal";
/// The data file inside a store directory.
pub const DATA_FILE: &str = "data.kv";

/// Everything [`Store::open`] can be told.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Create the store if there is none (default true).
    pub create_if_missing: bool,
    /// Buckets of the hash table (default 4096, a 16 MiB data file at
    /// creation; fixed at creation). Each
    /// bucket's head page is written at creation.
    pub buckets: u32,
    /// The journal's options. The default uses 1 MiB log buffers, so a
    /// transaction that carries full bucket images fits one record.
    pub journal: journal_core::Options,
    /// Checkpoint in the background this often (default 10 s; `None`: only
    /// by [`Store::checkpoint`] and by log volume).
    pub checkpoint_interval: Option<Duration>,
    /// Also checkpoint once this many log bytes were written since the
    /// last checkpoint began (default 64 MiB).
    pub checkpoint_log_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            create_if_missing: true,
            buckets: 4096,
            journal: journal_core::Options {
                logbsize: 1 << 20,
                ..journal_core::Options::default()
            },
            checkpoint_interval: Some(Duration::from_secs(10)),
            checkpoint_log_bytes: 64 << 20,
        }
    }
}

/// What opening the store found and replayed.
#[derive(Debug, Clone)]
pub struct RecoveryInfo {
    /// What the journal's own recovery found.
    pub journal: RecoveryReport,
    /// Transaction records read from the checkpoint on.
    pub records: u64,
    /// Operations replayed into buckets whose pageLSN was below them.
    pub ops_applied: u64,
    /// Operations skipped: their bucket's pages already held them.
    pub ops_skipped: u64,
    /// Buckets restored from the full image logged by their first change
    /// after the checkpoint.
    pub images_restored: u64,
    /// Of those, buckets whose pages on disk were torn or damaged.
    pub torn_pages_repaired: u64,
}

/// What a checkpoint did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The log position the checkpoint moved the tail to.
    pub redo_lsn: Lsn,
    /// Buckets written home.
    pub buckets_written: u64,
    /// Pages written home.
    pub pages_written: u64,
}

/// Free pages of the data file: used only by checkpoints.
#[derive(Debug, Default)]
struct Allocator {
    /// The first page number never used.
    end: u32,
    free: BTreeSet<u32>,
}

impl Allocator {
    fn alloc(&mut self) -> u32 {
        match self.free.pop_first() {
            Some(n) => n,
            None => {
                self.end += 1;
                self.end - 1
            }
        }
    }
}

struct Inner {
    dir: PathBuf,
    options: Options,
    journal: Journal,
    data: Box<dyn VfsFile>,
    buckets: Vec<Mutex<Bucket>>,
    /// Bumped by every checkpoint as it picks its redo position; the first
    /// change of a bucket in a newer epoch logs the bucket's full image.
    epoch: AtomicU64,
    /// Held shared across the choice "image or not" and the append, and
    /// exclusively by a checkpoint while it bumps the epoch and reads the
    /// log's end: every record below a checkpoint's redo position was
    /// decided in an older epoch, every record above it in the new one.
    /// (A std `RwLock`: journal-sync has none, and this prototype is not
    /// model-checked.)
    gate: std::sync::RwLock<()>,
    pages: Mutex<Allocator>,
    /// One checkpoint at a time.
    checkpointing: Mutex<()>,
    /// The log position the last checkpoint began at.
    last_redo: AtomicU64,
    closed: AtomicBool,
    worker: Mutex<WorkerState>,
    wake: Condvar,
    recovery: RecoveryInfo,
}

#[derive(Default)]
struct WorkerState {
    stop: bool,
    nudged: bool,
    last_error: Option<Error>,
}

/// An embedded key-value store on the journal. `Send + Sync`: share it
/// with `Arc`; many threads commit at once and share the journal's group
/// commit.
pub struct Store {
    inner: Arc<Inner>,
    worker: Mutex<Option<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

/// A batch of puts and deletes, committed atomically.
#[derive(Debug)]
pub struct Transaction<'s> {
    store: &'s Store,
    ops: Vec<Op>,
}

impl Transaction<'_> {
    /// Inserts or replaces `key`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> &mut Self {
        self.ops.push(Op::Put(key.to_vec(), value.to_vec()));
        self
    }

    /// Removes `key` (nothing if it is absent).
    pub fn delete(&mut self, key: &[u8]) -> &mut Self {
        self.ops.push(Op::Delete(key.to_vec()));
        self
    }

    /// Commits: every operation or none, durable when this returns.
    pub fn commit(self) -> Result<Lsn> {
        self.store.inner.apply(self.ops, true)
    }

    /// Commits without waiting for durability: visible at once, durable
    /// with the next group commit or [`Store::sync`].
    pub fn commit_no_wait(self) -> Result<Lsn> {
        self.store.inner.apply(self.ops, false)
    }
}

fn bucket_of(key: &[u8], buckets: u32) -> u32 {
    crc32c::crc32c(key) % buckets
}

impl Store {
    /// Opens (creating it if asked) the store in `dir` on the real
    /// filesystem, recovering it: pages are read and checked, buckets with
    /// torn pages restored from the images in the log, and the log replayed
    /// from the last checkpoint.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Self::open_with(Arc::new(OsVfs::new()), dir, options)
    }

    /// Like [`Store::open`], on any filesystem (a `SimVfs` in tests).
    pub fn open_with(vfs: Arc<dyn Vfs>, dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        let dir = dir.as_ref().to_path_buf();
        if options.buckets == 0 || options.buckets > page::MAX_BUCKETS {
            return Err(Error::Journal(journal_core::Error::InvalidOptions {
                option: "buckets",
                reason: format!("{} is outside 1..=1048576", options.buckets),
            }));
        }
        check_dir(&*vfs, &dir, &options)?;
        let journal = Journal::open_with(
            vfs.clone(),
            dir.join(WAL_DIR),
            journal_core::Options {
                create_if_missing: options.create_if_missing,
                ..options.journal
            },
        )?;
        let data_path = dir.join(DATA_FILE);
        let fresh = journal.appended_lsn() == Lsn(0) && journal.redo_lsn() == Lsn(0);
        if !vfs.exists(&data_path)? {
            if !fresh {
                return Err(Error::NotAStore {
                    path: data_path,
                    reason: "the data file is missing",
                });
            }
            create_data_file(&*vfs, &dir, &data_path, options.buckets, journal.id())?;
        }
        let mut data = vfs.open(&data_path, OpenOptions::write())?;
        let meta = loop {
            let len = data.len()?;
            match read_page(&*data, 0, len)?.map(|p| page::decode_meta(&p)) {
                Some(MetaCheck::Valid(m)) => break m,
                Some(MetaCheck::Newer(v)) => return Err(Error::UnsupportedVersion { found: v }),
                // A creation cut short by a crash: nothing was logged yet.
                Some(MetaCheck::Zeroes) | None if fresh => {
                    drop(data);
                    create_data_file(&*vfs, &dir, &data_path, options.buckets, journal.id())?;
                    data = vfs.open(&data_path, OpenOptions::write())?;
                }
                _ => {
                    return Err(Error::NotAStore {
                        path: data_path,
                        reason: "no valid meta page",
                    })
                }
            }
        };
        if meta.journal_id != journal.id() {
            return Err(Error::ForeignDataFile { path: data_path });
        }
        journal.register_data_file(&data_path)?;
        let (buckets, alloc, recovery) = recover(&journal, &*data, &meta)?;
        let redo = journal.redo_lsn();
        let replayed = recovery.ops_applied > 0 || recovery.images_restored > 0;
        let inner = Arc::new(Inner {
            dir,
            options,
            journal,
            data,
            buckets: buckets.into_iter().map(Mutex::new).collect(),
            epoch: AtomicU64::new(1),
            gate: std::sync::RwLock::new(()),
            pages: Mutex::new(alloc),
            checkpointing: Mutex::new(()),
            last_redo: AtomicU64::new(redo.0),
            closed: AtomicBool::new(false),
            worker: Mutex::new(WorkerState::default()),
            wake: Condvar::new(),
            recovery,
        });
        if replayed {
            // Write the recovered buckets home now, repairing torn pages.
            inner.checkpoint()?;
        }
        let i2 = inner.clone();
        let worker = thread::Builder::new()
            .name("kvstore-checkpointer".into())
            .spawn(move || i2.checkpointer())
            .map_err(|e| {
                Error::from(journal_core::VfsError::new(
                    journal_core::vfs::Op::Spawn,
                    &inner.dir,
                    e,
                ))
            })?;
        Ok(Store {
            inner,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The journal the store logs to (for its metrics and reports).
    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// What opening the store found and replayed.
    pub fn recovery_info(&self) -> &RecoveryInfo {
        &self.inner.recovery
    }

    /// The value of `key`, if present. Sees every committed transaction,
    /// including ones committed without waiting.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.check()?;
        let b = bucket_of(key, self.inner.buckets.len() as u32);
        Ok(self.inner.buckets[b as usize]
            .lock()
            .entries
            .get(key)
            .cloned())
    }

    /// Puts `key` in a transaction of its own; durable when this returns.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<Lsn> {
        self.inner
            .apply(vec![Op::Put(key.to_vec(), value.to_vec())], true)
    }

    /// Deletes `key` in a transaction of its own; durable when this returns.
    pub fn delete(&self, key: &[u8]) -> Result<Lsn> {
        self.inner.apply(vec![Op::Delete(key.to_vec())], true)
    }

    /// The entries whose keys fall in `range`, in key order.
    pub fn scan<R: RangeBounds<Vec<u8>>>(&self, range: R) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.check()?;
        let mut out = Vec::new();
        for b in &self.inner.buckets {
            let g = b.lock();
            out.extend(
                g.entries
                    .iter()
                    .filter(|(k, _)| range.contains(*k))
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
        out.sort();
        Ok(out)
    }

    /// A new transaction.
    pub fn transaction(&self) -> Transaction<'_> {
        Transaction {
            store: self,
            ops: Vec::new(),
        }
    }

    /// Makes every transaction committed so far durable.
    pub fn sync(&self) -> Result<Lsn> {
        self.inner.check()?;
        Ok(self.inner.journal.force_all()?)
    }

    /// Writes every changed bucket home and moves the log's tail past what
    /// they hold (segments are recycled as it moves). The data file gets no
    /// fsync of its own: the journal's PREFLUSH makes the pages stable
    /// before the tail moves.
    pub fn checkpoint(&self) -> Result<CheckpointInfo> {
        self.inner.check()?;
        self.inner.checkpoint()
    }

    /// The last error of the background checkpointer, if any (it stops at
    /// the first).
    pub fn background_error(&self) -> Option<Error> {
        self.inner.worker.lock().last_error.clone()
    }

    /// Stops the background checkpointer, checkpoints, and closes the
    /// journal. Later calls return [`Error::Closed`].
    pub fn close(&self) -> Result<()> {
        self.inner.check()?;
        self.stop_worker();
        self.inner.checkpoint()?;
        self.inner.closed.store(true, Ordering::Release);
        self.inner.journal.close()?;
        Ok(())
    }

    fn stop_worker(&self) {
        self.inner.worker.lock().stop = true;
        self.inner.wake.notify_all();
        if let Some(h) = self.worker.lock().take() {
            let _ = h.join();
        }
    }

    /// Checks the data file as written home: every page's CRC, every chain
    /// well formed and every page owned once, every key in its bucket and
    /// found once, and the pages holding what the store holds. Returns one
    /// line per problem (none: the store is sound). Checkpoints first, so
    /// that the pages are current.
    pub fn check(&self) -> Result<Vec<String>> {
        self.checkpoint()?;
        let inner = &self.inner;
        let _one = inner.checkpointing.lock();
        let len = inner.data.len()?;
        let n = inner.buckets.len() as u32;
        let mut problems = Vec::new();
        let mut owner: BTreeMap<u32, u32> = BTreeMap::new();
        let mut pages: BTreeMap<u32, Page> = BTreeMap::new();
        for p in 0..(len / PAGE_SIZE as u64) as u32 {
            if let Some(page) = read_page(&*inner.data, p, len)? {
                pages.insert(p, page);
            }
        }
        for b in 0..n {
            let head = 1 + b;
            match bucket::read_chain(head, |p| pages.get(&p).map(|x| &**x), pages.len()) {
                None => problems.push(format!(
                    "bucket {b}: torn or damaged chain from page {head}"
                )),
                Some((entries, chain, _)) => {
                    for p in &chain {
                        if let Some(other) = owner.insert(*p, b) {
                            problems.push(format!("page {p} is owned by buckets {other} and {b}"));
                        }
                    }
                    for k in entries.keys() {
                        if bucket_of(k, n) != b {
                            problems.push(format!(
                                "bucket {b} holds a key of bucket {}",
                                bucket_of(k, n)
                            ));
                        }
                    }
                    let mem = inner.buckets[b as usize].lock();
                    if mem.entries != entries {
                        problems.push(format!("bucket {b}: its pages differ from the store"));
                    }
                }
            }
        }
        Ok(problems)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_worker();
    }
}
