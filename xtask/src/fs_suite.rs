//! `cargo xtask fs-suite`: metafs checked as ordinary programs see it.
//!
//! Mounts a fresh metafs image through FUSE (`allow_other`, so the suite's
//! switched users reach it) and runs pjdfstest 0.2.2 — the maintained Rust
//! rewrite of the POSIX suite — on it as root, with a `tests` user and a
//! second filesystem for the cross-device cases. Every test must pass but
//! those in [`NOT_APPLICABLE`], each with its reason. Then (unless
//! `--quick`) a 2 GiB file goes through the mount and back byte-exact, and
//! the unmounted image must fsck clean. `--bindfs` also runs the suite on
//! ext4 through bindfs, the FUSE passthrough, for comparison.
//!
//! It installs what it needs: Debian's fuse3 (and bindfs with `--bindfs`),
//! pjdfstest into `target/tools`, the `tests` user.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// Tests that cannot pass on a FUSE mount, with why. A name here must also
/// be skipped or failed by ext4 through bindfs (checked with `--bindfs`).
const NOT_APPLICABLE: &[(&str, &str)] = &[
    (
        "link::link_count_max",
        "pathconf(_PC_LINK_MAX) has no answer on FUSE (glibc knows limits by filesystem magic; FUSE has one magic for all), so the suite cannot find the limit",
    ),
    (
        "erofs",
        "needs `mount -o remount,ro` of the filesystem under test, which FUSE does not offer (bindfs fails these the same way)",
    ),
];

const PJDFSTEST_VERSION: &str = "0.2.2";

fn sh(what: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("fs-suite: {what}: {cmd:?}");
    let st = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    st.success()
        .then_some(())
        .ok_or_else(|| format!("{what} failed ({st})"))
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn apt(pkg: &str) -> Result<(), String> {
    sh(
        "apt-get",
        Command::new("sh").args([
            "-c",
            &format!("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {pkg} >/dev/null"),
        ]),
    )
}

/// Root, FUSE, pjdfstest and the `tests` user; returns pjdfstest's path.
fn prepare(root: &Path, bindfs: bool) -> Result<PathBuf, String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("fs-suite runs as root: pjdfstest switches users and makes devices".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse on this machine".into());
    }
    if !have("fusermount3") {
        apt("fuse3")?;
    }
    if bindfs && !have("bindfs") {
        apt("bindfs")?;
    }
    let tools = root.join("target/tools");
    let bin = tools.join("bin/pjdfstest");
    if !bin.exists() {
        sh(
            "install pjdfstest",
            crate::cargo()
                .args([
                    "install",
                    "--locked",
                    "pjdfstest",
                    "--version",
                    PJDFSTEST_VERSION,
                    "--root",
                ])
                .arg(&tools),
        )?;
    }
    if !Command::new("id")
        .arg("tests")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        sh(
            "add the tests user",
            Command::new("useradd").args(["-U", "tests"]),
        )?;
    }
    Ok(bin)
}

/// A metafs image served on `mnt` by a `metafs mount` child.
struct Mounted {
    child: Child,
    mnt: PathBuf,
}

impl Mounted {
    fn start(metafs: &Path, image: &Path, mnt: &Path) -> Result<Self, String> {
        let mut child = Command::new(metafs)
            .args(["mount", "--allow-other"])
            .arg(image)
            .arg(mnt)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("metafs mount: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if !line.starts_with("mounted") {
            let _ = child.kill();
            return Err(format!("metafs mount did not come up: {line:?}"));
        }
        Ok(Mounted {
            child,
            mnt: mnt.to_owned(),
        })
    }

    fn stop(mut self) -> Result<(), String> {
        sh("unmount", Command::new("umount").arg(&self.mnt))?;
        let st = self.child.wait().map_err(|e| e.to_string())?;
        st.success()
            .then_some(())
            .ok_or_else(|| format!("metafs mount exited {st}"))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            let _ = self.child.wait();
        }
    }
}

/// pjdfstest's counts and the names of the tests it failed or skipped.
#[derive(Debug, Default)]
struct Outcome {
    passed: u64,
    failed: Vec<String>,
    skipped: Vec<(String, String)>,
}

