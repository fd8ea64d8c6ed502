//! The image's on-disk layout, byte by byte. All integers little-endian.
//!
//! ```text
//! block 0                  superblock
//! next I/32768 blocks      inode bitmap: bit i set = inode i in use (0 and the root included)
//! next I/16 blocks         inode table: 256-byte inodes, 16 per block (ino 0 unused, 1 = root)
//! next B/32768 blocks      block bitmap: bit b set = block b in use (the blocks above included)
//! the rest                 data: file data, directory blocks, indirect blocks
//! ```
//!
//! A file, directory or symlink maps its blocks as ext2 does: 12 direct
//! pointers, then a single-, a double- and a triple-indirect tree of
//! 1,024-pointer blocks (0 = a hole, read as zeros), so files reach
//! [`MAX_FILE_SIZE`] (about 4 TiB) and block numbers are 32-bit (images
//! to 16 TiB). Directory blocks hold variable-length entries ([`dir`]).
//! There are no `.` and `..` entries: a directory's inode records its
//! parent. A symlink's target is its data.

use crate::{Error, Result};

pub mod dir;
pub mod xattr;

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
/// Block indices the direct pointers and the three trees map.
pub const MAX_BLOCKS: u64 = DIRECT as u64
    + PER_INDIRECT as u64
    + (PER_INDIRECT as u64).pow(2)
    + (PER_INDIRECT as u64).pow(3);
/// Largest file: every index the block map reaches (about 4 TiB).
pub const MAX_FILE_SIZE: u64 = MAX_BLOCKS * BLOCK as u64;
/// Longest name, bytes (POSIX's `NAME_MAX` on Linux).
pub const NAME_MAX: usize = 255;
/// Longest symlink target, bytes (`PATH_MAX` less its NUL).
pub const SYMLINK_MAX: usize = 4095;
/// The root directory's inode number.
pub const ROOT: u32 = 1;
/// `"MTFS"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"MTFS");
/// The image format version this build writes and reads (3: inodes name
/// their extended attributes' chain).
pub const FORMAT_VERSION: u16 = 3;
/// Bits in one bitmap block.
pub const BITS_PER_BLOCK: u32 = (BLOCK * 8) as u32;

/// The `N` bytes of `b` at `o` (the caller has checked the length).
pub(crate) fn bytes_at<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[o..o + N]);
    a
}
pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(bytes_at(b, o))
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(bytes_at(b, o))
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(bytes_at(b, o))
}
fn put(b: &mut [u8], o: usize, v: &[u8]) {
    b[o..o + v.len()].copy_from_slice(v);
}

