//! Snapshot files: the store streamed from one consistent iterator into a
//! file of CRC'd chunks, sent from that file in openraft's chunks,
//! received into a file and installed from it chunk by chunk. Build, send
//! and install hold a chunk or two in memory at any data size; the file
//! survives a restart, so openraft need not rebuild a snapshot at start.
//!
//! The byte layout is in docs/FORMAT.md ("raftkv snapshot file"): a
//! header (magic, version, the snapshot's meta), chunks (length, CRC32C,
//! a postcard list of key-value pairs) and an end record (the entry
//! count). Nothing read is trusted: lengths are bounded before anything
//! is allocated, every chunk's CRC is checked, every key must be
//! raftkv's, and the file must end exactly after the end record.
//!
//! Files live in `snapshots/` in the state machine's directory: the
//! current one as `<id>.snap`; one being built or received as `*.tmp`
//! (removed at open). A built file is synced and renamed into place, and
//! the directory synced, before it is the current snapshot. A received
//! file (`recv-N.tmp`) is removed as soon as it is dropped without having
//! been installed: a transfer cut off or refused, a snapshot openraft
//! passed over, an install that failed.

use super::*;
use journal_core::vfs::VfsFile;
use std::io::{self, SeekFrom};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

/// The directory of snapshot files inside a state machine's directory.
pub const SNAPSHOT_DIR: &str = "snapshots";
const MAGIC: &[u8; 4] = b"RKS1";
const VERSION: u16 = 4;
/// Bytes of the fixed header before the meta.
const HEADER: usize = 16;
/// Bytes of the meta at most.
const MAX_META: u32 = 1 << 20;
/// A chunk is written once its pairs reach this many bytes.
const CHUNK_TARGET: usize = 1 << 20;
/// Bytes of a chunk's payload at most: the target plus one pair past it.
const MAX_CHUNK: u32 = 4 << 20;

/// A snapshot file as openraft reads, writes and seeks it (the
/// `SnapshotData` of raftkv's Raft types). Its reads and writes are
/// `pread`/`pwrite` through the node's VFS at a position it keeps; they
/// complete at once (a chunk at a time, from the page cache).
#[derive(Debug)]
pub struct SnapshotFile {
    file: Box<dyn VfsFile>,
    path: PathBuf,
    pos: u64,
    /// A received file, not yet installed: removed when dropped.
    remove_on_drop: Option<Arc<dyn Vfs>>,
}

impl Drop for SnapshotFile {
    fn drop(&mut self) {
        if let Some(vfs) = self.remove_on_drop.take() {
            // Best effort: what is left is removed at the next open.
            let _ = vfs.remove_file(&self.path);
        }
    }
}

impl SnapshotFile {
    /// Opens `path` to read it from the start.
    pub(crate) fn open(vfs: &dyn Vfs, path: &Path) -> Result<SnapshotFile, Error> {
        Ok(SnapshotFile {
            file: vfs.open(path, OpenOptions::read())?,
            path: path.to_path_buf(),
            pos: 0,
            remove_on_drop: None,
        })
    }

    /// Creates `path` empty, to write.
    pub(crate) fn create(vfs: &dyn Vfs, path: &Path) -> Result<SnapshotFile, Error> {
        let file = vfs.open(path, OpenOptions::create())?;
        file.set_len(0)?;
        Ok(SnapshotFile {
            file,
            path: path.to_path_buf(),
            pos: 0,
            remove_on_drop: None,
        })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Up to `max` bytes of the file from `pos` (empty at its end): a
    /// piece of a snapshot being sent.
    pub fn read_piece(&self, pos: u64, max: usize) -> io::Result<Vec<u8>> {
        let len = self.file.len().map_err(io::Error::other)?;
        let n = usize::try_from(len.saturating_sub(pos))
            .unwrap_or(usize::MAX)
            .min(max);
        let mut buf = vec![0u8; n];
        self.file
            .read_exact_at(&mut buf, pos)
            .map_err(io::Error::other)?;
        Ok(buf)
    }

    /// Appends `bytes` at the end of what was written (a piece of a
    /// snapshot being received).
    pub fn write_piece(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file
            .write_at(bytes, self.pos)
            .map_err(io::Error::other)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let n = this
            .file
            .read_at(buf.initialize_unfilled(), this.pos)
            .map_err(io::Error::other)?;
        buf.advance(n);
        this.pos += n as u64;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.file
            .write_at(buf, this.pos)
            .map_err(io::Error::other)?;
        this.pos += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(self: Pin<&mut Self>, to: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        let bad = || io::Error::new(io::ErrorKind::InvalidInput, "a seek outside the file");
        this.pos = match to {
            SeekFrom::Start(p) => p,
            SeekFrom::Current(d) => this.pos.checked_add_signed(d).ok_or_else(bad)?,
            SeekFrom::End(d) => {
                let len = this.file.len().map_err(io::Error::other)?;
                len.checked_add_signed(d).ok_or_else(bad)?
            }
        };
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.pos))
    }
}

