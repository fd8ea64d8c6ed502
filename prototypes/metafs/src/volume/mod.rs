//! The filesystem: `mkfs`, mount (with recovery), the operations,
//! transactions, checkpoints.
//!
//! # Journaling: ext4's ordered mode, jbd2's compound transactions
//!
//! Every operation changes metadata blocks (inode table, bitmap,
//! directory and indirect blocks) in a bounded in-memory block cache
//! (`cache.rs`: blocks whose home copy is current are evicted and read
//! back), inside the
//! *running transaction* — one transaction shared by every operation since
//! the last commit, as jbd2 compounds them. File data goes to its home
//! blocks in the image at once (through the page cache, no sync).
//!
//! A commit (`fsync`, `sync`, a checkpoint, or an operation that fills the
//! running transaction to a quarter of the journal's largest record, as
//! jbd2 commits a transaction that fills a quarter of its journal) takes
//! the running transaction:
//! under the state lock, the images of its dirty metadata blocks are
//! copied into one journal record; then the image file is fdatasynced if
//! data was written (**data before the metadata that points to it**: the
//! ordered-mode rule), the record is appended, and the journal's commit
//! makes it durable. One commit runs at a time, as jbd2's commit thread
//! runs them: a caller that finds one running waits on a condvar, and when
//! it ends the first caller it did not cover leads the next, whose snapshot
//! takes every change made by then — so concurrent fsyncs share commits,
//! and the log order is the transaction order.
//!
//! *Physical* journaling (full block images, like jbd2) rather than
//! logical redo records (like XFS): replay is writing images home in log
//! order — idempotent, no interpretation, no order-dependent redo logic —
//! and a block changed by a hundred operations in one transaction is
//! logged once. The price is 4 KiB per changed block per commit, which
//! group commit amortises.
//!
//! Two rules keep freed blocks honest (both jbd2's):
//! - a block freed in a transaction is not reused before that transaction
//!   is durable (else new data could overwrite a block the committed
//!   metadata still points to) — a write or `fallocate` short of space
//!   while such blocks wait commits to have them, as ext4 does;
//! - a freed *metadata* block is *revoked* in the transaction's record, so
//!   replay never writes an older image of it over what it holds next.
//!
//! # Checkpoints
//!
//! When the log since the last checkpoint passes
//! [`MountOptions::checkpoint_log_bytes`] (and at unmount), the running
//! transaction is committed, every metadata block changed since the last
//! checkpoint is written home, and `journal.checkpoint` moves the tail:
//! the image is registered with the journal, whose PREFLUSH makes the home
//! writes stable before the tail moves. The checkpoint holds the state
//! lock throughout, so what goes home is exactly the committed state.
//!
//! # Recovery
//!
//! Mounting opens the journal (its recovery finds the durable log), reads
//! every transaction from the tail, and writes their images home in order
//! — skipping images revoked at or after their transaction — then
//! checkpoints.

use crate::layout::{
    check_name, ptr_at, set_ptr, Inode, Kind, Super, Time, BLOCK, DIRECT, MAX_FILE_SIZE,
    PER_INDIRECT, ROOT,
};
use crate::{txn, Error, Result};
use journal_core::sync::{Condvar, Mutex};
use journal_core::vfs::{OpenOptions, OsVfs, Vfs, VfsFile};
use journal_core::{Journal, Lsn};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod bmap;
mod cache;
mod commit;
mod data;
mod dirs;
mod falloc;
mod ops;
mod orphans;
mod replay;
mod state;
mod xattr;

pub use falloc::Falloc;
pub use ops::{NewNode, RenameMode, SetAttr, LINK_MAX};
pub use xattr::{check_xattr_name, XattrSet};

/// An inode number.
pub type Ino = u32;

/// Options of [`Fs::mkfs`].
#[derive(Debug, Clone, Copy)]
pub struct MkfsOptions {
    /// Image size in bytes (rounded down to whole blocks; default 256 MiB).
    pub size: u64,
    /// Inodes (default: one per two blocks).
    pub inodes: Option<u32>,
    /// Options of the journal created beside the image.
    pub journal: journal_core::Options,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        Self {
            size: 256 << 20,
            inodes: None,
            journal: journal_core::Options::default(),
        }
    }
}

