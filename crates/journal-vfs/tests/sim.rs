//! SimVfs: the crash model behaves as documented.
#![cfg(not(loom))]

use journal_vfs::{AlignedBuf, CrashPolicy, Fault, Op, OpenOptions, Prealloc, SimVfs, Vfs};
use std::path::{Path, PathBuf};

fn setup() -> (SimVfs, PathBuf) {
    let vfs = SimVfs::new();
    let dir = PathBuf::from("/j");
    vfs.create_dir_all(&dir).unwrap();
    (vfs, dir)
}

/// A file whose name is already durable (created, dir fsynced).
fn durable_file(vfs: &SimVfs, dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    vfs.open(&p, OpenOptions::create()).unwrap();
    vfs.sync_dir(dir).unwrap();
    p
}

const TORN_SEEDS: std::ops::Range<u64> = 0..64;

#[test]
fn unsynced_write_is_gone_after_drop_all_crash() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    f.write_at(b"hello", 0).unwrap();
    assert_eq!(vfs.live_contents(&p).unwrap(), b"hello");
    let after = vfs.crash(CrashPolicy::DropUnsynced);
    assert_eq!(after.live_contents(&p).unwrap(), b"");
}

#[test]
fn fdatasync_keeps_the_write() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    f.write_at(b"hello", 0).unwrap();
    f.sync_data().unwrap();
    f.write_at(b"J", 0).unwrap();
    for policy in [
        CrashPolicy::DropUnsynced,
        CrashPolicy::TornSectors { seed: 1 },
    ] {
        let c = vfs.crash(policy).live_contents(&p).unwrap();
        assert!(c == b"hello" || c == b"Jello", "{policy:?}: {c:?}");
    }
    assert_eq!(
        vfs.crash(CrashPolicy::DropUnsynced)
            .live_contents(&p)
            .unwrap(),
        b"hello"
    );
}

#[test]
fn fua_write_survives_without_a_sync_and_only_it() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    f.write_at(&[1u8; 512], 0).unwrap();
    f.write_at_fua(&[2u8; 512], 512).unwrap();
    let c = vfs
        .crash(CrashPolicy::DropUnsynced)
        .live_contents(&p)
        .unwrap();
    assert_eq!(c.len(), 1024);
    assert!(
        c[..512].iter().all(|&b| b == 0),
        "plain write must not ride along"
    );
    assert!(c[512..].iter().all(|&b| b == 2));
}

#[test]
fn fua_write_supersedes_older_unsynced_bytes_under_every_torn_crash() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    f.write_at(&[7u8; 1024], 0).unwrap();
    f.write_at_fua(&[9u8; 512], 256).unwrap();
    for seed in TORN_SEEDS {
        let c = vfs
            .crash(CrashPolicy::TornSectors { seed })
            .live_contents(&p)
            .unwrap();
        assert!(c[256..768].iter().all(|&b| b == 9), "seed {seed}");
    }
}

#[test]
fn rename_without_dir_fsync_can_vanish_and_with_it_survives() {
    let (vfs, dir) = setup();
    let a = durable_file(&vfs, &dir, "a");
    let b = dir.join("b");
    vfs.rename(&a, &b).unwrap();
    let lost = vfs.crash(CrashPolicy::DropUnsynced);
    assert!(lost.exists(&a).unwrap());
    assert!(!lost.exists(&b).unwrap());
    vfs.sync_dir(&dir).unwrap();
    for policy in [
        CrashPolicy::DropUnsynced,
        CrashPolicy::TornSectors { seed: 3 },
    ] {
        let kept = vfs.crash(policy);
        assert!(!kept.exists(&a).unwrap());
        assert!(kept.exists(&b).unwrap());
    }
}

