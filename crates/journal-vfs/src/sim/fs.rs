//! `SimVfs` as a filesystem: the `Vfs` calls on the namespace and the
//! `VfsFile` calls on one file, each counted, checked against the injected
//! faults and recorded in the crash model.

use super::*;
use crate::Mapping;

impl Vfs for SimVfs {
    fn open(&self, path: &Path, opts: OpenOptions) -> Result<Box<dyn VfsFile>> {
        let create = opts.create || opts.create_new;
        let mut st = self.inner.state.lock();
        let ino = match st.live.get(path).copied() {
            Some(_) if opts.create_new => {
                st.call(Op::Create, path)?;
                return Err(VfsError::new(
                    Op::Create,
                    path,
                    io_err(io::ErrorKind::AlreadyExists),
                ));
            }
            Some(ino) => {
                st.call(Op::Open, path)?;
                ino
            }
            None if create => {
                st.call(Op::Create, path)?;
                if !st.parent_exists(path) || st.dirs.contains(path) {
                    return Err(not_found(Op::Create, path));
                }
                let ino = st.next_ino;
                st.next_ino += 1;
                st.inodes.insert(ino, Inode::default());
                st.live.insert(path.to_path_buf(), ino);
                st.pending_ns.push(NsOp::Link {
                    path: path.to_path_buf(),
                    ino,
                });
                self.inner.counters.creates.incr();
                ino
            }
            None => {
                st.call(Op::Open, path)?;
                return Err(not_found(Op::Open, path));
            }
        };
        Ok(Box::new(SimFile {
            vfs: self.clone(),
            ino,
            path: path.to_path_buf(),
            writable: opts.write || create,
            direct: opts.direct,
            append: opts.append,
        }))
    }

    fn create_dir_all(&self, path: &Path) -> Result<()> {
        let mut st = self.inner.state.lock();
        st.call(Op::CreateDir, path)?;
        for a in path.ancestors() {
            if a.as_os_str().is_empty() {
                continue;
            }
            if st.live.contains_key(a) {
                return Err(VfsError::new(
                    Op::CreateDir,
                    path,
                    io_err(io::ErrorKind::AlreadyExists),
                ));
            }
            st.dirs.insert(a.to_path_buf());
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let mut st = self.inner.state.lock();
        st.call(Op::Rename, from)?;
        if !st.parent_exists(to) || st.dirs.contains(to) {
            return Err(not_found(Op::Rename, to));
        }
        let Some(ino) = st.live.remove(from) else {
            return Err(not_found(Op::Rename, from));
        };
        st.live.insert(to.to_path_buf(), ino);
        st.pending_ns.push(NsOp::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        });
        self.inner.counters.renames.incr();
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> Result<()> {
        let mut st = self.inner.state.lock();
        st.call(Op::Remove, path)?;
        if st.live.remove(path).is_none() {
            return Err(not_found(Op::Remove, path));
        }
        st.pending_ns.push(NsOp::Unlink {
            path: path.to_path_buf(),
        });
        self.inner.counters.removes.incr();
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> Result<()> {
        let mut st = self.inner.state.lock();
        st.call(Op::Remove, path)?;
        if !st.dirs.contains(path) {
            return Err(not_found(Op::Remove, path));
        }
        let child = |p: &Path| p.parent() == Some(path);
        if st.live.keys().any(|p| child(p)) || st.dirs.iter().any(|p| child(p)) {
            return Err(VfsError::new(
                Op::Remove,
                path,
                io::Error::from_raw_os_error(Errno::NOTEMPTY.raw_os_error()),
            ));
        }
        st.dirs.remove(path);
        Ok(())
    }

    fn read_dir(&self, dir: &Path) -> Result<Vec<String>> {
        let mut st = self.inner.state.lock();
        st.call(Op::ReadDir, dir)?;
        if !st.dirs.contains(dir) {
            return Err(not_found(Op::ReadDir, dir));
        }
        let in_dir = |p: &&PathBuf| p.parent() == Some(dir);
        let name = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned());
        let mut names: Vec<String> = st.live.keys().filter(in_dir).filter_map(name).collect();
        names.extend(st.dirs.iter().filter(in_dir).filter_map(name));
        names.sort_unstable();
        Ok(names)
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        self.sync_latency();
        let mut st = self.inner.state.lock();
        st.call(Op::SyncDir, dir)?;
        if !st.dirs.contains(dir) {
            return Err(not_found(Op::SyncDir, dir));
        }
        let pending = std::mem::take(&mut st.pending_ns);
        let mut rest = Vec::with_capacity(pending.len());
        for op in pending {
            if op.touches(dir) {
                op.apply(&mut st.durable);
            } else {
                rest.push(op);
            }
        }
        st.pending_ns = rest;
        self.inner.counters.dir_fsyncs.incr();
        Ok(())
    }

    fn available_space(&self, path: &Path) -> Result<u64> {
        let st = self.inner.state.lock();
        if !st.live.contains_key(path) && !st.dirs.contains(path) {
            return Err(not_found(Op::Metadata, path));
        }
        Ok(match st.space_limit {
            Some(limit) => limit.saturating_sub(st.space_used()),
            None => u64::MAX,
        })
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        let st = self.inner.state.lock();
        Ok(st.live.contains_key(path) || st.dirs.contains(path))
    }

    fn lock_dir(&self, dir: &Path) -> Result<DirLock> {
        let mut st = self.inner.state.lock();
        st.call(Op::Lock, dir)?;
        if !st.dirs.contains(dir) {
            return Err(not_found(Op::Lock, dir));
        }
        if !st.locks.insert(dir.to_path_buf()) {
            return Err(VfsError::new(
                Op::Lock,
                dir,
                io::Error::from_raw_os_error(Errno::WOULDBLOCK.raw_os_error()),
            ));
        }
        Ok(DirLock::new(Box::new(SimLock {
            vfs: self.clone(),
            dir: dir.to_path_buf(),
        })))
    }

    fn counters(&self) -> CounterSnapshot {
        self.inner.counters.snapshot()
    }
}

struct SimLock {
    vfs: SimVfs,
    dir: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.vfs.inner.state.lock().locks.remove(&self.dir);
    }
}