/// Directory index names allowed per byte of [`MountOptions::cache_bytes`]:
/// one per 64.
const DIR_NAME_BYTES: usize = 64;

/// Options of [`Fs::mount`].
#[derive(Debug, Clone, Copy)]
pub struct MountOptions {
    /// Options of the journal (its geometry must match the one it was
    /// created with).
    pub journal: journal_core::Options,
    /// Checkpoint when this much log was written since the last one
    /// (default 64 MiB).
    pub checkpoint_log_bytes: u64,
    /// Bytes of metadata blocks kept in memory (default 64 MiB; at least
    /// 4 blocks). Blocks changed since the last checkpoint stay beyond
    /// it, so the cache holds at most this plus about
    /// `checkpoint_log_bytes` plus the running transaction (a quarter of
    /// the journal's largest record); the others are read back from the
    /// image when needed again. The directories' in-memory indexes (about
    /// 54 bytes a name: the rise in peak RSS from one to two million files
    /// in one directory) are
    /// dropped, oldest first, once they hold more than
    /// `cache_bytes / 64` names, except those of the eight directories
    /// used last.
    pub cache_bytes: usize,
    /// When reads move the access time (default: [`Atime::Relatime`]).
    pub atime: Atime,
    /// Whether listing a directory moves its access time too (the policy
    /// permitting; default yes; `nodiratime` turns it off).
    pub diratime: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            journal: journal_core::Options::default(),
            checkpoint_log_bytes: 64 << 20,
            cache_bytes: 64 << 20,
            atime: Atime::Relatime,
            diratime: true,
        }
    }
}

/// When a read (of a file's data, or a directory's listing) moves the
/// access time: Linux's mount options of the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Atime {
    /// `relatime` (Linux's default): when the access time is not after
    /// the modification or change time, or is a day old.
    #[default]
    Relatime,
    /// `strictatime`: at every read.
    Strict,
    /// `noatime`: never.
    Never,
}

/// What mounting found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountReport {
    /// Transactions replayed from the journal.
    pub transactions: u64,
    /// Block images written home.
    pub blocks_replayed: u64,
    /// Block images skipped because a later transaction revoked them.
    pub blocks_revoked: u64,
}

/// One entry of a listing ([`Fs::readdir_from`]): its position, name,
/// inode and kind.
pub type EntryAt = (u64, Vec<u8>, Ino, Kind);

/// Every block an inode's map reaches: (index, data block) pairs in index
/// order, and the tree blocks.
pub(crate) type BlockMap = (Vec<(u64, u32)>, Vec<u32>);

/// What [`Fs::stat`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The inode number.
    pub ino: Ino,
    /// What it is.
    pub kind: Kind,
    /// Permission bits (`0o7777`).
    pub mode: u16,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (a directory: its blocks; a symlink: its target).
    pub size: u64,
    /// Last access.
    pub atime: Time,
    /// Last change of the data.
    pub mtime: Time,
    /// Last change of the inode.
    pub ctime: Time,
    /// Device number (devices).
    pub rdev: u32,
    /// Blocks allocated to it (data, directory, indirect and extended
    /// attribute blocks).
    pub blocks: u64,
}

/// The journal directory of an image: `IMAGE.journal` beside it.
pub fn journal_dir(image: &Path) -> PathBuf {
    let mut s = image.as_os_str().to_owned();
    s.push(".journal");
    PathBuf::from(s)
}

