//! A temporary directory on the local disk, removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory under the system temporary directory (or a parent you
/// choose), removed with its contents when dropped. Used by tests and by
/// `journal bench`, which must measure the real local disk.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    /// Creates `$TMPDIR/<prefix>-<pid>-<n>-<nanos>`.
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        Self::new_in(&std::env::temp_dir(), prefix)
    }

    /// Creates a fresh directory inside `parent`.
    pub fn new_in(parent: &Path, prefix: &str) -> std::io::Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let path = parent.join(name);
        std::fs::create_dir_all(parent)?;
        std::fs::create_dir(&path)?;
        Ok(Self { path, keep: false })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the directory after drop (to inspect a failing test).
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.path.clone()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
