//! Through the FUSE mount, with ordinary programs: a fresh image is
//! mounted with `metafs mount`, a tar archive of a few hundred files and
//! directories is unpacked onto it with the system `tar` and compared with
//! `diff -r`; `mkdir`, `cp -r`, `mv`, `ls -l`, `cat`, `rm -r` and `sync` do
//! their work; after `umount`, `metafs fsck` finds it clean, and a second
//! mount shows the same tree. A second test runs the tools that need
//! more than that: `ln`, `ln -s`, `chmod`, `touch -d`, `mkfifo`,
//! `rsync -a` (which must then find nothing to change) and
//! `git init && git add && git commit`.
//!
//! Needs `/dev/fuse` and root (these machines have both).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn metafs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metafs"))
        .args(args)
        .output()
        .expect("run metafs")
}

/// A mounted image; unmounted (lazily, if the test failed) on drop.
struct Mounted {
    child: Option<Child>,
    dir: PathBuf,
}

impl Mounted {
    fn new(image: &Path, dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_metafs"))
            .args(["mount", image.to_str().unwrap(), dir.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn metafs mount");
        // The mount is live once it says so (a blocking read, no polling).
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("mounted"), "metafs mount said {line:?}");
        Self {
            child: Some(child),
            dir: dir.to_path_buf(),
        }
    }

    /// `umount DIR`, and the server exits cleanly (after its checkpoint).
    fn unmount(mut self) {
        sh("umount", &[self.dir.to_str().unwrap()]);
        let status = self.child.take().unwrap().wait().unwrap();
        assert!(status.success(), "metafs mount exited with {status}");
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A source tree of a few hundred files and directories, sizes 0 to
/// ~200 KiB (some past the 48 KiB the direct blocks map).
fn make_tree(root: &Path) -> usize {
    let mut n = 0;
    let mut seed = 0x1234_5678_u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for d in 0..12 {
        let dir = root
            .join(format!("dir-{d:02}"))
            .join(format!("sub {}", d % 3));
        std::fs::create_dir_all(&dir).unwrap();
        n += 2;
        for f in 0..25 {
            let len = match next() % 10 {
                0 => 0,
                1 => (next() % 200_000) as usize,
                _ => (next() % 6000) as usize,
            };
            let bytes: Vec<u8> = (0..len)
                .map(|i| (i as u64 * 31 + next() % 7) as u8)
                .collect();
            std::fs::write(dir.join(format!("file-{f:03}.dat")), bytes).unwrap();
            n += 1;
        }
    }
    std::fs::write(root.join("README"), b"top-level file\n").unwrap();
    n + 1
}

#[test]
fn tar_x_onto_the_mount_then_diff_fsck_remount_diff() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let entries = make_tree(&src);
    assert!(entries > 300);
    let archive = tmp.path().join("tree.tar");
    sh(
        "tar",
        &[
            "cf",
            archive.to_str().unwrap(),
            "-C",
            src.to_str().unwrap(),
            ".",
        ],
    );
    let image = tmp.path().join("fs.img");
    let out = metafs(&["mkfs", image.to_str().unwrap(), "--size", "128M"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = mnt.to_str().unwrap();

    let mounted = Mounted::new(&image, &mnt);
    sh("tar", &["xf", archive.to_str().unwrap(), "-C", m]);
    sh("diff", &["-r", src.to_str().unwrap(), m]);
    // Ordinary programs.
    sh("mkdir", &[&format!("{m}/scratch")]);
    sh(
        "cp",
        &["-r", &format!("{m}/dir-03"), &format!("{m}/scratch/copy")],
    );
    sh(
        "diff",
        &["-r", &format!("{m}/dir-03"), &format!("{m}/scratch/copy")],
    );
    sh("mv", &[&format!("{m}/scratch/copy"), &format!("{m}/moved")]);
    let listing = sh("ls", &["-l", m]);
    assert!(
        listing.contains("moved") && listing.contains("README"),
        "{listing}"
    );
    assert_eq!(sh("cat", &[&format!("{m}/README")]), "top-level file\n");
    sh(
        "rm",
        &["-r", &format!("{m}/moved"), &format!("{m}/scratch")],
    );
    sh("sync", &[]);
    sh("diff", &["-r", src.to_str().unwrap(), m]);
    mounted.unmount();

    let out = metafs(&["fsck", image.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "fsck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let mounted = Mounted::new(&image, &mnt);
    sh("diff", &["-r", src.to_str().unwrap(), m]);
    mounted.unmount();
}

fn mkfs_and_mount(tmp: &Path) -> (PathBuf, PathBuf) {
    let image = tmp.join("fs.img");
    let out = metafs(&["mkfs", image.to_str().unwrap(), "--size", "128M"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mnt = tmp.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    (image, mnt)
}

#[test]
fn links_modes_times_rsync_and_git_through_the_mount() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    std::os::unix::fs::symlink("README", src.join("readme-link")).unwrap();
    std::fs::hard_link(src.join("README"), src.join("README.hard")).unwrap();
    std::fs::set_permissions(src.join("README"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let (image, mnt) = mkfs_and_mount(tmp.path());
    let m = mnt.to_str().unwrap();
    let mounted = Mounted::new(&image, &mnt);
    // rsync -a keeps modes, times, symlinks and hard links (-H); a second
    // run, checksumming, finds nothing to do.
    let from = format!("{}/", src.display());
    sh("rsync", &["-aH", &from, &format!("{m}/copy")]);
    let again = sh(
        "rsync",
        &["-aHc", "--itemize-changes", &from, &format!("{m}/copy")],
    );
    assert!(again.trim().is_empty(), "rsync found differences: {again}");
    let md = std::fs::metadata(format!("{m}/copy/README")).unwrap();
    assert_eq!((md.mode() & 0o7777, md.nlink()), (0o640, 2));
    assert_eq!(
        std::fs::read_link(format!("{m}/copy/readme-link")).unwrap(),
        Path::new("README")
    );
    // The small tools.
    sh("cp", &[&format!("{m}/copy/README"), &format!("{m}/own")]);
    sh("ln", &[&format!("{m}/own"), &format!("{m}/third")]);
    sh("ln", &["-s", "copy/README", &format!("{m}/soft")]);
    assert_eq!(sh("cat", &[&format!("{m}/soft")]), "top-level file\n");
    sh("chmod", &["4711", &format!("{m}/third")]);
    sh(
        "touch",
        &["-d", "2001-02-03 04:05:06", &format!("{m}/third")],
    );
    sh("mkfifo", &[&format!("{m}/pipe")]);
    let md = std::fs::metadata(format!("{m}/third")).unwrap();
    assert_eq!((md.mode() & 0o7777, md.nlink()), (0o4711, 2));
    assert_eq!(
        std::fs::metadata(format!("{m}/own")).unwrap().mtime(),
        981_173_106
    );
    assert_eq!(md.mtime(), 981_173_106);
    assert!(std::fs::metadata(format!("{m}/pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    // git: a repository made, added to and committed on the mount.
    let repo = format!("{m}/repo");
    sh("mkdir", &[&repo]);
    sh("cp", &["-r", &format!("{m}/copy/dir-01"), &repo]);
    let git = |args: &[&str]| {
        let mut all = vec![
            "-C",
            &repo,
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.org",
            // No detached auto-maintenance (git 2.47 runs it in the
            // background after a commit): a process left working in the
            // repository keeps the mount busy, and `umount` refuses.
            "-c",
            "maintenance.auto=false",
            "-c",
            "gc.auto=0",
        ];
        all.extend_from_slice(args);
        sh("git", &all)
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "on metafs"]);
    assert!(git(&["log", "--oneline"]).contains("on metafs"));
    assert!(git(&["status", "--porcelain"]).trim().is_empty());
    git(&["fsck", "--strict"]);
    mounted.unmount();
    let out = metafs(&["fsck", image.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "fsck: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // After a remount, everything is as it was left.
    let mounted = Mounted::new(&image, &mnt);
    let again = sh(
        "rsync",
        &["-aHc", "--itemize-changes", &from, &format!("{m}/copy")],
    );
    assert!(again.trim().is_empty(), "after a remount: {again}");
    assert_eq!(
        std::fs::metadata(format!("{m}/third")).unwrap().mtime(),
        981_173_106
    );
    git(&["fsck", "--strict"]);
    mounted.unmount();
}

#[test]
fn the_command_line_refuses_bad_input_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.img");
    std::fs::write(&junk, vec![0x42u8; 8192]).unwrap();
    let out = metafs(&["fsck", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a metafs image"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(
        std::fs::read(&junk).unwrap(),
        vec![0x42u8; 8192],
        "untouched"
    );
    let out = metafs(&["mkfs", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "mkfs never overwrites");
    let out = metafs(&[
        "mkfs",
        tmp.path().join("x.img").to_str().unwrap(),
        "--size",
        "12Q",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = metafs(&["--help"]);
    assert!(out.status.success());
}

#[test]
fn the_bench_runs_every_scenario_in_smoke_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("xfs.json");
    let out = metafs(&[
        "bench",
        "--smoke",
        "--scenario",
        "xfs",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["results"].as_array().unwrap().len(), 8);
    for r in doc["results"].as_array().unwrap() {
        assert!(r["creates_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(doc["ratios"]["per_file_32k"].as_f64().unwrap() > 0.0);
    let out = metafs(&[
        "bench",
        "--smoke",
        "--threads",
        "1,2",
        "--dir",
        tmp.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("creates/s"));
    // One directory filling up: a rate per 1,000 creates.
    let json = tmp.path().join("scale.json");
    let out = metafs(&[
        "bench",
        "--smoke",
        "--scenario",
        "dir-scale",
        "--rounds",
        "1",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["rounds"][0]["rates"].as_array().unwrap().len(), 3);
    assert!(doc["whole_over_small_median"].as_f64().unwrap() > 0.0);
    // The real fs_mark on the mount, bindfs and ext4 (.ci/run installs
    // fsmark and bindfs).
    let json = tmp.path().join("fsmark.json");
    let out = metafs(&[
        "bench",
        "--smoke",
        "--scenario",
        "fs-mark",
        "--rounds",
        "1",
        "--threads",
        "1,2",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for r in doc["results"].as_array().unwrap() {
        for system in ["metafs", "bindfs", "ext4"] {
            assert!(r[system][0].as_f64().unwrap() > 0.0, "{r}");
        }
    }
}
