//! Extended attributes and POSIX ACLs: what `setxattr(2)` and `setfacl`
//! promise, kept across a crash where synced and dropped whole where not,
//! their blocks counted and freed, fsck clean, and all of it through a
//! cache of a few blocks.

use journal_core::vfs::{CrashPolicy, SimVfs, Vfs};
use metafs::acl::{self, Acl, Entry, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
use metafs::{fsck, Error, Fs, Kind, MkfsOptions, MountOptions, NewNode, SetAttr, XattrSet};
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

fn sim_fs(size: u64) -> (SimVfs, Fs) {
    let vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/")).unwrap();
    let o = MkfsOptions {
        size,
        inodes: None,
        journal: journal(),
    };
    Fs::mkfs_with(Arc::new(vfs.clone()), IMG, o).unwrap();
    let fs = mount(&vfs, 64 << 20);
    (vfs, fs)
}

fn mount(vfs: &SimVfs, cache_bytes: usize) -> Fs {
    let o = MountOptions {
        journal: journal(),
        cache_bytes,
        ..MountOptions::default()
    };
    Fs::mount_with(Arc::new(vfs.clone()), IMG, o).unwrap()
}

fn clean(fs: &Fs) {
    let p = fsck(fs).unwrap();
    assert!(p.is_empty(), "fsck: {p:?}");
}

fn names(fs: &Fs, ino: u32) -> Vec<String> {
    let mut n: Vec<String> = fs
        .listxattr(ino)
        .unwrap()
        .into_iter()
        .map(|n| String::from_utf8(n).unwrap())
        .collect();
    n.sort();
    n
}

#[test]
fn attributes_are_set_got_listed_replaced_and_removed_as_setxattr_says() {
    let (_, fs) = sim_fs(16 << 20);
    let f = fs.create_path("/f").unwrap();
    let any = XattrSet::Any;
    fs.setxattr(f, b"user.a", b"1", any).unwrap();
    fs.setxattr(f, b"trusted.t", b"", any).unwrap();
    fs.setxattr(f, b"security.s", b"label", any).unwrap();
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"1");
    assert_eq!(fs.getxattr(f, b"trusted.t").unwrap(), b"");
    assert_eq!(names(&fs, f), ["security.s", "trusted.t", "user.a"]);
    // XATTR_CREATE and XATTR_REPLACE.
    assert!(matches!(
        fs.setxattr(f, b"user.a", b"2", XattrSet::Create),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.setxattr(f, b"user.b", b"2", XattrSet::Replace),
        Err(Error::NoData)
    ));
    fs.setxattr(f, b"user.a", b"22", XattrSet::Replace).unwrap();
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"22");
    // What is refused, and how.
    assert!(matches!(fs.getxattr(f, b"user.none"), Err(Error::NoData)));
    assert!(matches!(
        fs.removexattr(f, b"user.none"),
        Err(Error::NoData)
    ));
    for ns in [&b"system.other"[..], b"os2.x", b"userx"] {
        assert!(matches!(
            fs.setxattr(f, ns, b"v", any),
            Err(Error::NotSupported(_))
        ));
    }
    assert!(matches!(
        fs.setxattr(f, b"user.", b"v", any),
        Err(Error::InvalidArgument(_))
    ));
    let long = [b"user.".to_vec(), vec![b'n'; 251]].concat();
    assert!(matches!(
        fs.setxattr(f, &long, b"v", any),
        Err(Error::OutOfRange)
    ));
    fs.setxattr(f, &long[..255], b"v", any).unwrap();
    assert!(matches!(
        fs.setxattr(f, b"user.v", &vec![0; 65537], any),
        Err(Error::TooBig)
    ));
    // A value of Linux's largest, beside the others.
    let big: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    fs.setxattr(f, b"user.big", &big, any).unwrap();
    assert_eq!(fs.getxattr(f, b"user.big").unwrap(), big);
    // The change time moves; the data's does not.
    let before = fs.stat(f).unwrap();
    fs.removexattr(f, b"user.a").unwrap();
    let after = fs.stat(f).unwrap();
    assert!(after.ctime > before.ctime && after.mtime == before.mtime);
    assert!(matches!(fs.getxattr(f, b"user.a"), Err(Error::NoData)));
    // Directories, symlinks and special files keep them too.
    let d = fs.mkdir_path("/d").unwrap();
    let l = fs.symlink(metafs::ROOT, b"l", b"f", 0, 0).unwrap();
    let p = fs
        .make_node(metafs::ROOT, b"p", NewNode::new(Kind::Fifo, 0o644))
        .unwrap();
    for ino in [d, l, p] {
        fs.setxattr(ino, b"trusted.k", b"v", any).unwrap();
        assert_eq!(fs.getxattr(ino, b"trusted.k").unwrap(), b"v");
    }
    clean(&fs);
}

