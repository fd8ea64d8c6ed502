//! The filesystem's crash campaign, on SimVfs.
//!
//! Several threads run random operations — create, append, truncate to
//! zero, unlink, rename across directories (replacing files), hard link,
//! symlink, chmod, mkdir, rmdir, extended attributes set and removed (one
//! to over two blocks of them), access ACLs set (the mode with them) and
//! rewritten by chmod, `fallocate` (preallocation past the end or up to a
//! new one; holes punched on block boundaries), fsync, sync — each in its
//! own two
//! directories, while the main
//! thread crashes the machine at a random moment (under both crash
//! policies: drop every unsynced write, or keep a random subset of
//! sectors). Checkpoints run on their own as the log grows, so crashes
//! also land in their middle; half the recoveries are crashed again in
//! the middle of mounting (replay, its checkpoint) and mounted once more.
//!
//! After each recovery: `fsck` is clean, and each thread's directories
//! hold exactly the state after some prefix of its operations (names,
//! bytes, modes, symlink targets, and which names share an inode) — at least
//! every operation before its last `fsync`/`sync` that returned (and the
//! extended attributes of each file). Exact
//! states make every rename all or nothing and show any block of one file
//! holding another's bytes. (Overwrites in place are left out on purpose:
//! in ordered mode, as in ext4's, an overwrite may reach the disk before
//! the transaction around it, so no prefix describes it; the API tests
//! cover them.)
//!
//! `cargo test` runs a fixed number of seeds (`SEEDS`, or
//! `METAFS_CRASH_SEEDS`); `METAFS_CRASH_SECONDS` runs them for a time
//! budget instead; a failure prints
//! its seed, `METAFS_CRASH_SEED=N` reruns it.

use journal_core::vfs::{CrashPolicy, SimVfs, SplitMix64, Vfs};
use metafs::acl::{self, Acl, Entry};
use metafs::{fsck, Error, Falloc, Fs, Kind, MkfsOptions, MountOptions, XattrSet};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const IMG: &str = "/fs.img";

fn journal_options(rng: &mut SplitMix64) -> journal_core::Options {
    journal_core::Options {
        segment_size: 256 << 10,
        logbufs: 4,
        // Small buffers: most transaction records are chains of parts.
        logbsize: if rng.chance(1, 2) { 16 << 10 } else { 64 << 10 },
        flush_policy: if rng.chance(1, 3) {
            journal_core::FlushPolicy::EveryWrite
        } else {
            journal_core::FlushPolicy::NeedFlags
        },
        max_batch: std::time::Duration::from_micros(100),
        ..journal_core::Options::default()
    }
}

/// What a name holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    /// A file: `id` is the same for every name of one inode (the model's
    /// own number; the filesystem's inode number when observed).
    File {
        id: u64,
        data: Vec<u8>,
        mode: u16,
        xattrs: Xattrs,
    },
    /// A symlink and its target.
    Link(Vec<u8>),
}

/// One thread's view: relative path → what it holds.
type Model = BTreeMap<String, Node>;

/// A file's extended attributes: name → value.
type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// A model with each file's id replaced by the first of its names, so a
/// model and an observation compare equal when the same names share the
/// same inodes.
fn canon(m: &Model) -> BTreeMap<&str, (&Node, &str)> {
    let mut first: HashMap<u64, &str> = HashMap::new();
    for (k, n) in m {
        if let Node::File { id, .. } = n {
            first.entry(*id).or_insert(k);
        }
    }
    m.iter()
        .map(|(k, n)| {
            let group = match n {
                Node::File { id, .. } => first[id],
                _ => "",
            };
            (k.as_str(), (n, group))
        })
        .collect()
}

