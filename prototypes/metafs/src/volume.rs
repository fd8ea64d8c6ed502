//! The filesystem: `mkfs`, mount (with recovery), the operations,
//! transactions, checkpoints.
//!
//! # Journaling: ext4's ordered mode, jbd2's compound transactions
//!
//! Every operation changes metadata blocks (inode table, bitmap,
//! directory and indirect blocks) in an in-memory block cache, inside the
//! *running transaction* — one transaction shared by every operation since
//! the last commit, as jbd2 compounds them. File data goes to its home
//! blocks in the image at once (through the page cache, no sync).
//!
//! A commit (`fsync`, `sync`, a checkpoint) takes the running transaction:
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
//!   metadata still points to);
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
    check_name, dirent_at, dirent_is, ptr_at, set_dirent, set_ptr, Inode, Kind, Super, BLOCK,
    DIRECT, DIRENTS_PER_BLOCK, MAX_FILE_SIZE, PER_INDIRECT, ROOT,
};
use crate::{txn, Error, Result};
use journal_core::sync::{Condvar, Mutex};
use journal_core::vfs::{OpenOptions, OsVfs, Vfs, VfsFile};
use journal_core::{Journal, Lsn};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Options of [`Fs::mount`].
#[derive(Debug, Clone, Copy)]
pub struct MountOptions {
    /// Options of the journal (its geometry must match the one it was
    /// created with).
    pub journal: journal_core::Options,
    /// Checkpoint when this much log was written since the last one
    /// (default 64 MiB).
    pub checkpoint_log_bytes: u64,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            journal: journal_core::Options::default(),
            checkpoint_log_bytes: 64 << 20,
        }
    }
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

/// What [`Fs::stat`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The inode number.
    pub ino: Ino,
    /// File or directory.
    pub kind: Kind,
    /// Size in bytes (a directory: its blocks).
    pub size: u64,
    /// Links.
    pub nlink: u16,
    /// Modification time, ns since the epoch.
    pub mtime_ns: u64,
    /// Blocks allocated to it (data, directory and indirect blocks).
    pub blocks: u64,
}

