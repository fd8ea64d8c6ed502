//! The filesystem's operations, their POSIX-like errors, remounting, and
//! bad input: on SimVfs and on the real disk.

use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
use metafs::{
    fsck, journal_dir, Error, Fs, Kind, MkfsOptions, MountOptions, MAX_FILE_SIZE, NAME_MAX,
};
use std::path::Path;
use std::sync::Arc;

fn small_journal() -> journal_core::Options {
    journal_core::Options {
        segment_size: 1 << 20,
        logbsize: 64 << 10,
        // No background writer: injected faults meet the filesystem's own
        // calls, deterministically.
        background_preallocation: false,
        ..journal_core::Options::default()
    }
}

fn mkfs_opts(size: u64) -> MkfsOptions {
    MkfsOptions {
        size,
        inodes: None,
        journal: small_journal(),
    }
}

fn mount_opts() -> MountOptions {
    MountOptions {
        journal: small_journal(),
        ..MountOptions::default()
    }
}

const IMG: &str = "/fs.img";

fn sim_fs(size: u64) -> (SimVfs, Fs) {
    sim_fs_with(mkfs_opts(size), mount_opts())
}

/// [`sim_fs`] made and mounted with these options.
fn sim_fs_with(mkfs: MkfsOptions, mount: MountOptions) -> (SimVfs, Fs) {
    let vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/")).unwrap();
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    Fs::mkfs_with(v.clone(), IMG, mkfs).unwrap();
    let fs = Fs::mount_with(v, IMG, mount).unwrap();
    (vfs, fs)
}

fn remount(vfs: &SimVfs) -> Fs {
    Fs::mount_with(Arc::new(vfs.clone()), IMG, mount_opts()).unwrap()
}