#[test]
fn create_and_remove_are_volatile_until_dir_fsync() {
    let (vfs, dir) = setup();
    let f = dir.join("new");
    let h = vfs.open(&f, OpenOptions::create()).unwrap();
    h.write_at(b"x", 0).unwrap();
    h.sync_all().unwrap();
    // The data is durable but the name is not.
    assert!(!vfs.crash(CrashPolicy::DropUnsynced).exists(&f).unwrap());
    vfs.sync_dir(&dir).unwrap();
    assert_eq!(
        vfs.crash(CrashPolicy::DropUnsynced)
            .live_contents(&f)
            .unwrap(),
        b"x"
    );
    vfs.remove_file(&f).unwrap();
    assert!(!vfs.exists(&f).unwrap());
    assert!(vfs.crash(CrashPolicy::DropUnsynced).exists(&f).unwrap());
    vfs.sync_dir(&dir).unwrap();
    assert!(!vfs.crash(CrashPolicy::DropUnsynced).exists(&f).unwrap());
}

#[test]
fn torn_write_leaves_each_sector_wholly_old_or_wholly_new() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    f.write_at(&[0xAA; 4096], 0).unwrap();
    f.sync_data().unwrap();
    f.write_at(&[0xBB; 4096], 0).unwrap();
    let mut saw_tear = false;
    for seed in TORN_SEEDS {
        let c = vfs
            .crash(CrashPolicy::TornSectors { seed })
            .live_contents(&p)
            .unwrap();
        assert_eq!(c.len(), 4096);
        let states: Vec<u8> = c
            .chunks(512)
            .map(|s| {
                assert!(
                    s.iter().all(|&b| b == s[0]),
                    "seed {seed}: sector mixes bytes"
                );
                s[0]
            })
            .collect();
        saw_tear |= states.contains(&0xAA) && states.contains(&0xBB);
    }
    assert!(saw_tear, "64 seeds never tore an 8-sector write");
}

#[test]
fn overwrite_with_identical_bytes_stays_intact() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    let data: Vec<u8> = (0..2048u32).map(|i| (i * 7) as u8).collect();
    f.write_at(&data, 0).unwrap();
    f.sync_data().unwrap();
    f.write_at(&data, 0).unwrap();
    f.write_at(&data[100..900], 100).unwrap();
    for seed in TORN_SEEDS {
        let c = vfs
            .crash(CrashPolicy::TornSectors { seed })
            .live_contents(&p)
            .unwrap();
        assert_eq!(c, data, "seed {seed}");
    }
}

#[test]
fn injected_fault_returns_the_error_and_changes_nothing() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    f.write_at(b"one", 0).unwrap();
    vfs.inject(Fault::eio(Op::Write, 2));
    f.write_at(b"two", 3).unwrap();
    let e = f.write_at(b"three", 6).unwrap_err();
    assert_eq!(e.op(), Op::Write);
    assert_eq!(e.raw_os_error(), Some(libc_eio()));
    assert_eq!(e.path(), p);
    assert_eq!(vfs.live_contents(&p).unwrap(), b"onetwo");
    f.write_at(b"four", 6).unwrap();

    vfs.inject(Fault::enospc(Op::SyncData, 1));
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(28));
    assert_eq!(
        vfs.crash(CrashPolicy::DropUnsynced)
            .live_contents(&p)
            .unwrap(),
        b""
    );
    vfs.inject(Fault::eio(Op::Rename, 1));
    assert!(vfs.rename(&p, &dir.join("g")).is_err());
    assert!(vfs.exists(&p).unwrap() && !vfs.exists(&dir.join("g")).unwrap());
    vfs.inject(Fault::eio(Op::Create, 1));
    assert!(vfs.open(&dir.join("h"), OpenOptions::create()).is_err());
    assert!(!vfs.exists(&dir.join("h")).unwrap());
    assert_eq!(vfs.calls(Op::Create), 2);
}

fn libc_eio() -> i32 {
    5
}

#[test]
fn same_seed_gives_the_same_image() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    for i in 0..32u64 {
        f.write_at(&[i as u8; 700], i * 300).unwrap();
    }
    vfs.rename(&p, &dir.join("g")).unwrap();
    let image = |seed| {
        let c = vfs.crash(CrashPolicy::TornSectors { seed });
        (c.live_contents(&p), c.live_contents(&dir.join("g")))
    };
    assert_eq!(image(42), image(42));
    let distinct: std::collections::HashSet<_> = (0..16).map(image).collect();
    assert!(distinct.len() > 1, "different seeds should differ");
}

