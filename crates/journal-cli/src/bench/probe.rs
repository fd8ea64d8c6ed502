//! The device's own cost of one group commit, sampled beside the load it
//! is compared with (the group-commit scenario's `limit` and
//! `efficiency`).

use super::{histogram, micros, Env};
use hdrhistogram::Histogram;
use journal_core::vfs::{OpenOptions, OsVfs, Prealloc, Vfs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The device's own cost of one group commit: a bare aligned write of the
/// group's bytes made durable the way the journal makes its log writes
/// durable (`sync_method`), on the filesystem of the run's directory.
///
/// The device's cost is not steady, so the probe is built to see it as the
/// load does. It drifts over seconds (a shared host's cache, its other
/// tenants): the probe is sampled in rounds between slices of the load it
/// is compared with ([`commit_load_sliced`](super::commit_load_sliced)), and its figure is the median
/// of every sample. A burst is cheaper than a sustained stream: on the VM
/// this was built on, a fresh writer's first ~250 syncs took ~120 µs and
/// every later one ~150 µs (medians of 250-sync windows, 512-byte pwrite +
/// fdatasync, C and Rust alike), while the load syncs without pause: each
/// round first makes `warmup` syncs it does not record.
pub struct DeviceProbe {
    dir: PathBuf,
    file: Box<dyn journal_core::vfs::VfsFile>,
    /// The bytes written (aligned in memory for direct I/O).
    buf: journal_core::vfs::AlignedBuf,
    span: u64,
    next: u64,
    method: journal_core::SyncMethod,
    latency: Histogram<u64>,
}

impl DeviceProbe {
    /// Creates the probe's file (preallocated like a segment) for writes
    /// of `bytes` rounded up to `alignment`, made durable by `method`;
    /// with `direct`, written with `O_DIRECT` as the journal writes its log
    /// then (where the filesystem allows it at this alignment).
    pub fn open(
        env: &Env,
        bytes: usize,
        alignment: u64,
        method: journal_core::SyncMethod,
        direct: bool,
    ) -> journal_core::vfs::Result<DeviceProbe> {
        let vfs = OsVfs::new();
        let dir = env.fresh_dir("device-probe");
        vfs.create_dir_all(&dir)?;
        let len = alignment_up(bytes as u64, alignment);
        let span = (alignment_up(len.max(4096), alignment) * 64).max(4 << 20);
        let path = dir.join("probe");
        let mut file = vfs.open(&path, OpenOptions::create_new())?;
        file.preallocate(0, span, Prealloc::ZeroFill)?;
        file.sync_all()?;
        let direct = direct
            && file.direct_io_alignment()?.is_some_and(|a| {
                a as usize <= journal_core::vfs::AlignedBuf::ALIGN
                    && alignment.is_multiple_of(u64::from(a))
            });
        if direct {
            file = vfs.open(
                &path,
                OpenOptions {
                    direct: true,
                    ..OpenOptions::write()
                },
            )?;
        }
        let mut buf = journal_core::vfs::AlignedBuf::zeroed(len as usize);
        buf.fill(0x5A);
        Ok(DeviceProbe {
            dir,
            file,
            buf,
            span,
            next: 0,
            method,
            latency: histogram(),
        })
    }

    /// One round: `warmup` then `samples` writes at consecutive offsets,
    /// each durable before the next, only the latter recorded; made on a
    /// fresh thread, like the load's clients (on a VM, the vCPU that takes
    /// the disk's interrupts completes a sync sooner than the other, so
    /// probe and clients must be placed alike).
    pub fn round(&mut self, warmup: usize, samples: usize) -> journal_core::vfs::Result<()> {
        std::thread::scope(|s| {
            s.spawn(|| self.sample(warmup, samples))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    fn sample(&mut self, warmup: usize, samples: usize) -> journal_core::vfs::Result<()> {
        use journal_core::SyncMethod;
        let len = self.buf.len() as u64;
        let buf = &self.buf[..];
        for k in 0..warmup + samples {
            if self.next + len > self.span {
                self.next = 0;
            }
            let t = Instant::now();
            match self.method {
                SyncMethod::Dsync => self.file.write_at_fua(buf, self.next)?,
                SyncMethod::Fsync => {
                    self.file.write_at(buf, self.next)?;
                    self.file.sync_all()?;
                }
                _ => {
                    self.file.write_at(buf, self.next)?;
                    self.file.sync_data()?;
                }
            }
            if k >= warmup {
                self.latency.record(micros(t.elapsed())).ok();
            }
            self.next += len;
        }
        Ok(())
    }

    /// The median of every sample so far.
    pub fn median(&self) -> Duration {
        Duration::from_micros(self.latency.value_at_quantile(0.5))
    }

    /// Removes the probe's file.
    pub fn discard(self, env: &Env) {
        drop(self.file);
        env.discard(&self.dir);
    }
}

fn alignment_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a.max(1)) * a.max(1)
}