fn names(fs: &Fs, path: &str) -> Vec<String> {
    let mut v: Vec<String> = fs
        .readdir(fs.resolve(path).unwrap())
        .unwrap()
        .into_iter()
        .map(|(n, _, _)| String::from_utf8(n).unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn the_operations_do_what_posix_says() {
    let (vfs, fs) = sim_fs(8 << 20);
    fs.mkdir_path("/a").unwrap();
    fs.mkdir_path("/a/b").unwrap();
    let f = fs.create_path("/a/b/f").unwrap();
    assert_eq!(fs.write(f, 0, b"hello world").unwrap(), 11);
    assert_eq!(fs.read(f, 6, 100).unwrap(), b"world");
    // A write past the end leaves a hole that reads as zeros.
    fs.write(f, 20_000, b"far").unwrap();
    let all = fs.read_path("/a/b/f").unwrap();
    assert_eq!(all.len(), 20_003);
    assert!(all[11..20_000].iter().all(|&b| b == 0));
    // Truncate down, then grow: the cut bytes never come back.
    fs.truncate(f, 5).unwrap();
    fs.truncate(f, 9).unwrap();
    assert_eq!(fs.read_path("/a/b/f").unwrap(), b"hello\0\0\0\0");
    // Rename within and across directories, replacing a file.
    let g = fs.create_path("/a/g").unwrap();
    fs.write(g, 0, b"gee").unwrap();
    fs.rename_path("/a/b/f", "/a/g").unwrap();
    assert_eq!(fs.read_path("/a/g").unwrap(), b"hello\0\0\0\0");
    assert_eq!(names(&fs, "/a"), ["b", "g"]);
    // Directories: link counts, moving, replacing an empty one.
    fs.mkdir_path("/c").unwrap();
    fs.mkdir_path("/c/empty").unwrap();
    fs.rename_path("/a/b", "/c/empty").unwrap();
    assert_eq!(names(&fs, "/c"), ["empty"]);
    assert_eq!(fs.stat(fs.resolve("/a").unwrap()).unwrap().nlink, 2);
    assert_eq!(fs.stat(fs.resolve("/c").unwrap()).unwrap().nlink, 3);
    // Errors, typed.
    assert!(matches!(fs.mkdir_path("/a"), Err(Error::Exists)));
    assert!(matches!(fs.create_path("/nope/x"), Err(Error::NotFound)));
    assert!(matches!(
        fs.create_path("/a/g/x"),
        Err(Error::NotADirectory)
    ));
    assert!(matches!(fs.rmdir_path("/c"), Err(Error::NotEmpty)));
    assert!(matches!(fs.rmdir_path("/a/g"), Err(Error::NotADirectory)));
    assert!(matches!(fs.unlink_path("/c"), Err(Error::IsADirectory)));
    assert!(matches!(
        fs.rename_path("/c", "/c/empty/inside"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        fs.rename_path("/c", "/a/g"),
        Err(Error::NotADirectory)
    ));
    assert!(matches!(
        fs.rename_path("/a/g", "/c"),
        Err(Error::IsADirectory)
    ));
    let r = fs.write(f, MAX_FILE_SIZE, b"x");
    assert!(matches!(r, Err(Error::FileTooLarge)), "{r:?}");
    fs.unlink_path("/a/g").unwrap();
    fs.rmdir_path("/c/empty").unwrap();
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
    // Synced: a remount (even after a crash) has it all.
    fs.sync().unwrap();
    drop(fs);
    let fs = Fs::mount_with(
        Arc::new(vfs.crash(journal_core::CrashPolicy::DropUnsynced)),
        IMG,
        mount_opts(),
    )
    .unwrap();
    assert!(fs.mount_report().transactions > 0);
    assert_eq!(names(&fs, "/"), ["a", "c"]);
    assert_eq!(names(&fs, "/c"), Vec::<String>::new());
    assert_eq!(fs.stat(fs.resolve("/c").unwrap()).unwrap().kind, Kind::Dir);
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
}

#[test]
fn bad_names_are_refused_and_change_nothing() {
    let (_vfs, fs) = sim_fs(4 << 20);
    let long = "x".repeat(NAME_MAX + 1);
    assert!(matches!(
        fs.create_path(&format!("/{long}")),
        Err(Error::NameTooLong)
    ));
    fs.create_path(&format!("/{}", "y".repeat(NAME_MAX)))
        .unwrap();
    for bad in [&b"a\0b"[..], b".", b"..", b"", b"a/b"] {
        assert!(
            matches!(fs.create(metafs::ROOT, bad), Err(Error::InvalidName)),
            "{bad:?}"
        );
    }
    assert_eq!(fs.readdir(metafs::ROOT).unwrap().len(), 1);
    assert!(fsck(&fs).unwrap().is_empty());
}

#[test]
fn a_full_filesystem_says_no_space_and_leaves_nothing_half_done() {
    let (vfs, fs) = sim_fs(1 << 20); // 256 blocks, some of them metadata
    let f = fs.create_path("/big").unwrap();
    let mut written = 0u64;
    loop {
        match fs.write(f, written, &[7u8; 8192]) {
            Ok(n) => written += n as u64,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let before = fs.stat(f).unwrap();
    assert!(matches!(
        fs.write(f, written, &[7u8; 8192]),
        Err(Error::NoSpace)
    ));
    assert_eq!(
        fs.stat(f).unwrap().size,
        before.size,
        "nothing half-written"
    );
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
    // Freeing makes room again once the free is durable.
    fs.unlink_path("/big").unwrap();
    fs.sync().unwrap();
    let g = fs.create_path("/again").unwrap();
    fs.write(g, 0, &[1u8; 8192]).unwrap();
    assert!(fsck(&fs).unwrap().is_empty());
    fs.fsync(g).unwrap();
    drop(fs);
    // Mounted again without an unmount: replayed, the same, and clean.
    let fs = remount(&vfs);
    assert!(fs.mount_report().transactions > 0);
    assert_eq!(fs.read_path("/again").unwrap(), vec![1u8; 8192]);
    assert!(matches!(fs.resolve("/big"), Err(Error::NotFound)));
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
}

#[test]
fn not_an_image_a_newer_image_and_a_foreign_journal_are_refused_untouched() {
    let vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/")).unwrap();
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    // Not metafs.
    let f = vfs
        .open(Path::new("/junk.img"), OpenOptions::create())
        .unwrap();
    f.write_at(&[0x42; 8192], 0).unwrap();
    assert!(matches!(
        Fs::mount_with(v.clone(), "/junk.img", mount_opts()),
        Err(Error::NotMetafs(_))
    ));
    assert_eq!(
        vfs.live_contents(Path::new("/junk.img")).unwrap(),
        vec![0x42; 8192]
    );
    // A newer version: refused before the journal is opened.
    Fs::mkfs_with(v.clone(), IMG, mkfs_opts(2 << 20)).unwrap();
    let mut sb = vfs.live_contents(Path::new(IMG)).unwrap()[..4096].to_vec();
    let newer = metafs::FORMAT_VERSION + 1;
    sb[4..6].copy_from_slice(&newer.to_le_bytes());
    let crc = crc32c::crc32c(&sb[..52]);
    sb[52..56].copy_from_slice(&crc.to_le_bytes());
    let f = vfs.open(Path::new(IMG), OpenOptions::write()).unwrap();
    f.write_at(&sb, 0).unwrap();
    let before = vfs.live_contents(Path::new(IMG)).unwrap();
    assert!(matches!(
        Fs::mount_with(v.clone(), IMG, mount_opts()),
        Err(Error::UnsupportedVersion(v)) if v == newer
    ));
    assert_eq!(vfs.live_contents(Path::new(IMG)).unwrap(), before);
    // An image whose journal is another image's.
    Fs::mkfs_with(v.clone(), "/other.img", mkfs_opts(2 << 20)).unwrap();
    let mut sb = vfs.live_contents(Path::new("/other.img")).unwrap()[..4096].to_vec();
    sb[36] ^= 1; // another journal id
    let crc = crc32c::crc32c(&sb[..52]);
    sb[52..56].copy_from_slice(&crc.to_le_bytes());
    let f = vfs
        .open(Path::new("/other.img"), OpenOptions::write())
        .unwrap();
    f.write_at(&sb, 0).unwrap();
    assert!(matches!(
        Fs::mount_with(v.clone(), "/other.img", mount_opts()),
        Err(Error::NotMetafs(_))
    ));
    // mkfs never overwrites.
    assert!(matches!(
        Fs::mkfs_with(v.clone(), IMG, mkfs_opts(2 << 20)),
        Err(Error::Exists)
    ));
    assert!(vfs.exists(&journal_dir(Path::new(IMG))).unwrap());
}

#[test]
fn many_threads_at_once_on_the_real_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("fs.img");
    Fs::mkfs(&image, mkfs_opts(32 << 20)).unwrap();
    let fs = Fs::mount(&image, mount_opts()).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let fs = &fs;
            s.spawn(move || {
                let dir = format!("/t{t}");
                fs.mkdir_path(&dir).unwrap();
                for i in 0..100 {
                    let f = fs.create_path(&format!("{dir}/f{i}")).unwrap();
                    fs.write(f, 0, format!("{t}-{i}").as_bytes()).unwrap();
                    if i % 10 == 0 {
                        fs.fsync(f).unwrap();
                    }
                    if i % 7 == 0 {
                        fs.rename_path(&format!("{dir}/f{i}"), &format!("/t{t}/r{i}"))
                            .unwrap();
                    }
                }
            });
        }
    });
    fs.unmount().unwrap();
    let fs = Fs::mount(&image, mount_opts()).unwrap();
    assert_eq!(
        fs.mount_report().transactions,
        0,
        "a clean unmount leaves nothing to replay"
    );
    for t in 0..4 {
        assert_eq!(names(&fs, &format!("/t{t}")).len(), 100);
        assert_eq!(
            fs.read_path(&format!("/t{t}/r7")).unwrap(),
            format!("{t}-7").as_bytes()
        );
    }
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
}

#[test]
fn an_image_write_error_poisons_and_a_remount_recovers_what_was_synced() {
    let (vfs, fs) = sim_fs(4 << 20);
    let f = fs.create_path("/kept").unwrap();
    fs.write(f, 0, b"synced").unwrap();
    fs.sync().unwrap();
    // The next data write to the image fails: the operation fails, and so
    // does everything after it — nothing half-done is ever committed.
    vfs.inject(journal_core::vfs::Fault::eio(
        journal_core::vfs::Op::Write,
        1,
    ));
    let g = fs.create_path("/lost").unwrap();
    assert!(matches!(fs.write(g, 0, &[1u8; 5000]), Err(Error::Io(_))));
    vfs.clear_faults();
    assert!(matches!(fs.sync(), Err(Error::Poisoned(_))));
    assert!(matches!(fs.create_path("/after"), Err(Error::Poisoned(_))));
    drop(fs);
    let fs = remount(&vfs);
    assert_eq!(fs.read_path("/kept").unwrap(), b"synced");
    assert!(matches!(fs.resolve("/lost"), Err(Error::NotFound)));
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
}

/// A full disk under the journal: the commit that needs a segment the disk
/// has no room for fails with ENOSPC (not EIO), the filesystem takes no
/// more changes (the failed transaction was already visible, so it is
/// poisoned rather than half-kept), and a remount once there is room
/// finds every file whose fsync returned, and a clean fsck.
#[test]
fn a_full_disk_under_the_journal_fails_with_enospc_and_loses_nothing_acknowledged() {
    let (vfs, fs) = sim_fs(8 << 20);
    fs.mkdir_path("/d").unwrap();
    fs.sync().unwrap();
    vfs.set_space_limit(Some(vfs.space_used()));
    let mut made = 0u32;
    let full = loop {
        let r = fs
            .create_path(&format!("/d/f{made}"))
            .and_then(|ino| fs.fsync(ino));
        match r {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100_000, "the disk never filled");
    };
    assert_eq!(full.errno(), 28, "{full}");
    assert!(
        matches!(full, Error::Journal(journal_core::Error::NoSpace { .. })),
        "{full}"
    );
    assert!(made > 10, "{made}");
    assert!(matches!(fs.mkdir_path("/e"), Err(Error::Poisoned(_))));
    drop(fs);
    vfs.set_space_limit(None);
    let fs = remount(&vfs);
    for i in 0..made {
        fs.resolve(&format!("/d/f{i}")).unwrap();
    }
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
    fs.mkdir_path("/e").unwrap();
}

#[test]
fn a_running_transaction_is_committed_before_it_outgrows_a_record() {
    // Many creates and no sync: the running transaction gathers every
    // inode-table, directory and bitmap block they change. Its record may
    // not pass the journal's largest (here 256 KiB, about 60 blocks);
    // jbd2 commits a transaction that fills a quarter of its journal, and
    // so must this one, or the sync at the end could never commit.
    let journal = journal_core::Options {
        max_record_size: 256 << 10,
        ..small_journal()
    };
    let mkfs = MkfsOptions {
        journal,
        ..mkfs_opts(32 << 20)
    };
    let opts = MountOptions {
        journal,
        ..MountOptions::default()
    };
    let (vfs, fs) = sim_fs_with(mkfs, opts);
    fs.mkdir_path("/d").unwrap();
    for i in 0..2_000 {
        let f = fs.create_path(&format!("/d/file-{i:05}")).unwrap();
        if i % 3 == 0 {
            fs.write(f, 0, format!("{i}").as_bytes()).unwrap();
        }
    }
    fs.sync().unwrap();
    // Crash: nothing is written home; the journal alone must hold it all.
    let image: Arc<dyn Vfs> = Arc::new(vfs.crash(journal_core::CrashPolicy::DropUnsynced));
    drop(fs);
    let fs = Fs::mount_with(image, IMG, opts).unwrap();
    assert!(
        fs.mount_report().transactions > 1,
        "{:?}",
        fs.mount_report()
    );
    assert_eq!(names(&fs, "/d").len(), 2_000);
    assert_eq!(fs.read_path("/d/file-01998").unwrap(), b"1998");
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
}

#[test]
fn a_cache_of_a_few_blocks_evicts_only_what_is_home_and_loses_nothing() {
    // Four blocks of cache under thirty directories of files: nearly every
    // metadata block is evicted and read back many times, between
    // commits and checkpoints. A block changed since the last checkpoint
    // must stay (its home copy is old); a clean one must come back as the
    // checkpoint left it.
    let opts = MountOptions {
        cache_bytes: 4 * 4096,
        checkpoint_log_bytes: 256 << 10,
        ..mount_opts()
    };
    let (vfs, fs) = sim_fs_with(mkfs_opts(32 << 20), opts);
    for d in 0..30 {
        fs.mkdir_path(&format!("/d{d}")).unwrap();
        for i in 0..60 {
            let f = fs.create_path(&format!("/d{d}/f{i}")).unwrap();
            fs.write(f, 0, format!("{d}/{i}").as_bytes()).unwrap();
            if i % 25 == 0 {
                fs.fsync(f).unwrap();
            }
        }
        if d % 7 == 0 {
            fs.rename_path(&format!("/d{d}/f0"), &format!("/moved-{d}"))
                .unwrap();
            fs.unlink_path(&format!("/d{d}/f1")).unwrap();
        }
    }
    fs.sync().unwrap();
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
    let image: Arc<dyn Vfs> = Arc::new(vfs.crash(journal_core::CrashPolicy::DropUnsynced));
    drop(fs);
    let fs = Fs::mount_with(image, IMG, opts).unwrap();
    for d in 0..30 {
        let want = if d % 7 == 0 { 58 } else { 60 };
        assert_eq!(names(&fs, &format!("/d{d}")).len(), want, "/d{d}");
        assert_eq!(
            fs.read_path(&format!("/d{d}/f59")).unwrap(),
            format!("{d}/59").as_bytes()
        );
    }
    assert_eq!(fs.read_path("/moved-28").unwrap(), b"28/0");
    assert!(fsck(&fs).unwrap().is_empty(), "{:?}", fsck(&fs).unwrap());
}