#[derive(Debug)]
struct SimFile {
    vfs: SimVfs,
    ino: u64,
    path: PathBuf,
    writable: bool,
    /// Opened with `O_DIRECT`: writes must be aligned (see
    /// [`SIM_DIRECT_ALIGN`]).
    direct: bool,
    /// Opened with `O_APPEND`: writes go at the end.
    append: bool,
}

/// The direct-I/O alignment [`SimVfs`] reports and enforces.
const SIM_DIRECT_ALIGN: u64 = 512;

/// `bytes` with the ranges a failed sync dropped put back to what was
/// durable then.
fn restore_lost(bytes: &mut [u8], lost: &[(u64, Vec<u8>)]) {
    for (off, old) in lost {
        let end = (*off as usize + old.len()).min(bytes.len());
        if (*off as usize) < end {
            bytes[*off as usize..end].copy_from_slice(&old[..end - *off as usize]);
        }
    }
}

/// The inode of an open file. Inodes are never removed from a [`SimVfs`]
/// (a removed name leaves its inode for the files still open on it), so
/// this fails only if that rule is broken: EBADF rather than a panic.
fn inode_of<'a>(
    inodes: &'a mut HashMap<u64, Inode>,
    ino: u64,
    op: Op,
    path: &Path,
) -> Result<&'a mut Inode> {
    inodes.get_mut(&ino).ok_or_else(|| {
        VfsError::new(
            op,
            path,
            io::Error::from_raw_os_error(Errno::BADF.raw_os_error()),
        )
    })
}

impl SimFile {
    /// A write on a direct-I/O file must be aligned in offset, length and
    /// memory, as the kernel requires (EINVAL otherwise).
    fn check_direct(&self, op: Op, buf: &[u8], offset: u64) -> Result<()> {
        let a = SIM_DIRECT_ALIGN;
        if self.direct
            && [offset, buf.len() as u64, buf.as_ptr() as u64]
                .iter()
                .any(|x| !x.is_multiple_of(a))
        {
            return Err(VfsError::new(
                op,
                &self.path,
                io::Error::from_raw_os_error(Errno::INVAL.raw_os_error()),
            ));
        }
        Ok(())
    }

