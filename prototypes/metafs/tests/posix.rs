//! What ordinary programs rely on beyond create/write/rename: hard links,
//! symlinks, special files, modes, owners and times, rename's flags,
//! files unlinked while open, long names, huge sparse files and large
//! directories — each kept across a crash where it was synced, and fsck
//! clean after.

use journal_core::vfs::{CrashPolicy, SimVfs, Vfs};
use metafs::{
    fsck, Atime, Error, Fs, Kind, MkfsOptions, MountOptions, NewNode, RenameMode, SetAttr, Time,
    NAME_MAX, ROOT, SYMLINK_MAX,
};
use std::path::Path;
use std::sync::Arc;

const IMG: &str = "/fs.img";

fn journal() -> journal_core::Options {
    journal_core::Options {
        segment_size: 1 << 20,
        logbsize: 64 << 10,
        background_preallocation: false,
        ..journal_core::Options::default()
    }
}

fn sim_fs(size: u64, inodes: Option<u32>) -> (SimVfs, Fs) {
    let vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/")).unwrap();
    let o = MkfsOptions {
        size,
        inodes,
        journal: journal(),
    };
    Fs::mkfs_with(Arc::new(vfs.clone()), IMG, o).unwrap();
    let fs = mount(&vfs);
    (vfs, fs)
}

fn mount(vfs: &SimVfs) -> Fs {
    let o = MountOptions {
        journal: journal(),
        ..MountOptions::default()
    };
    Fs::mount_with(Arc::new(vfs.clone()), IMG, o).unwrap()
}

/// Synced, then the power cut: what a remount finds.
fn crash(vfs: &SimVfs, fs: Fs) -> (SimVfs, Fs) {
    fs.sync().unwrap();
    drop(fs);
    let after = vfs.crash(CrashPolicy::DropUnsynced);
    let fs = mount(&after);
    (after, fs)
}

fn clean(fs: &Fs) {
    let p = fsck(fs).unwrap();
    assert!(p.is_empty(), "fsck: {p:?}");
}

#[test]
fn hard_links_share_one_inode_and_the_last_unlink_frees_it() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    // The root's first directory block stays once allocated (directories
    // do not shrink): count free space after it exists.
    fs.create_path("/keep").unwrap();
    let free0 = fs.free();
    let d = fs.mkdir_path("/d").unwrap();
    let f = fs.create_path("/f").unwrap();
    fs.write(f, 0, b"shared").unwrap();
    fs.link(f, d, b"g").unwrap();
    fs.link(f, ROOT, b"h").unwrap();
    assert_eq!(fs.stat(f).unwrap().nlink, 3);
    assert!(matches!(fs.link(f, d, b"g"), Err(Error::Exists)));
    assert!(matches!(fs.link(d, ROOT, b"dd"), Err(Error::NotPermitted)));
    clean(&fs);
    let (vfs, fs) = crash(&vfs, fs);
    assert_eq!(fs.read_path("/d/g").unwrap(), b"shared");
    fs.unlink_path("/f").unwrap();
    fs.unlink_path("/h").unwrap();
    assert_eq!(fs.stat(f).unwrap().nlink, 1);
    assert_eq!(fs.read_path("/d/g").unwrap(), b"shared");
    // Renaming one name onto another name of the same inode does nothing.
    fs.link(f, ROOT, b"k").unwrap();
    fs.rename_path("/k", "/d/g").unwrap();
    assert_eq!(fs.stat(f).unwrap().nlink, 2);
    fs.unlink_path("/k").unwrap();
    fs.unlink_path("/d/g").unwrap();
    assert!(matches!(fs.stat(f), Err(Error::NotFound)));
    fs.rmdir_path("/d").unwrap();
    clean(&fs);
    let (_, fs) = crash(&vfs, fs);
    assert_eq!(fs.free(), free0, "every block and inode came back");
    clean(&fs);
}