/// The superblock (block 0): written by `mkfs`, never changed after.
///
/// | offset | size | field |
/// |---:|---:|---|
/// | 0 | 4 | magic `MTFS` |
/// | 4 | 2 | format version (3) |
/// | 6 | 2 | reserved |
/// | 8 | 4 | block size (4096) |
/// | 12 | 4 | blocks in the image |
/// | 16 | 4 | inodes |
/// | 20 | 4 | first inode-bitmap block (1) |
/// | 24 | 4 | first inode-table block |
/// | 28 | 4 | first block-bitmap block |
/// | 32 | 4 | first data block |
/// | 36 | 16 | the journal's id (its segment headers carry the same) |
/// | 52 | 4 | CRC32C of bytes 0..52 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Super {
    /// Blocks in the image.
    pub blocks: u32,
    /// Inodes in the inode table.
    pub inodes: u32,
    /// First inode-bitmap block.
    pub ibitmap_start: u32,
    /// First inode-table block.
    pub inode_start: u32,
    /// First block-bitmap block.
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
        let inodes = inode_blocks.checked_mul(INODES_PER_BLOCK)?;
        let ibitmap_start = 1u32;
        let inode_start = ibitmap_start.checked_add(inodes.div_ceil(BITS_PER_BLOCK))?;
        let bitmap_start = inode_start.checked_add(inode_blocks)?;
        Some(Super {
            blocks,
            inodes,
            ibitmap_start,
            inode_start,
            bitmap_start,
            data_start: bitmap_start.checked_add(blocks.div_ceil(BITS_PER_BLOCK))?,
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

    /// The block-bitmap block and bit of block `b`.
    pub fn bit_place(&self, b: u32) -> (u32, usize) {
        (
            self.bitmap_start + b / BITS_PER_BLOCK,
            (b % BITS_PER_BLOCK) as usize,
        )
    }

    /// The inode-bitmap block and bit of inode `ino`.
    pub fn ibit_place(&self, ino: u32) -> (u32, usize) {
        (
            self.ibitmap_start + ino / BITS_PER_BLOCK,
            (ino % BITS_PER_BLOCK) as usize,
        )
    }

    /// Encodes the superblock into a block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK];
        put(&mut b, 0, &MAGIC.to_le_bytes());
        put(&mut b, 4, &FORMAT_VERSION.to_le_bytes());
        put(&mut b, 8, &(BLOCK as u32).to_le_bytes());
        put(&mut b, 12, &self.blocks.to_le_bytes());
        put(&mut b, 16, &self.inodes.to_le_bytes());
        put(&mut b, 20, &self.ibitmap_start.to_le_bytes());
        put(&mut b, 24, &self.inode_start.to_le_bytes());
        put(&mut b, 28, &self.bitmap_start.to_le_bytes());
        put(&mut b, 32, &self.data_start.to_le_bytes());
        put(&mut b, 36, &self.journal_id);
        let crc = crc32(&b[..52]);
        put(&mut b, 52, &crc.to_le_bytes());
        b
    }

    /// Decodes and checks a superblock.
    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() < 56 || u32_at(b, 0) != MAGIC {
            return Err(Error::NotMetafs("no metafs superblock".into()));
        }
        let version = u16_at(b, 4);
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion(version));
        }
        if crc32(&b[..52]) != u32_at(b, 52) {
            return Err(Error::NotMetafs("superblock checksum mismatch".into()));
        }
        if u32_at(b, 8) != BLOCK as u32 {
            return Err(Error::Corrupt(format!("block size {}", u32_at(b, 8))));
        }
        let s = Super {
            blocks: u32_at(b, 12),
            inodes: u32_at(b, 16),
            ibitmap_start: u32_at(b, 20),
            inode_start: u32_at(b, 24),
            bitmap_start: u32_at(b, 28),
            data_start: u32_at(b, 32),
            journal_id: bytes_at(b, 36),
        };
        if Super::layout(s.blocks, s.inodes, s.journal_id) != Some(s) || s.data_start >= s.blocks {
            return Err(Error::Corrupt("superblock layout is inconsistent".into()));
        }
        Ok(s)
    }
}

fn crc32(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

/// What an inode is (its byte 0; also kept in directory entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A free inode.
    Free,
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (its target is its data).
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix-domain socket's name.
    Socket,
    /// A character device (its number in `rdev`).
    CharDevice,
    /// A block device (its number in `rdev`).
    BlockDevice,
}

impl Kind {
    /// The on-disk code.
    pub fn code(self) -> u8 {
        match self {
            Kind::Free => 0,
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::CharDevice => 6,
            Kind::BlockDevice => 7,
        }
    }

    /// The kind of an on-disk code.
    pub fn from_code(c: u8) -> Result<Self> {
        Ok(match c {
            0 => Kind::Free,
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDevice,
            7 => Kind::BlockDevice,
            k => return Err(Error::Corrupt(format!("inode kind {k}"))),
        })
    }

    /// Whether inodes of this kind map blocks (files, directories,
    /// symlinks); the special files have no data.
    pub fn has_data(self) -> bool {
        matches!(self, Kind::File | Kind::Dir | Kind::Symlink)
    }
}

/// A timestamp: seconds since the epoch (negative before it) and
/// nanoseconds (below 10^9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time {
    /// Seconds since 1970-01-01 UTC.
    pub sec: i64,
    /// Nanoseconds within the second.
    pub nsec: u32,
}