    /// Runs `f` on this file's inode under the filesystem lock, after
    /// counting the call, firing faults and checking write permission.
    fn with_inode<R>(&self, op: Op, write: bool, f: impl FnOnce(&mut Inode) -> R) -> Result<R> {
        self.with_inode_to(op, write, 0, f)
    }

    /// [`SimFile::with_inode`] for a call that makes the file at least
    /// `end` bytes long: refused with ENOSPC past the space limit.
    fn with_inode_to<R>(
        &self,
        op: Op,
        write: bool,
        end: u64,
        f: impl FnOnce(&mut Inode) -> R,
    ) -> Result<R> {
        let mut st = self.vfs.inner.state.lock();
        st.call(op, &self.path)?;
        if write && !self.writable {
            return Err(VfsError::new(
                op,
                &self.path,
                io::Error::from_raw_os_error(Errno::BADF.raw_os_error()),
            ));
        }
        st.check_space(self.ino, end, op, &self.path)?;
        let inode = inode_of(&mut st.inodes, self.ino, op, &self.path)?;
        Ok(f(inode))
    }

    /// [`SimFile::with_inode_to`] for a write of `len` bytes at `offset`
    /// — or, opened `O_APPEND`, at the end of the file as it is under the
    /// lock, as Linux's `pwrite` does; `f` gets the offset written at.
    fn write_inode<R>(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        f: impl FnOnce(&mut Inode, u64) -> R,
    ) -> Result<R> {
        let mut st = self.vfs.inner.state.lock();
        st.call(op, &self.path)?;
        if !self.writable {
            let badf = io::Error::from_raw_os_error(Errno::BADF.raw_os_error());
            return Err(VfsError::new(op, &self.path, badf));
        }
        let at = match self.append {
            true => inode_of(&mut st.inodes, self.ino, op, &self.path)?
                .live
                .len() as u64,
            false => offset,
        };
        st.check_space(self.ino, at.saturating_add(len), op, &self.path)?;
        let inode = inode_of(&mut st.inodes, self.ino, op, &self.path)?;
        Ok(f(inode, at))
    }

    fn counters(&self) -> &Counters {
        &self.vfs.inner.counters
    }

    /// `fsync` / `fdatasync`. When it fails, the file's dirty pages are
    /// dropped as Linux does after a writeback error: the data stays
    /// readable but will never be made durable, and the next sync finds
    /// nothing dirty and succeeds (PostgreSQL's "fsyncgate"). Whoever
    /// retries a failed sync and believes the second answer loses data.
    fn sync(&self, op: Op) -> Result<()> {
        let mut st = self.vfs.inner.state.lock();
        let fault = st.call(op, &self.path);
        let inode = inode_of(&mut st.inodes, self.ino, op, &self.path)?;
        match fault {
            Ok(()) => {
                // The durable bytes become the live ones, less the ranges a
                // failed sync dropped. Built from what changed since the
                // last sync (truncations, then the pending writes in
                // order), not by copying the whole file: the crash
                // campaigns sync thousands of times per second.
                // A durable buffer still shared (with a crash image or a
                // mapping) is copied once here, as any write would.
                #[cfg(debug_assertions)]
                let whole = {
                    let mut w = inode.live.to_vec();
                    restore_lost(&mut w, &inode.lost);
                    w
                };
                let nothing_new = inode.pending.is_empty()
                    && inode.shrunk_to.is_none()
                    && inode.durable.len() == inode.live.len();
                if !nothing_new {
                    let durable = DataArc::make_mut(&mut inode.durable);
                    if let Some(shortest) = inode.shrunk_to.take() {
                        durable.truncate(shortest);
                    }
                    durable.resize(inode.live.len(), 0);
                    for (off, data) in &inode.pending {
                        write_bytes(durable, *off, data);
                    }
                    restore_lost(durable, &inode.lost);
                }
                #[cfg(debug_assertions)]
                debug_assert!(*inode.durable == whole, "incremental sync diverged");
            }
            Err(_) => {
                for (off, data) in std::mem::take(&mut inode.pending) {
                    let old: Vec<u8> = (0..data.len() as u64)
                        .map(|i| inode.durable.get((off + i) as usize).copied().unwrap_or(0))
                        .collect();
                    inode.lost.push((off, old));
                }
            }
        }
        inode.pending.clear();
        fault
    }
}