/// Two models say the same, file ids aside.
fn same(a: &Model, b: &Model) -> bool {
    let strip = |m: &Model| -> Vec<(String, Node, String)> {
        canon(m)
            .into_iter()
            .map(|(k, (n, g))| {
                let n = match n {
                    Node::File {
                        data, mode, xattrs, ..
                    } => Node::File {
                        id: 0,
                        data: data.clone(),
                        mode: *mode,
                        xattrs: xattrs.clone(),
                    },
                    n => n.clone(),
                };
                (k.to_string(), n, g.to_string())
            })
            .collect()
    };
    a.len() == b.len() && strip(a) == strip(b)
}

/// Applies `f` to the data, mode and attributes of every name of inode
/// `id`.
fn each_name(m: &mut Model, id: u64, mut f: impl FnMut(&mut Vec<u8>, &mut u16, &mut Xattrs)) {
    for n in m.values_mut() {
        if let Node::File {
            id: i,
            data,
            mode,
            xattrs,
        } = n
        {
            if *i == id {
                f(data, mode, xattrs);
            }
        }
    }
}

/// An access ACL granting `uid` `perm`: never one the mode says whole.
fn acl_for(uid: u32, perm: u16) -> Acl {
    let e = |tag, perm, id| Entry { tag, perm, id };
    Acl(vec![
        e(acl::USER_OBJ, 6, 0),
        e(acl::USER, perm, uid),
        e(acl::GROUP_OBJ, 4, 0),
        e(acl::MASK, perm | 4, 0),
        e(acl::OTHER, 0, 0),
    ])
}

/// Sets or removes (1 in 3, if set) one of four attributes of a file.
fn xattr_step(
    fs: &Fs,
    ino: u32,
    x: &mut Xattrs,
    rng: &mut SplitMix64,
    n: u64,
) -> metafs::Result<()> {
    let name = format!("user.k{}", rng.below(4)).into_bytes();
    if x.contains_key(&name) && rng.chance(1, 3) {
        fs.removexattr(ino, &name)?;
        x.remove(&name);
        return Ok(());
    }
    // Mostly small; now and then more than two attribute blocks.
    let len = match rng.chance(1, 4) {
        true => rng.range(4000, 9000),
        false => rng.range(0, 100),
    } as usize;
    let value = bytes(n, len);
    fs.setxattr(ino, &name, &value, XattrSet::Any)?;
    x.insert(name, value);
    Ok(())
}

/// What one thread did: the state after each of its operations, and how
/// many of them an fsync that returned covers.
#[derive(Default)]
struct Log {
    states: Vec<Model>,
    acked: AtomicUsize,
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    SplitMix64::new(seed).fill(&mut v);
    v
}

/// What a step did.
#[derive(PartialEq, Eq)]
enum Did {
    /// Changed the state.
    Changed,
    /// A sync or fsync that returned.
    Synced,
    /// Nothing (the drawn operation did not apply).
    Nothing,
}

