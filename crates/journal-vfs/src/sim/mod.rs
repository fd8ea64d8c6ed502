//! SimVfs: an in-memory filesystem with a volatile cache, the crash oracle.
//!
//! # The model
//!
//! Each file (inode) has *durable* bytes — what a power cut leaves — and
//! *live* bytes — what reads see — plus the ordered list of writes made since
//! the file was last synced. [`VfsFile::sync_data`] and [`VfsFile::sync_all`]
//! make the live bytes durable; [`VfsFile::write_at_fua`] makes exactly its
//! own range durable.
//!
//! Names are modelled the same way: a *live* namespace that opens, renames
//! and removes change at once, and a *durable* namespace that changes only
//! when [`Vfs::sync_dir`] runs on the directory holding the name. The
//! not-yet-durable name operations are kept in order.
//!
//! Directories themselves are durable as soon as they are created (the
//! journal creates its directory once, before any data, and fsyncs it).
//!
//! # Crashes
//!
//! [`SimVfs::crash`] builds the surviving image as a fresh `SimVfs`:
//!
//! - [`CrashPolicy::DropUnsynced`]: exactly the durable state.
//! - [`CrashPolicy::TornSectors`]: the durable state plus, for every 512-byte
//!   sector touched by unsynced writes, a random number of those writes
//!   applied in order — so each sector ends in one of the states it passed
//!   through (all-old or all-new with respect to each write, never a byte mix
//!   inside one write's sector), and a multi-sector write can tear at any
//!   sector boundary. Rewriting a sector with identical bytes therefore leaves
//!   it intact whatever survives. A random prefix of the pending name
//!   operations survives too, as a journaling filesystem commits its metadata
//!   in order. File lengths are the durable lengths, extended to cover any
//!   surviving write.
//!
//! Both policies are deterministic: the same seed on the same history gives
//! the same image.
//!
//! # Faults
//!
//! [`SimVfs::inject`] makes the Nth call of a kind fail with EIO or ENOSPC
//! (reads included, so recovery's handling of a failed read is tested). A
//! failed `fsync` / `fdatasync` behaves as Linux does after a writeback
//! error: the file's dirty pages are dropped from the set still to be
//! written (they stay readable, they never become durable) and the next
//! sync, finding nothing dirty, succeeds. A program that retries a failed
//! sync and trusts the second answer loses data (PostgreSQL's
//! "fsyncgate"); the journal poisons itself instead.

use crate::{
    CounterSnapshot, Counters, DirLock, Op, OpenOptions, Prealloc, Result, SplitMix64, Vfs,
    VfsError, VfsFile,
};
use journal_sync::{Arc, DataArc, Mutex};
use rustix::io::Errno;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod fs;

/// The sector size of the simulated device: the unit of atomicity of a write.
pub const SECTOR: u64 = 512;

/// What survives [`SimVfs::crash`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPolicy {
    /// Every write and name operation not yet made durable is lost.
    DropUnsynced,
    /// A seeded random subset of unsynced writes survives at sector
    /// granularity, and a random prefix of unsynced name operations.
    TornSectors {
        /// The seed: the same seed on the same history gives the same image.
        seed: u64,
    },
    /// The process died, the machine did not (`kill -9`): every write and
    /// name operation issued survives, synced or not.
    ProcessOnly,
}

/// An injected fault: the `nth` call (1-based, counted from injection) of
/// kind `op` — on `path` only, if set — fails with `errno` and changes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The kind of call that fails.
    pub op: Op,
    /// Which call, counting from 1 at the time of injection (calls on
    /// `path` only, if set).
    pub nth: u64,
    /// The errno it fails with.
    pub errno: i32,
    /// Only calls on this path count and fail (`None`: any path): aims a
    /// fault at one file, e.g. a data file's writes but not the log's.
    pub path: Option<PathBuf>,
}

impl Fault {
    /// The `nth` call of `op` fails with EIO.
    pub fn eio(op: Op, nth: u64) -> Self {
        Self {
            op,
            nth,
            errno: Errno::IO.raw_os_error(),
            path: None,
        }
    }
    /// The `nth` call of `op` fails with ENOSPC.
    pub fn enospc(op: Op, nth: u64) -> Self {
        Self {
            op,
            nth,
            errno: Errno::NOSPC.raw_os_error(),
            path: None,
        }
    }

    /// The same fault, counted and fired on calls on `path` only.
    pub fn on(self, path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
            ..self
        }
    }
}