fn pjdfstest(
    bin: &Path,
    dir: &Path,
    second: &Path,
    config: &Path,
    log: &Path,
) -> Result<Outcome, String> {
    let t = Instant::now();
    let out = Command::new(bin)
        .arg("-c")
        .arg(config)
        .arg("-p")
        .arg(dir)
        .arg("-s")
        .arg(second)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("pjdfstest: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    fs::write(log, &text).map_err(|e| e.to_string())?;
    let mut o = Outcome::default();
    let lines: Vec<&str> = text.lines().collect();
    for (k, l) in lines.iter().enumerate() {
        let mut words = l.split_whitespace();
        let (Some(name), Some(verdict), None) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        match verdict {
            "ok" => o.passed += 1,
            "FAILED" => o.failed.push(name.to_owned()),
            "skipped" => {
                let why = lines.get(k + 1).map_or("", |w| w.trim());
                o.skipped.push((name.to_owned(), why.to_owned()));
            }
            _ => {}
        }
    }
    eprintln!(
        "fs-suite: pjdfstest on {}: {} passed, {} failed, {} skipped in {:.0} s (log {})",
        dir.display(),
        o.passed,
        o.failed.len(),
        o.skipped.len(),
        t.elapsed().as_secs_f64(),
        log.display()
    );
    if o.passed == 0 {
        return Err(format!(
            "pjdfstest ran nothing: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(o)
}

fn not_applicable(name: &str) -> Option<&'static str> {
    NOT_APPLICABLE
        .iter()
        .find(|(n, _)| name == *n || name.split("::").any(|part| part.starts_with(n)))
        .map(|(_, why)| *why)
}

/// Writes `len` bytes of a counter-seeded xorshift stream to `path`.
fn pattern_file(path: &Path, len: u64) -> Result<(), String> {
    let mut f = fs::File::create(path).map_err(|e| e.to_string())?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for w in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    f.sync_all().map_err(|e| e.to_string())
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool, String> {
    let open = |p: &Path| fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()));
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba).map_err(|e| e.to_string())?;
        let mut nb = 0;
        while nb < na {
            match fb.read(&mut bb[nb..na]).map_err(|e| e.to_string())? {
                0 => return Ok(false),
                k => nb += k,
            }
        }
        if na == 0 {
            return Ok(fb.read(&mut bb).map_err(|e| e.to_string())? == 0);
        }
        if ba[..na] != bb[..na] {
            return Ok(false);
        }
    }
}

/// The 2 GiB round trip: written through the mount by `cp`, read back and
/// compared, then again after a remount.
fn big_file(metafs: &Path, image: &Path, mnt: &Path, work: &Path) -> Result<(), String> {
    let src = work.join("big.src");
    pattern_file(&src, 2 << 30)?;
    let m = Mounted::start(metafs, image, mnt)?;
    let dst = mnt.join("big");
    let t = Instant::now();
    sh("copy 2 GiB in", Command::new("cp").arg(&src).arg(&dst))?;
    sh("sync it", Command::new("sync").arg(&dst))?;
    let secs = t.elapsed().as_secs_f64();
    let ok = same_bytes(&src, &dst)?;
    m.stop()?;
    let m = Mounted::start(metafs, image, mnt)?;
    let again = same_bytes(&src, &dst)?;
    m.stop()?;
    let _ = fs::remove_file(&src);
    eprintln!("fs-suite: 2 GiB in through the mount in {secs:.1} s; byte-exact back: {ok}, after a remount: {again}");
    (ok && again)
        .then_some(())
        .ok_or_else(|| "the 2 GiB file did not come back byte-exact".into())
}

fn fsck(metafs: &Path, image: &Path) -> Result<(), String> {
    sh("fsck", Command::new(metafs).arg("fsck").arg(image))
}