#[test]
fn symlinks_and_special_files_keep_what_they_are() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    let l = fs.symlink(ROOT, b"l", b"/some/where", 7, 8).unwrap();
    let long = vec![b'x'; SYMLINK_MAX];
    fs.symlink(ROOT, b"long", &long, 0, 0).unwrap();
    assert!(matches!(
        fs.symlink(ROOT, b"too", &[b'x'; SYMLINK_MAX + 1], 0, 0),
        Err(Error::NameTooLong)
    ));
    let kinds = [
        (b"fifo", Kind::Fifo, 0),
        (b"sock", Kind::Socket, 0),
        (b"chr_", Kind::CharDevice, 0x0501),
        (b"blk_", Kind::BlockDevice, 0x0803),
    ];
    for (name, kind, rdev) in kinds {
        let node = NewNode {
            rdev,
            ..NewNode::new(kind, 0o640)
        };
        let i = fs.make_node(ROOT, name, node).unwrap();
        assert!(matches!(
            fs.write(i, 0, b"x"),
            Err(Error::InvalidArgument(_))
        ));
    }
    let (_, fs) = crash(&vfs, fs);
    let s = fs.stat(l).unwrap();
    assert_eq!((s.kind, s.size, s.uid, s.gid), (Kind::Symlink, 11, 7, 8));
    assert_eq!(fs.readlink(l).unwrap(), b"/some/where");
    assert_eq!(fs.readlink(fs.resolve("/long").unwrap()).unwrap(), long);
    for (name, kind, rdev) in kinds {
        let s = fs.stat(fs.lookup(ROOT, name).unwrap()).unwrap();
        assert_eq!((s.kind, s.rdev, s.mode, s.blocks), (kind, rdev, 0o640, 0));
    }
    let listed: Vec<Kind> = fs.readdir(ROOT).unwrap().into_iter().map(|e| e.2).collect();
    assert!(listed.contains(&Kind::Symlink) && listed.contains(&Kind::Socket));
    clean(&fs);
}

#[test]
fn modes_owners_and_times_are_kept_and_change_when_posix_says() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    let f = fs.create_path("/f").unwrap();
    let before = fs.stat(f).unwrap();
    let t = |sec| Time { sec, nsec: 5 };
    let s = fs
        .setattr(
            f,
            &SetAttr {
                mode: Some(0o4751),
                uid: Some(1000),
                gid: Some(100),
                atime: Some(t(-86_400)),
                mtime: Some(t(1_000_000_000)),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!((s.mode, s.uid, s.gid), (0o4751, 1000, 100));
    assert!(s.ctime >= before.ctime);
    // A write moves mtime and ctime, not atime.
    fs.write(f, 0, b"data").unwrap();
    let w = fs.stat(f).unwrap();
    assert_eq!(w.atime, t(-86_400));
    assert!(w.mtime > t(1_000_000_000) && w.ctime >= s.ctime);
    // A set-group-ID directory hands its group down, and the bit to
    // subdirectories.
    let d = fs.mkdir_path("/sgid").unwrap();
    let sg = SetAttr {
        mode: Some(0o2775),
        gid: Some(50),
        ..SetAttr::default()
    };
    fs.setattr(d, &sg).unwrap();
    let node = NewNode {
        uid: 1,
        gid: 1,
        ..NewNode::new(Kind::Dir, 0o755)
    };
    let sub = fs.make_node(d, b"sub", node).unwrap();
    let (_, fs) = crash(&vfs, fs);
    let k = fs.stat(f).unwrap();
    assert_eq!(
        (k.mode, k.uid, k.gid, k.atime),
        (0o4751, 1000, 100, t(-86_400))
    );
    assert_eq!((k.mtime, k.ctime), (w.mtime, w.ctime));
    let s = fs.stat(sub).unwrap();
    assert_eq!((s.gid, s.mode & 0o2000), (50, 0o2000));
    clean(&fs);
}

#[test]
fn rename_noreplace_and_exchange() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    let a = fs.mkdir_path("/a").unwrap();
    let b = fs.mkdir_path("/b").unwrap();
    let x = fs.mkdir_path("/a/x").unwrap();
    let y = fs.create_path("/b/y").unwrap();
    assert!(matches!(
        fs.rename_with(a, b"x", b, b"y", RenameMode::NoReplace),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.rename_with(a, b"x", b, b"none", RenameMode::Exchange),
        Err(Error::NotFound)
    ));
    // A directory and a file swap names across directories.
    fs.rename_with(a, b"x", b, b"y", RenameMode::Exchange)
        .unwrap();
    assert_eq!(fs.resolve("/b/y").unwrap(), x);
    assert_eq!(fs.resolve("/a/x").unwrap(), y);
    assert_eq!(fs.parent(x).unwrap(), b);
    assert_eq!(fs.stat(a).unwrap().nlink, 2);
    assert_eq!(fs.stat(b).unwrap().nlink, 3);
    // No swap may put a directory below itself.
    assert!(matches!(
        fs.rename_with(ROOT, b"b", b, b"y", RenameMode::Exchange),
        Err(Error::InvalidArgument(_))
    ));
    fs.rename_with(a, b"x", a, b"z", RenameMode::NoReplace)
        .unwrap();
    let (_, fs) = crash(&vfs, fs);
    assert_eq!(fs.resolve("/a/z").unwrap(), y);
    assert_eq!(fs.parent(x).unwrap(), b);
    clean(&fs);
}

