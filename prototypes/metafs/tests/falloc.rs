//! `fallocate(2)`'s modes and `SEEK_DATA`/`SEEK_HOLE`: preallocation past
//! the end and up to a new end, holes punched (their blocks and emptied
//! tree blocks freed, partial blocks zeroed), ranges zeroed and allocated,
//! the space checked before anything changes, data and holes found across
//! the direct pointers and all three trees — kept across a crash where
//! synced, fsck clean after each.

use journal_core::vfs::{CrashPolicy, SimVfs, Vfs};
use metafs::{fsck, Error, Falloc, Fs, MkfsOptions, MountOptions};
use std::path::Path;
use std::sync::Arc;

const IMG: &str = "/fs.img";
const B: u64 = 4096;

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

fn clean(fs: &Fs) {
    let p = fsck(fs).unwrap();
    assert!(p.is_empty(), "fsck: {p:?}");
}

const KEEP: Falloc = Falloc::Allocate { keep_size: true };
const GROW: Falloc = Falloc::Allocate { keep_size: false };

#[test]
fn preallocation_maps_zeroed_blocks_past_the_end_or_up_to_a_new_one() {
    let (vfs, fs) = sim_fs(64 << 20);
    let f = fs.create_path("/f").unwrap();
    fs.write(f, 0, &[1u8; 100]).unwrap();
    // Past the end: size kept, blocks counted, the end still the end.
    fs.fallocate(f, 0, 64 * B, KEEP).unwrap();
    let s = fs.stat(f).unwrap();
    assert_eq!(
        (s.size, s.blocks),
        (100, 64 + 1),
        "64 data blocks and a tree block"
    );
    assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), vec![1u8; 100]);
    assert_eq!(
        fs.seek(f, 0, false).unwrap(),
        Some(100),
        "the end is a hole"
    );
    clean(&fs);
    // A write past the end lands in a preallocated block; what lies
    // between reads as zeros.
    fs.write(f, 10 * B, b"later").unwrap();
    let mut want = vec![0u8; 10 * B as usize + 5];
    want[..100].fill(1);
    want[10 * B as usize..].copy_from_slice(b"later");
    assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), want);
    assert_eq!(fs.stat(f).unwrap().blocks, 65, "no block more");
    // Up to a new end: the old end's block tail is zeroed first.
    let g = fs.create_path("/g").unwrap();
    fs.write(g, 0, &[7u8; 3000]).unwrap();
    fs.truncate(g, 1000).unwrap();
    let before = fs.stat(g).unwrap();
    fs.fallocate(g, 500, 3 * B, GROW).unwrap();
    let after = fs.stat(g).unwrap();
    assert_eq!((after.size, after.blocks), (500 + 3 * B, 4));
    assert!(after.ctime > before.ctime);
    let data = fs.read(g, 0, 1 << 20).unwrap();
    assert_eq!(&data[..1000], &[7u8; 1000][..]);
    assert!(
        data[1000..].iter().all(|&b| b == 0),
        "old bytes past the end came back"
    );
    // A truncate frees the preallocated blocks with the rest.
    fs.truncate(f, 0).unwrap();
    assert_eq!(fs.stat(f).unwrap().blocks, 0);
    fs.fallocate(f, 5 * B, B, KEEP).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&vfs.crash(CrashPolicy::DropUnsynced));
    assert_eq!(fs.stat(f).unwrap().blocks, 1);
    assert_eq!(fs.stat(g).unwrap().size, 500 + 3 * B);
    clean(&fs);
}

#[test]
fn a_punched_hole_reads_zeros_and_frees_its_blocks_and_emptied_tree_blocks() {
    let (vfs, fs) = sim_fs(64 << 20);
    let f = fs.create_path("/f").unwrap();
    let data: Vec<u8> = (0..40 * B).map(|i| (i % 253) as u8 + 1).collect();
    fs.write(f, 0, &data).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.stat(f).unwrap().blocks, 41);
    let free0 = fs.free().0;
    // Partial blocks zeroed, whole ones freed, the size kept.
    let before = fs.stat(f).unwrap();
    fs.fallocate(f, 3 * B + 100, 4 * B, Falloc::PunchHole)
        .unwrap();
    let s = fs.stat(f).unwrap();
    assert_eq!((s.size, s.blocks), (40 * B, 41 - 3));
    assert!(s.mtime > before.mtime && s.ctime > before.ctime);
    let mut want = data.clone();
    want[(3 * B + 100) as usize..(7 * B + 100) as usize].fill(0);
    assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), want);
    // Every block the single-indirect tree maps: the tree block goes too.
    fs.fallocate(f, 12 * B, 28 * B, Falloc::PunchHole).unwrap();
    assert_eq!(fs.stat(f).unwrap().blocks, 12 - 3);
    want[12 * B as usize..].fill(0);
    assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), want);
    assert_eq!(fs.seek(f, 12 * B, true).unwrap(), None, "no data after");
    clean(&fs);
    // Past the end: preallocated blocks freed, nothing else.
    fs.fallocate(f, 40 * B, 8 * B, KEEP).unwrap();
    fs.fallocate(f, 39 * B, 100 * B, Falloc::PunchHole).unwrap();
    assert_eq!(fs.stat(f).unwrap().size, 40 * B);
    fs.sync().unwrap();
    assert_eq!(fs.free().0, free0 + 3 + 28 + 1);
    drop(fs);
    let fs = mount(&vfs.crash(CrashPolicy::DropUnsynced));
    assert_eq!(fs.read(f, 0, 1 << 20).unwrap(), want);
    clean(&fs);
}