/// A chunk's key-value pairs.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn crc(parts: &[&[u8]]) -> u32 {
    parts.iter().fold(0, |c, p| crc32c::crc32c_append(c, p))
}

/// Writes a snapshot file: the header, then chunks as pairs come.
pub(crate) struct Writer {
    file: Box<dyn VfsFile>,
    pos: u64,
    pairs: Pairs,
    bytes: usize,
    entries: u64,
}

impl Writer {
    /// Creates `path` with `meta`'s header.
    pub(crate) fn create(vfs: &dyn Vfs, path: &Path, meta: &Meta) -> Result<Writer, Error> {
        let file = vfs.open(path, OpenOptions::create())?;
        file.set_len(0)?;
        let m = postcard::to_stdvec(meta).map_err(corrupt)?;
        let len = u32::try_from(m.len())
            .ok()
            .filter(|l| *l <= MAX_META)
            .ok_or_else(|| corrupt("a snapshot meta too large"))?;
        let mut head = Vec::with_capacity(HEADER + m.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&[0, 0]);
        head.extend_from_slice(&len.to_le_bytes());
        let c = crc(&[&head, &m]);
        head.extend_from_slice(&c.to_le_bytes());
        head.extend_from_slice(&m);
        file.write_at(&head, 0)?;
        Ok(Writer {
            file,
            pos: head.len() as u64,
            pairs: Vec::new(),
            bytes: 0,
            entries: 0,
        })
    }

    /// Adds a pair; writes a chunk once enough have come.
    pub(crate) fn push(&mut self, k: Vec<u8>, v: Vec<u8>) -> Result<(), Error> {
        // (With postcard's two length prefixes, at most 10 bytes.)
        self.bytes += k.len() + v.len() + 10;
        self.pairs.push((k, v));
        self.entries += 1;
        if self.bytes >= CHUNK_TARGET {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        if self.pairs.is_empty() {
            return Ok(());
        }
        let payload = postcard::to_stdvec(&self.pairs).map_err(corrupt)?;
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| *l <= MAX_CHUNK)
            .ok_or_else(|| corrupt("a snapshot chunk too large"))?;
        self.record(len, &payload)?;
        self.pairs.clear();
        self.bytes = 0;
        Ok(())
    }

    fn record(&mut self, len: u32, payload: &[u8]) -> Result<(), Error> {
        let l = len.to_le_bytes();
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&l);
        head[4..].copy_from_slice(&crc(&[&l, payload]).to_le_bytes());
        self.file.write_at(&head, self.pos)?;
        self.file.write_at(payload, self.pos + 8)?;
        self.pos += 8 + payload.len() as u64;
        Ok(())
    }

    /// Writes the last chunk and the end record, and syncs the file;
    /// returns its length.
    pub(crate) fn finish(mut self) -> Result<u64, Error> {
        self.flush()?;
        let entries = self.entries.to_le_bytes();
        self.record(0, &entries)?;
        self.file.sync_all()?;
        Ok(self.pos)
    }
}