#[test]
fn a_file_unlinked_while_open_lives_until_closed_or_the_next_mount() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    // The root's first directory block stays once allocated (directories
    // do not shrink): count free space after it exists.
    fs.create_path("/keep").unwrap();
    let free0 = fs.free();
    let f = fs.create_path("/tmp").unwrap();
    fs.open(f).unwrap();
    fs.write(f, 0, &vec![7u8; 3 * 4096]).unwrap();
    fs.unlink_path("/tmp").unwrap();
    assert!(matches!(fs.resolve("/tmp"), Err(Error::NotFound)));
    assert_eq!(fs.stat(f).unwrap().nlink, 0);
    assert_eq!(fs.read(f, 4096, 3).unwrap(), [7, 7, 7]);
    clean(&fs);
    fs.release(f).unwrap();
    assert!(matches!(fs.stat(f), Err(Error::NotFound)));
    assert_eq!(fs.free(), free0);
    // Orphaned, synced, then the power cut: the mount frees it.
    let g = fs.create_path("/g").unwrap();
    fs.open(g).unwrap();
    fs.write(g, 0, b"gone").unwrap();
    fs.unlink_path("/g").unwrap();
    let (_, fs) = crash(&vfs, fs);
    assert!(matches!(fs.stat(g), Err(Error::NotFound)));
    assert_eq!(fs.free(), free0);
    clean(&fs);
}

#[test]
fn names_of_255_bytes_and_every_byte_but_slash_and_nul() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    let long = vec![b'n'; NAME_MAX];
    fs.create(ROOT, &long).unwrap();
    let odd: Vec<u8> = (1..=255u8).filter(|&c| c != b'/').collect();
    fs.mkdir(ROOT, &odd).unwrap();
    assert!(matches!(
        fs.create(ROOT, &[b'n'; NAME_MAX + 1]),
        Err(Error::NameTooLong)
    ));
    let (_, fs) = crash(&vfs, fs);
    fs.lookup(ROOT, &long).unwrap();
    assert_eq!(
        fs.stat(fs.lookup(ROOT, &odd).unwrap()).unwrap().kind,
        Kind::Dir
    );
    clean(&fs);
}

