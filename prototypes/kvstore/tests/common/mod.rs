//! Options and an opener the engine's integration tests share.

use journal_core::vfs::{SimVfs, Vfs};
use kvstore::{Options, Store};
use std::sync::Arc;

/// Options with a cache of `cache_pages` frames (at least 16), small
/// journal segments, and checkpoints only by log volume (4 MiB).
pub fn options(cache_pages: usize) -> Options {
    Options {
        cache_bytes: cache_pages * (4096 + 128),
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 256 << 10,
            background_preallocation: false,
            ..journal_core::Options::default()
        },
        checkpoint_interval: None,
        checkpoint_log_bytes: 4 << 20,
        ..Options::default()
    }
}

/// Opens the store `/db` on `vfs`.
pub fn sim_open(vfs: &SimVfs, o: Options) -> kvstore::Result<Store> {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    Store::open_with(v, "/db", o)
}
