//! The log written with `O_DIRECT` (`Options::direct_io`): every log write
//! meets the alignment direct I/O needs (SimVfs refuses a misaligned one
//! with EINVAL, which would poison the journal), records of every size
//! come back byte for byte, and where direct I/O cannot serve the journal's
//! alignment the log goes through the page cache instead.
#![cfg(not(loom))]

use journal_core::vfs::{OpenOptions, OsVfs, SimVfs, Vfs};
use journal_core::{ForceMode, Journal, Lsn, Options};
use journal_tests::{open_sim, payload, small_options, verify};

/// Appends from three threads, with every commit style and record sizes
/// from one byte to several buffers (chains) across segment boundaries,
/// checkpointing as it goes; returns what was acknowledged at or after the
/// redo LSN, which a replay must give back.
fn workload(j: &Journal) -> Vec<(Lsn, Vec<u8>)> {
    let sizes = [13usize, 300, 511, 512, 513, 4096, 9000, 40 << 10, 70 << 10];
    let acked = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..3u8 {
            let acked = &acked;
            s.spawn(move || {
                for i in 0..40u32 {
                    let p = payload(w, i, sizes[(i as usize + w as usize) % sizes.len()]);
                    let lsn = match i % 3 {
                        0 => j.append_durable(&p).unwrap(),
                        1 => {
                            let l = j.append(&p).unwrap();
                            j.commit(l).unwrap();
                            l
                        }
                        _ => {
                            let l = j.append(&p).unwrap();
                            j.force(l, ForceMode::Written).unwrap();
                            j.force(l, ForceMode::Durable).unwrap();
                            l
                        }
                    };
                    acked.lock().unwrap().push((lsn, p));
                }
            });
        }
        s.spawn(|| {
            for _ in 0..5 {
                let d = j.durable_lsn();
                j.checkpoint(Lsn(d.0 / 2)).unwrap();
                std::thread::yield_now();
            }
        });
    });
    let redo = j.redo_lsn();
    let mut acked: Vec<_> = acked
        .into_inner()
        .unwrap()
        .into_iter()
        .filter(|(l, _)| *l >= redo)
        .collect();
    acked.sort_by_key(|(l, _)| *l);
    acked
}

#[test]
fn every_direct_log_write_is_aligned_and_records_come_back() {
    let vfs = SimVfs::new();
    let opts = Options {
        direct_io: true,
        ..small_options()
    };
    let acked = {
        let j = open_sim(&vfs, opts).unwrap();
        assert!(j.direct_io(), "SimVfs supports direct I/O at 512");
        let acked = workload(&j);
        j.close().unwrap();
        acked
    };
    assert!(!acked.is_empty());
    // Reopened both ways: the bytes are the same through the page cache.
    for direct_io in [true, false] {
        let j = open_sim(&vfs, Options { direct_io, ..opts }).unwrap();
        assert_eq!(j.direct_io(), direct_io);
        verify(&j, &acked, &format!("reopened, direct_io {direct_io}"));
        j.close().unwrap();
    }
}

#[test]
fn alignment_finer_than_direct_io_falls_back_to_the_page_cache() {
    for alignment in [1, 256] {
        let vfs = SimVfs::new();
        let opts = Options {
            direct_io: true,
            alignment,
            ..small_options()
        };
        let j = open_sim(&vfs, opts).unwrap();
        assert!(!j.direct_io(), "alignment {alignment} is finer than 512");
        let acked = workload(&j);
        verify(&j, &acked, &format!("alignment {alignment}"));
    }
}

#[test]
fn direct_io_on_disk_where_the_filesystem_has_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let opts = Options {
        direct_io: true,
        ..small_options()
    };
    // What this filesystem says it can do.
    let vfs = OsVfs::new();
    let probe = vfs
        .open(&tmp.path().join("probe"), OpenOptions::create())
        .unwrap();
    let expected = probe
        .direct_io_alignment()
        .unwrap()
        .is_some_and(|a| 512 % a == 0);
    let acked = {
        let j = Journal::open(&dir, opts).unwrap();
        assert_eq!(j.direct_io(), expected);
        let acked = workload(&j);
        j.close().unwrap();
        acked
    };
    for direct_io in [false, true] {
        let j = Journal::open(&dir, Options { direct_io, ..opts }).unwrap();
        verify(
            &j,
            &acked,
            &format!("on disk, reopened direct_io {direct_io}"),
        );
        j.close().unwrap();
    }
}

/// A filesystem that said it takes direct I/O and then refuses a direct
/// write (EINVAL): the write goes through the page cache instead, the
/// journal stays healthy, and direct I/O stays off from then on.
#[test]
fn a_refused_direct_write_falls_back_to_the_page_cache_for_good() {
    use journal_core::vfs::{Fault, Op};
    let vfs = SimVfs::new();
    let opts = Options {
        direct_io: true,
        background_preallocation: false,
        ..small_options()
    };
    let j = open_sim(&vfs, opts).unwrap();
    assert!(j.direct_io());
    let mut acked = Vec::new();
    for i in 0..3u32 {
        let p = payload(1, i, 700);
        acked.push((j.append_durable(&p).unwrap(), p));
    }
    vfs.inject(Fault {
        op: Op::Write,
        nth: 1,
        errno: 22, // EINVAL
        path: None,
    });
    for i in 3..10u32 {
        let p = payload(1, i, 5000);
        acked.push((j.append_durable(&p).unwrap(), p));
    }
    assert!(!j.direct_io(), "direct I/O is off after a refusal");
    j.close().unwrap();
    drop(j);
    let j = open_sim(&vfs, opts).unwrap();
    verify(&j, &acked, "after a refused direct write");
}