impl Time {
    /// The system clock now.
    pub fn now() -> Self {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(_) => Time::default(),
        }
    }

    fn decode(b: &[u8], o: usize) -> Result<Self> {
        let t = Time {
            sec: u64_at(b, o) as i64,
            nsec: u32_at(b, o + 8),
        };
        if t.nsec >= 1_000_000_000 {
            return Err(Error::Corrupt(format!("timestamp nanoseconds {}", t.nsec)));
        }
        Ok(t)
    }

    fn encode(&self, b: &mut [u8], o: usize) {
        put(b, o, &self.sec.to_le_bytes());
        put(b, o + 8, &self.nsec.to_le_bytes());
    }
}

/// An inode.
///
/// | offset | size | field |
/// |---:|---:|---|
/// | 0 | 1 | kind: 0 free, 1 file, 2 directory, 3 symlink, 4 FIFO, 5 socket, 6 char device, 7 block device |
/// | 1 | 1 | reserved |
/// | 2 | 2 | mode: permission bits, setuid, setgid, sticky (`0o7777`) |
/// | 4 | 4 | link count (a directory: 2 + its subdirectories) |
/// | 8 | 4 | owner uid |
/// | 12 | 4 | group gid |
/// | 16 | 8 | size in bytes |
/// | 24 | 12 | access time (i64 seconds, u32 nanoseconds) |
/// | 36 | 12 | modification time |
/// | 48 | 12 | status-change time |
/// | 60 | 4 | parent directory's inode (directories; 0 otherwise) |
/// | 64 | 4 | device number (character and block devices) |
/// | 68 | 48 | 12 direct block pointers |
/// | 116 | 4 | single-indirect block (0: none) |
/// | 120 | 4 | double-indirect block |
/// | 124 | 4 | triple-indirect block |
/// | 128 | 8 | blocks allocated to it (data, indirect and extended attribute blocks) |
/// | 136 | 4 | the orphan list: in the root, its first inode; in an orphan, the next (0 ends it) |
/// | 140 | 4 | the first block of its extended attributes ([`xattr`]; 0: none) |
/// | 144 | 112 | reserved |
///
/// An *orphan* is an inode whose last name was removed while it was still
/// open: its link count is 0, it keeps its blocks until the last close,
/// and it is on the orphan list, so a mount after a crash frees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
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
    /// Size in bytes.
    pub size: u64,
    /// Last access (kept when set; reads do not move it: `noatime`).
    pub atime: Time,
    /// Last change of the data.
    pub mtime: Time,
    /// Last change of the inode.
    pub ctime: Time,
    /// Parent directory (directories only).
    pub parent: u32,
    /// Device number (devices only).
    pub rdev: u32,
    /// Direct block pointers.
    pub direct: [u32; DIRECT],
    /// Roots of the single-, double- and triple-indirect trees.
    pub trees: [u32; 3],
    /// Blocks allocated to it: data, tree and extended attribute blocks.
    pub blocks: u64,
    /// The orphan list's next inode (the root: its first).
    pub next_orphan: u32,
    /// The first block of its extended attributes' chain (0: none).
    pub xattr: u32,
}

impl Inode {
    /// A fresh inode of `kind`, its three times `now`.
    pub fn new(kind: Kind, mode: u16, uid: u32, gid: u32, parent: u32, now: Time) -> Self {
        Inode {
            kind,
            mode: mode & 0o7777,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            parent: if kind == Kind::Dir { parent } else { 0 },
            rdev: 0,
            direct: [0; DIRECT],
            trees: [0; 3],
            blocks: 0,
            next_orphan: 0,
            xattr: 0,
        }
    }

    /// A free inode.
    pub fn free() -> Self {
        Inode {
            nlink: 0,
            ..Inode::new(Kind::Free, 0, 0, 0, 0, Time::default())
        }
    }