impl VfsFile for SimFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn direct_io_alignment(&self) -> Result<Option<u32>> {
        Ok(Some(SIM_DIRECT_ALIGN as u32))
    }

    /// A snapshot of the whole file, taken in one read call (so read
    /// faults apply to it as to any read). It shares the file's buffer:
    /// a later write to the file copies the buffer instead of changing
    /// the snapshot.
    fn map(&self) -> Result<Mapping> {
        self.with_inode(Op::Read, false, |inode| Mapping::shared(inode.live.clone()))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.with_inode(Op::Read, false, |inode| {
            let len = inode.live.len() as u64;
            if offset >= len {
                return 0;
            }
            let n = buf.len().min((len - offset) as usize);
            buf[..n].copy_from_slice(&inode.live[offset as usize..offset as usize + n]);
            n
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_direct(Op::Write, buf, offset)?;
        self.vfs.write_latency();
        let len = buf.len() as u64;
        self.write_inode(Op::Write, offset, len, |inode, offset| {
            write_bytes(DataArc::make_mut(&mut inode.live), offset, buf);
            inode.pending.push((offset, buf.to_vec()));
            cut_ranges(&mut inode.lost, offset, offset + len);
        })?;
        self.counters().writes.incr();
        self.counters().bytes_written.add(buf.len() as u64);
        Ok(())
    }

    fn write_at_fua(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_direct(Op::FuaWrite, buf, offset)?;
        self.vfs.sync_latency();
        let end = offset.saturating_add(buf.len() as u64);
        self.with_inode_to(Op::FuaWrite, true, end, |inode| {
            write_bytes(DataArc::make_mut(&mut inode.live), offset, buf);
            write_bytes(DataArc::make_mut(&mut inode.durable), offset, buf);
            // Older unsynced writes under this range are superseded: cut
            // them so a torn crash cannot resurrect them over durable bytes.
            let (a, b) = (offset, offset + buf.len() as u64);
            cut_ranges(&mut inode.pending, a, b);
            cut_ranges(&mut inode.lost, a, b);
        })?;
        let c = self.counters();
        c.writes.incr();
        c.fua_writes.incr();
        c.bytes_written.add(buf.len() as u64);
        Ok(())
    }

    fn sync_data(&self) -> Result<()> {
        self.vfs.sync_latency();
        self.sync(Op::SyncData)?;
        self.counters().fdatasyncs.incr();
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        self.vfs.sync_latency();
        self.sync(Op::Sync)?;
        self.counters().fsyncs.incr();
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.with_inode_to(Op::SetLen, true, len, |inode| {
            if (len as usize) < inode.durable.len() {
                let shortest = inode
                    .shrunk_to
                    .map_or(len as usize, |s| s.min(len as usize));
                inode.shrunk_to = Some(shortest);
            }
            DataArc::make_mut(&mut inode.live).resize(len as usize, 0);
            // Unsynced writes past the new end must not come back in a crash.
            let mut kept = Vec::with_capacity(inode.pending.len());
            for (off, mut data) in inode.pending.drain(..) {
                if off >= len {
                    continue;
                }
                data.truncate((len - off) as usize);
                kept.push((off, data));
            }
            inode.pending = kept;
            cut_ranges(&mut inode.lost, len, u64::MAX);
        })
    }

    fn len(&self) -> Result<u64> {
        self.with_inode(Op::Metadata, false, |inode| inode.live.len() as u64)
    }

    fn preallocate(&self, offset: u64, len: u64, how: Prealloc) -> Result<()> {
        let zeros = matches!(how, Prealloc::ZeroFill);
        let end = offset.saturating_add(len);
        self.with_inode_to(Op::Preallocate, true, end, |inode| {
            if zeros {
                let live = DataArc::make_mut(&mut inode.live);
                let (a, b) = (offset as usize, end as usize);
                if live.len() < b {
                    live.resize(b, 0);
                }
                live[a..b].fill(0);
                inode.pending.push((offset, vec![0u8; len as usize]));
                cut_ranges(&mut inode.lost, offset, offset + len);
            } else if (inode.live.len() as u64) < offset + len {
                DataArc::make_mut(&mut inode.live).resize((offset + len) as usize, 0);
            }
        })?;
        if zeros {
            self.counters().writes.incr();
            self.counters().bytes_written.add(len);
        }
        Ok(())
    }
}
