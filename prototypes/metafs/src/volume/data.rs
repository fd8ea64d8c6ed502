//! File data: write, read, truncate (holes read as zeros), readlink.

use super::bmap::blocks_of;
use super::*;

impl Fs {
    /// Writes `data` at `offset` of file `ino`; returns the bytes written
    /// (all, or an error with nothing changed). A write past the end
    /// leaves a hole, which reads as zeros and takes no blocks.
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        self.with_space(|st, img| {
            let mut i = st.regular(img, ino)?;
            st.write_data(img, &mut i, offset, data)?;
            st.set_inode(img, ino, &i)?;
            Ok(data.len())
        })
    }

    /// Reads up to `len` bytes at `offset` of file `ino` (fewer at the end);
    /// moves its access time as [`MountOptions::atime`] says.
    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        let policy = self.options.atime;
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            let data = match i.kind {
                Kind::File | Kind::Symlink => st.read_data(img, &i, offset, len)?,
                Kind::Dir => return Err(Error::IsADirectory),
                _ => return Err(Error::InvalidArgument("not a regular file")),
            };
            st.accessed(img, ino, i, policy)?;
            Ok(data)
        })
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.with(|st, img| {
            let i = st.live(img, ino)?;
            if i.kind != Kind::Symlink {
                return Err(Error::InvalidArgument("not a symlink"));
            }
            st.read_data(img, &i, 0, i.size as usize)
        })
    }

    /// Sets the size of file `ino`: blocks past a smaller size are freed;
    /// a larger size reads as zeros (a hole).
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        self.with(|st, img| {
            let mut i = st.regular(img, ino)?;
            if size < i.size {
                st.free_blocks_from(img, &mut i, blocks_of(size), false)?;
                // The kept last block's bytes past the new size are zeroed
                // when the file grows again (`zero_tail`).
            } else if size > i.size {
                st.zero_tail(img, &i, size)?;
            }
            i.size = size;
            let now = Time::now();
            (i.mtime, i.ctime) = (now, now);
            st.set_inode(img, ino, &i)
        })
    }
}

impl State {
    /// `ino` (whose inode is `i`) was read: its access time moves if
    /// `policy` says so (Linux's `relatime_need_update`: under relatime,
    /// when the access time is not after the modification or the change
    /// time, or is a day old).
    pub(super) fn accessed(
        &mut self,
        img: &dyn VfsFile,
        ino: Ino,
        mut i: Inode,
        policy: Atime,
    ) -> Result<()> {
        let now = Time::now();
        let due = match policy {
            Atime::Never => false,
            Atime::Strict => true,
            Atime::Relatime => {
                i.atime <= i.mtime || i.atime <= i.ctime || now.sec - i.atime.sec >= 24 * 3600
            }
        };
        if !due || i.atime == now {
            return Ok(());
        }
        i.atime = now;
        self.set_inode(img, ino, &i)
    }

    /// Regular file `ino` (what write and truncate take).
    pub(super) fn regular(&mut self, img: &dyn VfsFile, ino: Ino) -> Result<Inode> {
        let i = self.live(img, ino)?;
        match i.kind {
            Kind::File => Ok(i),
            Kind::Dir => Err(Error::IsADirectory),
            _ => Err(Error::InvalidArgument("not a regular file")),
        }
    }

    /// Writes `data` at `offset` of inode `i` (the caller writes `i`
    /// back): allocates what it needs after checking there is room, so
    /// nothing changes when it fails.
    pub(super) fn write_data(
        &mut self,
        img: &dyn VfsFile,
        i: &mut Inode,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(Error::FileTooLarge)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        if data.is_empty() {
            return Ok(());
        }
        let bs = BLOCK as u64;
        let (first, last) = (offset / bs, (end - 1) / bs);
        if self.available() < self.blocks_needed(img, i, first, last)? {
            return Err(Error::NoSpace);
        }
        if offset > i.size {
            self.zero_tail(img, i, offset)?;
        }
        for idx in first..=last {
            let blk_start = idx * bs;
            let lo = offset.max(blk_start);
            let hi = end.min(blk_start + bs);
            let part = &data[(lo - offset) as usize..(hi - offset) as usize];
            let b = self.bmap(img, i, idx)?;
            if b == 0 {
                let b = self.map_new(img, i, idx)?;
                // A new block: written whole, zeros around the data.
                let mut whole = vec![0u8; BLOCK];
                whole[(lo - blk_start) as usize..(hi - blk_start) as usize].copy_from_slice(part);
                img.write_at(&whole, b as u64 * bs)?;
            } else {
                img.write_at(part, b as u64 * bs + (lo - blk_start))?;
            }
        }
        self.data_dirty = true;
        self.ops += 1;
        i.size = i.size.max(end);
        let now = Time::now();
        (i.mtime, i.ctime) = (now, now);
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` of inode `i`.
    pub(super) fn read_data(
        &mut self,
        img: &dyn VfsFile,
        i: &Inode,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        if offset >= i.size {
            return Ok(Vec::new());
        }
        let end = i.size.min(offset.saturating_add(len as u64));
        let bs = BLOCK as u64;
        let mut out = vec![0u8; (end - offset) as usize];
        let mut at = offset;
        while at < end {
            let idx = at / bs;
            let hi = end.min((idx + 1) * bs);
            let b = self.bmap(img, i, idx)?;
            let dst = &mut out[(at - offset) as usize..(hi - offset) as usize];
            if b != 0 {
                img.read_exact_at(dst, b as u64 * bs + at % bs)?;
            }
            at = hi;
        }
        Ok(out)
    }
}
