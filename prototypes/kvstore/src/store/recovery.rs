//! Opening a store: the directory checked, the data file created, the meta
//! page read, and redo — the log from the last checkpoint replayed onto
//! the pages it touches, never the whole data file.

use super::*;
use crate::meta::{decode_meta, encode_meta, Meta, MetaCheck};
use crate::page::{Kind, Page, FIRST_PAGE};
use crate::pool::{read_page, restore, DoubleWrite, Restored, DOUBLEWRITE_FILE};
use crate::record::{self, LogOp, Undecodable};
use journal_core::vfs::{OpenOptions, VfsFile};
use std::collections::HashMap;

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
    let ours =
        |n: &String| n == WAL_DIR || n == DATA_FILE || n == SPILL_FILE || n == DOUBLEWRITE_FILE;
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

/// Creates the data file: the first meta page and an empty root leaf,
/// durably, name included.
fn create_data_file(
    vfs: &dyn Vfs,
    dir: &Path,
    path: &Path,
    id: journal_core::JournalId,
) -> Result<()> {
    // A double-write area left by a store that was here before is not
    // this one's (its pages would look newer than the new store's).
    let dw = dir.join(DOUBLEWRITE_FILE);
    if vfs.exists(&dw)? {
        vfs.remove_file(&dw)?;
    }
    let f = vfs.open(path, OpenOptions::create())?;
    f.set_len(0)?;
    let mut bytes = Vec::with_capacity(3 * PAGE_SIZE);
    let meta = Meta {
        journal_id: id,
        sequence: 1,
        root: FIRST_PAGE,
        end: FIRST_PAGE + 1,
        free_head: 0,
    };
    bytes.extend_from_slice(&encode_meta(&meta)[..]);
    bytes.extend_from_slice(&[0u8; PAGE_SIZE]);
    bytes.extend_from_slice(Page::new(FIRST_PAGE, Kind::Leaf).sealed().bytes());
    f.write_at(&bytes, 0)?;
    f.sync_all()?;
    vfs.sync_dir(dir)?;
    Ok(())
}

/// What the two meta pages say: the valid one with the higher sequence.
enum MetaFound {
    Valid(Meta),
    /// Neither was ever written (a creation cut short).
    Unwritten,
    Version(u16),
    Bad,
}

fn read_meta(data: &dyn VfsFile) -> Result<MetaFound> {
    let mut best: Option<Meta> = None;
    let mut unwritten = 0;
    for slot in 0..2 {
        match read_page(data, slot)?.map(|p| decode_meta(&p)) {
            Some(MetaCheck::Valid(m)) => {
                if best.is_none_or(|b| m.sequence > b.sequence) {
                    best = Some(m);
                }
            }
            Some(MetaCheck::Version(v)) => return Ok(MetaFound::Version(v)),
            Some(MetaCheck::Zeroes) | None => unwritten += 1,
            Some(MetaCheck::Bad) => {}
        }
    }
    Ok(match best {
        Some(m) => MetaFound::Valid(m),
        None if unwritten == 2 => MetaFound::Unwritten,
        None => MetaFound::Bad,
    })
}

/// Opens the data file (creating it for a new store, or again for a
/// creation a crash cut short) and reads its meta page.
fn open_data_file(
    vfs: &dyn Vfs,
    dir: &Path,
    data_path: &Path,
    journal: &Journal,
) -> Result<(Box<dyn VfsFile>, Meta)> {
    let fresh = journal.appended_lsn() == Lsn(0) && journal.redo_lsn() == Lsn(0);
    if !vfs.exists(data_path)? {
        if !fresh {
            return Err(Error::NotAStore {
                path: data_path.to_path_buf(),
                reason: "the data file is missing",
            });
        }
        create_data_file(vfs, dir, data_path, journal.id())?;
    }
    let mut data = vfs.open(data_path, OpenOptions::write())?;
    loop {
        match read_meta(&*data)? {
            MetaFound::Valid(m) => return Ok((data, m)),
            MetaFound::Version(v) => return Err(Error::UnsupportedVersion { found: v }),
            // A creation cut short by a crash: nothing was logged yet.
            MetaFound::Unwritten if fresh => {
                drop(data);
                create_data_file(vfs, dir, data_path, journal.id())?;
                data = vfs.open(data_path, OpenOptions::write())?;
            }
            _ => {
                return Err(Error::NotAStore {
                    path: data_path.to_path_buf(),
                    reason: "no valid meta page",
                })
            }
        }
    }
}