/// One random operation valid in `m`, applied to both the filesystem and
/// the model.
fn step(fs: &Fs, root: &str, m: &mut Model, rng: &mut SplitMix64, n: u64) -> metafs::Result<Did> {
    let of = |want: fn(&Node) -> bool| -> Vec<String> {
        m.iter()
            .filter(|(_, v)| want(v))
            .map(|(k, _)| k.clone())
            .collect()
    };
    let files = of(|v| matches!(v, Node::File { .. }));
    let names = of(|v| !matches!(v, Node::Dir));
    // Files live in `a`, `b`, and the subdirectories made in them, so
    // directories get blocks and an rmdir frees (revokes) them.
    let mut dirs: Vec<String> = vec!["a".into(), "b".into()];
    dirs.extend(of(|v| matches!(v, Node::Dir)));
    let pick =
        |rng: &mut SplitMix64, xs: &[String]| xs[rng.below(xs.len() as u64) as usize].clone();
    let path = |name: &str| format!("{root}/{name}");
    let new_name = |rng: &mut SplitMix64| format!("{}/f{}", pick(rng, &dirs), rng.below(8));
    let id_of = |m: &Model, name: &str| match m.get(name) {
        Some(Node::File { id, .. }) => *id,
        _ => unreachable!("a file"),
    };
    match rng.below(19) {
        0..=2 => {
            let name = new_name(rng);
            if m.contains_key(&name) {
                return Ok(Did::Nothing);
            }
            fs.create_path(&path(&name))?;
            m.insert(
                name,
                Node::File {
                    id: n,
                    data: Vec::new(),
                    mode: 0o644,
                    xattrs: Xattrs::new(),
                },
            );
        }
        3..=5 if !files.is_empty() => {
            let name = pick(rng, &files);
            let add = bytes(n, rng.range(1, 9000) as usize);
            let ino = fs.resolve(&path(&name))?;
            let id = id_of(m, &name);
            let Some(Node::File { data, .. }) = m.get(&name) else {
                unreachable!()
            };
            if data.len() + add.len() > 60_000 {
                return Ok(Did::Nothing);
            }
            fs.write(ino, data.len() as u64, &add)?;
            each_name(m, id, |d, _, _| d.extend_from_slice(&add));
        }
        6 if !files.is_empty() => {
            let name = pick(rng, &files);
            fs.truncate(fs.resolve(&path(&name))?, 0)?;
            each_name(m, id_of(m, &name), |d, _, _| d.clear());
        }
        7 if !names.is_empty() => {
            let name = pick(rng, &names);
            fs.unlink_path(&path(&name))?;
            m.remove(&name);
        }
        8 | 9 if !names.is_empty() => {
            let from = pick(rng, &names);
            let to = new_name(rng);
            let same_inode = match (m.get(&from), m.get(&to)) {
                (Some(Node::File { id: a, .. }), Some(Node::File { id: b, .. })) => a == b,
                _ => false,
            };
            if from == to || same_inode || matches!(m.get(&to), Some(Node::Dir)) {
                return Ok(Did::Nothing);
            }
            fs.rename_path(&path(&from), &path(&to))?;
            let v = m.remove(&from).unwrap();
            m.insert(to, v);
        }
        10 if !files.is_empty() => {
            let (from, to) = (pick(rng, &files), new_name(rng));
            if m.contains_key(&to) {
                return Ok(Did::Nothing);
            }
            let full = path(&to);
            let (dir, leaf) = fs.split(&full)?;
            fs.link(fs.resolve(&path(&from))?, dir, leaf)?;
            let v = m[&from].clone();
            m.insert(to, v);
        }
        11 => {
            let name = new_name(rng);
            if m.contains_key(&name) {
                return Ok(Did::Nothing);
            }
            let target = format!("../target-{n}").into_bytes();
            let full = path(&name);
            let (dir, leaf) = fs.split(&full)?;
            fs.symlink(dir, leaf, &target, 0, 0)?;
            m.insert(name, Node::Link(target));
        }
        12 if !files.is_empty() => {
            let name = pick(rng, &files);
            let mode = rng.below(0o1000) as u16;
            let attr = metafs::SetAttr {
                mode: Some(mode),
                ..Default::default()
            };
            fs.setattr(fs.resolve(&path(&name))?, &attr)?;
            // chmod rewrites an access ACL's owner, mask and other.
            each_name(m, id_of(m, &name), |_, md, x| {
                *md = mode;
                if let Some(v) = x.get_mut(acl::ACCESS) {
                    let mut list = Acl::decode(v).unwrap();
                    list.chmod(mode);
                    *v = list.encode();
                }
            });
        }
        15 if !files.is_empty() => {
            let name = pick(rng, &files);
            let ino = fs.resolve(&path(&name))?;
            let Some(Node::File { xattrs, .. }) = m.get(&name) else {
                unreachable!()
            };
            let mut x = xattrs.clone();
            xattr_step(fs, ino, &mut x, rng, n)?;
            each_name(m, id_of(m, &name), |_, _, xs| *xs = x.clone());
        }
        16 if !files.is_empty() => {
            let name = pick(rng, &files);
            let list = acl_for(1000 + rng.below(5) as u32, rng.below(8) as u16);
            fs.setxattr(
                fs.resolve(&path(&name))?,
                acl::ACCESS,
                &list.encode(),
                XattrSet::Any,
            )?;
            each_name(m, id_of(m, &name), |_, md, x| {
                *md = list.mode(*md).0;
                x.insert(acl::ACCESS.to_vec(), list.encode());
            });
        }
        13 => {
            let name = format!("{}/d{}", ["a", "b"][rng.below(2) as usize], rng.below(3));
            match m.get(&name) {
                None => {
                    fs.mkdir_path(&path(&name))?;
                    m.insert(name, Node::Dir);
                }
                Some(Node::Dir) => {
                    // Empty it first (one operation each), then remove it.
                    let inside = format!("{name}/");
                    match m.keys().find(|k| k.starts_with(&inside)).cloned() {
                        Some(f) => {
                            fs.unlink_path(&path(&f))?;
                            m.remove(&f);
                        }
                        None => {
                            fs.rmdir_path(&path(&name))?;
                            m.remove(&name);
                        }
                    }
                }
                Some(_) => return Ok(Did::Nothing),
            }
        }
        17 if !files.is_empty() => {
            // Preallocation: past the end (invisible), or up to a new end
            // (zeros).
            let name = pick(rng, &files);
            let (off, len) = (rng.below(50_000), rng.range(1, 10_000));
            let keep_size = rng.chance(1, 2);
            let ino = fs.resolve(&path(&name))?;
            fs.fallocate(ino, off, len, Falloc::Allocate { keep_size })?;
            let end = (off + len) as usize;
            each_name(m, id_of(m, &name), |d, _, _| {
                if !keep_size && end > d.len() {
                    d.resize(end, 0);
                }
            });
        }
        18 if !files.is_empty() => {
            // A hole punched on block boundaries (only metadata changes).
            let name = pick(rng, &files);
            let (off, len) = (rng.below(14) * 4096, rng.range(1, 4) * 4096);
            fs.fallocate(fs.resolve(&path(&name))?, off, len, Falloc::PunchHole)?;
            each_name(m, id_of(m, &name), |d, _, _| {
                let (a, b) = (
                    (off as usize).min(d.len()),
                    ((off + len) as usize).min(d.len()),
                );
                d[a..b].fill(0);
            });
        }
        14 => {
            if rng.chance(1, 2) {
                fs.sync()?;
            } else {
                fs.fsync(fs.resolve(root)?)?;
            }
            return Ok(Did::Synced);
        }
        _ => return Ok(Did::Nothing),
    }
    Ok(Did::Changed)
}