    /// Decodes the inode at the start of `b`.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let kind = Kind::from_code(b[0])?;
        let mut direct = [0u32; DIRECT];
        for (i, d) in direct.iter_mut().enumerate() {
            *d = u32_at(b, 68 + 4 * i);
        }
        // Every loop over a file's blocks is bounded by its size: a size
        // no inode of its kind can have is refused here, once.
        let size = u64_at(b, 16);
        let limit = match kind {
            Kind::Symlink => SYMLINK_MAX as u64,
            k if k.has_data() => MAX_FILE_SIZE,
            _ => 0,
        };
        if size > limit {
            return Err(Error::Corrupt(format!("inode size {size}")));
        }
        let blocks = u64_at(b, 128);
        if blocks > MAX_BLOCKS * 2 {
            return Err(Error::Corrupt(format!("inode block count {blocks}")));
        }
        Ok(Inode {
            kind,
            mode: u16_at(b, 2) & 0o7777,
            nlink: u32_at(b, 4),
            uid: u32_at(b, 8),
            gid: u32_at(b, 12),
            size,
            atime: Time::decode(b, 24)?,
            mtime: Time::decode(b, 36)?,
            ctime: Time::decode(b, 48)?,
            parent: u32_at(b, 60),
            rdev: u32_at(b, 64),
            direct,
            trees: [u32_at(b, 116), u32_at(b, 120), u32_at(b, 124)],
            blocks,
            next_orphan: u32_at(b, 136),
            xattr: u32_at(b, 140),
        })
    }

    /// Encodes the inode into the first [`INODE_SIZE`] bytes of `b`.
    pub fn encode(&self, b: &mut [u8]) {
        b[..INODE_SIZE].fill(0);
        b[0] = self.kind.code();
        put(b, 2, &self.mode.to_le_bytes());
        put(b, 4, &self.nlink.to_le_bytes());
        put(b, 8, &self.uid.to_le_bytes());
        put(b, 12, &self.gid.to_le_bytes());
        put(b, 16, &self.size.to_le_bytes());
        self.atime.encode(b, 24);
        self.mtime.encode(b, 36);
        self.ctime.encode(b, 48);
        put(b, 60, &self.parent.to_le_bytes());
        put(b, 64, &self.rdev.to_le_bytes());
        for (i, d) in self.direct.iter().enumerate() {
            put(b, 68 + 4 * i, &d.to_le_bytes());
        }
        for (i, t) in self.trees.iter().enumerate() {
            put(b, 116 + 4 * i, &t.to_le_bytes());
        }
        put(b, 128, &self.blocks.to_le_bytes());
        put(b, 136, &self.next_orphan.to_le_bytes());
        put(b, 140, &self.xattr.to_le_bytes());
    }
}

/// Where block index `idx` of an inode is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapPath {
    /// Direct pointer `slot`.
    Direct(usize),
    /// In tree `depth` (1 single, 2 double, 3 triple indirect): the slot
    /// to follow in each tree block from the root down (`slots[..depth]`).
    Tree {
        /// Levels of tree blocks above the data block.
        depth: usize,
        /// The slot in each level, root first.
        slots: [usize; 3],
    },
}

/// Indices one pointer at `level` levels above the data covers
/// (`PER_INDIRECT^level`).
pub fn span(level: usize) -> u64 {
    (PER_INDIRECT as u64).pow(level as u32)
}

/// The path to block index `idx`; `None` past [`MAX_BLOCKS`].
pub fn map_path(idx: u64) -> Option<MapPath> {
    if idx < DIRECT as u64 {
        return Some(MapPath::Direct(idx as usize));
    }
    let mut rel = idx - DIRECT as u64;
    for depth in 1..=3 {
        if rel < span(depth) {
            let mut slots = [0usize; 3];
            for (level, slot) in slots.iter_mut().enumerate().take(depth) {
                let below = span(depth - 1 - level);
                *slot = (rel / below) as usize;
                rel %= below;
            }
            return Some(MapPath::Tree { depth, slots });
        }
        rel -= span(depth);
    }
    None
}

