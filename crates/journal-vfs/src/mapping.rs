//! Read-only views of whole files: a memory mapping on [`crate::OsVfs`],
//! an owned copy elsewhere.

use std::fmt;
use std::ops::Deref;

/// The bytes of a whole file, read-only, as returned by [`crate::VfsFile::map`].
///
/// On [`crate::OsVfs`] this is a shared memory mapping (`mmap(2)`,
/// `PROT_READ`, `MAP_SHARED`, `MADV_SEQUENTIAL`): reading it copies
/// nothing. On
/// [`crate::SimVfs`] (and any other backend that keeps the default of
/// [`crate::VfsFile::map`]) it is an owned snapshot of the file read at the
/// call. Either way it dereferences to `[u8]`.
///
/// # What a caller must guarantee
///
/// A mapping shows the file's current contents, not a snapshot: bytes the
/// caller reads through it must not be written (by this process or another)
/// for as long as the mapping lives, and the file must not be truncated
/// below the mapped length (touching a page past the new end raises
/// `SIGBUS`). The journal meets both for the segments it maps: it maps only
/// *sealed* segments (every byte below the durable end of the log, which it
/// never rewrites), segment files are never truncated (they are created at
/// their full size, renamed when recycled, and only removed by name, which
/// leaves a mapping valid), and a mapped segment is pinned against
/// recycling until the last view of it drops. Another process ignoring the
/// journal's directory lock and truncating a segment is outside that
/// contract, as it is for every mmap-based store.
pub struct Mapping {
    backing: Backing,
}

enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Box<[u8]>),
    /// A buffer shared with its owner, who copies it before writing
    /// ([`crate::SimVfs`]'s copy-on-write files).
    Shared(journal_sync::DataArc<Vec<u8>>),
}

impl Mapping {
    /// A mapping of an owned buffer (what backends without `mmap` return).
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self {
            backing: Backing::Owned(bytes.into_boxed_slice()),
        }
    }

    /// A snapshot that shares `bytes` with the file it was taken from.
    pub(crate) fn shared(bytes: journal_sync::DataArc<Vec<u8>>) -> Self {
        Self {
            backing: Backing::Shared(bytes),
        }
    }

    pub(crate) fn mapped(m: memmap2::Mmap) -> Self {
        Self {
            backing: Backing::Mapped(m),
        }
    }

    /// The buffer back, if this is an owned one made by
    /// [`Mapping::from_vec`] (a caller reusing its read buffers).
    pub fn into_vec(self) -> Option<Vec<u8>> {
        match self.backing {
            Backing::Owned(b) => Some(b.into_vec()),
            Backing::Mapped(_) | Backing::Shared(_) => None,
        }
    }

    /// Whether the bytes are a memory mapping of the file (rather than a copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped(_))
    }
}

impl Deref for Mapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.backing {
            Backing::Mapped(m) => m,
            Backing::Owned(b) => b,
            Backing::Shared(b) => b,
        }
    }
}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}