/// The state of `root` as the filesystem shows it.
fn observe(fs: &Fs, root: &str) -> Model {
    let mut m = Model::new();
    for d in ["a", "b"] {
        let dir = fs
            .resolve(&format!("{root}/{d}"))
            .expect("the thread's directories exist");
        let mut stack = vec![(d.to_string(), dir)];
        while let Some((prefix, dir)) = stack.pop() {
            for (name, ino, kind) in fs.readdir(dir).unwrap() {
                let name = format!("{prefix}/{}", String::from_utf8(name).unwrap());
                match kind {
                    Kind::Dir => {
                        m.insert(name.clone(), Node::Dir);
                        stack.push((name, ino));
                    }
                    Kind::Symlink => {
                        m.insert(name, Node::Link(fs.readlink(ino).unwrap()));
                    }
                    _ => {
                        let s = fs.stat(ino).unwrap();
                        let data = fs.read(ino, 0, s.size as usize).unwrap();
                        let xattrs = fs
                            .listxattr(ino)
                            .unwrap()
                            .into_iter()
                            .map(|n| {
                                let v = fs.getxattr(ino, &n).unwrap();
                                (n, v)
                            })
                            .collect();
                        m.insert(
                            name,
                            Node::File {
                                id: ino as u64,
                                data,
                                mode: s.mode,
                                xattrs,
                            },
                        );
                    }
                }
            }
        }
    }
    m
}