#[test]
fn read_dir_lists_live_names_and_lock_excludes_a_second_holder() {
    let (vfs, dir) = setup();
    durable_file(&vfs, &dir, "a");
    vfs.open(&dir.join("b"), OpenOptions::create()).unwrap();
    vfs.create_dir_all(&dir.join("sub")).unwrap();
    let mut names = vfs.read_dir(&dir).unwrap();
    names.sort();
    assert_eq!(names, ["a", "b", "sub"]);
    assert!(vfs.remove_dir(&dir).is_err(), "not empty");
    vfs.create_dir_all(&dir.join("empty")).unwrap();
    vfs.remove_dir(&dir.join("empty")).unwrap();
    assert!(!vfs.exists(&dir.join("empty")).unwrap());
    let l = vfs.lock_dir(&dir).unwrap();
    assert!(vfs.lock_dir(&dir).is_err());
    drop(l);
    vfs.lock_dir(&dir).unwrap();
}

#[test]
fn preallocate_zero_fill_and_set_len_are_volatile_until_synced() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    f.preallocate(0, 8192, Prealloc::ZeroFill).unwrap();
    assert_eq!(f.len().unwrap(), 8192);
    assert_eq!(
        vfs.crash(CrashPolicy::DropUnsynced)
            .live_contents(&p)
            .unwrap()
            .len(),
        0
    );
    f.sync_all().unwrap();
    assert_eq!(
        vfs.crash(CrashPolicy::DropUnsynced)
            .live_contents(&p)
            .unwrap()
            .len(),
        8192
    );
    f.preallocate(0, 16384, Prealloc::Fallocate).unwrap();
    assert_eq!(f.len().unwrap(), 16384);
    f.set_len(100).unwrap();
    f.sync_data().unwrap();
    assert_eq!(vfs.durable_contents(&p).unwrap().len(), 100);
    let ro = vfs.open(&p, OpenOptions::read()).unwrap();
    assert!(ro.write_at(b"x", 0).is_err());
}

#[test]
fn counters_count_by_kind() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let f = vfs.open(&p, OpenOptions::write()).unwrap();
    let before = vfs.counters();
    f.write_at(&[0; 10], 0).unwrap();
    f.write_at_fua(&[0; 20], 0).unwrap();
    f.sync_data().unwrap();
    f.sync_all().unwrap();
    vfs.sync_dir(&dir).unwrap();
    vfs.rename(&p, &dir.join("g")).unwrap();
    vfs.remove_file(&dir.join("g")).unwrap();
    let d = vfs.counters().since(&before);
    assert_eq!(
        (
            d.writes,
            d.bytes_written,
            d.fua_writes,
            d.fdatasyncs,
            d.fsyncs,
            d.dir_fsyncs
        ),
        (2, 30, 1, 1, 1, 1)
    );
    assert_eq!((d.renames, d.removes, d.creates), (1, 1, 0));
    assert_eq!(d.syncs(), 4);
}

/// Linux after a writeback error, as PostgreSQL learned it: the failed
/// fsync drops the dirty pages, the retry succeeds, and the data is gone in
/// a crash although it is still readable before one.
#[test]
fn a_failed_fsync_drops_the_dirty_pages_and_the_retry_lies() {
    let vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/d")).unwrap();
    let f = vfs.open(Path::new("/d/f"), OpenOptions::create()).unwrap();
    vfs.sync_dir(Path::new("/d")).unwrap();
    f.write_at(b"durable", 0).unwrap();
    f.sync_data().unwrap();
    f.write_at(b"LOSTLOST", 0).unwrap();
    vfs.inject(Fault::eio(Op::SyncData, 1));
    assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(5));
    // The retry "succeeds"...
    f.sync_data().unwrap();
    // ...the bytes are still readable...
    let mut b = [0u8; 8];
    f.read_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"LOSTLOST");
    // ...and a crash shows they never became durable.
    let img = vfs.crash(CrashPolicy::DropUnsynced);
    assert_eq!(
        &img.live_contents(Path::new("/d/f")).unwrap()[..7],
        b"durable"
    );
}