#[test]
fn attribute_blocks_are_counted_freed_and_bounded() {
    let (_, fs) = sim_fs(16 << 20);
    fs.create_path("/keep").unwrap();
    let free0 = fs.free();
    let f = fs.create_path("/f").unwrap();
    let any = XattrSet::Any;
    fs.setxattr(f, b"user.small", b"x", any).unwrap();
    assert_eq!(fs.stat(f).unwrap().blocks, 1, "one attribute block");
    fs.setxattr(f, b"user.big", &[1u8; 65536], any).unwrap();
    assert_eq!(
        fs.stat(f).unwrap().blocks,
        17,
        "65,547 bytes over 4,084-byte blocks"
    );
    fs.removexattr(f, b"user.big").unwrap();
    assert_eq!(fs.stat(f).unwrap().blocks, 1);
    clean(&fs);
    // An inode holds about 128 KiB of attributes, no more; a refused
    // change leaves everything as it was.
    fs.setxattr(f, b"user.v1", &[2u8; 65536], any).unwrap();
    assert!(matches!(
        fs.setxattr(f, b"user.v2", &[3u8; 65536], any),
        Err(Error::NoSpace)
    ));
    assert!(matches!(fs.getxattr(f, b"user.v2"), Err(Error::NoData)));
    assert_eq!(fs.getxattr(f, b"user.v1").unwrap(), vec![2u8; 65536]);
    clean(&fs);
    // Freed with the inode.
    fs.unlink_path("/f").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.free(), free0);
    clean(&fs);
}

#[test]
fn attributes_survive_a_crash_where_synced_and_vanish_whole_where_not() {
    let (vfs, fs) = sim_fs(16 << 20);
    let f = fs.create_path("/f").unwrap();
    let any = XattrSet::Any;
    fs.setxattr(f, b"user.kept", &[9u8; 10_000], any).unwrap();
    fs.fsync(f).unwrap();
    // Not synced: a replacement and a new one.
    fs.setxattr(f, b"user.kept", b"short", any).unwrap();
    fs.setxattr(f, b"user.lost", b"x", any).unwrap();
    drop(fs);
    let after = vfs.crash(CrashPolicy::DropUnsynced);
    let fs = mount(&after, 64 << 20);
    assert_eq!(fs.getxattr(f, b"user.kept").unwrap(), vec![9u8; 10_000]);
    assert!(matches!(fs.getxattr(f, b"user.lost"), Err(Error::NoData)));
    clean(&fs);
    // Synced this time: the new state whole.
    fs.setxattr(f, b"user.kept", b"short", any).unwrap();
    fs.removexattr(f, b"user.kept").unwrap();
    fs.setxattr(f, b"user.new", b"n", any).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&after.crash(CrashPolicy::DropUnsynced), 64 << 20);
    assert_eq!(names(&fs, f), ["user.new"]);
    clean(&fs);
}

#[test]
fn thousands_of_attributed_files_through_a_cache_of_four_blocks() {
    let (vfs, fs) = sim_fs(32 << 20);
    fs.unmount().unwrap();
    let fs = mount(&vfs, 4 * 4096);
    let d = fs.mkdir_path("/d").unwrap();
    let n = 2_000u32;
    for k in 0..n {
        let f = fs.create(d, format!("f{k}").as_bytes()).unwrap();
        let v = format!("value-{k}").repeat(1 + k as usize % 7);
        fs.setxattr(f, b"user.k", v.as_bytes(), XattrSet::Any)
            .unwrap();
        if k % 500 == 0 {
            fs.checkpoint().unwrap();
        }
    }
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&vfs.crash(CrashPolicy::DropUnsynced), 4 * 4096);
    for k in 0..n {
        let f = fs.lookup(d, format!("f{k}").as_bytes()).unwrap();
        let v = format!("value-{k}").repeat(1 + k as usize % 7);
        assert_eq!(fs.getxattr(f, b"user.k").unwrap(), v.as_bytes(), "file {k}");
    }
    clean(&fs);
}

fn e(tag: u16, perm: u16, id: u32) -> Entry {
    Entry { tag, perm, id }
}

