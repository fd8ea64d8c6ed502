//! The image's on-disk layout, byte by byte. All integers little-endian.
//!
//! ```text
//! block 0                 superblock
//! blocks 1 .. 1+I/16      inode table: 256-byte inodes, 16 per block (ino 0 unused, 1 = root)
//! next B/32768 blocks     block bitmap: bit b set = block b in use (the blocks above included)
//! the rest                data: file data, directory blocks, indirect blocks
//! ```
//!
//! A file or directory maps its blocks with 12 direct pointers and one
//! single-indirect block of 1,024 pointers (0 = a hole). A directory's
//! blocks hold 32 entries of 128 bytes: `ino u32` (0 = free slot),
//! `name_len u16`, 2 reserved bytes, the name (at most [`NAME_MAX`] bytes).
//! There are no `.` and `..` entries: an inode records its parent.

use crate::{Error, Result};

/// Bytes per block.
pub const BLOCK: usize = 4096;
/// Bytes per inode.
pub const INODE_SIZE: usize = 256;
/// Inodes per inode-table block.
pub const INODES_PER_BLOCK: u32 = (BLOCK / INODE_SIZE) as u32;
/// Direct block pointers per inode.
pub const DIRECT: usize = 12;
/// Pointers in an indirect block.
pub const PER_INDIRECT: usize = BLOCK / 4;
/// Largest file: 12 direct blocks and 1,024 through the indirect block.
pub const MAX_FILE_SIZE: u64 = ((DIRECT + PER_INDIRECT) * BLOCK) as u64;
/// Bytes per directory entry.
pub const DIRENT_SIZE: usize = 128;
/// Entries per directory block.
pub const DIRENTS_PER_BLOCK: usize = BLOCK / DIRENT_SIZE;
/// Longest name, bytes.
pub const NAME_MAX: usize = DIRENT_SIZE - 8;
/// The root directory's inode number.
pub const ROOT: u32 = 1;
/// `"MTFS"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"MTFS");
/// The image format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;

/// The `N` bytes of `b` at `o` (the caller has checked the length).
pub(crate) fn bytes_at<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[o..o + N]);
    a
}
fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(bytes_at(b, o))
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(bytes_at(b, o))
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(bytes_at(b, o))
}

/// The superblock (block 0): written by `mkfs`, never changed after.
///
/// | offset | size | field |
/// |---:|---:|---|
/// | 0 | 4 | magic `MTFS` |
/// | 4 | 2 | format version (1) |
/// | 6 | 2 | reserved |
/// | 8 | 4 | block size (4096) |
/// | 12 | 4 | blocks in the image |
/// | 16 | 4 | inodes |
/// | 20 | 4 | first inode-table block (1) |
/// | 24 | 4 | first bitmap block |
/// | 28 | 4 | first data block |
/// | 32 | 16 | the journal's id (its segment headers carry the same) |
/// | 48 | 4 | CRC32C of bytes 0..48 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Super {
    /// Blocks in the image.
    pub blocks: u32,
    /// Inodes in the inode table.
    pub inodes: u32,
    /// First inode-table block.
    pub inode_start: u32,
    /// First bitmap block.
    pub bitmap_start: u32,
    /// First data block.
    pub data_start: u32,
    /// The journal's identity.
    pub journal_id: [u8; 16],
}

impl Super {
    /// The layout of an image of `blocks` blocks with `inodes` inodes
    /// (rounded up to whole inode-table blocks); `None` if the numbers
    /// overflow the format's 32-bit block and inode numbers.
    pub fn layout(blocks: u32, inodes: u32, journal_id: [u8; 16]) -> Option<Self> {
        let inode_blocks = inodes.div_ceil(INODES_PER_BLOCK);
        let bitmap_blocks = blocks.div_ceil((BLOCK * 8) as u32);
        let inode_start = 1u32;
        let bitmap_start = inode_start.checked_add(inode_blocks)?;
        Some(Super {
            blocks,
            inodes: inode_blocks.checked_mul(INODES_PER_BLOCK)?,
            inode_start,
            bitmap_start,
            data_start: bitmap_start.checked_add(bitmap_blocks)?,
            journal_id,
        })
    }

    /// The block and byte offset of inode `ino`.
    pub fn inode_place(&self, ino: u32) -> (u32, usize) {
        (
            self.inode_start + ino / INODES_PER_BLOCK,
            (ino % INODES_PER_BLOCK) as usize * INODE_SIZE,
        )
    }

    /// The bitmap block and bit of block `b`.
    pub fn bit_place(&self, b: u32) -> (u32, usize) {
        let per = (BLOCK * 8) as u32;
        (self.bitmap_start + b / per, (b % per) as usize)
    }

