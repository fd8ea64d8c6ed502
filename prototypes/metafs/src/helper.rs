//! The helpers `mount(8)` and `umount(8)` run, when this binary is
//! installed (linked) as `/sbin/mount.fuse.metafs` and
//! `/sbin/umount.fuse`:
//!
//! ```text
//! mount -t fuse.metafs IMAGE DIR -o OPTIONS
//!   → mount.fuse.metafs IMAGE DIR -o OPTIONS
//!   → metafs mount --background --log IMAGE.log -o OPTIONS --fsname IMAGE IMAGE DIR
//! umount DIR
//!   → umount.fuse DIR
//!   → umount -i DIR, then, when DIR's source is a metafs image, wait until
//!     its daemon has checkpointed and let go of it
//! ```
//!
//! The mount's type is plain `fuse` (no subtype: xfstests finds its
//! `FSTYP=fuse` mounts by that type), so the unmount helper is the one
//! `umount(8)` runs for every FUSE mount; for one whose source is not a
//! metafs image it is `umount -i` and nothing more.
//!
//! A FUSE unmount returns before the daemon has finished (the kernel sends
//! no `DESTROY` to a non-block FUSE mount), so the unmount helper waits for
//! the image's journal lock, which the daemon holds until its checkpoint is
//! done: when `umount` returns, the image is whole and free — for `metafs
//! fsck`, or the next mount of a `umount; mount` cycle. The mount helper
//! waits for that lock too (a lazy unmount's daemon may still be serving);
//! an image the mount table shows mounted is refused at once: one daemon
//! serves an image, so it cannot be mounted twice side by side.
//! The waits are `flock(1)`'s, bounded by [`LOCK_WAIT_SECS`].

use crate::serve::{self, MountArgs};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The longest either helper waits for the image's previous daemon.
pub const LOCK_WAIT_SECS: u32 = 120;

/// A helper's entry: its arguments (after its name), its exit code.
pub type Helper = fn(&[OsString]) -> Result<ExitCode, String>;

/// Which helper this binary runs as, by the name it was started under.
pub fn by_name(argv0: &OsString) -> Option<Helper> {
    match Path::new(argv0).file_name()?.to_str()? {
        "mount.fuse.metafs" => Some(mount_helper),
        "umount.fuse" | "umount.fuse.metafs" => Some(umount_helper),
        _ => None,
    }
}

/// Waits (bounded) until no process holds `image`'s journal lock.
fn wait_free(image: &Path) -> Result<(), String> {
    let lock = metafs::journal_dir(image).join("LOCK");
    let exists = journal_core::vfs::Vfs::exists(&journal_core::vfs::OsVfs::new(), &lock)
        .map_err(|e| e.to_string())?;
    if !exists {
        return Ok(());
    }
    let st = Command::new("flock")
        .args(["-s", "-w", &LOCK_WAIT_SECS.to_string()])
        .arg(&lock)
        .arg("true")
        .status()
        .map_err(|e| format!("flock: {e}"))?;
    st.success().then_some(()).ok_or_else(|| {
        format!(
            "{} is still in use after {LOCK_WAIT_SECS} s",
            image.display()
        )
    })
}

/// `mount.fuse.metafs SOURCE DIR [-o OPTIONS] [-n] [-s] [-v] [-f] [-r] [-w]`.
fn mount_helper(args: &[OsString]) -> Result<ExitCode, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" => options.push(
                it.next()
                    .ok_or("-o without options")?
                    .to_string_lossy()
                    .into_owned(),
            ),
            "-r" => options.push("ro".into()),
            "-w" => options.push("rw".into()),
            "-n" | "-s" | "-v" | "-f" => {}
            o if o.starts_with("-o") => options.push(o[2..].to_owned()),
            o if o.starts_with('-') => return Err(format!("unknown flag {o}")),
            _ => positional.push(PathBuf::from(a)),
        }
    }
    let [source, dir] = &positional[..] else {
        return Err("usage: mount.fuse.metafs IMAGE DIR [-o OPTIONS]".into());
    };
    let all = options.join(",");
    if all.split(',').any(|o| o == "remount") {
        // A change of the kernel's flags (ro/rw): the kernel's alone.
        let st = Command::new("mount")
            .args(["-i", "-o", &all])
            .arg(dir)
            .status()
            .map_err(|e| format!("mount: {e}"))?;
        return Ok(ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8));
    }
    // An image serves one mount: mounted already, it is refused at once
    // (not after the wait below, which is for a daemon still finishing).
    let mounted = Command::new("findmnt")
        .args(["-n", "-l", "-t", "fuse", "-o", "TARGET", "-S"])
        .arg(source)
        .output()
        .map_err(|e| format!("findmnt: {e}"))?;
    let mounted = String::from_utf8_lossy(&mounted.stdout);
    if let Some(at) = mounted.lines().next() {
        return Err(format!(
            "{} is already mounted on {at}: an image serves one mount",
            source.display()
        ));
    }
    wait_free(source)?;
    let mut log = source.as_os_str().to_owned();
    log.push(".log");
    serve::mount(&MountArgs {
        image: source.clone(),
        dir: dir.clone(),
        commit_ms: 1000,
        allow_other: false,
        cache_mib: 64,
        options: vec![all],
        fsname: Some(source.display().to_string()),
        background: true,
        log: Some(PathBuf::from(log)),
    })
}

/// `umount.fuse.metafs DIR [FLAGS]`: `umount -i FLAGS DIR`, then (unless
/// lazy) the wait for the daemon.
fn umount_helper(args: &[OsString]) -> Result<ExitCode, String> {
    let Some(dir) = args.iter().find(|a| !a.to_string_lossy().starts_with('-')) else {
        return Err("usage: umount.fuse.metafs DIR [FLAGS]".into());
    };
    let lazy = args
        .iter()
        .any(|a| a == "-l" || a == "--lazy" || a.to_string_lossy().starts_with("-l"));
    let source = Command::new("findmnt")
        .args(["-n", "-o", "SOURCE", "--mountpoint"])
        .arg(dir)
        .output()
        .map_err(|e| format!("findmnt: {e}"))?;
    let source = String::from_utf8_lossy(&source.stdout).trim().to_owned();
    let st = Command::new("umount")
        .arg("-i")
        .args(args)
        .status()
        .map_err(|e| format!("umount: {e}"))?;
    if !st.success() {
        return Ok(ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8));
    }
    if !lazy && source.starts_with('/') {
        wait_free(Path::new(&source))?;
    }
    Ok(ExitCode::SUCCESS)
}