/// Reads a snapshot file's header: its meta and where its chunks begin.
pub(crate) fn read_meta(file: &dyn VfsFile) -> Result<(Meta, u64), Error> {
    let bad = |what: &str| corrupt(format!("snapshot file: {what}"));
    let mut head = [0u8; HEADER];
    file.read_exact_at(&mut head, 0)
        .map_err(|_| bad("shorter than its header"))?;
    if &head[..4] != MAGIC {
        return Err(bad("not a snapshot file"));
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if len > MAX_META {
        return Err(bad("a meta past its bound"));
    }
    let mut m = vec![0u8; len as usize];
    file.read_exact_at(&mut m, HEADER as u64)
        .map_err(|_| bad("its meta is cut short"))?;
    if crc(&[&head[..12], &m]).to_le_bytes() != head[12..16] {
        return Err(bad("the header's CRC does not match"));
    }
    if version != VERSION {
        return Err(bad("an unsupported version"));
    }
    let meta = postcard::from_bytes(&m).map_err(|_| bad("an undecodable meta"))?;
    Ok((meta, (HEADER + m.len()) as u64))
}

/// The chunks of a snapshot file, checked, in order; after the last, the
/// end record's entry count and the file's end are checked too.
pub(crate) struct Chunks<'a> {
    file: &'a dyn VfsFile,
    pos: u64,
    len: u64,
    entries: u64,
    done: bool,
}

impl<'a> Chunks<'a> {
    /// The chunks of `file`, whose header ends at `start`.
    pub(crate) fn new(file: &'a dyn VfsFile, start: u64) -> Result<Chunks<'a>, Error> {
        Ok(Chunks {
            file,
            pos: start,
            len: file.len()?,
            entries: 0,
            done: false,
        })
    }

    fn next_chunk(&mut self) -> Result<Option<Pairs>, Error> {
        let bad = |what: &str| corrupt(format!("snapshot file: {what}"));
        let mut head = [0u8; 8];
        if self.pos + 8 > self.len {
            return Err(bad("it ends before its end record"));
        }
        self.file.read_exact_at(&mut head, self.pos)?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let body = if len == 0 { 8 } else { len };
        if len > MAX_CHUNK || self.pos + 8 + u64::from(body) > self.len {
            return Err(bad("a chunk past the file's end or its bound"));
        }
        let mut payload = vec![0u8; body as usize];
        self.file.read_exact_at(&mut payload, self.pos + 8)?;
        if crc(&[&head[..4], &payload]).to_le_bytes() != head[4..] {
            return Err(bad("a chunk's CRC does not match"));
        }
        self.pos += 8 + u64::from(body);
        if len == 0 {
            let mut n = [0u8; 8];
            n.copy_from_slice(&payload);
            if u64::from_le_bytes(n) != self.entries {
                return Err(bad("the entry count does not match the chunks"));
            }
            if self.pos != self.len {
                return Err(bad("bytes after the end record"));
            }
            return Ok(None);
        }
        let pairs: Pairs =
            postcard::from_bytes(&payload).map_err(|_| bad("an undecodable chunk"))?;
        self.entries += pairs.len() as u64;
        Ok(Some(pairs))
    }
}

impl Iterator for Chunks<'_> {
    type Item = Result<Pairs, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.next_chunk().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}

/// Finds the current snapshot file in `dir/snapshots` at open: the valid
/// `.snap` file with the highest applied id. Everything else there (files
/// being built or received when the node stopped, older or damaged
/// snapshots) is removed.
pub(super) fn recover(vfs: &dyn Vfs, dir: &Path) -> Result<Option<(Meta, PathBuf)>, Error> {
    let snaps = dir.join(SNAPSHOT_DIR);
    if !vfs.exists(&snaps)? {
        vfs.create_dir_all(&snaps)?;
        vfs.sync_dir(dir)?;
        return Ok(None);
    }
    let mut best: Option<(Meta, PathBuf)> = None;
    for name in vfs.read_dir(&snaps)? {
        let path = snaps.join(&name);
        let found = match name.ends_with(".snap") {
            true => vfs
                .open(&path, OpenOptions::read())
                .ok()
                .and_then(|f| read_meta(&*f).ok()),
            false => None,
        };
        let Some((meta, _)) = found else {
            vfs.remove_file(&path)?;
            continue;
        };
        let newer = best
            .as_ref()
            .is_none_or(|(b, _)| meta.last_log_id > b.last_log_id);
        let loser = match newer {
            true => best.replace((meta, path)).map(|(_, p)| p),
            false => Some(path),
        };
        if let Some(p) = loser {
            vfs.remove_file(&p)?;
        }
    }
    Ok(best)
}

