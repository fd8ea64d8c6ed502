//! What a run stands on: Debian's packages, xfstests built at its pinned
//! commit, metafs and its mount helpers, and per filesystem a stage —
//! fresh images, loop devices, mount points and the `HOST_OPTIONS` file
//! `./check` reads.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The xfstests commit every run builds (kdave/xfstests's master, which
/// follows the kernel.org tree, on 2025-12-23).
pub const PIN: &str = "63a29724a85f1999e49bf0a9bf0d22643b6116e5";

/// Where its source comes from unless told otherwise.
pub const DEFAULT_SOURCE: &str = "https://github.com/kdave/xfstests";

/// Debian's packages a run needs: xfstests's build dependencies, the tools
/// its tests call, FUSE, bindfs.
pub const PACKAGES: &[&str] = &[
    "acl",
    "attr",
    "autoconf",
    "automake",
    "bc",
    "bindfs",
    "dbench",
    "e2fsprogs",
    "fio",
    "fuse3",
    "gawk",
    "gcc",
    "git",
    "indent",
    "libacl1-dev",
    "libaio-dev",
    "libattr1-dev",
    "libcap-dev",
    "libgdbm-compat-dev",
    "libgdbm-dev",
    "libtool",
    "libtool-bin",
    "liburing-dev",
    "make",
    "pkg-config",
    "psmisc",
    "python3",
    "quota",
    "sed",
    "sqlite3",
    "util-linux",
    "uuid-dev",
    "uuid-runtime",
    "xfslibs-dev",
    "xfsprogs",
];

/// Our one change to xfstests: its `_check_test_fs` and `_check_dev_fs`
/// do nothing for `FSTYP=fuse` ("no way to check consistency for fuse");
/// with it they call `_check_fuse_filesystem DEVICE` when the
/// configuration defines one — metafs's does: unmount, `metafs fsck`,
/// mount again — so every test is followed by an fsck of what it used.
/// Without the function (bindfs) they still do nothing.
pub const HOOK_PATCH: &str = "common/rc: _check_test_fs and _check_dev_fs call _check_fuse_filesystem for FSTYP=fuse when the configuration defines it";

const HOOK_FROM: &str = "    fuse)\n\t# no way to check consistency for fuse\n\t;;";

fn hook_to(dev: &str) -> String {
    format!(
        "    fuse)\n\tif declare -F _check_fuse_filesystem >/dev/null; then\n\t\t_check_fuse_filesystem {dev}\n\tfi\n\t;;"
    )
}

pub(super) fn sh(what: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("xfstests: {what}: {cmd:?}");
    let st = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    st.success()
        .then_some(())
        .ok_or_else(|| format!("{what} failed ({st})"))
}

pub(super) fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed ({})", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f", "${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

/// Root, FUSE, packages, users, and xfstests built; returns its directory.
pub fn prepare(root: &Path, source: &str) -> Result<PathBuf, String> {
    if output(Command::new("id").arg("-u"))? != "0" {
        return Err("xfstests runs as root: it makes filesystems and mounts them".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse on this machine".into());
    }
    let missing = missing_packages();
    if !missing.is_empty() {
        sh(
            "apt-get",
            Command::new("sh").args([
                "-c",
                &format!(
                    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {} >/dev/null",
                    missing.join(" ")
                ),
            ]),
        )?;
    }
    // The users and groups xfstests's tests switch to.
    for (user, home) in [("fsgqa", true), ("fsgqa2", true), ("123456-fsgqa", false)] {
        if Command::new("id")
            .arg(user)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            continue;
        }
        let mut cmd = Command::new("useradd");
        if home {
            cmd.arg("-m");
        }
        sh("useradd", cmd.arg(user))?;
    }
    build_xfstests(root, source)
}