/// The first block index tree `depth` maps.
pub fn tree_first(depth: usize) -> u64 {
    DIRECT as u64 + (1..depth).map(span).sum::<u64>()
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
    put(block, 4 * i, &b.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_superblock_round_trips_and_refuses_what_is_not_it() {
        let s = Super::layout(4096, 1000, [9; 16]).unwrap();
        assert_eq!(s.inodes % INODES_PER_BLOCK, 0);
        assert!(s.data_start > s.bitmap_start && s.bitmap_start > s.inode_start);
        assert!(s.inode_start > s.ibitmap_start);
        let b = s.encode();
        assert_eq!(Super::decode(&b).unwrap(), s);
        let mut flipped = b.clone();
        flipped[12] ^= 1;
        assert!(matches!(Super::decode(&flipped), Err(Error::NotMetafs(_))));
        assert!(matches!(
            Super::decode(&[0u8; 64]),
            Err(Error::NotMetafs(_))
        ));
        let mut old = b;
        old[4] = 1;
        assert!(matches!(
            Super::decode(&old),
            Err(Error::UnsupportedVersion(1))
        ));
    }

    #[test]
    fn inodes_round_trip_and_refuse_impossible_fields() {
        let t = Time {
            sec: -5,
            nsec: 999_999_999,
        };
        let mut i = Inode::new(Kind::File, 0o4755, 7, 8, 0, t);
        i.size = 123_456;
        i.direct[3] = 77;
        i.trees = [88, 89, 90];
        i.rdev = 3;
        i.blocks = 4;
        i.next_orphan = 12;
        i.xattr = 13;
        let mut b = vec![0u8; INODE_SIZE];
        i.encode(&mut b);
        assert_eq!(Inode::decode(&b).unwrap(), i);
        let mut k = b.clone();
        k[0] = 9;
        assert!(matches!(Inode::decode(&k), Err(Error::Corrupt(_))));
        let mut n = b.clone();
        n[32..36].copy_from_slice(&1_000_000_000u32.to_le_bytes());
        assert!(matches!(Inode::decode(&n), Err(Error::Corrupt(_))));
        let mut s = Inode::new(Kind::Symlink, 0o777, 0, 0, 0, t);
        s.size = SYMLINK_MAX as u64 + 1;
        s.encode(&mut b);
        assert!(matches!(Inode::decode(&b), Err(Error::Corrupt(_))));
    }

    #[test]
    fn map_paths_cover_every_index_once_in_order() {
        assert_eq!(map_path(0), Some(MapPath::Direct(0)));
        assert_eq!(map_path(11), Some(MapPath::Direct(11)));
        let t = |depth, a, b, c| {
            Some(MapPath::Tree {
                depth,
                slots: [a, b, c],
            })
        };
        assert_eq!(map_path(12), t(1, 0, 0, 0));
        assert_eq!(map_path(12 + 1023), t(1, 1023, 0, 0));
        assert_eq!(map_path(12 + 1024), t(2, 0, 0, 0));
        assert_eq!(map_path(12 + 1024 + 1025), t(2, 1, 1, 0));
        assert_eq!(tree_first(3), 12 + 1024 + 1024 * 1024);
        assert_eq!(map_path(tree_first(3) + 1024 * 1024 + 5), t(3, 1, 0, 5));
        assert_eq!(map_path(MAX_BLOCKS - 1), t(3, 1023, 1023, 1023));
        assert_eq!(map_path(MAX_BLOCKS), None);
        const { assert!(MAX_FILE_SIZE > 64 << 30) };
    }

    #[test]
    fn names_are_checked() {
        assert!(matches!(
            check_name(&[b'a'; NAME_MAX + 1]),
            Err(Error::NameTooLong)
        ));
        assert!(check_name(&[b'a'; NAME_MAX]).is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert!(matches!(check_name(bad), Err(Error::InvalidName)));
        }
    }
}