/// The byte policy: a snapshot is due once the bytes applied since the
/// last one reach the store's size (its data file), and at least the
/// floor. A snapshot rewrites the whole store, so this bounds its cost to
/// about one store's worth of writes per store's worth of log, at any
/// size; and the log kept behind it stays about the store's size.
pub(super) fn due(st: &State) -> bool {
    let Some(floor) = st.snapshot_min_bytes else {
        return false;
    };
    if st.bytes_since_snapshot < floor {
        return false;
    }
    let store = u64::from(st.store.cache_stats().file_pages) * kvstore::PAGE_SIZE as u64;
    st.bytes_since_snapshot >= store
}

/// Whether `(k, v)` is a pair raftkv's store can hold.
fn ours(k: &[u8], v: &[u8]) -> bool {
    let key_ok = match k.first() {
        Some(&super::mvcc::INDEX | &super::mvcc::RECORD) => super::mvcc::valid(k, v),
        Some(&layout::CLIENT) => k.len() == 9 && sessions::decode(v).is_some(),
        Some(&super::leases::LEASE | &super::leases::ATTACHED) => super::leases::valid(k, v),
        Some(b'm') => {
            k == layout::APPLIED
                || (k == layout::CLOCK && v.len() == 8)
                || (k == layout::FORMAT_KEY && v == layout::FORMAT.to_le_bytes())
                || (k == super::mvcc::MVCC_STATE && super::mvcc::MvccState::decode(v).is_some())
        }
        _ => false,
    };
    key_ok && v.len() <= kvstore::MAX_VALUE
}

impl StateMachine {
    /// Makes the store durable, then streams it, with its applied id, into
    /// a new snapshot file, which becomes the current snapshot.
    pub(super) fn build(&self) -> Result<Snapshot, Error> {
        let inner = &self.inner;
        let began = std::time::Instant::now();
        let (meta, name, pairs) = {
            let mut st = inner.state.lock();
            st.store.sync()?;
            self.mark_durable(st.applied.log_id);
            st.snapshots_built += 1;
            st.bytes_since_snapshot = 0;
            st.snapshot_asked = false;
            let last = st.applied.log_id;
            let meta = Meta {
                last_log_id: last,
                last_membership: st.applied.membership.clone(),
            };
            let name = format!(
                "{}-{}-{}",
                last.map_or(0, |l| l.leader_id.term),
                last.map_or(0, |l| l.index),
                st.snapshots_built
            );
            // The iterator's snapshot is taken now, under the lock applies
            // hold: exactly the entries up to `last`.
            (meta, name, st.store.range(..)?)
        };
        let snaps = inner.dir.join(SNAPSHOT_DIR);
        let tmp = snaps.join(format!("{name}.tmp"));
        let mut w = Writer::create(&*inner.vfs, &tmp, &meta)?;
        for pair in pairs {
            let (k, v) = pair?;
            w.push(k, v)?;
        }
        let bytes = w.finish()?;
        let path = self.make_current(&tmp, &meta, &name)?;
        self.observe("build", began, bytes);
        Ok(Snapshot {
            meta,
            snapshot: SnapshotFile::open(&*inner.vfs, &path)?,
        })
    }

    /// Renames a synced snapshot file into place as `name.snap` (the
    /// directory synced), the current snapshot, and removes the one before
    /// it. A file already in place (installed again at start) stays.
    fn make_current(&self, from: &Path, meta: &Meta, name: &str) -> Result<PathBuf, Error> {
        let inner = &self.inner;
        let snaps = inner.dir.join(SNAPSHOT_DIR);
        let path = snaps.join(format!("{name}.snap"));
        if from != path {
            inner.vfs.rename(from, &path)?;
            inner.vfs.sync_dir(&snaps)?;
        }
        let old = inner
            .state
            .lock()
            .snapshot
            .replace((meta.clone(), path.clone()));
        if let Some((_, old)) = old.filter(|(_, p)| *p != path) {
            // (Open keeps only the newest if this removal is lost.)
            inner.vfs.remove_file(&old)?;
        }
        Ok(path)
    }

