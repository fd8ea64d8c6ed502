//! The double-write buffer (InnoDB's doublewrite): the second way to
//! survive a page write torn by a crash, chosen by
//! [`TornPages::DoubleWrite`](crate::TornPages::DoubleWrite).
//!
//! Every batch of pages written home goes first, sealed, to the fixed
//! area of `doublewrite.kv` (one write of up to [`SLOTS`] pages), which is
//! synced; then the pages go home, and the data file is synced before the
//! area takes the next batch. So at any crash, a page whose home write
//! may be torn has an intact copy in the area, and a copy that may be torn
//! (its CRC fails) belongs to a batch whose home writes never began.
//! Recovery ([`restore`]) puts back every copy whose home page is torn or
//! older, before the log is replayed; the log then needs no page images.
//!
//! The price is two syncs per batch of home writes, and every page written
//! twice; the full-page images' price is log bytes after each checkpoint.
//! docs/PERFORMANCE.md has both measured.

use crate::page::{Page, PageNo, FIRST_PAGE, PAGE_SIZE};
use crate::store::pages_bytes;
use crate::Result;
use journal_core::sync::Mutex;
use journal_core::vfs::{OpenOptions, Vfs, VfsFile};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The double-write buffer's file inside a store directory.
pub const DOUBLEWRITE_FILE: &str = "doublewrite.kv";

/// Pages the area holds: a larger batch goes through it in pieces.
pub(crate) const SLOTS: usize = 64;

/// The open area. Its mutex is held through a whole batch (area write,
/// sync, home writes, sync): one batch uses the area at a time.
pub(crate) struct DoubleWrite {
    file: Mutex<Box<dyn VfsFile>>,
}

impl DoubleWrite {
    /// Opens `dir`'s area, creating it (durably, name included) if absent.
    /// The area is written whole once, so its space is allocated: a full
    /// disk cannot fail a later batch for want of it. (Called after
    /// [`restore`]: nothing in the area is needed any more.)
    pub(crate) fn open(vfs: &dyn Vfs, dir: &Path) -> Result<DoubleWrite> {
        let path = dir.join(DOUBLEWRITE_FILE);
        let existed = vfs.exists(&path)?;
        let file = vfs.open(&path, OpenOptions::create())?;
        let len = file.len()?;
        let area = (SLOTS * PAGE_SIZE) as u64;
        if len < area {
            let zeros = vec![0u8; (area - len) as usize];
            file.write_at(&zeros, len)?;
            file.sync_all()?;
        }
        if !existed {
            vfs.sync_dir(dir)?;
        }
        Ok(DoubleWrite {
            file: Mutex::new(file),
        })
    }

    /// Writes `batch` home through the area, syncing the data file with
    /// `sync_data` (the pool's, serialized and poisoning). The caller
    /// forced the log over every page's LSN. On error the batch may be
    /// partly home — a page torn there has its intact copy in the area —
    /// and the caller poisons the store, so no later batch overwrites the
    /// area before recovery has read it.
    pub(crate) fn write_home(
        &self,
        batch: &[(PageNo, Arc<Page>)],
        data: &dyn VfsFile,
        sync_data: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let area = self.file.lock();
        let mut sealed = Vec::with_capacity(batch.len().min(SLOTS) * PAGE_SIZE);
        for chunk in batch.chunks(SLOTS) {
            sealed.clear();
            for (_, page) in chunk {
                page.seal_onto(&mut sealed);
            }
            area.write_at(&sealed, 0)?;
            area.sync_data()?;
            for ((no, _), bytes) in chunk.iter().zip(sealed.chunks_exact(PAGE_SIZE)) {
                data.write_at(bytes, pages_bytes(u64::from(*no)))?;
            }
            // Home before the area is overwritten: a torn home page always
            // has its copy.
            sync_data()?;
        }
        Ok(())
    }
}

/// What [`restore`] found in the area.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Restored {
    /// Copies in the area whose CRC and number held.
    pub(crate) valid: u64,
    /// Of those, the pages whose home copy was torn, damaged or older.
    pub(crate) restored: u64,
}

/// Puts back, before redo, every page the area holds intact whose home copy
/// is torn, damaged or older than it. With `write`, each goes home and the
/// data file is synced; read-only, `install` receives them instead. A
/// missing area restores nothing. The area is not trusted: a slot is used
/// only if its CRC holds and it names a tree page inside the file.
pub(crate) fn restore(
    vfs: &dyn Vfs,
    dir: &Path,
    data: &dyn VfsFile,
    write: bool,
    mut install: impl FnMut(PageNo, Page),
) -> Result<Restored> {
    let path = dir.join(DOUBLEWRITE_FILE);
    let mut found = Restored::default();
    if !vfs.exists(&path)? {
        return Ok(found);
    }
    let area = vfs.open(&path, OpenOptions::read())?;
    let file_pages = data.len()? / PAGE_SIZE as u64;
    // The newest intact copy of each page (the area may also hold stale
    // slots of earlier, longer batches).
    let mut copies: BTreeMap<PageNo, Page> = BTreeMap::new();
    for slot in 0..SLOTS as u64 {
        let Some(copy) = read_page(&*area, slot)? else {
            break;
        };
        let no = crate::page::u32_at(&copy[..], 16);
        if no < FIRST_PAGE || u64::from(no) >= file_pages {
            continue;
        }
        let Ok(copy) = Page::from_disk(copy, no) else {
            continue;
        };
        found.valid += 1;
        if copies.get(&no).is_none_or(|c| c.lsn() < copy.lsn()) {
            copies.insert(no, copy);
        }
    }
    for (no, copy) in copies {
        let home = read_page(data, u64::from(no))?.and_then(|b| Page::from_disk(b, no).ok());
        if home.is_some_and(|h| h.lsn() >= copy.lsn()) {
            continue;
        }
        found.restored += 1;
        if write {
            // (Read whole and checked: its bytes are the sealed page.)
            data.write_at(&copy.into_buffer()[..], pages_bytes(u64::from(no)))?;
        } else {
            install(no, copy);
        }
    }
    if write && found.restored > 0 {
        data.sync_data()?;
    }
    Ok(found)
}

/// Page `n` of `f`, or `None` past its end.
pub(crate) fn read_page(f: &dyn VfsFile, n: u64) -> Result<Option<Box<[u8; PAGE_SIZE]>>> {
    let mut p = Box::new([0u8; PAGE_SIZE]);
    let mut got = 0;
    while got < PAGE_SIZE {
        let r = f.read_at(&mut p[got..], pages_bytes(n) + got as u64)?;
        if r == 0 {
            return Ok(None);
        }
        got += r;
    }
    Ok(Some(p))
}
