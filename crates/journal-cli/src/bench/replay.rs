//! `--scenario replay`: how fast the log reads back, against the disk's
//! own sequential read of the same files (issue: zero-copy replay).
//!
//! Writes a log of `--log-mib` MiB (default 1,024) of `--replay-record-size`
//! records (default 4 KiB), closes it, warms the page cache, then times in
//! the same run, over three interleaved rounds (medians):
//!
//! - (a) `Journal::open` — recovery's scan of the whole log;
//! - (b) `read_from` from the start, touching every payload byte;
//! - (c) a plain sequential read of the same segment files (1 MiB reads).
//!
//! and the ratio (b) / (c). Then the same with 1 MiB records: chains of
//! parts over 256 KiB buffers, read part by part in place
//! (`EntryBytes::parts`, no reassembly).

use super::{bench_options, err, median, options_json, table, BenchArgs, Env};
use journal_core::vfs::{OpenOptions, OsVfs, Vfs};
use journal_core::{Journal, Options};
use serde_json::{json, Value as Json};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

/// Touches every byte: a wrapping sum over 8-byte words and the tail.
fn touch(b: &[u8]) -> u64 {
    let mut words = b.chunks_exact(8);
    let mut sum = 0u64;
    for w in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        sum = sum.wrapping_add(u64::from_le_bytes(word));
    }
    for &x in words.remainder() {
        sum = sum.wrapping_add(x as u64);
    }
    sum
}

/// Reads every segment file of `dir` sequentially in 1 MiB reads; returns
/// the bytes read.
pub(super) fn plain_read(vfs: &OsVfs, dir: &Path) -> Result<u64, String> {
    let mut names: Vec<String> = vfs
        .read_dir(dir)
        .map_err(err)?
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    for n in names {
        let f = vfs.open(&dir.join(n), OpenOptions::read()).map_err(err)?;
        let mut off = 0u64;
        loop {
            let got = f.read_at(&mut buf, off).map_err(err)?;
            if got == 0 {
                break;
            }
            black_box(&buf[..got]);
            off += got as u64;
            total += got as u64;
        }
    }
    Ok(total)
}

/// One record size: write the log, then three rounds of (a), (b), (c).
fn one(env: &Env, log_bytes: u64, record: usize) -> Result<Json, String> {
    let segment = bench_options(env).segment_size;
    let options = Options {
        // Room for the whole log and the segments prepared ahead.
        max_segments: log_bytes / segment + 8,
        ..bench_options(env)
    };
    let dir = env.fresh_dir("replay");
    let label = format!(
        "replay: writing {} MiB of {record}-byte records",
        log_bytes >> 20
    );
    env.progress(&label);
    let count = (log_bytes / record as u64).max(1);
    {
        let j = Journal::open(&dir, options).map_err(err)?;
        let mut rec = vec![0u8; record];
        for i in 0..count {
            rec[..8].copy_from_slice(&i.to_le_bytes());
            j.append(&rec).map_err(err)?;
            if i % 4096 == 4095 {
                j.force_all().map_err(err)?;
            }
        }
        j.close().map_err(err)?;
    }
    let vfs = OsVfs::new();
    // Warm the cache: every measurement below reads from memory.
    let file_bytes = plain_read(&vfs, &dir)?;
    let (mut open_s, mut read_s, mut plain_s) = (Vec::new(), Vec::new(), Vec::new());
    let mut payload = 0u64;
    let mut mapped = 0u64;
    let rounds = 3;
    for round in 0..rounds {
        env.progress_bar(round, rounds, &format!("replay: {record}-byte records"));
        let t = Instant::now();
        let j = Journal::open(&dir, options).map_err(err)?;
        open_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let (mut n, mut bytes, mut sum, mut in_place) = (0u64, 0u64, 0u64, 0u64);
        for r in j.read_from(j.redo_lsn()).map_err(err)? {
            let (_, b) = r.map_err(err)?;
            // In place, part by part: a chained record is never copied.
            for part in b.parts() {
                sum = sum.wrapping_add(touch(part));
                bytes += part.len() as u64;
            }
            n += 1;
            in_place += b.is_mapped() as u64;
        }
        read_s.push(t.elapsed().as_secs_f64());
        black_box(sum);
        if n != count {
            return Err(format!("read {n} records back, wrote {count}"));
        }
        payload = bytes;
        mapped = in_place;
        drop(j);
        let t = Instant::now();
        black_box(plain_read(&vfs, &dir)?);
        plain_s.push(t.elapsed().as_secs_f64());
    }
    env.discard(&dir);
    let (open_t, read_t, plain_t) = (median(open_s), median(read_s), median(plain_s));
    let mbps = |bytes: u64, s: f64| bytes as f64 / s / 1e6;
    let read_mbps = mbps(payload, read_t);
    let plain_mbps = mbps(file_bytes, plain_t);
    Ok(json!({
        "record_size": record, "records": count, "log_bytes": payload,
        "segment_file_bytes": file_bytes,
        "open_s": open_t, "recovery_mb_per_s": mbps(payload, open_t),
        "read_from_s": read_t, "read_from_mb_per_s": read_mbps,
        "plain_read_s": plain_t, "plain_read_mb_per_s": plain_mbps,
        "read_over_plain": read_mbps / plain_mbps,
        "entries_read_in_place": mapped,
        "options": options_json(&options),
    }))
}

/// The replay scenario.
pub fn replay(env: &Env, args: &BenchArgs) -> Result<Json, String> {
    let log_bytes = args.log_mib.unwrap_or(if env.smoke { 8 } else { 1024 }) << 20;
    let sizes = [args.replay_record_size, 1 << 20];
    let mut results = Vec::new();
    let mut rows = Vec::new();
    for record in sizes {
        let r = one(env, log_bytes, record)?;
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        rows.push(vec![
            record.to_string(),
            format!("{:.3}", f("open_s")),
            format!("{:.0}", f("recovery_mb_per_s")),
            format!("{:.0}", f("read_from_mb_per_s")),
            format!("{:.0}", f("plain_read_mb_per_s")),
            format!("{:.2}", f("read_over_plain")),
        ]);
        results.push(r);
    }
    println!(
        "replay: a {} MiB log read back, warm cache, medians of 3 rounds",
        log_bytes >> 20
    );
    table(
        &[
            "record bytes",
            "(a) open s",
            "recovery MB/s",
            "(b) read_from MB/s",
            "(c) plain read MB/s",
            "(b)/(c)",
        ],
        &rows,
    );
    Ok(json!({"scenario": "replay", "log_mib": log_bytes >> 20, "results": results}))
}
