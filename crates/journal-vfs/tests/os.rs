//! OsVfs against a temporary directory of the local disk.
#![cfg(not(loom))]

use journal_vfs::{AlignedBuf, FuaMode, OpenOptions, OsVfs, OsVfsOptions, Prealloc, Vfs};

#[test]
fn every_operation_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let vfs = OsVfs::new();
    let dir = tmp.path().join("j");
    vfs.create_dir_all(&dir).unwrap();
    let p = dir.join("a");
    assert!(!vfs.exists(&p).unwrap());
    let f = vfs.open(&p, OpenOptions::create_new()).unwrap();
    assert!(vfs.open(&p, OpenOptions::create_new()).is_err());
    f.write_at(b"hello world", 0).unwrap();
    f.sync_data().unwrap();
    f.sync_all().unwrap();
    let mut buf = [0u8; 5];
    f.read_exact_at(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"world");
    assert_eq!(f.read_at(&mut buf, 100).unwrap(), 0);
    assert!(f.read_exact_at(&mut buf, 9).is_err());
    f.preallocate(0, 1 << 16, Prealloc::Fallocate).unwrap();
    assert_eq!(f.len().unwrap(), 1 << 16);
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"hello", "fallocate must not change contents");
    f.preallocate(0, 4096, Prealloc::ZeroFill).unwrap();
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0; 5]);
    f.set_len(10).unwrap();
    assert_eq!(f.len().unwrap(), 10);
    let b = dir.join("b");
    vfs.rename(&p, &b).unwrap();
    vfs.sync_dir(&dir).unwrap();
    let mut names = vfs.read_dir(&dir).unwrap();
    names.sort();
    assert_eq!(names, ["b"]);
    vfs.remove_file(&b).unwrap();
    assert!(!vfs.exists(&b).unwrap());
    let err = vfs.open(&b, OpenOptions::read()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains("/b"), "{err}");
    let c = vfs.counters();
    assert_eq!(
        (c.creates, c.renames, c.removes, c.dir_fsyncs),
        (1, 1, 1, 1)
    );
    assert_eq!((c.fdatasyncs, c.fsyncs), (1, 1));
}

fn fua_round_trip(vfs: &OsVfs) {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("f");
    let f = vfs.open(&p, OpenOptions::create()).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    f.write_at_fua(&data, 512).unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 512).unwrap();
    assert_eq!(back, data);
    assert_eq!(vfs.counters().fua_writes, 1);
}

#[test]
fn fua_write_uses_rwf_dsync_where_the_kernel_has_it() {
    let vfs = OsVfs::new();
    assert_eq!(vfs.fua_mode(), FuaMode::Unknown);
    fua_round_trip(&vfs);
    assert_ne!(vfs.fua_mode(), FuaMode::Unknown);
    if vfs.fua_mode() == FuaMode::Native {
        assert_eq!(vfs.counters().fua_fallbacks, 0);
        assert_eq!(vfs.counters().fdatasyncs, 0);
    }
}

#[test]
fn fua_fallback_is_pwrite_plus_fdatasync() {
    let vfs = OsVfs::with_options(OsVfsOptions {
        force_fua_fallback: true,
        ..OsVfsOptions::default()
    });
    fua_round_trip(&vfs);
    assert_eq!(vfs.fua_mode(), FuaMode::Fallback);
    let c = vfs.counters();
    assert_eq!((c.fua_fallbacks, c.fdatasyncs, c.syncs()), (1, 1, 1));
}

#[test]
fn dsync_and_direct_opens_work_where_the_os_has_them() {
    let tmp = tempfile::tempdir().unwrap();
    let vfs = OsVfs::new();
    let f = vfs
        .open(
            &tmp.path().join("d"),
            OpenOptions {
                dsync: true,
                ..OpenOptions::create()
            },
        )
        .unwrap();
    f.write_at(b"x", 0).unwrap();
    // O_DIRECT is refused by some filesystems (tmpfs): then the error must
    // name the operation and the path; where accepted, the file works.
    match vfs.open(
        &tmp.path().join("o"),
        OpenOptions {
            direct: true,
            ..OpenOptions::create()
        },
    ) {
        Ok(f) => assert_eq!(f.len().unwrap(), 0),
        Err(e) => assert!(e.to_string().contains("/o"), "{e}"),
    }
}

#[test]
fn directory_lock_refuses_a_second_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let vfs = OsVfs::new();
    let held = vfs.lock_dir(tmp.path()).unwrap();
    let err = vfs.lock_dir(tmp.path()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    // Another process is refused too: flock(1) exits non-zero with -n.
    if let Ok(status) = std::process::Command::new("flock")
        .args(["-n", "-E", "42"])
        .arg(tmp.path().join("LOCK"))
        .arg("true")
        .status()
    {
        assert_eq!(status.code(), Some(42), "another process took the lock");
    }
    drop(held);
    vfs.lock_dir(tmp.path()).unwrap();
}

/// Where the filesystem reports a direct-I/O alignment, a file opened with
/// `O_DIRECT` takes a write aligned to it, from a buffer aligned to it, and
/// reads it back; where it reports none, asking is not an error.
#[test]
fn direct_io_alignment_is_what_a_direct_write_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let vfs = OsVfs::new();
    let path = tmp.path().join("d");
    let f = vfs.open(&path, OpenOptions::create()).unwrap();
    let Some(a) = f.direct_io_alignment().unwrap() else {
        return;
    };
    let a = a as usize;
    assert!(a.is_power_of_two(), "{a}");
    let direct = vfs
        .open(
            &path,
            OpenOptions {
                direct: true,
                ..OpenOptions::write()
            },
        )
        .unwrap();
    assert!(a <= AlignedBuf::ALIGN, "{a}");
    let mut buf = AlignedBuf::zeroed(a);
    buf.fill(0xAB);
    direct.write_at(&buf, a as u64).unwrap();
    direct.sync_data().unwrap();
    let mut back = vec![0u8; a];
    assert_eq!(f.read_at(&mut back, a as u64).unwrap(), a);
    assert!(back.iter().all(|&b| b == 0xAB));
}

#[test]
fn available_space_is_what_statvfs_reports() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = OsVfs::new();
    let free = vfs.available_space(dir.path()).unwrap();
    assert!(free > 0, "a test machine's disk has room");
    // 16 MiB written and synced take about that much off (other writers
    // on the machine move it too: only the order of magnitude is sure).
    let f = vfs
        .open(&dir.path().join("f"), OpenOptions::create())
        .unwrap();
    f.write_at(&vec![7u8; 16 << 20], 0).unwrap();
    f.sync_all().unwrap();
    let after = vfs.available_space(dir.path()).unwrap();
    assert!(after < free, "{after} < {free}");
    assert!(vfs.available_space(&dir.path().join("missing")).is_err());
}
