//! The state directory's small files: `CURRENT` (which store directory
//! is current), written durably by replacement; and removing a store
//! directory.

use super::{Error, CURRENT};
use journal_core::vfs::{OpenOptions, Vfs};
use std::path::Path;

pub(crate) use raftkv_wire::read_small_file;

/// Replaces `dir/name` durably by `bytes`: a new file written and synced,
/// renamed over the old one, the directory synced.
pub(crate) fn replace_small_file(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), journal_core::VfsError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let f = vfs.open(&tmp, OpenOptions::create())?;
    f.set_len(0)?;
    f.write_at(bytes, 0)?;
    f.sync_all()?;
    drop(f);
    vfs.rename(&tmp, &dir.join(name))?;
    vfs.sync_dir(dir)
}

/// Reads `CURRENT` (`sm-<generation>` and a newline); `None` if absent.
pub(super) fn read_current(vfs: &dyn Vfs, dir: &Path) -> Result<Option<u64>, Error> {
    let path = dir.join(CURRENT);
    let bad = || Error::Corrupt(format!("{}: not a store name", path.display()));
    match read_small_file(vfs, &path, 64)? {
        None => Ok(None),
        Some(None) => Err(bad()),
        Some(Some(buf)) => std::str::from_utf8(&buf)
            .ok()
            .and_then(|s| s.strip_suffix('\n'))
            .and_then(|s| s.strip_prefix("sm-"))
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or_else(bad),
    }
}

/// Replaces `CURRENT` durably.
pub(super) fn write_current(vfs: &dyn Vfs, dir: &Path, generation: u64) -> Result<(), Error> {
    let text = format!("sm-{generation}\n");
    Ok(replace_small_file(vfs, dir, CURRENT, text.as_bytes())?)
}

/// Removes a directory and everything in it.
pub(super) fn remove_tree(vfs: &dyn Vfs, path: &Path) -> Result<(), Error> {
    for name in vfs.read_dir(path)? {
        let p = path.join(name);
        if vfs.remove_file(&p).is_err() {
            remove_tree(vfs, &p)?;
        }
    }
    vfs.remove_dir(path)?;
    Ok(())
}