#[test]
fn a_zeroed_range_reads_zeros_and_is_allocated() {
    let (_, fs) = sim_fs(64 << 20);
    let f = fs.create_path("/f").unwrap();
    fs.write(f, 0, &[9u8; 4 * 4096]).unwrap();
    fs.write(f, 10 * B, &[9u8; 100]).unwrap();
    // Mapped bytes zeroed, holes between allocated, the size kept.
    fs.fallocate(f, 2 * B + 1, 9 * B, Falloc::ZeroRange { keep_size: true })
        .unwrap();
    let s = fs.stat(f).unwrap();
    assert_eq!((s.size, s.blocks), (10 * B + 100, 12));
    let got = fs.read(f, 0, 1 << 20).unwrap();
    assert!(got[..(2 * B + 1) as usize].iter().all(|&b| b == 9));
    assert!(
        got[(2 * B + 1) as usize..(11 * B + 1).min(10 * B + 100) as usize]
            .iter()
            .all(|&b| b == 0)
    );
    // Without KEEP_SIZE the file grows to the range's end.
    fs.fallocate(f, 20 * B, 10, Falloc::ZeroRange { keep_size: false })
        .unwrap();
    assert_eq!(fs.stat(f).unwrap().size, 20 * B + 10);
    assert_eq!(
        fs.seek(f, 11 * B, true).unwrap(),
        Some(11 * B),
        "the range's last block"
    );
    assert_eq!(fs.seek(f, 12 * B, true).unwrap(), Some(20 * B));
    clean(&fs);
}

#[test]
fn a_range_larger_than_the_free_space_is_refused_untouched() {
    let (_, fs) = sim_fs(16 << 20);
    let f = fs.create_path("/f").unwrap();
    fs.write(f, 0, b"x").unwrap();
    let before = (fs.stat(f).unwrap(), fs.free());
    for mode in [KEEP, GROW, Falloc::ZeroRange { keep_size: false }] {
        assert!(matches!(
            fs.fallocate(f, 0, 1 << 30, mode),
            Err(Error::NoSpace)
        ));
    }
    assert!(matches!(
        fs.fallocate(f, metafs::MAX_FILE_SIZE, 1, KEEP),
        Err(Error::FileTooLarge)
    ));
    assert!(matches!(
        fs.fallocate(f, 0, 0, KEEP),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!((fs.stat(f).unwrap(), fs.free()), before);
    clean(&fs);
}

#[test]
fn seek_data_and_seek_hole_find_each_other_through_every_tree() {
    let (_, fs) = sim_fs(64 << 20);
    let f = fs.create_path("/f").unwrap();
    // Data in the direct pointers, the single-, double- and
    // triple-indirect trees; holes everywhere else.
    let direct = 3 * B;
    let single = (12 + 5) * B;
    let double = (12 + 1024 + 2048 + 7) * B;
    let triple = (12 + 1024 + 1024 * 1024 + 3) * B + 17;
    for at in [direct, single, double, triple] {
        fs.write(f, at, b"data").unwrap();
    }
    let size = triple + 4;
    let expect = [
        (0, true, Some(direct)),
        (0, false, Some(0)),
        (direct, false, Some(direct + B)),
        (direct + 2, true, Some(direct + 2)),
        (direct + B, true, Some(single)),
        (single + B, true, Some(double)),
        (double + 1, false, Some(double + B)),
        (double + B, true, Some(triple - 17)),
        (triple, false, Some(size)),
        (size, true, None),
        (size, false, None),
    ];
    for (from, data, want) in expect {
        assert_eq!(
            fs.seek(f, from, data).unwrap(),
            want,
            "from {from}, data {data}"
        );
    }
    // A file of one hole, and an empty one.
    let h = fs.create_path("/h").unwrap();
    fs.truncate(h, 10 * B).unwrap();
    assert_eq!(fs.seek(h, 0, true).unwrap(), None);
    assert_eq!(fs.seek(h, 5, false).unwrap(), Some(5));
    let e = fs.create_path("/e").unwrap();
    assert_eq!(fs.seek(e, 0, false).unwrap(), None);
    clean(&fs);
}

#[test]
fn space_freed_by_a_delete_is_had_again_before_any_sync() {
    // Freed blocks are reusable once their free is durable: a write or
    // preallocation short of space commits to have them (xfstests's
    // generic/213: preallocate 1 GiB, delete, preallocate it again).
    let (_, fs) = sim_fs(64 << 20);
    fs.sync().unwrap();
    let most = fs.data_available() * 3 / 4;
    let f = fs.create_path("/f").unwrap();
    fs.fallocate(f, 0, most * B, GROW).unwrap();
    fs.unlink_path("/f").unwrap();
    let g = fs.create_path("/g").unwrap();
    fs.fallocate(g, 0, most * B, GROW).unwrap();
    assert_eq!(fs.stat(g).unwrap().size, most * B);
    fs.unlink_path("/g").unwrap();
    // Written rather than preallocated: the same.
    let h = fs.create_path("/h").unwrap();
    let chunk = vec![7u8; 1 << 20];
    for k in 0..(most * B) / (1 << 20) {
        fs.write(h, k * (1 << 20), &chunk).unwrap();
    }
    clean(&fs);
}

#[test]
fn a_file_of_the_size_statfs_reports_available_fits() {
    // xfstests's generic/103 preallocates what `df` says is available but
    // 512 KiB: the tree blocks that map the file must be left out of it.
    let (_, fs) = sim_fs(64 << 20);
    let avail = fs.data_available();
    assert!(avail < fs.free().0, "the mapping's blocks are set aside");
    let f = fs.create_path("/f").unwrap();
    fs.fallocate(f, 0, avail * B, GROW).unwrap();
    assert_eq!(fs.stat(f).unwrap().size, avail * B);
    assert!(matches!(
        fs.fallocate(f, avail * B, fs.free().0 * B + B, KEEP),
        Err(Error::NoSpace)
    ));
    clean(&fs);
}