#[test]
fn an_access_acl_and_the_mode_stay_one() {
    let (vfs, fs) = sim_fs(16 << 20);
    let f = fs.create_path("/f").unwrap();
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o2644),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let list = Acl(vec![
        e(USER_OBJ, 7, 0),
        e(USER, 5, 1000),
        e(GROUP_OBJ, 4, 0),
        e(MASK, 5, 0),
        e(OTHER, 1, 0),
    ]);
    fs.setxattr(f, acl::ACCESS, &list.encode(), XattrSet::Any)
        .unwrap();
    // The mode takes the owner's, the mask's and other's bits.
    assert_eq!(fs.stat(f).unwrap().mode, 0o2751);
    assert_eq!(fs.getxattr(f, acl::ACCESS).unwrap(), list.encode());
    // chmod rewrites the list: owner, mask, other.
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o640),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let got = Acl::decode(&fs.getxattr(f, acl::ACCESS).unwrap()).unwrap();
    assert_eq!(
        got.0,
        vec![
            e(USER_OBJ, 6, 0),
            e(USER, 5, 1000),
            e(GROUP_OBJ, 4, 0),
            e(MASK, 4, 0),
            e(OTHER, 0, 0)
        ]
    );
    // A list the mode says whole sets the mode and is not kept.
    fs.setxattr(
        f,
        acl::ACCESS,
        &Acl::from_mode(0o705).encode(),
        XattrSet::Any,
    )
    .unwrap();
    assert_eq!(fs.stat(f).unwrap().mode, 0o705);
    assert!(matches!(fs.getxattr(f, acl::ACCESS), Err(Error::NoData)));
    // The set-group-ID bit goes when the caller says so (not in the group).
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o2755),
            ..SetAttr::default()
        },
    )
    .unwrap();
    fs.setxattr_with(f, acl::ACCESS, &list.encode(), XattrSet::Any, true)
        .unwrap();
    assert_eq!(fs.stat(f).unwrap().mode, 0o751);
    // What is not a list is EINVAL, and changes nothing.
    let mut bad = list.encode();
    bad[0] = 1;
    assert!(matches!(
        fs.setxattr(f, acl::ACCESS, &bad, XattrSet::Any),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        fs.setxattr(f, acl::DEFAULT, &list.encode(), XattrSet::Any),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(fs.stat(f).unwrap().mode, 0o751);
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&vfs.crash(CrashPolicy::DropUnsynced), 64 << 20);
    assert_eq!(fs.stat(f).unwrap().mode, 0o751);
    assert_eq!(fs.getxattr(f, acl::ACCESS).unwrap(), list.encode());
    clean(&fs);
}

#[test]
fn a_default_acl_is_inherited_in_place_of_the_umask() {
    let (vfs, fs) = sim_fs(16 << 20);
    let d = fs.mkdir_path("/d").unwrap();
    let default = Acl(vec![
        e(USER_OBJ, 7, 0),
        e(USER, 7, 1000),
        e(GROUP_OBJ, 5, 0),
        e(MASK, 7, 0),
        e(OTHER, 0, 0),
    ]);
    fs.setxattr(d, acl::DEFAULT, &default.encode(), XattrSet::Any)
        .unwrap();
    let node = |kind, mode| NewNode {
        umask: 0o077,
        ..NewNode::new(kind, mode)
    };
    // A file: the default masked by the mode asked for; no umask.
    let f = fs.make_node(d, b"f", node(Kind::File, 0o666)).unwrap();
    assert_eq!(fs.stat(f).unwrap().mode, 0o660);
    let fa = Acl::decode(&fs.getxattr(f, acl::ACCESS).unwrap()).unwrap();
    assert_eq!(fa.0[3], e(MASK, 6, 0));
    assert!(matches!(fs.getxattr(f, acl::DEFAULT), Err(Error::NoData)));
    // A directory: that, and the default list itself, to pass on.
    let sub = fs.make_node(d, b"sub", node(Kind::Dir, 0o777)).unwrap();
    assert_eq!(fs.stat(sub).unwrap().mode, 0o770);
    assert_eq!(fs.getxattr(sub, acl::DEFAULT).unwrap(), default.encode());
    let deeper = fs
        .make_node(sub, b"deeper", node(Kind::File, 0o600))
        .unwrap();
    assert_eq!(fs.stat(deeper).unwrap().mode, 0o600);
    // Symlinks inherit nothing; elsewhere the umask applies.
    let l = fs.symlink(d, b"l", b"f", 0, 0).unwrap();
    assert!(fs.listxattr(l).unwrap().is_empty());
    let plain = fs
        .make_node(metafs::ROOT, b"plain", node(Kind::File, 0o666))
        .unwrap();
    assert_eq!(fs.stat(plain).unwrap().mode, 0o600);
    assert!(fs.listxattr(plain).unwrap().is_empty());
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&vfs.crash(CrashPolicy::DropUnsynced), 64 << 20);
    assert_eq!(
        Acl::decode(&fs.getxattr(f, acl::ACCESS).unwrap()).unwrap(),
        fa
    );
    assert_eq!(fs.getxattr(sub, acl::DEFAULT).unwrap(), default.encode());
    clean(&fs);
}