/// A file's bytes, shared copy-on-write: a crash image, a mapping and the
/// durable copy of an unchanged file all point at one buffer, and the
/// first write to a shared buffer copies it ([`DataArc::make_mut`]).
type Bytes = DataArc<Vec<u8>>;

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Bytes,
    live: Bytes,
    /// Writes since the last sync, in order: (offset, bytes).
    pending: Vec<(u64, Vec<u8>)>,
    /// Ranges whose dirty pages a failed sync dropped, with the durable
    /// bytes they had then: no later sync writes them (they are clean in
    /// the cache) until the range is written again.
    lost: Vec<(u64, Vec<u8>)>,
    /// The shortest the file has been since the last successful sync, if
    /// it was truncated below the durable length meanwhile.
    shrunk_to: Option<usize>,
}

/// Removes `[a, b)` from a list of `(offset, bytes)` ranges, keeping the
/// parts outside it.
fn cut_ranges(ranges: &mut Vec<(u64, Vec<u8>)>, a: u64, b: u64) {
    let mut kept = Vec::with_capacity(ranges.len());
    for (off, data) in ranges.drain(..) {
        let end = off + data.len() as u64;
        if end <= a || off >= b {
            kept.push((off, data));
            continue;
        }
        if off < a {
            kept.push((off, data[..(a - off) as usize].to_vec()));
        }
        if end > b {
            kept.push((b, data[(b - off) as usize..].to_vec()));
        }
    }
    *ranges = kept;
}

/// A namespace: path → inode. Hashed, not ordered: `Path`'s ordering
/// compares component by component, which the crash campaigns paid for
/// on every lookup; listings are sorted where they are made
/// ([`Vfs::read_dir`]), so nothing depends on the map's order.
type Names = HashMap<PathBuf, u64>;

#[derive(Debug, Clone)]
enum NsOp {
    Link { path: PathBuf, ino: u64 },
    Unlink { path: PathBuf },
    Rename { from: PathBuf, to: PathBuf },
}

impl NsOp {
    fn touches(&self, dir: &Path) -> bool {
        let parent_is = |p: &Path| p.parent() == Some(dir);
        match self {
            NsOp::Link { path, .. } | NsOp::Unlink { path } => parent_is(path),
            NsOp::Rename { from, to } => parent_is(from) || parent_is(to),
        }
    }