/// xfstests at [`PIN`] with the hook, built under `target/tools`.
fn build_xfstests(root: &Path, source: &str) -> Result<PathBuf, String> {
    let dir = root.join("target/tools/xfstests");
    let marker = dir.join(".metafs-built");
    if fs::read_to_string(&marker).is_ok_and(|m| m.trim() == PIN) {
        return Ok(dir);
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(root.join("target/tools")).map_err(|e| e.to_string())?;
    sh(
        "fetch xfstests",
        Command::new("git")
            .args(["clone", "-q", "--no-checkout", source])
            .arg(&dir),
    )?;
    sh(
        "check out the pinned commit",
        Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args(["checkout", "-q", PIN]),
    )?;
    let rc = dir.join("common/rc");
    let text = fs::read_to_string(&rc).map_err(|e| e.to_string())?;
    if text.matches(HOOK_FROM).count() != 2 {
        return Err(format!(
            "{}: not the two fuse branches the hook replaces",
            rc.display()
        ));
    }
    let text = text.replacen(HOOK_FROM, &hook_to("$TEST_DEV"), 1).replacen(
        HOOK_FROM,
        &hook_to("$device"),
        1,
    );
    fs::write(&rc, text).map_err(|e| e.to_string())?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    sh(
        "build xfstests",
        Command::new("make")
            .arg("-C")
            .arg(&dir)
            .arg(format!("-j{jobs}"))
            .stdout(Stdio::null()),
    )?;
    fs::write(&marker, PIN).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// A few lines on what a run ran on, for the document.
pub fn describe(xfstests: &Path) -> Result<String, String> {
    let head = output(
        Command::new("git")
            .arg("-C")
            .arg(xfstests)
            .args(["rev-parse", "HEAD"]),
    )?;
    let diff = output(
        Command::new("git")
            .arg("-C")
            .arg(xfstests)
            .args(["diff", "--stat"]),
    )?;
    let kernel = output(Command::new("uname").args(["-r"]))?;
    let debian = fs::read_to_string("/etc/debian_version").unwrap_or_default();
    Ok(format!(
        "xfstests {head} ({}: {HOOK_PATCH}), Linux {kernel}, Debian {}, {} CPUs",
        diff.lines().last().unwrap_or("nothing changed").trim(),
        debian.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    ))
}

/// Builds metafs (release) and links the mount helpers into /sbin:
/// metafs's own (`mount.fuse.metafs`, `umount.fuse`: see metafs's
/// `helper.rs`) and bindfs's ([`BINDFS_HELPER`]); returns the tools a
/// stage names in its configuration.
pub fn build_metafs(root: &Path) -> Result<Tools, String> {
    sh(
        "build metafs",
        crate::cargo().args(["build", "--release", "-p", "metafs"]),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    // A copy of the run's own: a build during the run leaves it alone. It
    // replaces the last by a rename, so a run still going on (another
    // filesystem's) never finds the helper missing.
    let bin = root.join("target/tools/bin/metafs");
    let bindfs = root.join("target/tools/bin/mount.fuse.bindfs");
    fs::create_dir_all(root.join("target/tools/bin")).map_err(|e| e.to_string())?;
    let fresh = bin.with_extension(format!("new.{}", std::process::id()));
    fs::copy(target.join("release/metafs"), &fresh).map_err(|e| format!("copy metafs: {e}"))?;
    fs::rename(&fresh, &bin).map_err(|e| format!("install metafs: {e}"))?;
    for (file, text) in [
        (&bindfs, BINDFS_HELPER),
        (&umount_by_source(root), UMOUNT_BY_SOURCE),
    ] {
        if fs::read_to_string(file).is_ok_and(|t| t == text) {
            continue;
        }
        fs::write(file, text).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(file, fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    }
    for (link, to) in [
        ("/sbin/mount.fuse.metafs", &bin),
        ("/sbin/umount.fuse", &bin),
        ("/sbin/mount.fuse.bindfs", &bindfs),
    ] {
        let link = Path::new(link);
        match fs::symlink_metadata(link) {
            Ok(m) if !m.file_type().is_symlink() => {
                return Err(format!("{} exists and is not our link", link.display()))
            }
            Ok(_) if fs::read_link(link).is_ok_and(|t| t == *to) => continue,
            Ok(_) => fs::remove_file(link).map_err(|e| e.to_string())?,
            Err(_) => {}
        }
        std::os::unix::fs::symlink(to, link).map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(Tools {
        metafs: bin,
        umount_by_source: umount_by_source(root),
    })
}

/// What a stage's configuration names.
pub struct Tools {
    /// metafs's binary.
    pub metafs: PathBuf,
    /// [`UMOUNT_BY_SOURCE`]'s script.
    pub umount_by_source: PathBuf,
}

/// `mount.fuse.bindfs UNDER DIR -o OPTIONS`: `bindfs -o OPTIONS UNDER DIR`
/// (Debian's `mount.fuse3` would start it too, but with `nosuid,nodev`
/// whatever the options say).
const BINDFS_HELPER: &str = r#"#!/bin/sh
# Written by `cargo xtask xfstests` (xtask/src/xfstests/setup.rs).
src=$1 dir=$2
shift 2
opts=
while [ $# -gt 0 ]; do
	case $1 in
	-o) opts="$opts,$2"; shift 2 ;;
	-o*) opts="$opts,${1#-o}"; shift ;;
	*) shift ;;
	esac
done
case "$opts," in
*,remount,*) exec mount -i -o "${opts#,}" "$dir" ;;
esac
exec bindfs -o "${opts#,}" "$src" "$dir"
"#;

/// The bindfs stage's `UMOUNT_PROG`: xfstests unmounts a FUSE filesystem
/// by its "device", and bindfs's is its source directory (bindfs sets its
/// `fsname` to it, whatever the options say), which `umount` takes for a
/// mount point; so a directory that is no mount point but a FUSE mount's
/// source is replaced by that mount's mount point.
const UMOUNT_BY_SOURCE: &str = r#"#!/bin/bash
# Written by `cargo xtask xfstests` (xtask/src/xfstests/setup.rs).
args=()
for a in "$@"; do
	if [[ $a != -* && -d $a ]] && ! mountpoint -q "$a"; then
		t=$(findmnt -n -l -t fuse -o TARGET -S "$a" | tail -1)
		[ -n "$t" ] && a=$t
	fi
	args+=("$a")
done
exec umount "${args[@]}"
"#;

fn umount_by_source(root: &Path) -> PathBuf {
    root.join("target/tools/bin/umount-by-source")
}

/// One filesystem's stage: its devices, mount points, configuration.
pub struct Stage {
    /// ext4, bindfs or metafs.
    pub fs: &'static str,
    /// Its directory under `target/xfstests`.
    pub dir: PathBuf,
    /// The `HOST_OPTIONS` file.
    pub config: PathBuf,
    /// Where `./check` keeps its results.
    pub results: PathBuf,
    /// Loop devices to detach, mounts to unmount (last first).
    loops: Vec<String>,
    mounts: Vec<PathBuf>,
}

const DEV_SIZE: &str = "4G";
const HOST_SIZE: &str = "12G";

impl Stage {
    /// A fresh stage for `fs`.
    pub fn new(work: &Path, fs: &'static str, tools: &Tools) -> Result<Stage, String> {
        let metafs = &tools.metafs;
        let dir = work.join(fs);
        let _ = Command::new("umount")
            .arg("-R")
            .arg(&dir)
            .stderr(Stdio::null())
            .status();
        let _ = fs::remove_dir_all(&dir);
        let mut s = Stage {
            fs,
            config: dir.join("config"),
            results: dir.join("results"),
            dir: dir.clone(),
            loops: Vec::new(),
            mounts: Vec::new(),
        };
        let (test_mnt, scratch_mnt) = (dir.join("mnt/test"), dir.join("mnt/scratch"));
        for d in [&test_mnt, &scratch_mnt] {
            fs::create_dir_all(d).map_err(|e| e.to_string())?;
        }
        let vars = match fs {
            "ext4" => {
                let test = s.loop_device("test.img")?;
                let scratch = s.loop_device("scratch.img")?;
                sh(
                    "mkfs.ext4",
                    Command::new("mkfs.ext4").args(["-q", "-F", &test]),
                )?;
                format!("export FSTYP=ext4\nexport TEST_DEV={test}\nexport SCRATCH_DEV={scratch}\n")
            }
            "bindfs" => {
                let host = s.host()?;
                let (t, sc) = (host.join("test"), host.join("scratch"));
                for d in [&t, &sc] {
                    fs::create_dir_all(d).map_err(|e| e.to_string())?;
                }
                format!(
                    "export FSTYP=fuse\nexport FUSE_SUBTYP=.bindfs\nexport TEST_DEV={}\nexport SCRATCH_DEV={}\n\
                     export FUSE_MOUNT_OPTIONS=\"-o allow_other,dev,suid\"\nexport UMOUNT_PROG={}\n",
                    t.display(),
                    sc.display(),
                    tools.umount_by_source.display()
                )
            }
            _ => {
                let host = s.host()?;
                let (t, sc) = (host.join("test.img"), host.join("scratch.img"));
                for img in [&t, &sc] {
                    sh(
                        "metafs mkfs",
                        Command::new(metafs)
                            .args(["mkfs", "--size", DEV_SIZE])
                            .arg(img),
                    )?;
                }
                format!(
                    "export FSTYP=fuse\nexport FUSE_SUBTYP=.metafs\nexport TEST_DEV={}\nexport SCRATCH_DEV={}\n\
                     export FUSE_MOUNT_OPTIONS=\"-o allow_other\"\nexport METAFS_BIN={}\n{}",
                    t.display(),
                    sc.display(),
                    metafs.display(),
                    METAFS_FSCK_HOOK
                )
            }
        };
        let config = format!(
            "{vars}export TEST_DIR={}\nexport SCRATCH_MNT={}\nexport RESULT_BASE={}\n",
            test_mnt.display(),
            scratch_mnt.display(),
            s.results.display()
        );
        fs::write(&s.config, config).map_err(|e| e.to_string())?;
        Ok(s)
    }

    /// A sparse file of [`DEV_SIZE`] under the stage, on a loop device.
    fn loop_device(&mut self, name: &str) -> Result<String, String> {
        let img = self.dir.join(name);
        sh(
            "truncate",
            Command::new("truncate").args(["-s", DEV_SIZE]).arg(&img),
        )?;
        let dev = output(Command::new("losetup").args(["-f", "--show"]).arg(&img))?;
        self.loops.push(dev.clone());
        Ok(dev)
    }

    /// An ext4 of [`HOST_SIZE`] on a loop device, mounted at `host`: what
    /// bindfs passes through to, and where metafs's images live.
    fn host(&mut self) -> Result<PathBuf, String> {
        let img = self.dir.join("host.img");
        sh(
            "truncate",
            Command::new("truncate").args(["-s", HOST_SIZE]).arg(&img),
        )?;
        sh(
            "mkfs.ext4",
            Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img),
        )?;
        let dev = output(Command::new("losetup").args(["-f", "--show"]).arg(&img))?;
        self.loops.push(dev.clone());
        let host = self.dir.join("host");
        fs::create_dir_all(&host).map_err(|e| e.to_string())?;
        sh(
            "mount the host ext4",
            Command::new("mount").arg(&dev).arg(&host),
        )?;
        self.mounts.push(host.clone());
        Ok(host)
    }

    /// What metafs's daemons logged: starts, clean exits, errors, panics.
    /// Their logs are copied into the results first (the host filesystem
    /// they are on goes with the stage).
    pub fn daemon_report(&self) -> Result<DaemonReport, String> {
        for name in DAEMON_LOGS {
            let log = self.dir.join("host").join(name);
            if log.exists() {
                fs::copy(&log, self.results.join(name)).map_err(|e| format!("{name}: {e}"))?;
            }
        }
        Ok(DaemonReport::from_logs(&self.results))
    }

    /// Unmounts what is still mounted under the stage, detaches its loop
    /// devices, removes its images (the results stay).
    pub fn teardown(mut self) -> Result<(), String> {
        for m in [self.dir.join("mnt/test"), self.dir.join("mnt/scratch")] {
            let _ = Command::new("umount")
                .arg(&m)
                .stderr(Stdio::null())
                .status();
        }
        for m in self.mounts.drain(..).rev() {
            sh("unmount the host", Command::new("umount").arg(&m))?;
        }
        for l in self.loops.drain(..).rev() {
            sh("detach", Command::new("losetup").args(["-d", &l]))?;
        }
        for img in ["test.img", "scratch.img", "host.img"] {
            let _ = fs::remove_file(self.dir.join(img));
        }
        Ok(())
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        for m in [self.dir.join("mnt/test"), self.dir.join("mnt/scratch")] {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&m)
                .stderr(Stdio::null())
                .status();
        }
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        for l in self.loops.iter().rev() {
            let _ = Command::new("losetup").args(["-d", l]).status();
        }
    }
}