/// The in-memory state, under one lock: the metadata block cache and the
/// running transaction.
struct State {
    sb: Super,
    /// Metadata blocks read or changed: inode table, bitmap, directory and
    /// indirect blocks, bounded by [`MountOptions::cache_bytes`]
    /// (`cache.rs`). File data is never cached.
    cache: cache::BlockCache,
    /// Blocks the running transaction changed.
    running: BTreeSet<u32>,
    /// Metadata blocks the running transaction freed.
    revoked: Vec<u32>,
    /// Blocks the running transaction freed (not reusable yet).
    pending_free: Vec<u32>,
    /// Every freed block not reusable yet: freed by the running transaction
    /// or by one whose record is not yet durable.
    unavailable: HashSet<u32>,
    /// Freed blocks of appended transactions, by their record's LSN.
    awaiting: Vec<(Lsn, Vec<u32>)>,
    /// Metadata blocks changed since the last checkpoint.
    checkpoint_set: BTreeSet<u32>,
    /// File data written since the image was last synced.
    data_dirty: bool,
    /// Free bits in the bitmap (unavailable blocks included).
    free_blocks: u64,
    free_inodes: u64,
    /// Clear bits in each block-bitmap block (unavailable ones included),
    /// so allocation skips full stretches of the bitmap.
    group_free: Vec<u32>,
    /// Clear bits in each inode-bitmap block.
    igroup_free: Vec<u32>,
    /// The key of the directory indexes' name hashes, drawn at mount.
    dir_hasher: std::collections::hash_map::RandomState,
    /// The directories' indexes (`dirs.rs`).
    dirs: dirs::DirIndexes,
    /// Open handles per inode ([`Fs::open`]): an inode unlinked while
    /// open lives on as an orphan until its count drops to 0.
    open: HashMap<Ino, u32>,
    block_hint: u32,
    inode_hint: u32,
    /// Changes made so far (every metadata block or data write counts
    /// one): a commit covers every change up to its snapshot's count.
    ops: u64,
}

impl State {
    /// The state of a mounted image (after replay): an empty cache of
    /// `cache_bytes`, the free counts from the bitmaps, the root checked.
    fn load(image: &dyn VfsFile, sb: Super, cache_bytes: usize) -> Result<State> {
        let mut state = State {
            sb,
            cache: cache::BlockCache::new(cache_bytes),
            running: BTreeSet::new(),
            revoked: Vec::new(),
            pending_free: Vec::new(),
            unavailable: HashSet::new(),
            awaiting: Vec::new(),
            checkpoint_set: BTreeSet::new(),
            data_dirty: false,
            free_blocks: 0,
            free_inodes: 0,
            group_free: Vec::new(),
            igroup_free: Vec::new(),
            dir_hasher: Default::default(),
            dirs: dirs::DirIndexes::new(cache_bytes / DIR_NAME_BYTES),
            open: HashMap::new(),
            block_hint: sb.data_start,
            inode_hint: ROOT + 1,
            ops: 0,
        };
        // Free counts from the bitmaps (popcounts; no inode is read).
        state.group_free = state.count_clear(image, sb.bitmap_start, sb.blocks)?;
        state.igroup_free = state.count_clear(image, sb.ibitmap_start, sb.inodes)?;
        state.free_blocks = state.group_free.iter().map(|&n| n as u64).sum();
        state.free_inodes = state.igroup_free.iter().map(|&n| n as u64).sum();
        if !state.bit(image, 0)? || !state.ibit(image, ROOT)? {
            return Err(Error::Corrupt(
                "the bitmaps do not mark the fixed blocks and the root".into(),
            ));
        }
        if state.live(image, ROOT)?.kind != Kind::Dir {
            return Err(Error::Corrupt("the root is not a directory".into()));
        }
        Ok(state)
    }
}

/// A transaction taken from the state for commit.
struct Snapshot {
    record: Option<Vec<u8>>,
    frees: Vec<u32>,
    data_dirty: bool,
    /// The operations it covers: all up to this count.
    ops: u64,
}

/// Where commits are sequenced (jbd2's commit, one at a time).
struct Committer {
    next_tid: u64,
    /// A commit is running: its leader let go of this lock for the I/O;
    /// every other caller waits on `commit_done`.
    committing: bool,
    /// Every change up to this count ([`State::ops`]) is durable.
    durable: u64,
    /// Log bytes appended since the last checkpoint.
    since_checkpoint: u64,
}

