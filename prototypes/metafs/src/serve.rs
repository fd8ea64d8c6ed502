//! `metafs mount`: an image served through FUSE until unmounted, in the
//! foreground or as a daemon (`--background`, what `mount(8)`'s helper
//! runs), with an optional log of its life.

use clap::Args;
use journal_core::vfs::{OpenOptions, OsVfs, Vfs};
use metafs::fuse::MountConfig;
use metafs::{Fs, MountOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The arguments of `metafs mount`.
#[derive(Debug, Clone, Args)]
pub struct MountArgs {
    /// The image file.
    pub image: PathBuf,
    /// The mount point (an existing directory).
    pub dir: PathBuf,
    /// Commit the running transaction this often, milliseconds (the
    /// kernel does not forward sync(2) to FUSE).
    #[arg(long, default_value_t = 1000)]
    pub commit_ms: u64,
    /// Let every user reach the mount, not only its owner (FUSE's
    /// `allow_other`; non-root mounters need `user_allow_other` in
    /// /etc/fuse.conf). Access is still checked against each file's
    /// mode and owner.
    #[arg(long)]
    pub allow_other: bool,
    /// Memory for metadata blocks, MiB (the directory indexes may
    /// hold a name per 64 bytes of it besides; see
    /// `MountOptions::cache_bytes`).
    #[arg(long, default_value_t = 64)]
    pub cache_mib: usize,
    /// Mount options, comma-separated, as `mount -o` takes them:
    /// fsname=NAME, allow_other, ro, rw, relatime, strictatime, noatime,
    /// nodiratime, nosuid, nodev, noexec, commit=SECONDS, cache=MIB, ...
    /// (see `MountConfig::apply_options`).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// The mount's source in the mount table (FUSE's `fsname`) [default:
    /// the image's absolute path].
    #[arg(long)]
    pub fsname: Option<String>,
    /// Serve in the background: return once the mount is live, leaving a
    /// daemon that serves it until it is unmounted (its stdio closed, its
    /// messages in the log: `--log`, by default IMAGE.log).
    #[arg(long)]
    pub background: bool,
    /// Append the daemon's life to this file: mounted, unmounted, every
    /// error and panic (a log with a `mounted` line and no `exited` line
    /// is a daemon that died).
    #[arg(long)]
    pub log: Option<PathBuf>,
}

/// A log file, appended to line by line. Opened `O_APPEND`: each line is
/// one write at the end of the file as it is then, so the daemons of
/// successive mounts of an image may share its log — the next mount's
/// daemon starts as soon as this one lets go of the image, before this
/// one's last line (the `exited` line, written after the checkpoint) is
/// written; a daemon keeping its own end would write that line over the
/// next one's `mounted` (seen under xfstests: a daemon that looked dead).
pub struct Log {
    file: Box<dyn journal_core::vfs::VfsFile>,
}

impl Log {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path) -> Result<Arc<Log>, String> {
        let file = OsVfs::new()
            .open(path, OpenOptions::append().mode(0o644))
            .map_err(|e| format!("log {}: {e}", path.display()))?;
        Ok(Arc::new(Log { file }))
    }

    /// Appends `line`, stamped with the time and this process's id
    /// (a failed write is dropped: the log must not stop the daemon).
    pub fn line(&self, line: &str) {
        let t = metafs::Time::now();
        let text = format!(
            "{}.{:03} metafs[{}]: {line}\n",
            t.sec,
            t.nsec / 1_000_000,
            std::process::id()
        );
        // O_APPEND: the offset is the end, whatever is passed.
        let _ = self.file.write_at(text.as_bytes(), 0);
    }
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// `metafs mount`.
pub fn mount(args: &MountArgs) -> Result<ExitCode, String> {
    let image = absolute(&args.image)?;
    let mut config = MountConfig {
        commit_every: Duration::from_millis(args.commit_ms.max(1)),
        allow_other: args.allow_other,
        fsname: image.display().to_string(),
        ..MountConfig::default()
    };
    let mut options = MountOptions {
        cache_bytes: args.cache_mib.saturating_mul(1 << 20),
        ..MountOptions::default()
    };
    for o in &args.options {
        config.apply_options(o, &mut options)?;
    }
    if let Some(name) = &args.fsname {
        config.fsname = name.clone();
    }
    if args.background {
        return background(args, &image);
    }
    let log = args.log.as_deref().map(Log::open).transpose()?;
    if let Some(log) = &log {
        let l = log.clone();
        std::panic::set_hook(Box::new(move |info| l.line(&format!("panic: {info}"))));
    }
    let say = |s: &str| match &log {
        Some(l) => l.line(s),
        None => eprintln!("metafs: {s}"),
    };
    let started = Instant::now();
    let r = serve(&image, &args.dir, config, options, &say);
    match &r {
        Ok(()) => say(&format!(
            "exited: {} unmounted from {} and checkpointed after {:.1} s",
            image.display(),
            args.dir.display(),
            started.elapsed().as_secs_f64()
        )),
        Err(e) => say(&format!("exited with an error: {e}")),
    }
    r.map(|()| ExitCode::SUCCESS)
}

fn serve(
    image: &Path,
    dir: &Path,
    config: MountConfig,
    options: MountOptions,
    say: &dyn Fn(&str),
) -> Result<(), String> {
    let fs = Arc::new(Fs::mount(image, options).map_err(|e| format!("{}: {e}", image.display()))?);
    let fs = metafs::fuse::mount(fs, dir, config, || {
        let line = format!("mounted {} on {}", image.display(), dir.display());
        say(&line);
        // Scripts, tests and `--background` wait for this line.
        println!("{line}");
    })
    .map_err(|e| format!("mount {}: {e}", dir.display()))?;
    fs.close().map_err(|e| e.to_string())
}

/// `--background`: runs this command again in the foreground as a child
/// of its own (its own process group, working in `/`, stdin closed, its
/// stderr the log's when there is one), returns once it says it is
/// mounted — silently — and leaves it serving.
fn background(args: &MountArgs, image: &Path) -> Result<ExitCode, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(image)
        .arg(absolute(&args.dir)?)
        .arg("--commit-ms")
        .arg(args.commit_ms.to_string())
        .arg("--cache-mib")
        .arg(args.cache_mib.to_string());
    if args.allow_other {
        cmd.arg("--allow-other");
    }
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    if let Some(n) = &args.fsname {
        cmd.arg("--fsname").arg(n);
    }
    // Nothing of the caller's stays open in the daemon: a caller reading
    // our output to its end must not wait for the daemon's.
    let log = match &args.log {
        Some(l) => absolute(l)?,
        None => {
            let mut l = image.as_os_str().to_owned();
            l.push(".log");
            PathBuf::from(l)
        }
    };
    cmd.arg("--log").arg(&log).stderr(Stdio::null());
    use std::os::unix::process::CommandExt;
    cmd.current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("metafs mount: {e}"))?;
    let out = child.stdout.take().ok_or("no stdout from the daemon")?;
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.starts_with("mounted") {
        // Silent, as mount helpers are: the caller's output is a test's.
        return Ok(ExitCode::SUCCESS);
    }
    let st = child.wait().map_err(|e| e.to_string())?;
    Err(format!(
        "the daemon exited ({st}) before mounting: {}",
        last_line(&log).unwrap_or_else(|| format!("see {}", log.display()))
    ))
}