    /// Makes an installed file the current snapshot; returns its length.
    fn received_current(&self, meta: &Meta, file: &mut SnapshotFile) -> Result<u64, Error> {
        let bytes = file.file.len()?;
        let (term, index) = (meta.last_log_id).map_or((0, 0), |l| (l.leader_id.term, l.index));
        // Renamed into place: no longer a received file to remove.
        file.remove_on_drop = None;
        self.make_current(&file.path, meta, &format!("{term}-{index}-received"))?;
        Ok(bytes)
    }

    /// Counts snapshot durations and sizes in `metrics`.
    pub fn set_metrics(&self, metrics: Arc<crate::metrics::Metrics>) {
        self.inner.state.lock().metrics = Some(metrics);
    }

    /// Notes a snapshot of `bytes` built or installed from `began`.
    fn observe(&self, op: &str, began: std::time::Instant, bytes: u64) {
        if let Some(m) = self.inner.state.lock().metrics.clone() {
            m.observe_snapshot(op, began.elapsed(), bytes);
        }
    }

    /// Turns on the byte policy ([`StateMachine::snapshot_due`]) with
    /// `floor` bytes at least between snapshots.
    pub fn snapshot_by_bytes(&self, floor: u64) {
        self.inner.state.lock().snapshot_min_bytes = Some(floor);
    }

    /// Waits until the byte policy asks for a snapshot: the value bytes
    /// applied since the last one reached the store's size (and the
    /// floor). The node then has openraft build one.
    pub async fn snapshot_due(&self) {
        self.inner.snapshot_due.notified().await;
    }

    /// Whether the byte policy asked for a snapshot not yet built.
    pub fn snapshot_asked(&self) -> bool {
        self.inner.state.lock().snapshot_asked
    }

    /// A new file to receive a snapshot into (the network writes what a
    /// leader streams into it, then hands it to openraft to install);
    /// removed when dropped unless it was installed.
    pub fn receive(&self) -> Result<SnapshotFile, Error> {
        let n = {
            let mut st = self.inner.state.lock();
            st.received += 1;
            st.received
        };
        let path = self
            .inner
            .dir
            .join(SNAPSHOT_DIR)
            .join(format!("recv-{n}.tmp"));
        let mut file = SnapshotFile::create(&*self.inner.vfs, &path)?;
        file.remove_on_drop = Some(self.inner.vfs.clone());
        Ok(file)
    }