/// A mounted filesystem. `Send + Sync`: share it between threads.
pub struct Fs {
    image: Box<dyn VfsFile>,
    journal: Journal,
    sb: Super,
    state: Mutex<State>,
    committer: Mutex<Committer>,
    /// Signalled when a commit ends (durable, or failed).
    commit_done: Condvar,
    options: MountOptions,
    /// The running transaction is committed once its record reaches this
    /// length: a quarter of the journal's largest record.
    commit_at: usize,
    failed: Mutex<Option<String>>,
    report: MountReport,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("image", &self.image.path())
            .finish_non_exhaustive()
    }
}

impl Fs {
    /// Makes a filesystem in a new image file `image` on the real
    /// filesystem, with its journal in `IMAGE.journal`.
    pub fn mkfs(image: impl AsRef<Path>, options: MkfsOptions) -> Result<()> {
        Self::mkfs_with(Arc::new(OsVfs::new()), image, options)
    }

    /// [`Fs::mkfs`] on any filesystem (a `SimVfs` in tests).
    pub fn mkfs_with(
        vfs: Arc<dyn Vfs>,
        image: impl AsRef<Path>,
        options: MkfsOptions,
    ) -> Result<()> {
        let image = image.as_ref();
        let blocks = (options.size / BLOCK as u64).min(u32::MAX as u64) as u32;
        let inodes = options
            .inodes
            .unwrap_or(blocks / 2)
            .max(crate::layout::INODES_PER_BLOCK);
        // Check the layout before creating anything.
        let probe = Super::layout(blocks, inodes, [0; 16]).ok_or(Error::InvalidArgument(
            "more inodes than the format can number",
        ))?;
        if probe.data_start.saturating_add(16) > blocks {
            return Err(Error::InvalidArgument(
                "image too small for its inode table and bitmap",
            ));
        }
        if vfs.exists(image)? || vfs.exists(&journal_dir(image))? {
            return Err(Error::Exists);
        }
        let journal = Journal::open_with(
            vfs.clone(),
            journal_dir(image),
            journal_core::Options {
                create_if_missing: true,
                ..options.journal
            },
        )?;
        let sb = Super {
            journal_id: journal.id(),
            ..probe
        };
        let f = vfs.open(image, OpenOptions::create_new())?;
        f.set_len(blocks as u64 * BLOCK as u64)?;
        // Inode bitmap: inode 0 (never used) and the root.
        let mut ibitmap = vec![0u8; BLOCK];
        ibitmap[0] = 0b11;
        f.write_at(&ibitmap, sb.ibitmap_start as u64 * BLOCK as u64)?;
        // Block bitmap: the superblock, bitmaps and inode table are in use.
        let bitmap_blocks = sb.data_start - sb.bitmap_start;
        let mut bitmap = vec![0u8; bitmap_blocks as usize * BLOCK];
        for b in 0..sb.data_start as usize {
            bitmap[b / 8] |= 1 << (b % 8);
        }
        f.write_at(&bitmap, sb.bitmap_start as u64 * BLOCK as u64)?;
        // The root directory.
        let (rb, ro) = sb.inode_place(ROOT);
        let mut blk = vec![0u8; BLOCK];
        Inode::new(Kind::Dir, 0o755, 0, 0, ROOT, Time::now()).encode(&mut blk[ro..]);
        f.write_at(&blk, rb as u64 * BLOCK as u64)?;
        // The superblock last: an image without one is not a filesystem.
        f.sync_data()?;
        f.write_at(&sb.encode(), 0)?;
        f.sync_all()?;
        if let Some(parent) = image.parent().filter(|p| !p.as_os_str().is_empty()) {
            vfs.sync_dir(parent)?;
        }
        journal.close()?;
        Ok(())
    }

    /// Mounts the image `image` on the real filesystem (recovering it).
    pub fn mount(image: impl AsRef<Path>, options: MountOptions) -> Result<Fs> {
        Self::mount_with(Arc::new(OsVfs::new()), image, options)
    }

