//! A filesystem prototype on the journal: the whole filesystem in one
//! image file, its metadata journaled through `journal-core` in ext4's
//! ordered mode.
//!
//! - [`Fs`]: `mkfs`, mount (replaying the journal), the operations —
//!   [`Fs::mkdir`], [`Fs::create`], [`Fs::make_node`] (FIFOs, sockets,
//!   devices), [`Fs::symlink`], [`Fs::link`], [`Fs::write`], [`Fs::read`],
//!   [`Fs::truncate`], [`Fs::rename`] and [`Fs::rename_with`], [`Fs::unlink`],
//!   [`Fs::rmdir`], [`Fs::readdir`], [`Fs::stat`], [`Fs::setattr`],
//!   [`Fs::open`] / [`Fs::release`] (files unlinked while open live on),
//!   [`Fs::fsync`], [`Fs::sync`] — by inode and by path, from many threads
//!   at once; [`Fs::checkpoint`].
//! - What it keeps: POSIX modes, owners, three times, hard links,
//!   symlinks, names to 255 bytes, files to ~4 TiB (holes read as zeros),
//!   directories indexed so a lookup costs the same at 100,000 entries as
//!   at 10; extended attributes, POSIX ACLs, `fallocate` and
//!   `SEEK_DATA`/`SEEK_HOLE`; pjdfstest passes on a mount (`cargo xtask
//!   fs-suite`), and 175 of the 186 tests of xfstests's generic/quick it
//!   runs (`cargo xtask xfstests`; the other 11 in docs/XFSTESTS.md).
//! - [`fsck`]: the filesystem checked against itself.
//! - [`fuse`]: the filesystem mounted through FUSE (`metafs mount`).
//! - The formats: [`layout`] (the image), [`txn`] (the journal records).
//!
//! How it journals — compound transactions, full block images, data
//! before metadata, revokes, checkpoints, recovery — is in the docs of
//! [`volume`].
//!
//! ```
//! use metafs::{Fs, MkfsOptions, MountOptions};
//! let tmp = tempfile::tempdir().unwrap();
//! let image = tmp.path().join("fs.img");
//! Fs::mkfs(&image, MkfsOptions { size: 8 << 20, ..MkfsOptions::default() }).unwrap();
//! let fs = Fs::mount(&image, MountOptions::default()).unwrap();
//! fs.mkdir_path("/docs").unwrap();
//! let f = fs.create_path("/docs/a.txt").unwrap();
//! fs.write(f, 0, b"hello").unwrap();
//! fs.fsync(f).unwrap();            // durable when this returns
//! fs.rename_path("/docs/a.txt", "/docs/b.txt").unwrap();
//! fs.unmount().unwrap();
//! let fs = Fs::mount(&image, MountOptions::default()).unwrap();
//! assert_eq!(fs.read_path("/docs/b.txt").unwrap(), b"hello");
//! assert!(metafs::fsck(&fs).unwrap().is_empty());
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod acl;
mod error;
mod fsck;
pub mod fuse;
pub mod layout;
pub mod txn;
pub mod volume;

pub use error::{Error, Result};
pub use fsck::fsck;
pub use layout::{Kind, Time, FORMAT_VERSION, MAX_FILE_SIZE, NAME_MAX, ROOT, SYMLINK_MAX};
pub use volume::{
    check_xattr_name, journal_dir, Atime, Falloc, Fs, Ino, MkfsOptions, MountOptions, MountReport,
    NewNode, RenameMode, SetAttr, Stat, XattrSet, LINK_MAX,
};
