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

fn read_page(data: &dyn VfsFile, n: u32, len: u64) -> Result<Option<Page>> {
    let off = n as u64 * PAGE_SIZE as u64;
    if off + PAGE_SIZE as u64 > len {
        return Ok(None);
    }
    let mut p = page::zero_page();
    let mut got = 0;
    while got < PAGE_SIZE {
        let r = data.read_at(&mut p[got..], off + got as u64)?;
        if r == 0 {
            return Ok(None);
        }
        got += r;
    }
    Ok(Some(p))
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
        if options.buckets == 0 || options.buckets > 1 << 20 {
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
        let worker = thread::spawn(move || i2.checkpointer());
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

/// Refuses a directory that holds something other than a store.
fn check_dir(vfs: &dyn Vfs, dir: &Path, options: &Options) -> Result<()> {
    if !vfs.exists(dir)? {
        if !options.create_if_missing {
            return Err(Error::NotAStore {
                path: dir.to_path_buf(),
                reason: "no such directory",
            });
        }
        vfs.create_dir_all(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            vfs.sync_dir(parent)?;
        }
        return Ok(());
    }
    let names = vfs.read_dir(dir)?;
    let ours = |n: &String| n == WAL_DIR || n == DATA_FILE;
    if names.iter().any(|n| !ours(n)) && !names.iter().any(|n| n == WAL_DIR) {
        return Err(Error::NotAStore {
            path: dir.to_path_buf(),
            reason: "the directory holds other files and no store",
        });
    }
    if !names.iter().any(|n| n == WAL_DIR) && !options.create_if_missing {
        return Err(Error::NotAStore {
            path: dir.to_path_buf(),
            reason: "no store here",
        });
    }
    Ok(())
}

/// Creates the data file: the meta page and every bucket's (empty) head
/// page, durably, name included.
fn create_data_file(
    vfs: &dyn Vfs,
    dir: &Path,
    path: &Path,
    buckets: u32,
    journal_id: journal_core::JournalId,
) -> Result<()> {
    let f = vfs.open(path, OpenOptions::create())?;
    f.set_len(0)?;
    let empty = bucket::serialize(&bucket::Entries::new());
    let mut bytes = Vec::with_capacity((1 + buckets as usize) * PAGE_SIZE);
    bytes.extend_from_slice(
        &page::encode_meta(&Meta {
            buckets,
            journal_id,
        })[..],
    );
    for b in 0..buckets {
        let (_, p) = bucket::to_pages(&[1 + b], Lsn(0), &empty).remove(0);
        bytes.extend_from_slice(&p[..]);
    }
    f.write_at(&bytes, 0)?;
    f.sync_all()?;
    vfs.sync_dir(dir)?;
    Ok(())
}

/// Reads the buckets from the data file and replays the log into them:
/// pass 1 restores every bucket whose first change since the checkpoint
/// logged its full image (torn pages included); pass 2 applies every
/// operation whose record LSN is above its bucket's pageLSN.
fn recover(
    journal: &Journal,
    data: &dyn VfsFile,
    meta: &Meta,
) -> Result<(Vec<Bucket>, Allocator, RecoveryInfo)> {
    let len = data.len()?;
    let file_pages = (len / PAGE_SIZE as u64) as u32;
    let mut pages: BTreeMap<u32, Page> = BTreeMap::new();
    for p in 1..file_pages {
        if let Some(page) = read_page(data, p, len)? {
            pages.insert(p, page);
        }
    }
    let n = meta.buckets;
    let mut buckets: Vec<Bucket> = Vec::with_capacity(n as usize);
    let mut torn = vec![false; n as usize];
    for b in 0..n {
        match bucket::read_chain(1 + b, |p| pages.get(&p).map(|x| &**x), pages.len()) {
            Some((entries, chain, lsn)) => buckets.push(Bucket {
                entries,
                chain,
                lsn,
                ..Bucket::default()
            }),
            None => {
                torn[b as usize] = true;
                buckets.push(Bucket::default());
            }
        }
    }
    let mut info = RecoveryInfo {
        journal: journal.recovery_report().clone(),
        records: 0,
        ops_applied: 0,
        ops_skipped: 0,
        images_restored: 0,
        torn_pages_repaired: 0,
    };
    let redo = journal.redo_lsn();
    // Pass 1: restore the images.
    let mut restored = vec![false; n as usize];
    for r in journal.read_from(redo)? {
        let (lsn, bytes) = r?;
        info.records += 1;
        for s in decode(lsn, &bytes)? {
            let b = s.bucket as usize;
            let Some((image_lsn, content)) = s.image.filter(|_| b < n as usize && !restored[b])
            else {
                continue;
            };
            let entries = bucket::deserialize(&content).ok_or(Error::BadRecord { lsn })?;
            let lsn = image_lsn;
            restored[b] = true;
            info.images_restored += 1;
            if torn[b] {
                info.torn_pages_repaired += 1;
                torn[b] = false;
            }
            buckets[b] = Bucket {
                entries,
                chain: vec![1 + s.bucket],
                lsn,
                dirty: true,
                image_epoch: 0,
            };
        }
    }
    if let Some(b) = torn.iter().position(|t| *t) {
        return Err(Error::TornPage { page: 1 + b as u32 });
    }
    // Pages in use: every head, and the chains of the buckets read from
    // disk (a restored bucket's old chain may be stale: it gets new pages).
    let mut used: BTreeSet<u32> = (0..=n).collect();
    for (b, bucket) in buckets.iter().enumerate() {
        if !restored[b] {
            used.extend(bucket.chain.iter().copied());
        }
    }
    let end = file_pages
        .max(n + 1)
        .max(used.iter().next_back().map_or(0, |m| m + 1));
    let alloc = Allocator {
        end,
        free: (0..end).filter(|p| !used.contains(p)).collect(),
    };
    // Pass 2: replay, idempotently by pageLSN.
    for r in journal.read_from(redo)? {
        let (lsn, bytes) = r?;
        for s in decode(lsn, &bytes)? {
            let Some(bucket) = buckets.get_mut(s.bucket as usize) else {
                return Err(Error::BadRecord { lsn });
            };
            if lsn <= bucket.lsn {
                info.ops_skipped += s.ops.len() as u64;
                continue;
            }
            for op in s.ops {
                apply_op(&mut bucket.entries, op);
                info.ops_applied += 1;
            }
            bucket.lsn = lsn;
            bucket.dirty = true;
        }
    }
    Ok((buckets, alloc, info))
}

fn decode(lsn: Lsn, bytes: &[u8]) -> Result<Vec<Section>> {
    record::decode(bytes).map_err(|e| match e {
        Undecodable::Newer(v) => Error::UnsupportedVersion { found: v },
        Undecodable::Malformed => Error::BadRecord { lsn },
    })
}

fn apply_op(entries: &mut bucket::Entries, op: Op) {
    match op {
        Op::Put(k, v) => {
            entries.insert(k, v);
        }
        Op::Delete(k) => {
            entries.remove(&k);
        }
    }
}

impl Inner {
    fn check(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// The full image of a bucket as it stands: its pageLSN and content
    /// (its pages are a pure function of them).
    fn image(bucket: &Bucket) -> (Lsn, Vec<u8>) {
        (bucket.lsn, bucket::serialize(&bucket.entries))
    }

    /// Commits `ops` atomically: one log record; `wait`: durable on return.
    fn apply(&self, ops: Vec<Op>, wait: bool) -> Result<Lsn> {
        self.check()?;
        for op in &ops {
            if op.key().len() > MAX_KEY {
                return Err(Error::KeyTooLarge {
                    len: op.key().len(),
                    max: MAX_KEY,
                });
            }
            if let Op::Put(_, v) = op {
                if v.len() > MAX_VALUE {
                    return Err(Error::ValueTooLarge {
                        len: v.len(),
                        max: MAX_VALUE,
                    });
                }
            }
        }
        if ops.is_empty() {
            return Ok(self.journal.appended_lsn());
        }
        let n = self.buckets.len() as u32;
        // One section per bucket, in ascending bucket order (a single-op
        // transaction, the common case, allocates nothing more here).
        let mut sections: Vec<Section> = if ops.len() == 1 {
            let bucket = bucket_of(ops[0].key(), n);
            vec![Section {
                bucket,
                image: None,
                ops,
            }]
        } else {
            let mut by_bucket: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
            for op in ops {
                by_bucket
                    .entry(bucket_of(op.key(), n))
                    .or_default()
                    .push(op);
            }
            by_bucket
                .into_iter()
                .map(|(bucket, ops)| Section {
                    bucket,
                    image: None,
                    ops,
                })
                .collect()
        };
        // Buckets are locked in ascending order: no deadlock.
        let mut guards: Vec<MutexGuard<'_, Bucket>> = sections
            .iter()
            .map(|s| self.buckets[s.bucket as usize].lock())
            .collect();
        let max = self.journal.options().max_record();
        let (lsn, epoch) = loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            for (s, g) in sections.iter_mut().zip(&guards) {
                s.image = (g.image_epoch < epoch).then(|| Self::image(g));
            }
            let bytes = record::encoded_len(&sections);
            if bytes > max {
                return Err(Error::TransactionTooLarge { bytes, max });
            }
            let record = record::encode(&sections);
            // Shared: transactions append side by side; a checkpoint takes
            // it exclusively for the instant it bumps the epoch.
            let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            if self.epoch.load(Ordering::Acquire) != epoch {
                // A checkpoint began meanwhile: decide the images again.
                continue;
            }
            let lsn = self.journal.append(&record)?;
            drop(gate);
            break (lsn, epoch);
        };
        for (g, s) in guards.iter_mut().zip(sections) {
            for op in s.ops {
                apply_op(&mut g.entries, op);
            }
            g.lsn = lsn;
            g.dirty = true;
            g.image_epoch = epoch;
        }
        drop(guards);
        // Committed after the append, like a thread calling `commit`:
        // opening the commit before building the record
        // (`Journal::begin_commit`) measured slower here (leaders waited
        // for committers still building theirs).
        if wait {
            self.journal.commit(lsn)?;
        }
        // (From our own LSN: the log's end would cost the ring's lock.)
        let since = lsn.0.saturating_sub(self.last_redo.load(Ordering::Relaxed));
        if since > self.options.checkpoint_log_bytes {
            self.worker.lock().nudged = true;
            self.wake.notify_all();
        }
        Ok(lsn)
    }

    /// Writes the changed buckets home, then moves the log's tail.
    fn checkpoint(&self) -> Result<CheckpointInfo> {
        let _one = self.checkpointing.lock();
        let redo = {
            let _gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.journal.appended_lsn()
        };
        self.last_redo.store(redo.0, Ordering::Relaxed);
        let mut writes = Vec::new();
        let mut buckets_written = 0;
        {
            let mut alloc = self.pages.lock();
            for (i, b) in self.buckets.iter().enumerate() {
                let mut g = b.lock();
                if !g.dirty {
                    continue;
                }
                let content = bucket::serialize(&g.entries);
                let need = bucket::pages_needed(content.len());
                let mut chain = std::mem::take(&mut g.chain);
                if chain.is_empty() {
                    chain.push(1 + i as u32);
                }
                while chain.len() > need {
                    let freed = chain.pop().expect("longer than needed");
                    alloc.free.insert(freed);
                }
                while chain.len() < need {
                    chain.push(alloc.alloc());
                }
                writes.extend(bucket::to_pages(&chain, g.lsn, &content));
                g.chain = chain;
                g.dirty = false;
                buckets_written += 1;
            }
        }
        // Write-ahead: the log is durable over every page's LSN before
        // any page goes home.
        self.journal.force_all()?;
        for (n, p) in &writes {
            self.data.write_at(&p[..], *n as u64 * PAGE_SIZE as u64)?;
        }
        self.journal.checkpoint(redo)?;
        Ok(CheckpointInfo {
            redo_lsn: redo,
            buckets_written,
            pages_written: writes.len() as u64,
        })
    }

    /// The background checkpointer: every interval, or when nudged by log
    /// volume, until stopped.
    fn checkpointer(&self) {
        loop {
            {
                let mut st = self.worker.lock();
                let deadline = self.options.checkpoint_interval.map(Deadline::after);
                while !st.stop && !st.nudged {
                    match &deadline {
                        Some(d) => {
                            let (g, expired) = self.wake.wait_deadline(st, d);
                            st = g;
                            if expired {
                                break;
                            }
                        }
                        None => st = self.wake.wait(st),
                    }
                }
                if st.stop {
                    return;
                }
                st.nudged = false;
            }
            if let Err(e) = self.checkpoint() {
                self.worker.lock().last_error = Some(e);
                return;
            }
        }
    }
}