    /// [`Fs::mount`] on any filesystem. Checks the superblock before
    /// touching anything; then opens the journal and replays it.
    pub fn mount_with(
        vfs: Arc<dyn Vfs>,
        image: impl AsRef<Path>,
        options: MountOptions,
    ) -> Result<Fs> {
        let image_path = image.as_ref();
        if !vfs.exists(image_path)? {
            return Err(Error::NotFound);
        }
        let image = vfs.open(image_path, OpenOptions::write())?;
        let mut sb_block = vec![0u8; BLOCK];
        let n = image.read_at(&mut sb_block, 0)?;
        if n < 64 {
            return Err(Error::NotMetafs("shorter than a superblock".into()));
        }
        let sb = Super::decode(&sb_block)?;
        if image.len()? != sb.blocks as u64 * BLOCK as u64 {
            return Err(Error::Corrupt(format!(
                "image is {} bytes, its superblock says {} blocks",
                image.len()?,
                sb.blocks
            )));
        }
        let jdir = journal_dir(image_path);
        if !vfs.exists(&jdir)? {
            return Err(Error::NotMetafs(format!(
                "no journal at {}",
                jdir.display()
            )));
        }
        let journal = Journal::open_with(
            vfs.clone(),
            &jdir,
            journal_core::Options {
                create_if_missing: false,
                ..options.journal
            },
        )?;
        if journal.id() != sb.journal_id {
            return Err(Error::NotMetafs(
                "the journal beside it belongs to another image".into(),
            ));
        }
        journal.register_data_file(image_path)?;
        let (report, next_tid) = replay::replay(&journal, &*image, &sb)?;
        let state = State::load(&*image, sb, options.cache_bytes)?;
        let fs = Fs {
            image,
            journal,
            sb,
            state: Mutex::new(state),
            committer: Mutex::new(Committer {
                next_tid,
                committing: false,
                durable: 0,
                since_checkpoint: 0,
            }),
            commit_done: Condvar::new(),
            commit_at: options.journal.max_record() / 4,
            options,
            failed: Mutex::new(None),
            report,
        };
        // Inodes unlinked while open when the last mount ended: free them.
        if fs.with(|st, img| st.reap_orphans(img))? {
            fs.sync()?;
        }
        Ok(fs)
    }

    /// What mounting replayed.
    pub fn mount_report(&self) -> &MountReport {
        &self.report
    }

    /// The superblock.
    pub fn superblock(&self) -> Super {
        self.sb
    }

    /// The journal (for its metrics).
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Free blocks and inodes (blocks freed by commits not yet durable
    /// included).
    pub fn free(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.free_blocks, st.free_inodes)
    }

    fn check(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    fn poison(&self, e: Error) -> Error {
        let mut f = self.failed.lock();
        if f.is_none() {
            *f = Some(e.to_string());
        }
        e
    }

    /// Runs `op` on the state under its lock, after the poison check. An
    /// I/O error of the image poisons the filesystem: the operation may
    /// have changed the running transaction part-way, and no commit may
    /// ever make that durable (remount to recover from the journal).
    ///
    /// A running transaction whose record has grown to a quarter of the
    /// journal's largest is committed before the call returns, as jbd2
    /// commits a transaction that fills a quarter of its journal: left to
    /// grow until the next sync, it could outgrow any record, and that
    /// sync could never commit it.
    fn with<T>(&self, op: impl FnOnce(&mut State, &dyn VfsFile) -> Result<T>) -> Result<T> {
        self.check()?;
        let mut st = self.state.lock();
        let r = op(&mut st, &*self.image).map_err(|e| match e {
            Error::Io(_) => self.poison(e),
            e => e,
        });
        let full = st.record_len() >= self.commit_at;
        drop(st);
        if full {
            self.sync()?;
        }
        r
    }

    // ---- paths -----------------------------------------------------------

    /// The inode at `path` (`/a/b/c`; empty components are ignored).
    pub fn resolve(&self, path: &str) -> Result<Ino> {
        let mut ino = ROOT;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if self.stat(ino)?.kind != Kind::Dir {
                return Err(Error::NotADirectory);
            }
            ino = self.lookup(ino, part.as_bytes())?;
        }
        Ok(ino)
    }

