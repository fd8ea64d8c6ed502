//! `metafs bench --scenario fs-mark`: the real fs_mark (Debian's `fsmark`)
//! on a metafs mount, on ext4 through bindfs (the FUSE passthrough) and on
//! native ext4, all in directories of the same disk, in one run: 0-byte
//! files, an fsync before each close, a directory per thread, at each
//! thread count; rounds interleaved (the systems' order turns each round),
//! medians with their ranges. Needs root, /dev/fuse, `fs_mark` and
//! `bindfs` (`cargo xtask bench-fs` installs them).

use crate::bench::BenchArgs;
use bench_harness::{median, table, write_json};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The three systems, in the order of the first round.
const SYSTEMS: [&str; 3] = ["metafs", "ext4 via bindfs", "ext4"];

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn mkdir(d: &Path) -> Result<(), String> {
    use journal_core::vfs::Vfs;
    journal_core::vfs::OsVfs::new()
        .create_dir_all(d)
        .map_err(|e| format!("{}: {e}", d.display()))
}

/// A FUSE server (metafs or bindfs) mounted on `dir`; unmounted on drop.
struct Served {
    child: Option<Child>,
    dir: PathBuf,
}

impl Served {
    fn metafs(image: &Path, dir: &Path) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .arg("mount")
            .arg(image)
            .arg(dir)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("metafs mount: {e}"))?;
        let mut line = String::new();
        let out = child.stdout.take().ok_or("no stdout")?;
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let served = Served {
            child: Some(child),
            dir: dir.to_owned(),
        };
        if !line.starts_with("mounted") {
            return Err(format!("metafs mount said {line:?}"));
        }
        Ok(served)
    }

    fn bindfs(under: &Path, dir: &Path) -> Result<Self, String> {
        run(Command::new("bindfs").arg(under).arg(dir))?;
        Ok(Served {
            child: None,
            dir: dir.to_owned(),
        })
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

/// One fs_mark run: `threads` threads, each `files` 0-byte files with an
/// fsync before close in its own new directory under `root/sub`; files/s.
/// (The directories are named relative to `root`, its working directory:
/// fs_mark copies its command line into a fixed buffer that sixteen long
/// paths overflow.)
fn fs_mark(root: &Path, sub: &str, tag: &str, threads: usize, files: usize) -> Result<f64, String> {
    let mut cmd = Command::new("fs_mark");
    cmd.current_dir(root);
    for t in 0..threads {
        let d = format!("{sub}/{tag}-t{t}");
        mkdir(&root.join(&d))?;
        cmd.arg("-d").arg(d);
    }
    run(&mut Command::new("sync"))?;
    let n = files.to_string();
    let t = threads.to_string();
    let out = run(cmd.args(["-t", &t, "-n", &n, "-s", "0", "-S", "1", "-k", "-L", "1"]))?;
    // The result line: FSUse% Count Size Files/sec App-overhead.
    out.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 5).then(|| w[3].parse::<f64>().ok()).flatten()
        })
        .next()
        .ok_or_else(|| format!("no result line from fs_mark: {out}"))
}

/// `metafs bench --scenario fs-mark`.
pub fn bench(args: &BenchArgs, root: &Path, files: usize) -> Result<(), String> {
    for tool in ["fs_mark", "bindfs"] {
        if run(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_err() {
            return Err(format!(
                "{tool} is not on PATH (Debian's fsmark and bindfs; `cargo xtask bench-fs` installs them)"
            ));
        }
    }
    let image = root.join("fs.img");
    // Every file of every round, the warm-up round's too, stays.
    let most = args.threads.iter().copied().max().unwrap_or(1);
    let all = (args.rounds.max(1) * args.threads.iter().sum::<usize>() + most) * files;
    let inodes = u32::try_from(all + 4096).map_err(|_| "too many files for one image")?;
    metafs::Fs::mkfs(
        &image,
        metafs::MkfsOptions {
            size: 4 << 30,
            inodes: Some(inodes),
            ..metafs::MkfsOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let dirs: Vec<PathBuf> = ["metafs", "bindfs", "under", "native"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    for d in &dirs {
        mkdir(d)?;
    }
    let _meta = Served::metafs(&image, &dirs[0])?;
    let _bind = Served::bindfs(&dirs[2], &dirs[1])?;
    let targets = ["metafs", "bindfs", "native"];
    // A round first that counts for nothing: the journal's segments are
    // still being prepared after mkfs and the mount, and ext4's journal,
    // shared by all three, would carry that into the first rounds.
    for t in targets {
        fs_mark(root, t, "w", most, files)?;
    }
    let rounds = args.rounds.max(1);
    // rates[threads index][system] = one rate per round
    let mut rates = vec![vec![Vec::new(); 3]; args.threads.len()];
    for r in 0..rounds {
        for (ti, &threads) in args.threads.iter().enumerate() {
            for k in 0..3 {
                let s = (k + r) % 3;
                let rate = fs_mark(root, targets[s], &format!("r{r}"), threads, files)?;
                eprintln!(
                    "round {r}: {threads} threads: {}: {rate:.0} files/s",
                    SYSTEMS[s]
                );
                rates[ti][s].push(rate);
            }
        }
    }
    report(args, files, rounds, &rates)
}

fn report(
    args: &BenchArgs,
    files: usize,
    rounds: usize,
    rates: &[Vec<Vec<f64>>],
) -> Result<(), String> {
    let span = |v: &[f64]| {
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(0.0, f64::max);
        format!("{:.0} ({lo:.0}–{hi:.0})", median(v.to_vec()))
    };
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for (ti, &threads) in args.threads.iter().enumerate() {
        let per_round = |a: usize, b: usize| -> Vec<f64> {
            rates[ti][a]
                .iter()
                .zip(&rates[ti][b])
                .map(|(x, y)| x / y)
                .collect()
        };
        let (vs_bind, vs_ext4) = (per_round(0, 1), per_round(0, 2));
        rows.push(vec![
            threads.to_string(),
            span(&rates[ti][0]),
            span(&rates[ti][1]),
            span(&rates[ti][2]),
            format!("{:.2}", median(vs_bind.clone())),
            format!("{:.2}", median(vs_ext4.clone())),
        ]);
        results.push(
            json!({"threads": threads, "metafs": rates[ti][0], "bindfs": rates[ti][1],
            "ext4": rates[ti][2], "metafs_over_bindfs_median": median(vs_bind),
            "metafs_over_ext4_median": median(vs_ext4)}),
        );
    }
    println!(
        "fs_mark: {files} empty files per thread, fsync before close, a directory per thread; {rounds} interleaved rounds, median (min–max) files/s"
    );
    table(
        &[
            "threads",
            "metafs",
            "ext4 via bindfs",
            "ext4",
            "metafs / bindfs",
            "metafs / ext4",
        ],
        &rows,
    );
    if let Some(path) = &args.json {
        write_json(
            path,
            &json!({"scenario": "fs-mark", "files_per_thread": files,
            "rounds": rounds, "results": results}),
        )?;
    }
    Ok(())
}
