//! Log sequence numbers.

use std::fmt;

/// A log sequence number: a byte position in the log's infinite address
/// space. Records and entries are addressed by the `Lsn` of their first
/// byte. The log never wraps in `Lsn` space; mapping it onto files is the
/// business of the crate that owns the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The first position of a new log.
    pub const ZERO: Lsn = Lsn(0);

    /// This position plus `n` bytes.
    pub fn plus(self, n: u64) -> Lsn {
        Lsn(self.0 + n)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Self {
        Lsn(v)
    }
}