    /// The parent directory and last name of `path`.
    pub fn split<'p>(&self, path: &'p str) -> Result<(Ino, &'p [u8])> {
        let path = path.trim_end_matches('/');
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let d = self.resolve(dir)?;
        if self.stat(d)?.kind != Kind::Dir {
            return Err(Error::NotADirectory);
        }
        Ok((d, name.as_bytes()))
    }

    /// `mkdir PATH`.
    pub fn mkdir_path(&self, path: &str) -> Result<Ino> {
        let (d, n) = self.split(path)?;
        self.mkdir(d, n)
    }

    /// `create PATH` (an empty file).
    pub fn create_path(&self, path: &str) -> Result<Ino> {
        let (d, n) = self.split(path)?;
        self.create(d, n)
    }

    /// `unlink PATH`.
    pub fn unlink_path(&self, path: &str) -> Result<()> {
        let (d, n) = self.split(path)?;
        self.unlink(d, n)
    }

    /// `rmdir PATH`.
    pub fn rmdir_path(&self, path: &str) -> Result<()> {
        let (d, n) = self.split(path)?;
        self.rmdir(d, n)
    }

    /// `rename FROM TO`.
    pub fn rename_path(&self, from: &str, to: &str) -> Result<()> {
        let (d, n) = self.split(from)?;
        let (td, tn) = self.split(to)?;
        self.rename(d, n, td, tn)
    }

    /// The whole content of the file at `path`.
    pub fn read_path(&self, path: &str) -> Result<Vec<u8>> {
        let ino = self.resolve(path)?;
        let size = self.stat(ino)?.size;
        self.read(ino, 0, size as usize)
    }

    /// Every block the metadata reaches, and the cache's view of the
    /// bitmap: for `fsck`.
    pub(crate) fn inspect<T>(&self, f: impl FnOnce(&mut Inspector<'_>) -> Result<T>) -> Result<T> {
        self.with(|st, img| {
            let mut i = Inspector { st, img };
            f(&mut i)
        })
    }
}

/// Read access to the metadata for `fsck`.
pub(crate) struct Inspector<'a> {
    st: &'a mut State,
    img: &'a dyn VfsFile,
}

impl Inspector<'_> {
    pub(crate) fn sb(&self) -> Super {
        self.st.sb
    }
    pub(crate) fn inode(&mut self, ino: Ino) -> Result<Inode> {
        self.st.inode(self.img, ino)
    }
    pub(crate) fn bit(&mut self, b: u32) -> Result<bool> {
        self.st.bit(self.img, b)
    }
    pub(crate) fn ibit(&mut self, ino: Ino) -> Result<bool> {
        self.st.ibit(self.img, ino)
    }
    /// Every block an inode's map reaches: (index, data block) pairs and
    /// the tree blocks.
    pub(crate) fn walk(&mut self, i: &Inode) -> Result<BlockMap> {
        self.st.walk(self.img, i)
    }
    /// The entries of a directory as its blocks hold them.
    pub(crate) fn entries(&mut self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, Kind)>> {
        self.st.entries(self.img, dir)
    }
    /// The orphan list.
    pub(crate) fn orphans(&mut self) -> Result<Vec<Ino>> {
        self.st.orphans(self.img)
    }
    /// The blocks of an inode's attribute chain.
    pub(crate) fn xattr_chain(&mut self, i: &Inode) -> Result<Vec<u32>> {
        self.st.xattr_chain(self.img, i)
    }
    /// An inode's attributes.
    pub(crate) fn xattrs(&mut self, i: &Inode) -> Result<Vec<crate::layout::xattr::Xattr>> {
        self.st.xattrs(self.img, i)
    }
    /// What a symlink points to.
    pub(crate) fn data(&mut self, i: &Inode) -> Result<Vec<u8>> {
        self.st.read_data(self.img, i, 0, i.size as usize)
    }
}