/// `cargo xtask fs-suite [--quick] [--bindfs]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "--quick");
    let bindfs = args.iter().any(|a| a == "--bindfs");
    if let Some(a) = args.iter().find(|a| *a != "--quick" && *a != "--bindfs") {
        return Err(format!(
            "fs-suite: unknown argument {a} (--quick, --bindfs)"
        ));
    }
    let root = std::env::current_dir().map_err(|e| e.to_string())?;
    let pjd = prepare(&root, bindfs)?;
    sh(
        "build metafs",
        crate::cargo().args(["build", "--release", "-p", "metafs"]),
    )?;
    let metafs = root.join("target/release/metafs");
    let work = root.join("target/fs-suite");
    let _ = fs::remove_dir_all(&work);
    let (mnt, second, image) = (work.join("mnt"), work.join("second"), work.join("fs.img"));
    for d in [&mnt, &second] {
        fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let config = work.join("pjdfstest.toml");
    fs::write(
        &config,
        "[features]\nposix_fallocate = {}\nrename_ctime = {}\nutime_now = {}\nutimensat = {}\n\
         [settings]\nnaptime = 0.001\nallow_remount = false\n\
         [dummy_auth]\nentries = [[\"nobody\", \"nogroup\"], [\"tests\", \"tests\"]]\n",
    )
    .map_err(|e| e.to_string())?;
    sh(
        "mkfs",
        Command::new(&metafs)
            .args(["mkfs", "--size", "4G"])
            .arg(&image),
    )?;
    let m = Mounted::start(&metafs, &image, &mnt)?;
    sh(
        "open the mount to the suite's users",
        Command::new("chmod").arg("0777").arg(&mnt),
    )?;
    let o = pjdfstest(
        &pjd,
        &mnt,
        &second,
        &config,
        &work.join("pjdfstest-metafs.log"),
    )?;
    m.stop()?;
    fsck(&metafs, &image)?;
    let mut wrong: Vec<String> = o.failed.iter().map(|n| format!("{n}: FAILED")).collect();
    for (n, why) in &o.skipped {
        match not_applicable(n) {
            Some(_) => {}
            None => wrong.push(format!("{n}: skipped ({why})")),
        }
    }
    for (n, why) in NOT_APPLICABLE {
        let count = o
            .skipped
            .iter()
            .filter(|(s, _)| not_applicable(s) == Some(why))
            .count();
        eprintln!("fs-suite: not applicable ({count}): {n}: {why}");
    }
    if bindfs {
        compare_bindfs(&pjd, &work, &second, &config, &o)?;
    }
    if !wrong.is_empty() {
        return Err(format!("pjdfstest on metafs:\n  {}", wrong.join("\n  ")));
    }
    println!(
        "fs-suite: pjdfstest {PJDFSTEST_VERSION} on metafs: {} passed, 0 failed, {} not applicable",
        o.passed,
        o.skipped.len()
    );
    if !quick {
        big_file(&metafs, &image, &mnt, &work)?;
        fsck(&metafs, &image)?;
    }
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// The same suite on ext4 through bindfs: prints its counts, and fails if
/// a test metafs calls not applicable passes there.
fn compare_bindfs(
    pjd: &Path,
    work: &Path,
    second: &Path,
    config: &Path,
    meta: &Outcome,
) -> Result<(), String> {
    let (under, bmnt) = (work.join("under"), work.join("bindfs"));
    for d in [&under, &bmnt] {
        fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    sh(
        "bindfs",
        Command::new("bindfs")
            .args(["-o", "allow_other,dev,suid"])
            .arg(&under)
            .arg(&bmnt),
    )?;
    let _ = Command::new("chmod").arg("0777").arg(&bmnt).status();
    let o = pjdfstest(
        pjd,
        &bmnt,
        second,
        config,
        &work.join("pjdfstest-bindfs.log"),
    );
    sh("unmount bindfs", Command::new("umount").arg(&bmnt))?;
    let o = o?;
    println!(
        "fs-suite: pjdfstest on ext4 through bindfs: {} passed, {} failed, {} skipped",
        o.passed,
        o.failed.len(),
        o.skipped.len()
    );
    let passed_there: Vec<&String> = meta
        .skipped
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !o.failed.contains(n) && !o.skipped.iter().any(|(s, _)| s == *n))
        .collect();
    if !passed_there.is_empty() {
        return Err(format!(
            "not applicable on metafs but passed through bindfs: {passed_there:?}"
        ));
    }
    Ok(())
}

/// `cargo xtask bench-fs [ARGS...]`: fsmark and bindfs installed if
/// missing, then `metafs bench --scenario fs-mark ARGS`.
pub fn bench_fs(args: &[String]) -> Result<(), String> {
    for (tool, pkg) in [
        ("fs_mark", "fsmark"),
        ("bindfs", "bindfs"),
        ("fusermount3", "fuse3"),
    ] {
        if !have(tool) {
            apt(pkg)?;
        }
    }
    sh(
        "bench-fs",
        crate::cargo()
            .args([
                "run",
                "--release",
                "-p",
                "metafs",
                "--",
                "bench",
                "--scenario",
                "fs-mark",
            ])
            .args(args),
    )
}