/// A model in brief, for failure messages: names with sizes.
fn shape(m: &Model) -> Vec<(&String, usize)> {
    m.iter()
        .map(|(k, v)| match v {
            Node::File { data, .. } => (k, data.len()),
            _ => (k, 0),
        })
        .collect()
}

fn mount(vfs: &SimVfs, opts: MountOptions, ctx: &str) -> Fs {
    Fs::mount_with(Arc::new(vfs.clone()), IMG, opts)
        .unwrap_or_else(|e| panic!("{ctx}: mount failed: {e}"))
}

/// Checks a recovered filesystem against the threads' logs; returns each
/// thread's recovered state.
fn check(fs: &Fs, logs: &[Arc<Mutex<Log>>], ctx: &str) -> Vec<Model> {
    let problems = fsck(fs).unwrap();
    assert!(problems.is_empty(), "{ctx}: fsck: {problems:?}");
    logs.iter()
        .enumerate()
        .map(|(t, log)| {
            let got = observe(fs, &format!("/t{t}"));
            let log = log.lock().unwrap();
            let acked = log.acked.load(Ordering::SeqCst);
            let k = log.states.iter().rposition(|s| same(s, &got));
            match k {
                Some(k) if k >= acked => got,
                Some(k) => panic!(
                    "{ctx}: thread {t} recovered the state after {k} operations, but {acked} were acknowledged ({:?}; {:?})\n{}",
                    fs.mount_report(),
                    fs.journal().recovery_report(),
                    log.states.iter().enumerate().map(|(i, s)| format!("  {i}: {:?}", shape(s))).collect::<Vec<_>>().join("\n")
                ),
                None => panic!(
                    "{ctx}: thread {t} recovered a state after no prefix of its operations ({} states; acked {acked}): {:?}",
                    log.states.len(),
                    shape(&got)
                ),
            }
        })
        .collect()
}