    /// Encodes the superblock into a block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.blocks.to_le_bytes());
        b[16..20].copy_from_slice(&self.inodes.to_le_bytes());
        b[20..24].copy_from_slice(&self.inode_start.to_le_bytes());
        b[24..28].copy_from_slice(&self.bitmap_start.to_le_bytes());
        b[28..32].copy_from_slice(&self.data_start.to_le_bytes());
        b[32..48].copy_from_slice(&self.journal_id);
        let crc = crc32(&b[..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a superblock.
    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() < 52 || u32_at(b, 0) != MAGIC {
            return Err(Error::NotMetafs("no metafs superblock".into()));
        }
        if crc32(&b[..48]) != u32_at(b, 48) {
            return Err(Error::NotMetafs("superblock checksum mismatch".into()));
        }
        let version = u16_at(b, 4);
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion(version));
        }
        if u32_at(b, 8) != BLOCK as u32 {
            return Err(Error::Corrupt(format!("block size {}", u32_at(b, 8))));
        }
        let s = Super {
            blocks: u32_at(b, 12),
            inodes: u32_at(b, 16),
            inode_start: u32_at(b, 20),
            bitmap_start: u32_at(b, 24),
            data_start: u32_at(b, 28),
            journal_id: bytes_at(b, 32),
        };
        if Super::layout(s.blocks, s.inodes, s.journal_id) != Some(s) {
            return Err(Error::Corrupt("superblock layout is inconsistent".into()));
        }
        Ok(s)
    }
}

fn crc32(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A free inode.
    Free,
    /// A regular file.
    File,
    /// A directory.
    Dir,
}

/// An inode.
///
/// | offset | size | field |
/// |---:|---:|---|
/// | 0 | 1 | kind: 0 free, 1 file, 2 directory |
/// | 1 | 1 | reserved |
/// | 2 | 2 | link count (a directory: 2 + its subdirectories) |
/// | 4 | 4 | parent directory's inode (directories; 0 for files) |
/// | 8 | 8 | size in bytes |
/// | 16 | 8 | modification time, ns since the epoch |
/// | 24 | 48 | 12 direct block pointers |
/// | 72 | 4 | the indirect block (0: none) |
/// | 76 | 180 | reserved |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
    /// What it is.
    pub kind: Kind,
    /// Links.
    pub nlink: u16,
    /// Parent directory (directories only).
    pub parent: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: u64,
    /// Direct block pointers.
    pub direct: [u32; DIRECT],
    /// Indirect block.
    pub indirect: u32,
}

impl Inode {
    /// A fresh inode of `kind`.
    pub fn new(kind: Kind, parent: u32, mtime_ns: u64) -> Self {
        Inode {
            kind,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            parent: if kind == Kind::Dir { parent } else { 0 },
            size: 0,
            mtime_ns,
            direct: [0; DIRECT],
            indirect: 0,
        }
    }

    /// A free inode.
    pub fn free() -> Self {
        Inode {
            kind: Kind::Free,
            nlink: 0,
            parent: 0,
            size: 0,
            mtime_ns: 0,
            direct: [0; DIRECT],
            indirect: 0,
        }
    }

    /// Decodes the inode at the start of `b`.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let kind = match b[0] {
            0 => Kind::Free,
            1 => Kind::File,
            2 => Kind::Dir,
            k => return Err(Error::Corrupt(format!("inode kind {k}"))),
        };
        let mut direct = [0u32; DIRECT];
        for (i, d) in direct.iter_mut().enumerate() {
            *d = u32_at(b, 24 + 4 * i);
        }
        // Every loop over a file's or directory's blocks is bounded by its
        // size: a size no inode can have is refused here, once.
        let size = u64_at(b, 8);
        if size > MAX_FILE_SIZE {
            return Err(Error::Corrupt(format!("inode size {size}")));
        }
        Ok(Inode {
            kind,
            nlink: u16_at(b, 2),
            parent: u32_at(b, 4),
            size,
            mtime_ns: u64_at(b, 16),
            direct,
            indirect: u32_at(b, 72),
        })
    }

    /// Encodes the inode into the first [`INODE_SIZE`] bytes of `b`.
    pub fn encode(&self, b: &mut [u8]) {
        b[..INODE_SIZE].fill(0);
        b[0] = match self.kind {
            Kind::Free => 0,
            Kind::File => 1,
            Kind::Dir => 2,
        };
        b[2..4].copy_from_slice(&self.nlink.to_le_bytes());
        b[4..8].copy_from_slice(&self.parent.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.mtime_ns.to_le_bytes());
        for (i, d) in self.direct.iter().enumerate() {
            b[24 + 4 * i..28 + 4 * i].copy_from_slice(&d.to_le_bytes());
        }
        b[72..76].copy_from_slice(&self.indirect.to_le_bytes());
    }
}