/// An armed crash captures the image a power cut would leave just before
/// the chosen mutating call, while the run goes on.
#[test]
fn an_armed_crash_captures_the_image_mid_run() {
    let (vfs, dir) = setup();
    let f = vfs.open(&dir.join("f"), OpenOptions::create()).unwrap();
    vfs.sync_dir(&dir).unwrap();
    f.write_at(b"one", 0).unwrap();
    f.sync_data().unwrap();
    // Calls from now: write "two" (1), sync (2), write "three" (3).
    vfs.arm_crash(2, CrashPolicy::DropUnsynced);
    f.write_at(b"two", 0).unwrap();
    f.sync_data().unwrap();
    f.write_at(b"333", 0).unwrap();
    let img = vfs.take_crash().expect("the crash was captured");
    // Just before the sync: "two" was not durable yet.
    assert_eq!(img.live_contents(&dir.join("f")).unwrap(), b"one");
    assert!(vfs.take_crash().is_none(), "taken once");
    // Armed past the end of the run: nothing captured.
    vfs.arm_crash(100, CrashPolicy::DropUnsynced);
    f.sync_data().unwrap();
    assert!(vfs.take_crash().is_none());
}

/// SimVfs holds a file opened with `O_DIRECT` to the kernel's rule: offset,
/// length and buffer address aligned to what `direct_io_alignment` says,
/// EINVAL otherwise (nothing written); a buffered handle has no such rule.
#[test]
fn direct_writes_must_be_aligned() {
    let (vfs, dir) = setup();
    let p = durable_file(&vfs, &dir, "f");
    let buffered = vfs.open(&p, OpenOptions::write()).unwrap();
    let a = buffered.direct_io_alignment().unwrap().unwrap() as usize;
    assert_eq!(a, 512);
    let direct = vfs
        .open(
            &p,
            OpenOptions {
                direct: true,
                ..OpenOptions::write()
            },
        )
        .unwrap();
    let mut buf = AlignedBuf::zeroed(3 * a);
    buf.fill(7);
    let aligned = &buf[..2 * a];
    let einval = |r: journal_vfs::Result<()>| {
        let e = r.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(22), "{e}");
    };
    einval(direct.write_at(&aligned[..a - 1], 0));
    einval(direct.write_at(&aligned[..a], 1));
    einval(direct.write_at(&buf[1..1 + a], 0));
    einval(direct.write_at_fua(&aligned[..a], 7));
    assert_eq!(buffered.len().unwrap(), 0, "a refused write wrote nothing");
    direct.write_at(aligned, a as u64).unwrap();
    direct.write_at_fua(&aligned[..a], 0).unwrap();
    buffered.write_at(b"odd", 3 * a as u64 + 1).unwrap();
    let mut back = vec![0u8; 2 * a];
    buffered.read_at(&mut back, a as u64).unwrap();
    assert_eq!(back, aligned);
}

#[test]
fn available_space_is_the_limit_less_what_the_files_hold() {
    let (vfs, dir) = setup();
    assert_eq!(vfs.available_space(&dir).unwrap(), u64::MAX, "no limit");
    vfs.set_space_limit(Some(10_000));
    assert_eq!(vfs.available_space(&dir).unwrap(), 10_000);
    let f = vfs.open(&dir.join("a"), OpenOptions::create()).unwrap();
    f.write_at(&[1; 4_000], 0).unwrap();
    assert_eq!(vfs.available_space(&dir).unwrap(), 6_000);
    assert!(f.write_at(&[1; 7_000], 4_000).is_err(), "past the limit");
    assert_eq!(vfs.available_space(&dir).unwrap(), 6_000);
    vfs.remove_file(&dir.join("a")).unwrap();
    drop(f);
    assert_eq!(vfs.available_space(&dir).unwrap(), 10_000, "freed");
    assert!(vfs.available_space(Path::new("/nowhere")).is_err());
}