/// Opens the journal and the data file and recovers the tree.
pub(super) fn open(vfs: Arc<dyn Vfs>, dir: &Path, options: Options) -> Result<Inner> {
    check_dir(&*vfs, dir, &options)?;
    let journal = Journal::open_with(
        vfs.clone(),
        dir.join(WAL_DIR),
        journal_core::Options {
            create_if_missing: options.create_if_missing,
            ..options.journal
        },
    )?;
    let data_path = dir.join(DATA_FILE);
    let (data, meta) = open_data_file(&*vfs, dir, &data_path, &journal)?;
    if meta.journal_id != journal.id() {
        return Err(Error::ForeignDataFile { path: data_path });
    }
    journal.register_data_file(&data_path)?;
    let file_pages = data.len()? / PAGE_SIZE as u64;
    if u64::from(meta.end) > file_pages {
        return Err(Error::Corrupt {
            page: 0,
            reason: "the meta page's end is past the data file",
        });
    }
    let spill = Spill::new(
        vfs.clone(),
        dir.join(SPILL_FILE),
        options.snapshot_spill_bytes,
    );
    // A crashed run's versions: scratch, no one reads them.
    spill.remove()?;
    let (doublewrite, restored) = open_doublewrite(&*vfs, dir, &*data, &options)?;
    let poison = Arc::new(Poison::default());
    let pool = Pool::new(
        data,
        options.cache_bytes,
        spill,
        options.read_only,
        doublewrite,
        poison.clone(),
    );
    for (no, page) in restored.pages {
        pool.install_recovered(no, page);
    }
    let mut tree = TreeMeta {
        root: meta.root,
        end: meta.end,
        free_head: meta.free_head,
    };
    let mut recovery = redo(&journal, &pool, &mut tree)?;
    recovery.doublewrite_restored = restored.count.restored;
    let redo_lsn = journal.redo_lsn();
    let applied = journal.appended_lsn();
    Ok(Inner {
        dir: dir.to_path_buf(),
        options,
        journal_id: meta.journal_id,
        journal,
        pool,
        tree_hint: AtomicU64::new((u64::from(tree.root) << 32) | u64::from(tree.end)),
        tree: RwLock::new(tree),
        queue: Mutex::new(Vec::new()),
        combiner: Mutex::new(()),
        record_buf: Mutex::new(Vec::new()),
        hints: Mutex::new(tree::InsertHints::default()),
        applied: AtomicU64::new(applied.0),
        epoch: AtomicU64::new(1),
        meta_seq: AtomicU64::new(meta.sequence),
        file_pages: AtomicU64::new(file_pages),
        checkpointing: Mutex::new(()),
        last_redo: AtomicU64::new(redo_lsn.0),
        closed: AtomicBool::new(false),
        poison,
        grow_lock: Mutex::new(()),
        worker: Mutex::new(WorkerState::default()),
        wake: Condvar::new(),
        recovery,
    })
}

/// What the double-write area gave back: pages restored, and (read-only)
/// the pages to install in the pool instead of writing them home.
struct FromDoublewrite {
    count: Restored,
    pages: Vec<(PageNo, Page)>,
}

/// Repairs torn pages from the double-write area a last run left, if any,
/// and opens the area if `options` want one, or if one is left: a log
/// written with the area holds no page images, so until a checkpoint has
/// moved the redo point past it, pages must still go home through the area
/// ([`Store::open_with`] retires it after that checkpoint). A read-only
/// open neither writes home nor opens it.
fn open_doublewrite(
    vfs: &dyn Vfs,
    dir: &Path,
    data: &dyn VfsFile,
    options: &Options,
) -> Result<(Option<DoubleWrite>, FromDoublewrite)> {
    let write = !options.read_only;
    let mut pages = Vec::new();
    let count = restore(vfs, dir, data, write, |no, p| pages.push((no, p)))?;
    let found = FromDoublewrite { count, pages };
    let wanted = options.torn_pages == TornPages::DoubleWrite;
    if !write || !(wanted || vfs.exists(&dir.join(DOUBLEWRITE_FILE))?) {
        return Ok((None, found));
    }
    Ok((Some(DoubleWrite::open(vfs, dir)?), found))
}

fn decode(lsn: Lsn, bytes: &[u8]) -> Result<Vec<LogOp>> {
    record::decode(bytes).map_err(|e| match e {
        Undecodable::Version(v) => Error::UnsupportedVersion { found: v },
        Undecodable::Malformed => Error::BadRecord { lsn },
    })
}