/// A directory entry read from a directory block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirent {
    /// The inode it names (never 0).
    pub ino: u32,
    /// Its name.
    pub name: Vec<u8>,
}

/// The entry in slot `i` of a directory block, if the slot is used.
pub fn dirent_at(block: &[u8], i: usize) -> Result<Option<Dirent>> {
    let o = i * DIRENT_SIZE;
    let ino = u32_at(block, o);
    if ino == 0 {
        return Ok(None);
    }
    let len = u16_at(block, o + 4) as usize;
    if len == 0 || len > NAME_MAX {
        return Err(Error::Corrupt(format!("directory entry name length {len}")));
    }
    Ok(Some(Dirent {
        ino,
        name: block[o + 8..o + 8 + len].to_vec(),
    }))
}

/// Whether slot `i` of a directory block names exactly `name`.
pub fn dirent_is(block: &[u8], i: usize, name: &[u8]) -> Option<u32> {
    let o = i * DIRENT_SIZE;
    let ino = u32_at(block, o);
    let len = u16_at(block, o + 4) as usize;
    (ino != 0 && len == name.len() && &block[o + 8..o + 8 + len] == name).then_some(ino)
}

/// Writes an entry into slot `i` (or clears it, with `ino` 0).
pub fn set_dirent(block: &mut [u8], i: usize, ino: u32, name: &[u8]) {
    let o = i * DIRENT_SIZE;
    block[o..o + DIRENT_SIZE].fill(0);
    if ino != 0 {
        block[o..o + 4].copy_from_slice(&ino.to_le_bytes());
        block[o + 4..o + 6].copy_from_slice(&(name.len() as u16).to_le_bytes());
        block[o + 8..o + 8 + name.len()].copy_from_slice(name);
    }
}

/// Checks a name: 1..=[`NAME_MAX`] bytes, not `.` or `..`, no `/` or NUL.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&c| c == b'/' || c == 0)
    {
        return Err(Error::InvalidName);
    }
    Ok(())
}

/// The pointer in slot `i` of an indirect block.
pub fn ptr_at(block: &[u8], i: usize) -> u32 {
    u32_at(block, 4 * i)
}

/// Sets the pointer in slot `i` of an indirect block.
pub fn set_ptr(block: &mut [u8], i: usize, b: u32) {
    block[4 * i..4 * i + 4].copy_from_slice(&b.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_superblock_round_trips_and_refuses_what_is_not_it() {
        let s = Super::layout(4096, 1000, [9; 16]).unwrap();
        assert_eq!(s.inodes % INODES_PER_BLOCK, 0);
        assert!(s.data_start > s.bitmap_start && s.bitmap_start > s.inode_start);
        let b = s.encode();
        assert_eq!(Super::decode(&b).unwrap(), s);
        let mut flipped = b.clone();
        flipped[12] ^= 1;
        assert!(matches!(Super::decode(&flipped), Err(Error::NotMetafs(_))));
        assert!(matches!(
            Super::decode(&[0u8; 64]),
            Err(Error::NotMetafs(_))
        ));
    }

    #[test]
    fn inodes_and_entries_round_trip() {
        let mut i = Inode::new(Kind::File, 0, 42);
        i.size = 123_456;
        i.direct[3] = 77;
        i.indirect = 88;
        let mut b = vec![0u8; INODE_SIZE];
        i.encode(&mut b);
        assert_eq!(Inode::decode(&b).unwrap(), i);
        b[0] = 9;
        assert!(matches!(Inode::decode(&b), Err(Error::Corrupt(_))));
        let mut blk = vec![0u8; BLOCK];
        set_dirent(&mut blk, 5, 31, b"name");
        assert_eq!(dirent_is(&blk, 5, b"name"), Some(31));
        assert_eq!(dirent_is(&blk, 5, b"nam"), None);
        assert_eq!(
            dirent_at(&blk, 5).unwrap(),
            Some(Dirent {
                ino: 31,
                name: b"name".to_vec()
            })
        );
        set_dirent(&mut blk, 5, 0, b"");
        assert_eq!(dirent_at(&blk, 5).unwrap(), None);
        assert!(matches!(
            check_name(&[b'a'; NAME_MAX + 1]),
            Err(Error::NameTooLong)
        ));
        assert!(check_name(&[b'a'; NAME_MAX]).is_ok());
    }
}
