//! `metafs mount --background` and the binary as the helpers `mount(8)`
//! and `umount(8)` run (`mount.fuse.metafs`, `umount.fuse`), called by
//! those names through links in a temporary directory (nothing is
//! installed into /sbin): the mount's source is its `fsname`, options
//! are taken or refused, the daemon logs its life, and an unmount returns
//! only once the daemon has let go of the image — so `metafs fsck` right
//! after it finds the image free and clean.
//!
//! Needs `/dev/fuse` and root (these machines have both).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(cmd: &Path, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", cmd.display()))
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn metafs() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_metafs"))
}

/// The mount's (source, options) in the mount table, if mounted.
fn mounted(dir: &Path) -> Option<(String, String)> {
    let out = run(
        Path::new("findmnt"),
        &["-n", "-o", "SOURCE,OPTIONS", "--mountpoint", dir.to_str()?],
    );
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (src, opts) = text.split_once(char::is_whitespace)?;
    Some((src.to_owned(), opts.trim().to_owned()))
}

/// Unmounts `dir` lazily if a test left it mounted.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if mounted(&self.0).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn setup(tmp: &Path) -> (PathBuf, PathBuf, Cleanup) {
    let image = tmp.join("fs.img");
    ok(run(
        &metafs(),
        &["mkfs", image.to_str().unwrap(), "--size", "64M"],
    ));
    let mnt = tmp.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let guard = Cleanup(mnt.clone());
    (image, mnt, guard)
}

#[test]
fn background_mount_takes_fsname_and_options_and_logs_its_life() {
    let tmp = tempfile::tempdir().unwrap();
    let (image, mnt, _guard) = setup(tmp.path());
    let log = tmp.path().join("daemon.log");
    let (i, m, l) = (
        image.to_str().unwrap(),
        mnt.to_str().unwrap(),
        log.to_str().unwrap(),
    );
    // Returns once mounted, saying nothing (helpers are silent).
    let out = ok(run(
        &metafs(),
        &[
            "mount",
            "--background",
            "--log",
            l,
            "-o",
            "fsname=test-dev,noatime,nosuid",
            i,
            m,
        ],
    ));
    assert!(out.is_empty(), "{out}");
    let (src, opts) = mounted(&mnt).expect("mounted");
    assert_eq!(src, "test-dev");
    assert!(opts.contains("nosuid"), "{opts}");
    std::fs::write(mnt.join("f"), b"kept").unwrap();
    ok(run(Path::new("umount"), &[m]));
    // The log says mounted, then exited; the unmount above was plain
    // umount(8) (no helper), so wait for the daemon through its lock.
    ok(run(
        Path::new("flock"),
        &["-s", &format!("{i}.journal/LOCK"), "true"],
    ));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains(&format!("mounted {i} on {m}")), "{text}");
    assert!(lines[1].contains("exited: "), "{text}");
    // Without fsname, the source is the image's absolute path.
    ok(run(&metafs(), &["mount", "--background", i, m]));
    assert_eq!(mounted(&mnt).unwrap().0, i);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"kept");
    ok(run(Path::new("umount"), &[m]));
    // An unknown option is refused before anything is mounted.
    let out = run(&metafs(), &["mount", "--background", "-o", "bogus", i, m]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"bogus\""));
    assert!(mounted(&mnt).is_none());
}

#[test]
fn the_helpers_mount_and_unmount_so_fsck_right_after_finds_the_image_free() {
    let tmp = tempfile::tempdir().unwrap();
    let (image, mnt, _guard) = setup(tmp.path());
    let (i, m) = (image.to_str().unwrap(), mnt.to_str().unwrap());
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let (mount_helper, umount_helper) = (bin.join("mount.fuse.metafs"), bin.join("umount.fuse"));
    std::os::unix::fs::symlink(metafs(), &mount_helper).unwrap();
    std::os::unix::fs::symlink(metafs(), &umount_helper).unwrap();
    for round in 0..5 {
        // As mount(8) calls it: source, target, -o options.
        let out = ok(run(&mount_helper, &[i, m, "-o", "rw,relatime,allow_other"]));
        assert!(out.is_empty(), "{out}");
        assert_eq!(mounted(&mnt).unwrap().0, i, "the source is the image");
        std::fs::write(mnt.join(format!("f{round}")), vec![round as u8; 10_000]).unwrap();
        // As umount(8) calls it: the target, then its flags.
        ok(run(&umount_helper, &[m, "-n"]));
        assert!(mounted(&mnt).is_none());
        // The daemon has let go: fsck opens the image at once.
        let out = ok(run(&metafs(), &["fsck", i]));
        assert!(out.contains("clean"), "{out}");
    }
    ok(run(&mount_helper, &[i, m]));
    for round in 0..5u8 {
        assert_eq!(
            std::fs::read(mnt.join(format!("f{round}"))).unwrap(),
            vec![round; 10_000]
        );
    }
    // Mounted already: a second mount of the image is refused at once,
    // not after the wait for a finishing daemon (xfstests's generic/732).
    let second = tmp.path().join("mnt2");
    std::fs::create_dir(&second).unwrap();
    let t = std::time::Instant::now();
    let out = run(&mount_helper, &[i, second.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already mounted"),
        "{out:?}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(30));
    assert!(mounted(&second).is_none());
    ok(run(&umount_helper, &[m]));
    let log = std::fs::read_to_string(format!("{i}.log")).unwrap();
    assert_eq!(log.matches(": mounted ").count(), 6, "{log}");
    assert_eq!(log.matches(": exited: ").count(), 6, "{log}");
    // A bad option fails the mount with the helper's message.
    let out = run(&mount_helper, &[i, m, "-o", "data=journal"]);
    assert!(!out.status.success());
    assert!(mounted(&mnt).is_none());
}
