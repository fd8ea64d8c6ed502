//! The journal's counters count what they say: group sizes land in their
//! buckets, log syncs and RWF_DSYNC writes by sync method, and one data
//! preflush per registered file per checkpoint.
#![cfg(not(loom))]

use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
use journal_core::{Options, SyncMethod};
use journal_tests::{open_sim, small_options};
use std::path::Path;

fn options(sync_method: SyncMethod) -> Options {
    Options {
        sync_method,
        // One FUA write per commit: each commit is one log write made
        // durable the sync method's way.
        commits_in_flight: 1,
        direct_io: false,
        ..small_options()
    }
}

#[test]
fn lone_commits_are_groups_of_one_and_each_is_one_fdatasync() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, options(SyncMethod::Fdatasync)).unwrap();
    let m0 = j.metrics();
    for i in 0..5u8 {
        j.append_durable(&[i; 100]).unwrap();
    }
    let m = j.metrics();
    assert_eq!(m.groups - m0.groups, 5);
    assert_eq!(
        m.group_sizes[0] - m0.group_sizes[0],
        5,
        "five groups of one"
    );
    assert_eq!(m.group_sizes[1..], m0.group_sizes[1..]);
    assert_eq!(m.log_syncs - m0.log_syncs, 5, "one fdatasync per commit");
    assert_eq!(m.dsync_writes, 0);
}

/// With staged commits (the default), a commit that is alone — nothing in
/// flight, nobody waiting — has nothing to overlap: it is one FUA write
/// (the record's write and the flush back to back in the device), not a
/// plain write and then a bare flush through the ring and the batcher.
#[test]
fn a_lone_staged_commit_is_one_fua_write() {
    let vfs = SimVfs::new();
    let options = Options {
        direct_io: false,
        ..small_options()
    };
    assert!(options.commits_in_flight > 1, "staged by default");
    let j = open_sim(&vfs, options).unwrap();
    let m0 = j.metrics();
    for i in 0..5u8 {
        j.append_durable(&[i; 100]).unwrap();
    }
    let m = j.metrics();
    assert_eq!(m.groups - m0.groups, 5);
    assert_eq!(m.log_writes - m0.log_writes, 5, "one log write per commit");
    assert_eq!(
        m.log_writes_fua - m0.log_writes_fua,
        5,
        "each a FUA write, not a plain write and a bare flush: {m:?}"
    );
    assert_eq!(m.log_syncs - m0.log_syncs, 5, "one fdatasync per commit");
}

#[test]
fn with_rwf_dsync_each_commit_is_one_dsync_write_and_no_fdatasync() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, options(SyncMethod::Dsync)).unwrap();
    let m0 = j.metrics();
    for i in 0..4u8 {
        j.append_durable(&[i; 100]).unwrap();
    }
    let m = j.metrics();
    assert_eq!(m.dsync_writes - m0.dsync_writes, 4);
    assert_eq!(m.log_syncs - m0.log_syncs, 0);
}

#[test]
fn a_checkpoint_flushes_each_registered_data_file_once() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, options(SyncMethod::Fdatasync)).unwrap();
    for name in ["/a.dat", "/b.dat"] {
        let f = vfs.open(Path::new(name), OpenOptions::create()).unwrap();
        f.write_at(b"page", 0).unwrap();
        vfs.sync_dir(Path::new("/")).unwrap();
        j.register_data_file(name).unwrap();
    }
    let lsn = j.append_durable(b"record").unwrap();
    assert_eq!(j.metrics().data_preflushes, 0);
    j.checkpoint(lsn).unwrap();
    assert_eq!(j.metrics().data_preflushes, 2, "both files, once");
    let lsn = j.append_durable(b"another").unwrap();
    assert_eq!(
        j.metrics().data_preflushes,
        2,
        "a commit flushes no data file"
    );
    j.checkpoint(lsn).unwrap();
    assert_eq!(j.metrics().data_preflushes, 4);
}

/// A record that crosses a segment boundary is two writes, and FUA applies
/// to both halves: with RWF_DSYNC, the commit that writes it makes two
/// durable writes, one into each segment.
#[test]
fn both_halves_of_a_split_record_are_written_fua() {
    use journal_core::vfs::Op;
    let vfs = SimVfs::new();
    let o = options(SyncMethod::Dsync);
    let j = open_sim(&vfs, o).unwrap();
    // 3,532-byte entries make 3,584-byte records (7 × 512), which do not
    // divide a segment's 61,440 data bytes: the 18th crosses the boundary.
    let data = j.geometry().data_size();
    let entry = vec![0x5Au8; 3584 - 48 - 4];
    let mut split_seen = false;
    for _ in 0..40 {
        let (m0, fua0) = (j.metrics(), vfs.calls(Op::FuaWrite));
        let start = j.appended_lsn();
        j.append_durable(&entry).unwrap();
        let crosses = start.0 / data != (start.0 + 3584 - 1) / data;
        let (m, fua) = (j.metrics(), vfs.calls(Op::FuaWrite));
        if crosses {
            assert_eq!(m.split_records - m0.split_records, 1);
            assert_eq!(fua - fua0, 2, "both halves durable on return");
            split_seen = true;
        } else {
            assert_eq!(m.split_records, m0.split_records);
            assert_eq!(fua - fua0, 1);
        }
    }
    assert!(split_seen, "a record crossed a segment boundary");
}
