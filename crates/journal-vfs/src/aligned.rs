//! A buffer for direct I/O.

/// A zeroed byte buffer whose first byte sits on a 4 KiB boundary in
/// memory, as `O_DIRECT` wants of a buffer (4 KiB covers the largest
/// [`crate::VfsFile::direct_io_alignment`] a journal accepts). Safe code: a
/// `Vec` with a page to spare, viewed from its first aligned byte; the
/// heap block never moves, since the `Vec` never grows.
#[derive(Debug, Clone)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// The memory alignment of every `AlignedBuf`.
    pub const ALIGN: usize = 4096;

    /// `len` zero bytes, aligned.
    pub fn zeroed(len: usize) -> Self {
        let raw = vec![0u8; len + Self::ALIGN];
        let start = (Self::ALIGN - raw.as_ptr() as usize % Self::ALIGN) % Self::ALIGN;
        Self { raw, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}