/// metafs's daemons over a run, from their logs.
#[derive(Debug, Default, Clone)]
pub struct DaemonReport {
    /// Mounts served.
    pub starts: usize,
    /// Daemons that unmounted, checkpointed and exited cleanly.
    pub clean_exits: usize,
    /// Errors and panics, one line each.
    pub problems: Vec<String>,
}

/// The daemons' logs, beside their images.
const DAEMON_LOGS: [&str; 2] = ["test.img.log", "scratch.img.log"];

impl DaemonReport {
    /// What the logs in `dir` say.
    pub fn from_logs(dir: &Path) -> DaemonReport {
        let mut r = DaemonReport::default();
        for name in DAEMON_LOGS {
            let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
            for line in text.lines() {
                let what = line.split_once("]: ").map_or(line, |(_, w)| w);
                if what.starts_with("mounted ") {
                    r.starts += 1;
                } else if what.starts_with("exited: ") {
                    r.clean_exits += 1;
                } else if what.starts_with("exited with an error") || what.starts_with("panic") {
                    r.problems.push(format!("{name}: {what}"));
                }
            }
        }
        r
    }
}

/// `_check_fuse_filesystem` for metafs (see [`HOOK_PATCH`]): the device
/// unmounted if mounted (the unmount helper returns once the daemon has
/// let go of the image; an unmount that finds the mount busy is tried
/// again, and one that never succeeds fails the test rather than fsck a
/// live image), `metafs fsck` on it, mounted again as it was.
const METAFS_FSCK_HOOK: &str = r#"
_check_fuse_filesystem()
{
	local device=$1 ok=1 opts
	local mnt=$(findmnt -n -l -o TARGET,SOURCE -t fuse | awk -v d="$device" '$2 == d { print $1; exit }')
	if [ -n "$mnt" ]; then
		# A statfs of every mount (df, findmnt -D: anything on the
		# machine) holds the mount for an instant: an unmount that
		# meets one says "busy". Tried again, a few times.
		local try
		for try in 1 2 3 4 5 6 7 8 9 10; do
			$UMOUNT_PROG "$mnt" 2>> $seqres.full && break
			sleep 1
		done
		if findmnt -n "$mnt" > /dev/null; then
			_log_err "_check_fuse_filesystem: $mnt stays busy: not unmounted, not checked"
			status=1
			[ "$iam" != "check" ] && _exit 1
			return 1
		fi
	fi
	if ! $METAFS_BIN fsck "$device" > $tmp.fsck 2>&1; then
		_log_err "_check_fuse_filesystem: metafs on $device is inconsistent"
		echo "*** metafs fsck output ***" >> $seqres.full
		cat $tmp.fsck >> $seqres.full
		echo "*** end metafs fsck output" >> $seqres.full
		ok=0
	fi
	rm -f $tmp.fsck
	if [ -n "$mnt" ]; then
		opts="$MOUNT_OPTIONS"
		[ "$device" = "$TEST_DEV" ] && opts="$TEST_FS_MOUNT_OPTS"
		_mount -t fuse.metafs $opts "$device" "$mnt" || ok=0
	fi
	if [ $ok -eq 0 ]; then
		status=1
		[ "$iam" != "check" ] && _exit 1
		return 1
	fi
	return 0
}
"#;