/// Replays the log from the checkpoint: an image replaces its page; a
/// leaf operation applies if its page's LSN is below the record's (the
/// decision taken once per page and record); meta operations set the
/// tree's shape. Pages rebuilt stay dirty in the pool; when they fill it,
/// some are written home (the log is durable: it is being read).
fn redo(journal: &Journal, pool: &Pool, tree: &mut TreeMeta) -> Result<RecoveryInfo> {
    let mut info = RecoveryInfo {
        journal: journal.recovery_report().clone(),
        records: 0,
        ops_applied: 0,
        ops_skipped: 0,
        images_restored: 0,
        pages_read: 2,
        doublewrite_restored: 0,
    };
    for r in journal.read_from(journal.redo_lsn())? {
        let (lsn, bytes) = r?;
        info.records += 1;
        // Per page of this record: apply its operations or not.
        let mut decided: HashMap<PageNo, bool> = HashMap::new();
        for op in decode(lsn, &bytes)? {
            let bad = || Error::BadRecord { lsn };
            match op {
                LogOp::Image { page, head, tail } => {
                    let p = Page::from_image(page, &head, &tail, lsn).map_err(|_| bad())?;
                    pool.install_recovered(page, p);
                    decided.insert(page, true);
                    info.images_restored += 1;
                }
                // (Only encoded: decoding yields `Image`.)
                LogOp::Whole(_) => return Err(bad()),
                LogOp::Put { page, .. }
                | LogOp::Delete { page, .. }
                | LogOp::Truncate { page, .. }
                | LogOp::BranchPut { page, .. } => {
                    if page < FIRST_PAGE {
                        return Err(bad());
                    }
                    let apply = match decided.get(&page) {
                        Some(a) => *a,
                        None => {
                            info.pages_read += 1;
                            let a = pool.fetch(page, journal)?.lsn() < lsn;
                            decided.insert(page, a);
                            a
                        }
                    };
                    if !apply {
                        info.ops_skipped += 1;
                        continue;
                    }
                    let mut p = Page::clone(&*pool.fetch(page, journal)?);
                    if !redo_page_op(&mut p, &op) {
                        return Err(bad());
                    }
                    p.set_lsn(lsn);
                    pool.install_recovered(page, p);
                    info.ops_applied += 1;
                }
                LogOp::Meta {
                    root,
                    end,
                    free_head,
                } => {
                    let inside = |p: PageNo| (FIRST_PAGE..end).contains(&p);
                    if !inside(root) || (free_head != 0 && !inside(free_head)) {
                        return Err(bad());
                    }
                    *tree = TreeMeta {
                        root,
                        end,
                        free_head,
                    };
                }
            }
        }
        // Full, the pool writes every dirty page home (in page order) and
        // evicts down to seven eighths of its bound: one pass over the
        // pool per eighth of it replayed. (A search for dirty pages from
        // the clock's start after every record was quadratic: 6 s of CPU
        // to open a store after `kill -9` at a million keys.)
        let (frames, _) = pool.usage();
        if frames >= pool.capacity() && !pool.read_only() {
            pool.write_back(&pool.dirty_pages(), journal)?;
            pool.shrink_with_room();
        }
    }
    Ok(info)
}

/// Applies a logged page operation; `false` if it cannot apply (the page
/// is not the one it was logged against).
fn redo_page_op(p: &mut Page, op: &LogOp) -> bool {
    let leaf = p.kind() == Some(Kind::Leaf);
    match op {
        LogOp::Truncate { key, .. } if leaf => {
            p.truncate_from(key);
            true
        }
        LogOp::BranchPut { cell, .. } if p.kind() == Some(Kind::Branch) => {
            let Some(key) = crate::page::branch_cell_key(cell) else {
                return false;
            };
            match p.search(key) {
                Err(i) => p.put_cell(i, cell, false),
                Ok(_) => false,
            }
        }
        LogOp::Put { cell, .. } if leaf => {
            let probe = crate::page::leaf_cell_key(cell);
            let Some(key) = probe else { return false };
            match p.search(key) {
                Ok(i) => p.put_cell(i, cell, true),
                Err(i) => p.put_cell(i, cell, false),
            }
        }
        LogOp::Delete { key, .. } if leaf => match p.search(key) {
            Ok(i) => {
                p.remove_cell(i);
                true
            }
            Err(_) => false,
        },
        _ => false,
    }
}

impl Inner {
    /// Removes the double-write area once pages no longer go through it
    /// (durably: a crash after this never finds a stale area).
    pub(super) fn retire_doublewrite_file(&self) -> Result<()> {
        let vfs = self.journal.vfs();
        let path = self.dir.join(DOUBLEWRITE_FILE);
        if vfs.exists(&path)? {
            vfs.remove_file(&path)?;
            vfs.sync_dir(&self.dir)?;
        }
        Ok(())
    }
}