/// The journal directory of an image: `IMAGE.journal` beside it.
pub fn journal_dir(image: &Path) -> PathBuf {
    let mut s = image.as_os_str().to_owned();
    s.push(".journal");
    PathBuf::from(s)
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The in-memory state, under one lock: the metadata block cache and the
/// running transaction.
struct State {
    sb: Super,
    /// Metadata blocks read or changed: inode table, bitmap, directory and
    /// indirect blocks. File data is never cached.
    cache: HashMap<u32, Box<[u8]>>,
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
    block_hint: u32,
    inode_hint: u32,
    /// Changes made so far (every metadata block or data write counts
    /// one): a commit covers every change up to its snapshot's count.
    ops: u64,
}

/// A transaction taken from the state for commit.
struct Snapshot {
    record: Option<Vec<u8>>,
    frees: Vec<u32>,
    data_dirty: bool,
    /// The operations it covers: all up to this count.
    ops: u64,
}

impl State {
    fn load(&mut self, img: &dyn VfsFile, b: u32) -> Result<()> {
        if !self.cache.contains_key(&b) {
            if b >= self.sb.blocks {
                return Err(Error::Corrupt(format!("block {b} beyond the image")));
            }
            let mut buf = vec![0u8; BLOCK].into_boxed_slice();
            img.read_exact_at(&mut buf, b as u64 * BLOCK as u64)?;
            self.cache.insert(b, buf);
        }
        Ok(())
    }

    fn get(&mut self, img: &dyn VfsFile, b: u32) -> Result<&[u8]> {
        self.load(img, b)?;
        Ok(&self.cache[&b])
    }

    fn get_mut(&mut self, img: &dyn VfsFile, b: u32) -> Result<&mut [u8]> {
        self.load(img, b)?;
        self.ops += 1;
        self.running.insert(b);
        self.checkpoint_set.insert(b);
        Ok(self.cache.get_mut(&b).expect("loaded"))
    }

    /// A newly allocated metadata block: zeros, never read from disk.
    fn fresh(&mut self, b: u32) -> &mut [u8] {
        self.ops += 1;
        self.cache.insert(b, vec![0u8; BLOCK].into_boxed_slice());
        self.running.insert(b);
        self.checkpoint_set.insert(b);
        self.cache.get_mut(&b).expect("inserted")
    }

    fn inode(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<Inode> {
        if ino == 0 || ino >= self.sb.inodes {
            return Err(Error::NotFound);
        }
        let (b, o) = self.sb.inode_place(ino);
        Inode::decode(&self.get(img, b)?[o..])
    }

    /// A live inode (not free).
    fn live(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<Inode> {
        let i = self.inode(img, ino)?;
        if i.kind == Kind::Free {
            return Err(Error::NotFound);
        }
        Ok(i)
    }

    fn dir(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<Inode> {
        let i = self.live(img, ino)?;
        if i.kind != Kind::Dir {
            return Err(Error::NotADirectory);
        }
        Ok(i)
    }

    fn set_inode(&mut self, img: &dyn VfsFile, ino: Ino, i: &Inode) -> Result<()> {
        let (b, o) = self.sb.inode_place(ino);
        i.encode(&mut self.get_mut(img, b)?[o..]);
        Ok(())
    }

    fn bit(&mut self, img: &dyn VfsFile, b: u32) -> Result<bool> {
        let (blk, bit) = self.sb.bit_place(b);
        Ok(self.get(img, blk)?[bit / 8] & (1 << (bit % 8)) != 0)
    }

    fn set_bit(&mut self, img: &dyn VfsFile, b: u32, on: bool) -> Result<()> {
        let (blk, bit) = self.sb.bit_place(b);
        let byte = &mut self.get_mut(img, blk)?[bit / 8];
        if on {
            *byte |= 1 << (bit % 8);
        } else {
            *byte &= !(1 << (bit % 8));
        }
        Ok(())
    }

    /// Blocks that can be allocated now.
    fn available(&self) -> u64 {
        self.free_blocks - self.unavailable.len() as u64
    }

    /// Allocates a block (the caller checked [`State::available`]).
    fn alloc_block(&mut self, img: &dyn VfsFile) -> Result<u32> {
        let (lo, hi) = (self.sb.data_start, self.sb.blocks);
        let span = hi - lo;
        for k in 0..span {
            let b = lo + (self.block_hint - lo + k) % span;
            if !self.unavailable.contains(&b) && !self.bit(img, b)? {
                self.set_bit(img, b, true)?;
                self.free_blocks -= 1;
                self.block_hint = b + 1;
                if self.block_hint >= hi {
                    self.block_hint = lo;
                }
                return Ok(b);
            }
        }
        Err(Error::NoSpace)
    }

    /// Frees a block; `meta`: it held metadata (it leaves the cache and is
    /// revoked).
    fn free_block(&mut self, img: &dyn VfsFile, b: u32, meta: bool) -> Result<()> {
        self.set_bit(img, b, false)?;
        self.free_blocks += 1;
        self.pending_free.push(b);
        self.unavailable.insert(b);
        if meta {
            self.cache.remove(&b);
            self.running.remove(&b);
            self.checkpoint_set.remove(&b);
            self.revoked.push(b);
        }
        Ok(())
    }

    fn alloc_inode(&mut self, img: &dyn VfsFile, kind: Kind, parent: Ino) -> Result<Ino> {
        let n = self.sb.inodes;
        for k in 0..n {
            let ino = (self.inode_hint + k) % n;
            if ino <= ROOT {
                continue;
            }
            if self.inode(img, ino)?.kind == Kind::Free {
                self.set_inode(img, ino, &Inode::new(kind, parent, now_ns()))?;
                self.free_inodes -= 1;
                self.inode_hint = ino + 1;
                return Ok(ino);
            }
        }
        Err(Error::NoSpace)
    }

    fn free_inode(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let mut i = self.inode(img, ino)?;
        let meta = i.kind == Kind::Dir;
        self.free_blocks_from(img, &mut i, 0, meta)?;
        self.set_inode(img, ino, &Inode::free())?;
        self.free_inodes += 1;
        Ok(())
    }

    /// The block at index `idx` of an inode (0: a hole).
    fn bmap(&mut self, img: &dyn VfsFile, i: &Inode, idx: usize) -> Result<u32> {
        if idx < DIRECT {
            return Ok(i.direct[idx]);
        }
        if i.indirect == 0 {
            return Ok(0);
        }
        Ok(ptr_at(self.get(img, i.indirect)?, idx - DIRECT))
    }

    /// Blocks a write of indices `[first, last]` must allocate.
    fn blocks_needed(
        &mut self,
        img: &dyn VfsFile,
        i: &Inode,
        first: usize,
        last: usize,
    ) -> Result<u64> {
        let mut n = 0;
        for idx in first..=last {
            if self.bmap(img, i, idx)? == 0 {
                n += 1;
            }
        }
        if last >= DIRECT && i.indirect == 0 {
            n += 1;
        }
        Ok(n)
    }

    /// Maps index `idx` of inode `i` to a newly allocated block `b`.
    fn bmap_set(&mut self, img: &dyn VfsFile, i: &mut Inode, idx: usize, b: u32) -> Result<()> {
        if idx < DIRECT {
            i.direct[idx] = b;
            return Ok(());
        }
        if i.indirect == 0 {
            let ind = self.alloc_block(img)?;
            self.fresh(ind);
            i.indirect = ind;
        }
        set_ptr(self.get_mut(img, i.indirect)?, idx - DIRECT, b);
        Ok(())
    }

    /// Frees every block at index `from` and above (`meta`: they are
    /// directory blocks), and the indirect block if no longer needed.
    fn free_blocks_from(
        &mut self,
        img: &dyn VfsFile,
        i: &mut Inode,
        from: usize,
        meta: bool,
    ) -> Result<()> {
        for idx in from..DIRECT {
            if i.direct[idx] != 0 {
                self.free_block(img, i.direct[idx], meta)?;
                i.direct[idx] = 0;
            }
        }
        if i.indirect != 0 {
            let start = from.saturating_sub(DIRECT);
            let ptrs: Vec<(usize, u32)> = {
                let blk = self.get(img, i.indirect)?;
                (start..PER_INDIRECT)
                    .map(|k| (k, ptr_at(blk, k)))
                    .filter(|&(_, p)| p != 0)
                    .collect()
            };
            for &(_, p) in &ptrs {
                self.free_block(img, p, meta)?;
            }
            if start == 0 {
                let ind = i.indirect;
                self.free_block(img, ind, true)?;
                i.indirect = 0;
            } else if !ptrs.is_empty() {
                let blk = self.get_mut(img, i.indirect)?;
                for (k, _) in ptrs {
                    set_ptr(blk, k, 0);
                }
            }
        }
        Ok(())
    }

    /// A file grows from `i.size` to `upto`: zeros the rest of its old last
    /// block up to there, which may hold bytes of an earlier, longer life
    /// of the file. (Beyond the old size: invisible until the new size
    /// commits, so this data write needs no ordering of its own.)
    fn zero_tail(&mut self, img: &dyn VfsFile, i: &Inode, upto: u64) -> Result<()> {
        let bs = BLOCK as u64;
        if i.size.is_multiple_of(bs) {
            return Ok(());
        }
        let idx = i.size / bs;
        let b = self.bmap(img, i, idx as usize)?;
        if b == 0 {
            return Ok(());
        }
        let from = i.size % bs;
        let to = if upto / bs == idx { upto % bs } else { bs };
        img.write_at(&vec![0u8; (to - from) as usize], b as u64 * bs + from)?;
        self.data_dirty = true;
        self.ops += 1;
        Ok(())
    }

    // ---- directories ---------------------------------------------------

    fn dir_blocks(&mut self, img: &dyn VfsFile, d: &Inode) -> Result<Vec<u32>> {
        let n = (d.size / BLOCK as u64) as usize;
        (0..n).map(|idx| self.bmap(img, d, idx)).collect()
    }

    /// The (block, slot, inode) of `name` in directory `dir`.
    fn find(
        &mut self,
        img: &dyn VfsFile,
        dir: Ino,
        name: &[u8],
    ) -> Result<Option<(u32, usize, Ino)>> {
        let d = self.dir(img, dir)?;
        for b in self.dir_blocks(img, &d)? {
            let blk = self.get(img, b)?;
            for slot in 0..DIRENTS_PER_BLOCK {
                if let Some(ino) = dirent_is(blk, slot, name) {
                    return Ok(Some((b, slot, ino)));
                }
            }
        }
        Ok(None)
    }

    /// A free slot in `dir`, if one exists without growing it.
    fn free_slot(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<Option<(u32, usize)>> {
        let d = self.dir(img, dir)?;
        for b in self.dir_blocks(img, &d)? {
            let blk = self.get(img, b)?;
            for slot in 0..DIRENTS_PER_BLOCK {
                if blk[slot * crate::layout::DIRENT_SIZE..][..4] == [0; 4] {
                    return Ok(Some((b, slot)));
                }
            }
        }
        Ok(None)
    }

    /// Blocks adding an entry to `dir` needs (0, 1, or 2 with an indirect).
    fn add_needs(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<u64> {
        if self.free_slot(img, dir)?.is_some() {
            return Ok(0);
        }
        let d = self.dir(img, dir)?;
        let idx = (d.size / BLOCK as u64) as usize;
        if idx >= DIRECT + PER_INDIRECT {
            return Err(Error::NoSpace);
        }
        Ok(1 + (idx >= DIRECT && d.indirect == 0) as u64)
    }

    /// Adds `name → ino` to `dir` (space checked by the caller).
    fn add_entry(&mut self, img: &dyn VfsFile, dir: Ino, name: &[u8], ino: Ino) -> Result<()> {
        let (b, slot) = match self.free_slot(img, dir)? {
            Some(s) => s,
            None => {
                let mut d = self.dir(img, dir)?;
                let idx = (d.size / BLOCK as u64) as usize;
                let b = self.alloc_block(img)?;
                self.fresh(b);
                self.bmap_set(img, &mut d, idx, b)?;
                d.size += BLOCK as u64;
                self.set_inode(img, dir, &d)?;
                (b, 0)
            }
        };
        set_dirent(self.get_mut(img, b)?, slot, ino, name);
        Ok(())
    }

    fn entries(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<Vec<(Vec<u8>, Ino)>> {
        let d = self.dir(img, dir)?;
        let mut out = Vec::new();
        for b in self.dir_blocks(img, &d)? {
            let blk = self.get(img, b)?;
            for slot in 0..DIRENTS_PER_BLOCK {
                if let Some(e) = dirent_at(blk, slot)? {
                    out.push((e.name, e.ino));
                }
            }
        }
        Ok(out)
    }

    fn is_empty_dir(&mut self, img: &dyn VfsFile, dir: Ino) -> Result<bool> {
        Ok(self.entries(img, dir)?.is_empty())
    }

    fn touch(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<()> {
        let mut i = self.live(img, ino)?;
        i.mtime_ns = now_ns();
        self.set_inode(img, ino, &i)
    }

    // ---- transactions --------------------------------------------------

    /// Takes the running transaction: its record (if it changed metadata),
    /// the blocks it freed, and whether data was written since the last
    /// image sync.
    fn take(&mut self, tid: u64) -> Snapshot {
        let data_dirty = std::mem::take(&mut self.data_dirty);
        let ops = self.ops;
        if self.running.is_empty() && self.revoked.is_empty() {
            return Snapshot {
                record: None,
                frees: std::mem::take(&mut self.pending_free),
                data_dirty,
                ops,
            };
        }
        let running = std::mem::take(&mut self.running);
        let revoked = std::mem::take(&mut self.revoked);
        let cache = &self.cache;
        let blocks: Vec<(u32, &[u8])> = running.iter().map(|b| (*b, &cache[b][..])).collect();
        let record = txn::encode(tid, blocks.into_iter(), &revoked);
        Snapshot {
            record: Some(record),
            frees: std::mem::take(&mut self.pending_free),
            data_dirty,
            ops,
        }
    }
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
        let probe = Super::layout(blocks, inodes, [0; 16]);
        if probe.data_start + 16 > blocks {
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
        let sb = Super::layout(blocks, inodes, journal.id());
        let f = vfs.open(image, OpenOptions::create_new())?;
        f.set_len(blocks as u64 * BLOCK as u64)?;
        // Bitmap: the superblock, inode table and bitmap are in use.
        let bitmap_blocks = sb.data_start - sb.bitmap_start;
        let mut bitmap = vec![0u8; bitmap_blocks as usize * BLOCK];
        for b in 0..sb.data_start as usize {
            bitmap[b / 8] |= 1 << (b % 8);
        }
        f.write_at(&bitmap, sb.bitmap_start as u64 * BLOCK as u64)?;
        // The root directory.
        let (rb, ro) = sb.inode_place(ROOT);
        let mut blk = vec![0u8; BLOCK];
        Inode::new(Kind::Dir, ROOT, now_ns()).encode(&mut blk[ro..]);
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
        let (report, next_tid) = replay(&journal, &*image, &sb)?;
        let mut state = State {
            sb,
            cache: HashMap::new(),
            running: BTreeSet::new(),
            revoked: Vec::new(),
            pending_free: Vec::new(),
            unavailable: HashSet::new(),
            awaiting: Vec::new(),
            checkpoint_set: BTreeSet::new(),
            data_dirty: false,
            free_blocks: 0,
            free_inodes: 0,
            block_hint: sb.data_start,
            inode_hint: ROOT + 1,
            ops: 0,
        };
        for b in sb.data_start..sb.blocks {
            if !state.bit(&*image, b)? {
                state.free_blocks += 1;
            }
        }
        for ino in ROOT + 1..sb.inodes {
            if state.inode(&*image, ino)?.kind == Kind::Free {
                state.free_inodes += 1;
            }
        }
        if state.live(&*image, ROOT)?.kind != Kind::Dir {
            return Err(Error::Corrupt("the root is not a directory".into()));
        }
        Ok(Fs {
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
            options,
            failed: Mutex::new(None),
            report,
        })
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
    fn with<T>(&self, op: impl FnOnce(&mut State, &dyn VfsFile) -> Result<T>) -> Result<T> {
        self.check()?;
        let mut st = self.state.lock();
        op(&mut st, &*self.image).map_err(|e| match e {
            Error::Io(_) => self.poison(e),
            e => e,
        })
    }

    // ---- namespace -------------------------------------------------------

    /// The inode `name` names in directory `dir`.
    pub fn lookup(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.with(|st, img| st.find(img, dir, name)?.map(|f| f.2).ok_or(Error::NotFound))
    }

    /// Attributes of an inode.
    pub fn stat(&self, ino: Ino) -> Result<Stat> {
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            let mut blocks = 0;
            let n = i.size.div_ceil(BLOCK as u64) as usize;
            for idx in 0..n.min(DIRECT + PER_INDIRECT) {
                blocks += (st.bmap(img, &i, idx)? != 0) as u64;
            }
            blocks += (i.indirect != 0) as u64;
            Ok(Stat {
                ino,
                kind: i.kind,
                size: i.size,
                nlink: i.nlink,
                mtime_ns: i.mtime_ns,
                blocks,
            })
        })
    }

    /// The entries of a directory: (name, inode, kind).
    pub fn readdir(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, Kind)>> {
        self.with(|st, img| {
            let entries = st.entries(img, dir)?;
            entries
                .into_iter()
                .map(|(n, ino)| Ok((n, ino, st.live(img, ino)?.kind)))
                .collect()
        })
    }

    /// The parent of a directory (the root is its own).
    pub fn parent(&self, dir: Ino) -> Result<Ino> {
        self.with(|st, img| Ok(st.dir(img, dir)?.parent))
    }

    fn make(&self, dir: Ino, name: &[u8], kind: Kind) -> Result<Ino> {
        check_name(name)?;
        self.with(|st, img| {
            st.dir(img, dir)?;
            if st.find(img, dir, name)?.is_some() {
                return Err(Error::Exists);
            }
            if st.free_inodes == 0 || st.available() < st.add_needs(img, dir)? {
                return Err(Error::NoSpace);
            }
            let ino = st.alloc_inode(img, kind, dir)?;
            st.add_entry(img, dir, name, ino)?;
            let mut d = st.dir(img, dir)?;
            if kind == Kind::Dir {
                d.nlink += 1;
            }
            d.mtime_ns = now_ns();
            st.set_inode(img, dir, &d)?;
            Ok(ino)
        })
    }

    /// Creates an empty file `name` in `dir`.
    pub fn create(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.make(dir, name, Kind::File)
    }

    /// Creates a directory `name` in `dir`.
    pub fn mkdir(&self, dir: Ino, name: &[u8]) -> Result<Ino> {
        self.make(dir, name, Kind::Dir)
    }

    /// Removes the file `name` from `dir` (its inode and blocks are freed).
    pub fn unlink(&self, dir: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.with(|st, img| {
            let (b, slot, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            if st.live(img, ino)?.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            set_dirent(st.get_mut(img, b)?, slot, 0, b"");
            st.free_inode(img, ino)?;
            st.touch(img, dir)
        })
    }

    /// Removes the empty directory `name` from `dir`.
    pub fn rmdir(&self, dir: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.with(|st, img| {
            let (b, slot, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            if st.live(img, ino)?.kind != Kind::Dir {
                return Err(Error::NotADirectory);
            }
            if !st.is_empty_dir(img, ino)? {
                return Err(Error::NotEmpty);
            }
            set_dirent(st.get_mut(img, b)?, slot, 0, b"");
            st.free_inode(img, ino)?;
            let mut d = st.dir(img, dir)?;
            d.nlink -= 1;
            d.mtime_ns = now_ns();
            st.set_inode(img, dir, &d)
        })
    }

    /// Renames `dir/name` to `to_dir/to_name`, atomically, replacing a
    /// file there, or an empty directory when moving a directory.
    pub fn rename(&self, dir: Ino, name: &[u8], to_dir: Ino, to_name: &[u8]) -> Result<()> {
        check_name(name)?;
        check_name(to_name)?;
        self.with(|st, img| {
            let (sb_, sslot, ino) = st.find(img, dir, name)?.ok_or(Error::NotFound)?;
            st.dir(img, to_dir)?;
            let src = st.live(img, ino)?;
            if src.kind == Kind::Dir {
                // Not into itself or below itself.
                let mut p = to_dir;
                loop {
                    if p == ino {
                        return Err(Error::InvalidArgument(
                            "a directory cannot move below itself",
                        ));
                    }
                    if p == ROOT {
                        break;
                    }
                    p = st.dir(img, p)?.parent;
                }
            }
            let target = st.find(img, to_dir, to_name)?;
            if let Some((_, _, t)) = target {
                if t == ino {
                    return Ok(()); // the same file: nothing to do
                }
                let tk = st.live(img, t)?.kind;
                let empty = tk == Kind::Dir && st.is_empty_dir(img, t)?;
                match (src.kind, tk) {
                    (Kind::Dir, Kind::Dir) if !empty => return Err(Error::NotEmpty),
                    (Kind::Dir, Kind::Dir) => {}
                    (Kind::Dir, _) => return Err(Error::NotADirectory),
                    (_, Kind::Dir) => return Err(Error::IsADirectory),
                    _ => {}
                }
            } else if st.available() < st.add_needs(img, to_dir)? {
                return Err(Error::NoSpace);
            }
            // Checks done: from here nothing fails for want of space.
            set_dirent(st.get_mut(img, sb_)?, sslot, 0, b"");
            match target {
                Some((tb, tslot, t)) => {
                    let t_dir = st.live(img, t)?.kind == Kind::Dir;
                    set_dirent(st.get_mut(img, tb)?, tslot, ino, to_name);
                    st.free_inode(img, t)?;
                    if t_dir {
                        let mut d = st.dir(img, to_dir)?;
                        d.nlink -= 1;
                        st.set_inode(img, to_dir, &d)?;
                    }
                }
                None => st.add_entry(img, to_dir, to_name, ino)?,
            }
            if src.kind == Kind::Dir && dir != to_dir {
                let mut s = st.live(img, ino)?;
                s.parent = to_dir;
                st.set_inode(img, ino, &s)?;
                let mut from = st.dir(img, dir)?;
                from.nlink -= 1;
                st.set_inode(img, dir, &from)?;
                let mut to = st.dir(img, to_dir)?;
                to.nlink += 1;
                st.set_inode(img, to_dir, &to)?;
            }
            st.touch(img, dir)?;
            st.touch(img, to_dir)
        })
    }

    // ---- file data -------------------------------------------------------

    /// Writes `data` at `offset` of file `ino`; returns the bytes written
    /// (all, or an error with nothing changed).
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(Error::FileTooLarge)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            if data.is_empty() {
                return Ok(0);
            }
            let bs = BLOCK as u64;
            let (first, last) = ((offset / bs) as usize, ((end - 1) / bs) as usize);
            if st.available() < st.blocks_needed(img, &i, first, last)? {
                return Err(Error::NoSpace);
            }
            if offset > i.size {
                st.zero_tail(img, &i, offset)?;
            }
            for idx in first..=last {
                let blk_start = idx as u64 * bs;
                let lo = offset.max(blk_start);
                let hi = end.min(blk_start + bs);
                let part = &data[(lo - offset) as usize..(hi - offset) as usize];
                let mut b = st.bmap(img, &i, idx)?;
                if b == 0 {
                    b = st.alloc_block(img)?;
                    st.bmap_set(img, &mut i, idx, b)?;
                    // A new block: written whole, zeros around the data.
                    let mut whole = vec![0u8; BLOCK];
                    whole[(lo - blk_start) as usize..(hi - blk_start) as usize]
                        .copy_from_slice(part);
                    img.write_at(&whole, b as u64 * bs)?;
                } else {
                    img.write_at(part, b as u64 * bs + (lo - blk_start))?;
                }
            }
            st.data_dirty = true;
            st.ops += 1;
            i.size = i.size.max(end);
            i.mtime_ns = now_ns();
            st.set_inode(img, ino, &i)?;
            Ok(data.len())
        })
    }

    /// Reads up to `len` bytes at `offset` of file `ino` (fewer at the end).
    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            if offset >= i.size {
                return Ok(Vec::new());
            }
            let end = i.size.min(offset + len as u64);
            let bs = BLOCK as u64;
            let mut out = vec![0u8; (end - offset) as usize];
            let mut at = offset;
            while at < end {
                let idx = (at / bs) as usize;
                let hi = end.min((idx as u64 + 1) * bs);
                let b = st.bmap(img, &i, idx)?;
                let dst = &mut out[(at - offset) as usize..(hi - offset) as usize];
                if b != 0 {
                    img.read_exact_at(dst, b as u64 * bs + at % bs)?;
                }
                at = hi;
            }
            Ok(out)
        })
    }

    /// Sets the size of file `ino`: blocks past a smaller size are freed;
    /// a larger size reads as zeros.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        self.with(|st, img| {
            let mut i = st.live(img, ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::IsADirectory);
            }
            let bs = BLOCK as u64;
            if size < i.size {
                let keep = size.div_ceil(bs) as usize;
                st.free_blocks_from(img, &mut i, keep, false)?;
            } else if size > i.size {
                st.zero_tail(img, &i, size)?;
            }
            i.size = size;
            i.mtime_ns = now_ns();
            st.set_inode(img, ino, &i)
        })
    }

    // ---- durability ------------------------------------------------------

    /// Makes every operation that returned before this call durable (jbd2
    /// commits the whole running transaction for any fsync).
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        self.with(|st, img| st.live(img, ino).map(|_| ()))?;
        self.sync()
    }

    /// Commits the running transaction: returns once every operation that
    /// returned before the call is durable. One commit runs at a time,
    /// as jbd2's commit thread does: callers that arrive meanwhile wait
    /// for it, and the first of them not covered leads the next commit,
    /// whose snapshot takes every change made by then — so concurrent
    /// fsyncs share commits.
    pub fn sync(&self) -> Result<()> {
        self.check()?;
        let want = self.state.lock().ops;
        let mut c = self.committer.lock();
        loop {
            self.check()?;
            if c.durable >= want {
                break;
            }
            if c.committing {
                c = self.commit_done.wait(c);
                continue;
            }
            c.committing = true;
            let tid = c.next_tid;
            c.next_tid += 1;
            drop(c);
            let r = self.commit_running(tid);
            c = self.committer.lock();
            c.committing = false;
            self.commit_done.notify_all();
            let (ops, bytes) = r?;
            c.durable = c.durable.max(ops);
            c.since_checkpoint += bytes;
        }
        let due = c.since_checkpoint >= self.options.checkpoint_log_bytes;
        drop(c);
        self.release_frees();
        if due {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// One commit of the running transaction (the caller leads it): data
    /// first (ordered mode), then the record, then the journal's commit.
    /// Returns the change count it made durable and the log bytes written.
    fn commit_running(&self, tid: u64) -> Result<(u64, u64)> {
        let snap = self.state.lock().take(tid);
        let bytes = snap.record.as_ref().map_or(0, |r| r.len() as u64);
        if let Some(lsn) = self.make_durable(&snap)? {
            self.state.lock().awaiting.push((lsn, snap.frees));
        }
        Ok((snap.ops, bytes))
    }

    /// A taken transaction made durable: the image's data synced first
    /// (ordered mode), then its record appended and committed. Returns the
    /// record's LSN (none when no metadata changed; frees always change the
    /// bitmap, so then there are none).
    fn make_durable(&self, snap: &Snapshot) -> Result<Option<Lsn>> {
        if snap.data_dirty {
            self.image.sync_data().map_err(|e| self.poison(e.into()))?;
        }
        let Some(rec) = &snap.record else {
            return Ok(None);
        };
        let lsn = self
            .journal
            .append(rec)
            .map_err(|e| self.poison(e.into()))?;
        self.journal
            .commit(lsn)
            .map_err(|e| self.poison(e.into()))?;
        Ok(Some(lsn))
    }

    /// Blocks freed by transactions that are now durable become reusable.
    fn release_frees(&self) {
        let durable = self.journal.durable_lsn();
        let mut st = self.state.lock();
        let mut keep = Vec::new();
        for (lsn, blocks) in std::mem::take(&mut st.awaiting) {
            if lsn < durable {
                for b in blocks {
                    st.unavailable.remove(&b);
                }
            } else {
                keep.push((lsn, blocks));
            }
        }
        st.awaiting = keep;
    }

    /// Commits, writes every metadata block changed since the last
    /// checkpoint home, and moves the journal's tail past it all (the
    /// journal flushes the image first). Holds the state lock from its
    /// commit through the home writes, so what goes home is exactly the
    /// committed state.
    pub fn checkpoint(&self) -> Result<()> {
        self.check()?;
        let mut c = self.committer.lock();
        while c.committing {
            c = self.commit_done.wait(c);
        }
        // Holding the committer lock: no commit starts until we are done.
        let mut st = self.state.lock();
        let snap = st.take(c.next_tid);
        c.next_tid += 1;
        self.make_durable(&snap)?;
        c.durable = c.durable.max(snap.ops);
        // Everything appended is durable now: every free may be reused.
        for (_, blocks) in std::mem::take(&mut st.awaiting) {
            for b in blocks {
                st.unavailable.remove(&b);
            }
        }
        for b in snap.frees {
            st.unavailable.remove(&b);
        }
        for b in std::mem::take(&mut st.checkpoint_set) {
            let img = &st.cache[&b];
            self.image
                .write_at(img, b as u64 * BLOCK as u64)
                .map_err(|e| self.poison(e.into()))?;
        }
        let redo = self.journal.appended_lsn();
        drop(st);
        self.journal
            .checkpoint(redo)
            .map_err(|e| self.poison(e.into()))?;
        c.since_checkpoint = 0;
        self.commit_done.notify_all();
        Ok(())
    }

    /// Checkpoints and closes the journal.
    pub fn unmount(self) -> Result<()> {
        self.close()
    }

    /// [`Fs::unmount`] through a shared reference: checkpoints and closes
    /// the journal; later operations fail.
    pub fn close(&self) -> Result<()> {
        self.checkpoint()?;
        self.journal.close()?;
        Ok(())
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
    pub(crate) fn bmap(&mut self, i: &Inode, idx: usize) -> Result<u32> {
        self.st.bmap(self.img, i, idx)
    }
    pub(crate) fn entries(&mut self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino)>> {
        self.st.entries(self.img, dir)
    }
}

/// Replays the journal into the image; returns what it did and the next
/// transaction id.
fn replay(journal: &Journal, image: &dyn VfsFile, sb: &Super) -> Result<(MountReport, u64)> {
    let mut txns = Vec::new();
    for r in journal.read_from(journal.redo_lsn())? {
        let (_, bytes) = r?;
        txns.push(txn::decode(&bytes)?);
    }
    let mut report = MountReport {
        transactions: txns.len() as u64,
        ..MountReport::default()
    };
    // A block's image is replayed unless a transaction at or after it
    // revoked the block (jbd2's revoke table).
    let mut revoked_at: HashMap<u32, u64> = HashMap::new();
    for t in &txns {
        for &b in &t.revoked {
            let e = revoked_at.entry(b).or_insert(t.tid);
            *e = (*e).max(t.tid);
        }
    }
    let mut next_tid = 1;
    for t in &txns {
        for (b, img) in &t.blocks {
            if *b >= sb.blocks {
                return Err(Error::Corrupt(format!(
                    "transaction {} logs block {b}",
                    t.tid
                )));
            }
            if revoked_at.get(b).is_some_and(|&r| r >= t.tid) {
                report.blocks_revoked += 1;
                continue;
            }
            image.write_at(img, *b as u64 * BLOCK as u64)?;
            report.blocks_replayed += 1;
        }
        next_tid = next_tid.max(t.tid + 1);
    }
    if !txns.is_empty() {
        // The image holds everything now: flush it and move the tail.
        journal.checkpoint(journal.appended_lsn())?;
    }
    Ok((report, next_tid))
}