    fn apply(&self, ns: &mut Names) {
        match self {
            NsOp::Link { path, ino } => {
                ns.insert(path.clone(), *ino);
            }
            NsOp::Unlink { path } => {
                ns.remove(path);
            }
            NsOp::Rename { from, to } => {
                if let Some(ino) = ns.remove(from) {
                    ns.insert(to.clone(), ino);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    live: Names,
    durable: Names,
    pending_ns: Vec<NsOp>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    /// Armed faults: (op, calls left before it fires, errno, path).
    faults: Vec<(Op, u64, i32, Option<PathBuf>)>,
    calls: HashMap<Op, u64>,
    sync_latency: Duration,
    write_latency: Duration,
    /// An armed crash: before the mutating call that brings the count to
    /// zero, the image a power cut would leave is captured.
    armed_crash: Option<(u64, CrashPolicy)>,
    captured: Option<SimVfs>,
    /// The most bytes the files may hold together ([`SimVfs::set_space_limit`]).
    space_limit: Option<u64>,
}

impl State {
    /// Bytes held by the files that have a name.
    fn space_used(&self) -> u64 {
        let named: BTreeSet<u64> = self.live.values().copied().collect();
        named
            .iter()
            .filter_map(|ino| self.inodes.get(ino))
            .map(|i| i.live.len() as u64)
            .sum()
    }

    /// ENOSPC if growing inode `ino` to `end` bytes would pass the limit.
    fn check_space(&self, ino: u64, end: u64, op: Op, path: &Path) -> Result<()> {
        let Some(limit) = self.space_limit else {
            return Ok(());
        };
        let cur = self.inodes.get(&ino).map_or(0, |i| i.live.len() as u64);
        if end > cur && self.space_used().saturating_add(end - cur) > limit {
            return Err(VfsError::new(
                op,
                path,
                io::Error::from_raw_os_error(Errno::NOSPC.raw_os_error()),
            ));
        }
        Ok(())
    }

    /// Counts the call, captures an armed crash, and fires a matching
    /// armed fault, if any.
    fn call(&mut self, op: Op, path: &Path) -> Result<()> {
        *self.calls.entry(op).or_default() += 1;
        let mutating = !matches!(
            op,
            Op::Open | Op::Read | Op::ReadDir | Op::Lock | Op::Metadata | Op::CreateDir
        );
        if let Some((left, policy)) = self.armed_crash.as_mut().filter(|_| mutating) {
            *left -= 1;
            if *left == 0 {
                let policy = *policy;
                self.armed_crash = None;
                self.captured = Some(image(self, policy));
            }
        }
        let mut fired = None;
        self.faults.retain_mut(|(fop, left, errno, on)| {
            if *fop != op || fired.is_some() || on.as_deref().is_some_and(|p| p != path) {
                return true;
            }
            *left -= 1;
            if *left == 0 {
                fired = Some(*errno);
                false
            } else {
                true
            }
        });
        match fired {
            Some(errno) => Err(VfsError::new(op, path, io::Error::from_raw_os_error(errno))),
            None => Ok(()),
        }
    }

    fn parent_exists(&self, path: &Path) -> bool {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => self.dirs.contains(p),
            _ => true,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    counters: Counters,
}

/// The simulated filesystem. Cheap to clone: clones share one image.
#[derive(Debug, Clone, Default)]
pub struct SimVfs {
    inner: Arc<Inner>,
}

fn io_err(kind: io::ErrorKind) -> io::Error {
    io::Error::from(kind)
}

fn not_found(op: Op, path: &Path) -> VfsError {
    VfsError::new(op, path, io_err(io::ErrorKind::NotFound))
}

fn write_bytes(buf: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[offset as usize..end].copy_from_slice(data);
}

impl SimVfs {
    /// An empty filesystem.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms a fault. Several may be armed at once.
    pub fn inject(&self, fault: Fault) {
        assert!(fault.nth > 0, "Fault::nth counts from 1");
        self.inner
            .state
            .lock()
            .faults
            .push((fault.op, fault.nth, fault.errno, fault.path));
    }

    /// Disarms every fault not yet fired.
    pub fn clear_faults(&self) {
        self.inner.state.lock().faults.clear();
    }

    /// How many calls of kind `op` were made (failed ones included).
    pub fn calls(&self, op: Op) -> u64 {
        self.inner.state.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Gives the filesystem a capacity: a write, preallocation or length
    /// change that would make the named files hold more than `limit` bytes
    /// in all fails with ENOSPC and changes nothing (`None`: unlimited, the
    /// default). Removing or truncating files frees their bytes at once.
    pub fn set_space_limit(&self, limit: Option<u64>) {
        self.inner.state.lock().space_limit = limit;
    }

    /// Bytes the named files hold together (what a space limit counts).
    pub fn space_used(&self) -> u64 {
        self.inner.state.lock().space_used()
    }

    /// Makes every sync (fdatasync, fsync, directory fsync, FUA write) take
    /// at least `d`, to model a slow device in benchmarks. Ignored under loom.
    pub fn set_sync_latency(&self, d: Duration) {
        self.inner.state.lock().sync_latency = d;
    }

    /// Makes every plain write take at least `d` (a slow device's write
    /// path, as opposed to its flushes). Ignored under loom.
    pub fn set_write_latency(&self, d: Duration) {
        self.inner.state.lock().write_latency = d;
    }

    /// The bytes a read of the whole file would return now, if it exists.
    pub fn live_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.inner.state.lock();
        let ino = st.live.get(path)?;
        Some(st.inodes[ino].live.to_vec())
    }

    /// The bytes under this name that a crash with
    /// [`CrashPolicy::DropUnsynced`] would leave, if the name would survive.
    pub fn durable_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.inner.state.lock();
        let ino = st.durable.get(path)?;
        Some(st.inodes[ino].durable.to_vec())
    }

    /// The image a power cut would leave now, as an independent filesystem
    /// with fresh counters, no faults, no latency and no locks held.
    pub fn crash(&self, policy: CrashPolicy) -> SimVfs {
        image(&self.inner.state.lock(), policy)
    }

    /// Arms a crash in the middle of whatever runs next: just before the
    /// `after`-th mutating call from now (writes, syncs, creations,
    /// renames, removals, length changes), the image a power cut would
    /// leave is captured, as [`SimVfs::crash`] would build it; the run
    /// itself goes on. [`SimVfs::take_crash`] hands the image over.
    pub fn arm_crash(&self, after: u64, policy: CrashPolicy) {
        assert!(after > 0, "arm_crash counts calls from 1");
        let mut st = self.inner.state.lock();
        st.armed_crash = Some((after, policy));
        st.captured = None;
    }

    /// Whether an armed crash has captured its image (which
    /// [`SimVfs::take_crash`] then hands over): a test that runs operations
    /// one after another asks after each, to know which one the crash cut.
    pub fn crash_captured(&self) -> bool {
        self.inner.state.lock().captured.is_some()
    }

    /// The image an armed crash captured, if its call came (disarming it
    /// if it did not).
    pub fn take_crash(&self) -> Option<SimVfs> {
        let mut st = self.inner.state.lock();
        st.armed_crash = None;
        st.captured.take()
    }

    fn sync_latency(&self) {
        let d = self.inner.state.lock().sync_latency;
        model_latency(d);
    }

    fn write_latency(&self) {
        let d = self.inner.state.lock().write_latency;
        model_latency(d);
    }
}

/// The image a power cut (or, with [`CrashPolicy::ProcessOnly`], a
/// process crash) would leave of `st`.
fn image(st: &State, policy: CrashPolicy) -> SimVfs {
    let mut rng = match policy {
        CrashPolicy::DropUnsynced | CrashPolicy::ProcessOnly => None,
        CrashPolicy::TornSectors { seed } => Some(SplitMix64::new(seed)),
    };
    let process_only = policy == CrashPolicy::ProcessOnly;
    let mut names = if process_only {
        st.live.clone()
    } else {
        st.durable.clone()
    };
    if let Some(rng) = rng.as_mut() {
        let keep = rng.below(st.pending_ns.len() as u64 + 1) as usize;
        for op in &st.pending_ns[..keep] {
            op.apply(&mut names);
        }
    }
    let mut inodes = HashMap::new();
    let used: BTreeSet<u64> = names.values().copied().collect();
    for ino in used {
        let old = &st.inodes[&ino];
        // Unchanged bytes are shared with this image, not copied.
        let bytes = match rng.as_mut() {
            _ if process_only => old.live.clone(),
            Some(rng) if !old.pending.is_empty() => DataArc::new(torn_image(old, rng)),
            _ => old.durable.clone(),
        };
        inodes.insert(
            ino,
            Inode {
                durable: bytes.clone(),
                live: bytes,
                pending: Vec::new(),
                lost: Vec::new(),
                shrunk_to: None,
            },
        );
    }
    let state = State {
        inodes,
        next_ino: st.next_ino,
        live: names.clone(),
        durable: names,
        dirs: st.dirs.clone(),
        ..State::default()
    };
    SimVfs {
        inner: Arc::new(Inner {
            state: Mutex::new(state),
            counters: Counters::default(),
        }),
    }
}

/// Spends `d` as a slow device would. Deliberate: this models the device's
/// own latency; it is not a wait for progress (nothing here polls).
fn model_latency(d: Duration) {
    #[cfg(not(any(loom, shuttle)))]
    if !d.is_zero() {
        std::thread::sleep(d);
    }
    #[cfg(any(loom, shuttle))]
    let _ = d;
}

/// The durable bytes of `inode` plus, per sector, a random prefix of the
/// pending writes that touched it.
fn torn_image(inode: &Inode, rng: &mut SplitMix64) -> Vec<u8> {
    let sectors = |off: u64, len: usize| {
        let first = off / SECTOR;
        let last = (off + len as u64).div_ceil(SECTOR);
        first..last
    };
    let mut touched: BTreeMap<u64, u64> = BTreeMap::new();
    for (off, data) in &inode.pending {
        for s in sectors(*off, data.len()) {
            *touched.entry(s).or_default() += 1;
        }
    }
    let keep: BTreeMap<u64, u64> = touched
        .iter()
        .map(|(&s, &n)| (s, rng.below(n + 1)))
        .collect();
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let mut out = inode.durable.to_vec();
    for (off, data) in &inode.pending {
        let end = off + data.len() as u64;
        for s in sectors(*off, data.len()) {
            let n = seen.entry(s).or_default();
            if *n < keep[&s] {
                let a = (s * SECTOR).max(*off);
                let b = ((s + 1) * SECTOR).min(end);
                write_bytes(&mut out, a, &data[(a - off) as usize..(b - off) as usize]);
            }
            *n += 1;
        }
    }
    out
}