fn run_seed(seed: u64) -> u64 {
    let mut rng = SplitMix64::new(seed);
    let jopts = journal_options(&mut rng);
    let opts = MountOptions {
        journal: jopts,
        checkpoint_log_bytes: rng.range(64 << 10, 512 << 10),
        // From the least the cache keeps (4 blocks) up: eviction and
        // read-back under every operation and crash.
        cache_bytes: rng.range(4, 64) as usize * 4096,
        ..MountOptions::default()
    };
    let threads = rng.range(2, 4) as usize;
    let mut vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/")).unwrap();
    Fs::mkfs_with(
        Arc::new(vfs.clone()),
        IMG,
        MkfsOptions {
            size: 16 << 20,
            inodes: Some(1024),
            journal: jopts,
        },
    )
    .unwrap();
    let mut models: Vec<Model> = vec![Model::new(); threads];
    {
        let fs = mount(&vfs, opts, "setup");
        for t in 0..threads {
            fs.mkdir_path(&format!("/t{t}")).unwrap();
            fs.mkdir_path(&format!("/t{t}/a")).unwrap();
            fs.mkdir_path(&format!("/t{t}/b")).unwrap();
        }
        fs.unmount().unwrap();
    }
    let mut states = 0;
    for round in 0..2u64 {
        let ctx = format!("seed {seed} round {round}");
        let fs = Arc::new(mount(&vfs, opts, &ctx));
        let stop = Arc::new(AtomicBool::new(false));
        let logs: Vec<Arc<Mutex<Log>>> = models
            .iter()
            .map(|m| {
                Arc::new(Mutex::new(Log {
                    states: vec![m.clone()],
                    acked: AtomicUsize::new(0),
                }))
            })
            .collect();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (fs, stop, log) = (fs.clone(), stop.clone(), logs[t].clone());
                let mut m = models[t].clone();
                let mut trng = SplitMix64::new(seed ^ (round << 40) ^ ((t as u64) << 32));
                std::thread::spawn(move || {
                    let root = format!("/t{t}");
                    let mut n = seed << 20 | round << 16 | (t as u64) << 12;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        // Every state is logged before the check reads the
                        // logs (after the threads stopped), so a crash that
                        // caught an operation finds its state there.
                        let mut next = m.clone();
                        let before = log.lock().unwrap().states.len();
                        let did = match step(&fs, &root, &mut next, &mut trng, n) {
                            Ok(d) => d,
                            Err(Error::Journal(_)) | Err(Error::Poisoned(_))
                                if stop.load(Ordering::Relaxed) =>
                            {
                                break
                            }
                            Err(e) => panic!("thread {t}: {e}"),
                        };
                        match did {
                            Did::Changed => {
                                m = next;
                                log.lock().unwrap().states.push(m.clone());
                            }
                            // A sync that returned covers every state so far.
                            Did::Synced => log
                                .lock()
                                .unwrap()
                                .acked
                                .store(before - 1, Ordering::SeqCst),
                            Did::Nothing => {}
                        }
                    }
                })
            })
            .collect();
        // Crash after a random number of operations.
        let target = rng.range(5, 120) as usize;
        loop {
            let done: usize = logs.iter().map(|l| l.lock().unwrap().states.len()).sum();
            // (A thread ends before the stop only by panicking: then the
            // join below reports it, instead of this loop waiting forever.)
            if done >= target || handles.iter().any(|h| h.is_finished()) {
                break;
            }
            std::thread::yield_now();
        }
        let policy = if rng.chance(1, 2) {
            CrashPolicy::DropUnsynced
        } else {
            CrashPolicy::TornSectors {
                seed: rng.next_u64(),
            }
        };
        // Acknowledgements read before the crash were durable before it.
        let acked: Vec<usize> = logs
            .iter()
            .map(|l| l.lock().unwrap().acked.load(Ordering::SeqCst))
            .collect();
        let image = vfs.crash(policy);
        let ctx = format!("{ctx} ({policy:?})");
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join()
                .unwrap_or_else(|_| panic!("{ctx}: a thread panicked"));
        }
        drop(fs);
        for (l, a) in logs.iter().zip(&acked) {
            l.lock().unwrap().acked.store(*a, Ordering::SeqCst);
        }
        // Half the time, crash the recovery itself, then recover again.
        if rng.chance(1, 2) {
            image.arm_crash(rng.range(1, 30), CrashPolicy::DropUnsynced);
            let fs = mount(&image, opts, &ctx);
            drop(fs);
            if let Some(again) = image.take_crash() {
                let ctx = format!("{ctx} (crash during recovery)");
                let fs = mount(&again, opts, &ctx);
                check(&fs, &logs, &ctx);
                states += 1;
            }
        }
        let fs = mount(&image, opts, &ctx);
        models = check(&fs, &logs, &ctx);
        states += 1;
        fs.unmount().unwrap();
        vfs = image;
    }
    states
}

/// Seeds `cargo test` runs: the same cases on any machine (`METAFS_CRASH_SECONDS`
/// runs seeds for a time budget instead).
const SEEDS: u64 = 30;

#[test]
fn crash_campaign() {
    if let Ok(s) = std::env::var("METAFS_CRASH_SEED") {
        let seed = s.parse().expect("METAFS_CRASH_SEED is a number");
        let n = run_seed(seed);
        println!("metafs crash campaign: seed {seed}: {n} crash states checked");
        return;
    }
    let budget: Option<f64> = std::env::var("METAFS_CRASH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    let fixed: u64 = std::env::var("METAFS_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS);
    let start = Instant::now();
    let (mut seeds, mut states) = (0u64, 0u64);
    while match budget {
        Some(b) => seeds == 0 || start.elapsed().as_secs_f64() < b,
        None => seeds < fixed,
    } {
        let seed = seeds;
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok(n) => states += n,
            Err(e) => {
                eprintln!("metafs crash campaign failed at seed {seed}; rerun with METAFS_CRASH_SEED={seed}");
                std::panic::resume_unwind(e);
            }
        }
        seeds += 1;
    }
    println!(
        "metafs crash campaign: {seeds} seeds, {states} crash states checked in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(states >= 2 * seeds, "two recoveries per seed at least");
}
