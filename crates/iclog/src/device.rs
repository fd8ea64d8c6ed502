//! The device a ring writes its records to.

use crate::Lsn;
use std::fmt;
use std::sync::Arc as StdArc;

bitflags::bitflags! {
    /// Cache-control flags of one record write, named after the Linux block
    /// layer's request flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct IoFlags: u16 {
        /// Before this write, make every *completed* earlier write durable
        /// (REQ_PREFLUSH: a cache flush issued ahead of the write).
        const PREFLUSH = 1 << 0;
        /// This write is durable when it completes (REQ_FUA).
        const FUA = 1 << 1;
    }
}

/// A type-erased device error, for devices that have no error type of their
/// own (test and benchmark devices). Cheap to clone: the same error is
/// handed to every waiter once the ring is poisoned.
#[derive(Clone)]
pub struct DeviceError(StdArc<dyn std::error::Error + Send + Sync>);

impl DeviceError {
    /// Wraps any error.
    pub fn new<E: std::error::Error + Send + Sync + 'static>(e: E) -> Self {
        Self(StdArc::new(e))
    }
    /// The underlying error, for downcasting.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for DeviceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Where a ring writes its records. Implemented by the journal facade (on
/// files) and by tests (in memory).
///
/// Calls come from the thread that submits a buffer, outside every ring
/// lock, and several may be in flight at once for different records: their
/// completions may arrive in any order.
pub trait LogDevice: Send + Sync + 'static {
    /// What a failed write or flush reports. It reaches every caller of a
    /// poisoned ring unchanged ([`crate::Error::Poisoned`]), so the device's
    /// owner gets its own error type back, not an erased one.
    type Error: std::error::Error + Clone + Send + Sync + 'static;

    /// Writes the complete record `bytes` (header, entries, padding) at
    /// `lsn`, honouring `flags`: with [`IoFlags::PREFLUSH`], first make every
    /// write that completed before this call durable; with [`IoFlags::FUA`],
    /// return only once `bytes` are durable. Returns when the write is
    /// complete. `bytes` starts at a multiple of [`crate::BUFFER_ALIGN`] in
    /// memory and its length is a multiple of the configured alignment, so
    /// a device may write it with `O_DIRECT` without copying.
    fn write(&self, lsn: Lsn, bytes: &[u8], flags: IoFlags) -> Result<(), Self::Error>;

    /// Makes every write that completed before this call durable (a cache
    /// flush with no write attached). Used when a force finds its record
    /// already written without FUA.
    fn flush(&self) -> Result<(), Self::Error>;
}
