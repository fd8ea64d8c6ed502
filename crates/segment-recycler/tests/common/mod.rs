//! Helpers shared by the store tests.
#![allow(dead_code)]

use journal_vfs::{SimVfs, Vfs};
use segment_recycler::{JournalId, SegmentStore, StartupReport, StoreConfig};
use std::path::{Path, PathBuf};

pub const ID: JournalId = *b"test-journal-id!";

pub fn small() -> StoreConfig {
    StoreConfig {
        segment_size: 64 << 10,
        preallocate_ahead: 1,
        max_segments: 8,
        ..StoreConfig::default()
    }
}

pub fn dir() -> PathBuf {
    PathBuf::from("/j")
}

pub fn sim() -> SimVfs {
    let v = SimVfs::new();
    v.create_dir_all(&dir()).unwrap();
    v
}

pub fn open(vfs: &SimVfs, cfg: StoreConfig) -> (SegmentStore, StartupReport) {
    let v: std::sync::Arc<dyn Vfs> = std::sync::Arc::new(vfs.clone());
    SegmentStore::open(v, &dir(), cfg, ID).unwrap()
}

pub fn names(vfs: &dyn Vfs, d: &Path) -> Vec<String> {
    let mut n = vfs.read_dir(d).unwrap();
    n.sort();
    n
}

/// A store with segments `0..n` created, the head at `n - 1`.
pub fn store_with(vfs: &SimVfs, cfg: StoreConfig, n: u64) -> SegmentStore {
    let (store, _) = open(vfs, cfg);
    for i in 0..n {
        store.set_head(i);
        store.file(i).unwrap();
    }
    store
}
