//! Opening a store: the directory checked, the data file created, and
//! recovery — the buckets read from their pages, full images restored,
//! operations replayed by pageLSN.

use super::*;

pub(super) fn read_page(data: &dyn VfsFile, n: u32, len: u64) -> Result<Option<Page>> {
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

/// Refuses a directory that holds something other than a store.
pub(super) fn check_dir(vfs: &dyn Vfs, dir: &Path, options: &Options) -> Result<()> {
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
pub(super) fn create_data_file(
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
pub(super) fn recover(
    journal: &Journal,
    data: &dyn VfsFile,
    meta: &Meta,
) -> Result<(Vec<Bucket>, Allocator, RecoveryInfo)> {
    let (mut buckets, mut torn, file_pages) = read_buckets(data, meta.buckets)?;
    let mut info = RecoveryInfo {
        journal: journal.recovery_report().clone(),
        records: 0,
        ops_applied: 0,
        ops_skipped: 0,
        images_restored: 0,
        torn_pages_repaired: 0,
    };
    let restored = restore_images(journal, &mut buckets, &mut torn, &mut info)?;
    if let Some(b) = torn.iter().position(|t| *t) {
        return Err(Error::TornPage { page: 1 + b as u32 });
    }
    let alloc = allocator(&buckets, &restored, meta.buckets, file_pages);
    replay_ops(journal, &mut buckets, &mut info)?;
    Ok((buckets, alloc, info))
}

/// Every bucket as its pages on disk say (`torn`: its chain did not read
/// back whole), and the data file's length in pages.
pub(super) fn read_buckets(data: &dyn VfsFile, n: u32) -> Result<(Vec<Bucket>, Vec<bool>, u32)> {
    let len = data.len()?;
    let file_pages = (len / PAGE_SIZE as u64) as u32;
    let mut pages: BTreeMap<u32, Page> = BTreeMap::new();
    for p in 1..file_pages {
        if let Some(page) = read_page(data, p, len)? {
            pages.insert(p, page);
        }
    }
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
    Ok((buckets, torn, file_pages))
}

/// Pass 1: each bucket's first full image since the checkpoint replaces
/// it (repairing a torn one). Returns which buckets were restored.
pub(super) fn restore_images(
    journal: &Journal,
    buckets: &mut [Bucket],
    torn: &mut [bool],
    info: &mut RecoveryInfo,
) -> Result<Vec<bool>> {
    let n = buckets.len();
    let mut restored = vec![false; n];
    for r in journal.read_from(journal.redo_lsn())? {
        let (lsn, bytes) = r?;
        info.records += 1;
        for s in decode(lsn, &bytes)? {
            let b = s.bucket as usize;
            let Some((image_lsn, content)) = s.image.filter(|_| b < n && !restored[b]) else {
                continue;
            };
            let entries = bucket::deserialize(&content).ok_or(Error::BadRecord { lsn })?;
            restored[b] = true;
            info.images_restored += 1;
            if torn[b] {
                info.torn_pages_repaired += 1;
                torn[b] = false;
            }
            buckets[b] = Bucket {
                entries,
                chain: vec![1 + s.bucket],
                lsn: image_lsn,
                dirty: true,
                image_epoch: 0,
            };
        }
    }
    Ok(restored)
}

/// The page allocator after recovery: pages in use are every head, and
/// the chains of the buckets read from disk (a restored bucket's old chain
/// may be stale: it gets new pages).
pub(super) fn allocator(
    buckets: &[Bucket],
    restored: &[bool],
    n: u32,
    file_pages: u32,
) -> Allocator {
    let mut used: BTreeSet<u32> = (0..=n).collect();
    for (b, bucket) in buckets.iter().enumerate() {
        if !restored[b] {
            used.extend(bucket.chain.iter().copied());
        }
    }
    let end = file_pages
        .max(n + 1)
        .max(used.iter().next_back().map_or(0, |m| m + 1));
    Allocator {
        end,
        free: (0..end).filter(|p| !used.contains(p)).collect(),
    }
}

/// Pass 2: replay every operation above its bucket's pageLSN (idempotent).
pub(super) fn replay_ops(
    journal: &Journal,
    buckets: &mut [Bucket],
    info: &mut RecoveryInfo,
) -> Result<()> {
    for r in journal.read_from(journal.redo_lsn())? {
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
    Ok(())
}

pub(super) fn decode(lsn: Lsn, bytes: &[u8]) -> Result<Vec<Section>> {
    record::decode(bytes).map_err(|e| match e {
        Undecodable::Newer(v) => Error::UnsupportedVersion { found: v },
        Undecodable::Malformed => Error::BadRecord { lsn },
    })
}

pub(super) fn apply_op(entries: &mut bucket::Entries, op: Op) {
    match op {
        Op::Put(k, v) => {
            entries.insert(k, v);
        }
        Op::Delete(k) => {
            entries.remove(&k);
        }
    }
}