#[test]
fn a_64_gib_sparse_file_maps_through_the_triple_indirect_tree() {
    let (vfs, fs) = sim_fs(16 << 20, None);
    // The root's first directory block stays once allocated (directories
    // do not shrink): count free space after it exists.
    fs.create_path("/keep").unwrap();
    let free0 = fs.free();
    let f = fs.create_path("/huge").unwrap();
    let far = (64u64 << 30) - 3;
    fs.write(f, far, b"end").unwrap();
    fs.write(f, 5 << 30, b"mid").unwrap();
    let s = fs.stat(f).unwrap();
    assert_eq!(s.size, 64 << 30);
    // Two data blocks, each under its own triple-tree path (root shared).
    assert!(s.blocks <= 2 + 1 + 2 * 2, "{} blocks", s.blocks);
    let (_, fs) = crash(&vfs, fs);
    assert_eq!(fs.read(f, far - 2, 10).unwrap(), b"\0\0end");
    assert_eq!(fs.read(f, 5 << 30, 3).unwrap(), b"mid");
    assert_eq!(
        fs.read(f, 1 << 30, 4).unwrap(),
        [0; 4],
        "a hole reads as zeros"
    );
    clean(&fs);
    fs.truncate(f, (5 << 30) + 1).unwrap();
    assert_eq!(fs.read(f, 5 << 30, 3).unwrap(), b"m");
    clean(&fs);
    fs.truncate(f, 0).unwrap();
    assert_eq!(fs.stat(f).unwrap().blocks, 0);
    fs.unlink_path("/huge").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.free(), free0);
    clean(&fs);
}

#[test]
fn a_directory_of_twenty_thousand_entries_lists_and_finds_each_once() {
    let (vfs, fs) = sim_fs(64 << 20, Some(30_000));
    let d = fs.mkdir_path("/big").unwrap();
    let n = 20_000;
    for k in 0..n {
        fs.create(d, format!("entry-{k:05}").as_bytes()).unwrap();
    }
    for k in (0..n).step_by(2) {
        fs.unlink(d, format!("entry-{k:05}").as_bytes()).unwrap();
    }
    // Freed space is reused: these land in the holes the unlinks left.
    for k in 0..100 {
        fs.create(d, format!("new-{k}").as_bytes()).unwrap();
    }
    let size = fs.stat(d).unwrap().size;
    let (_, fs) = crash(&vfs, fs);
    assert_eq!(
        fs.stat(d).unwrap().size,
        size,
        "no block was added for the new names"
    );
    // A listing in pages of 333 sees every name exactly once.
    let mut seen = std::collections::HashSet::new();
    let mut pos = 0;
    loop {
        let page = fs.readdir_from(d, pos, 333).unwrap();
        let Some(last) = page.last() else { break };
        pos = last.0 + 1;
        for (_, name, _, _) in page {
            assert!(seen.insert(name), "a name listed twice");
        }
    }
    assert_eq!(seen.len(), n / 2 + 100);
    for k in 0..n {
        let r = fs.lookup(d, format!("entry-{k:05}").as_bytes());
        assert_eq!(r.is_ok(), k % 2 == 1, "entry {k}");
    }
    clean(&fs);
}

fn mount_atime(vfs: &SimVfs, atime: Atime, diratime: bool) -> Fs {
    let o = MountOptions {
        journal: journal(),
        atime,
        diratime,
        ..MountOptions::default()
    };
    Fs::mount_with(Arc::new(vfs.clone()), IMG, o).unwrap()
}