/// The last line of a log (what a daemon that failed said last).
fn last_line(path: &Path) -> Option<String> {
    let f = OsVfs::new().open(path, OpenOptions::read()).ok()?;
    let len = f.len().ok()?;
    let want = len.min(4096);
    let mut buf = vec![0u8; want as usize];
    let n = f.read_at(&mut buf, len - want).ok()?;
    let text = String::from_utf8_lossy(&buf[..n]);
    let line = text.lines().last()?;
    Some(line.split_once("]: ").map_or(line, |(_, w)| w).to_owned())
}

#[cfg(test)]
mod tests {
    use super::{Log, OpenOptions, OsVfs, Vfs};

    #[test]
    fn two_daemons_sharing_a_log_lose_none_of_each_others_lines() {
        // The next mount's daemon opens the log before this one writes
        // its `exited` line.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image.log");
        let first = Log::open(&path).unwrap();
        first.line("mounted by the first");
        let second = Log::open(&path).unwrap();
        second.line("mounted by the second");
        first.line("exited: the first");
        second.line("exited: the second");
        let f = OsVfs::new().open(&path, OpenOptions::read()).unwrap();
        let mut bytes = vec![0; f.len().unwrap() as usize];
        f.read_exact_at(&mut bytes, 0).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.split_once("]: ").unwrap().1)
            .collect();
        assert_eq!(
            lines,
            [
                "mounted by the first",
                "mounted by the second",
                "exited: the first",
                "exited: the second"
            ]
        );
    }
}