    /// Replaces the store by the content of a received snapshot file (see
    /// the module docs of `machine.rs`).
    pub(super) fn install(&self, meta: &Meta, mut file: SnapshotFile) -> Result<(), Error> {
        let inner = &self.inner;
        let began = std::time::Instant::now();
        file.file.sync_all()?;
        let (found, start) = read_meta(&*file.file)?;
        if found.last_log_id != meta.last_log_id || found.last_membership != meta.last_membership {
            return Err(corrupt("snapshot file: not the snapshot openraft sent"));
        }
        let generation = inner.state.lock().generation + 1;
        let new_dir = store_dir(&inner.dir, generation);
        if inner.vfs.exists(&new_dir)? {
            remove_tree(&*inner.vfs, &new_dir)?;
        }
        let store = Store::open_with(inner.vfs.clone(), &new_dir, inner.options)?;
        let partial = fill(&store, &*file.file, start).and_then(|held| partial_of(held, meta));
        let partial = match partial {
            Ok(p) => p,
            Err(e) => {
                // Not named by `CURRENT`: nothing to keep.
                drop(store);
                remove_tree(&*inner.vfs, &new_dir)?;
                return Err(e);
            }
        };
        // A crash here leaves a new store without its applied state, which
        // `CURRENT` does not name: the next open removes it.
        fail::fail_point!("raftkv::install", |_| std::process::abort());
        let applied = AppliedState {
            log_id: meta.last_log_id,
            membership: meta.last_membership.clone(),
            partial,
        };
        let state = postcard::to_stdvec(&applied).map_err(corrupt)?;
        let mut txn = store.transaction();
        txn.put(layout::APPLIED, &state);
        txn.commit()?;
        let loaded = load(&store)?;
        // The snapshot is current before `CURRENT` names the store with its
        // applied id: at any crash the current snapshot covers the applied
        // id, which openraft may purge the log up to (at start, or by the
        // purge gate after `mark_durable`); it refuses to start otherwise.
        let bytes = self.received_current(meta, &mut file)?;
        let mut st = inner.state.lock();
        // A crash here: the next open removes the new store (not named),
        // and openraft installs the current snapshot again at start.
        fail::fail_point!("raftkv::install-switch", |_| std::process::abort());
        write_current(&*inner.vfs, &inner.dir, generation)?;
        // A crash here: openraft purges the log up to the snapshot at the
        // next start (its log ends below the applied index).
        self.mark_durable(meta.last_log_id);
        fail::fail_point!("raftkv::installed", |_| std::process::abort());
        let old = std::mem::replace(&mut st.store, Arc::new(store));
        let old_dir = store_dir(&inner.dir, st.generation);
        st.generation = generation;
        st.applied = applied;
        st.sessions = loaded.sessions;
        st.mvcc = loaded.mvcc;
        st.readable = loaded.readable;
        let revisions = super::reads::Revisions {
            current: st.readable,
            compact: st.mvcc.compact,
            physical: st.mvcc.physical,
        };
        let listening = st.leases.listening();
        st.leases = loaded.leases;
        if listening {
            st.leases.listen(true);
            st.leases.reloaded();
            inner.lease_changed.notify_one();
        }
        drop(st);
        if let Some(l) = meta.last_log_id {
            inner.applied_index.send_replace(l.index);
        }
        inner.revisions.send_replace(revisions);
        old.close()?;
        drop(old);
        remove_tree(&*inner.vfs, &old_dir)?;
        inner.vfs.sync_dir(&inner.dir)?;
        self.observe("install", began, bytes);
        Ok(())
    }
}

/// Fills a new store from a snapshot file's chunks by a sorted bulk load
/// (the file holds the keys in order, as the build's iterator read them;
/// a key out of order is a damaged file), checking every pair. Durable on
/// return. Returns the `m/applied` the file holds (not loaded: the
/// install writes its own).
fn fill(store: &Store, file: &dyn VfsFile, start: u64) -> Result<Option<Vec<u8>>, Error> {
    let mut load = store.bulk_load()?;
    let mut applied = None;
    for chunk in Chunks::new(file, start)? {
        for (k, v) in chunk? {
            if !ours(&k, &v) {
                return Err(corrupt("snapshot: a key that is not raftkv's"));
            }
            if k == layout::APPLIED {
                applied = Some(v);
                continue;
            }
            load.push(&k, &v).map_err(|e| match e {
                kvstore::Error::OutOfOrder => corrupt("snapshot: keys out of order"),
                e => e.into(),
            })?;
        }
    }
    load.finish()?;
    Ok(applied)
}

/// The partial mark of a snapshot built between two apply steps
/// (`step.rs`): the entry after its last log id, applied in part. The
/// node that installs it goes on from there when that entry is applied.
fn partial_of(held: Option<Vec<u8>>, meta: &Meta) -> Result<Option<Partial>, Error> {
    let Some(v) = held else {
        return Ok(None);
    };
    let held: AppliedState =
        postcard::from_bytes(&v).map_err(|e| corrupt(format!("snapshot: m/applied: {e}")))?;
    if held.log_id != meta.last_log_id {
        return Err(corrupt("snapshot: m/applied is not the meta's log id"));
    }
    match held.partial {
        Some(p) if Some(p.index) != meta.last_log_id.map(|l| l.index + 1) => Err(corrupt(
            "snapshot: a partial mark not in the entry after the last log id",
        )),
        p => Ok(p),
    }
}