#[test]
fn reads_move_the_access_time_as_the_mount_says() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    let f = fs.create_path("/f").unwrap();
    let d = fs.mkdir_path("/d").unwrap();
    fs.write(f, 0, b"data").unwrap();
    // relatime (the default): a read after a change moves atime once.
    let w = fs.stat(f).unwrap();
    fs.read(f, 0, 4).unwrap();
    let r1 = fs.stat(f).unwrap();
    assert!(r1.atime > w.mtime && r1.atime > w.ctime, "{r1:?}");
    assert_eq!(
        (r1.mtime, r1.ctime),
        (w.mtime, w.ctime),
        "a read changes nothing else"
    );
    fs.read(f, 0, 4).unwrap();
    assert_eq!(
        fs.stat(f).unwrap().atime,
        r1.atime,
        "relatime: no second move"
    );
    // ... or when atime is a day old.
    let old = Time {
        sec: r1.atime.sec - 2 * 86_400,
        nsec: 0,
    };
    let a = SetAttr {
        atime: Some(old),
        ctime: Some(w.ctime),
        ..SetAttr::default()
    };
    fs.setattr(f, &a).unwrap();
    fs.read(f, 0, 1).unwrap();
    assert!(fs.stat(f).unwrap().atime > r1.atime);
    // A listing from the start moves the directory's.
    let d0 = fs.stat(d).unwrap();
    fs.readdir_from(d, 0, 10).unwrap();
    let d1 = fs.stat(d).unwrap();
    assert!(d1.atime > d0.atime);
    // Synced, the moved times survive a crash.
    let (vfs, fs) = crash(&vfs, fs);
    assert_eq!(fs.stat(d).unwrap().atime, d1.atime);
    drop(fs);
    // strictatime: every read.
    let fs = mount_atime(&vfs, Atime::Strict, true);
    let before = fs.stat(f).unwrap().atime;
    fs.read(f, 0, 1).unwrap();
    let s1 = fs.stat(f).unwrap().atime;
    fs.read(f, 0, 1).unwrap();
    assert!(before < s1 && s1 < fs.stat(f).unwrap().atime);
    fs.unmount().unwrap();
    // noatime: never; nodiratime: not a directory's.
    let fs = mount_atime(&vfs, Atime::Never, true);
    fs.write(f, 0, b"new").unwrap();
    let n0 = fs.stat(f).unwrap().atime;
    fs.read(f, 0, 3).unwrap();
    assert_eq!(fs.stat(f).unwrap().atime, n0);
    fs.unmount().unwrap();
    let fs = mount_atime(&vfs, Atime::Strict, false);
    let dn = fs.stat(d).unwrap().atime;
    fs.readdir_from(d, 0, 10).unwrap();
    assert_eq!(fs.stat(d).unwrap().atime, dn);
    fs.read(f, 0, 3).unwrap();
    assert!(
        fs.stat(f).unwrap().atime > n0,
        "files still move under nodiratime"
    );
    clean(&fs);
}

#[test]
fn a_directory_removed_or_replaced_while_open_lives_until_closed_or_the_next_mount() {
    let (vfs, fs) = sim_fs(8 << 20, None);
    // (The root's first directory block stays once allocated.)
    fs.create_path("/keep").unwrap();
    let root_links = fs.stat(ROOT).unwrap().nlink;
    let free0 = fs.free();
    // rmdir of an open directory: gone from its parent, alive with no
    // links until its last close.
    let d = fs.mkdir_path("/d").unwrap();
    fs.create_path("/d/x").unwrap();
    fs.unlink_path("/d/x").unwrap();
    fs.open(d).unwrap();
    fs.rmdir_path("/d").unwrap();
    assert!(matches!(fs.resolve("/d"), Err(Error::NotFound)));
    let s = fs.stat(d).unwrap();
    assert_eq!((s.kind, s.nlink), (Kind::Dir, 0));
    assert!(fs.readdir(d).unwrap().is_empty());
    assert_eq!(fs.stat(ROOT).unwrap().nlink, root_links);
    clean(&fs);
    fs.release(d).unwrap();
    assert!(matches!(fs.stat(d), Err(Error::NotFound)));
    // rename over an open empty directory (generic/035): the one replaced
    // has nlink 0 while open.
    let a = fs.mkdir_path("/a").unwrap();
    let b = fs.mkdir_path("/b").unwrap();
    fs.open(b).unwrap();
    fs.rename_path("/a", "/b").unwrap();
    assert_eq!(fs.resolve("/b").unwrap(), a);
    assert_eq!(fs.stat(b).unwrap().nlink, 0);
    assert_eq!(fs.stat(ROOT).unwrap().nlink, root_links + 1);
    clean(&fs);
    // Synced and crashed while still open: the mount frees it.
    let (_, fs) = crash(&vfs, fs);
    assert!(matches!(fs.stat(b), Err(Error::NotFound)));
    fs.rmdir_path("/b").unwrap();
    assert_eq!(fs.free(), free0);
    clean(&fs);
}
