//! Hostile images: one to three fields of the superblock (its CRC
//! re-sealed), of an inode in use (kind, mode, link count, owner, size,
//! times, parent, device, block pointers, tree roots, block count, its
//! extended attribute chain), of a directory entry (inode number,
//! `rec_len`, name length, kind), of an indirect block's pointers, of an
//! extended attribute block (magic, next block, length, the first
//! attribute's name and value lengths), or a word of either bitmap, set to
//! values a
//! damaged or
//! malicious image could hold. Mounting, walking the tree (every
//! directory listed, every file stat'ed and read, its attributes listed
//! and read), fsck, a write and an attribute set, every
//! file unlinked (so hostile block maps are freed) and an unmount must
//! each answer with a typed error or with data: never a
//! panic, a hang, or an allocation sized by a number read from the image.
//!
//! `cargo test` runs a fixed number of cases; `JOURNAL_FUZZ_SECONDS` runs
//! for a time budget instead (`cargo xtask fuzz --minutes N`).

use journal_core::vfs::{CrashPolicy, OpenOptions, SimVfs, SplitMix64, Vfs};
use metafs::layout::{dir, Super, BLOCK, DIRECT, PER_INDIRECT};
use metafs::{fsck, Fs, Kind, MkfsOptions, MountOptions, ROOT};
use std::path::Path;
use std::sync::Arc;

const IMG: &str = "/fs.img";
/// Cases `cargo test` runs.
const CASES: u64 = 150;

fn journal() -> journal_core::Options {
    journal_core::Options {
        segment_size: 1 << 20,
        logbsize: 64 << 10,
        background_preallocation: false,
        ..journal_core::Options::default()
    }
}

fn mount(vfs: &SimVfs) -> metafs::Result<Fs> {
    let o = MountOptions {
        journal: journal(),
        ..MountOptions::default()
    };
    Fs::mount_with(Arc::new(vfs.clone()), IMG, o)
}

/// An unmounted image: nested directories, small files, one file large
/// enough to need its single-indirect tree, a sparse one that reaches the
/// double-indirect tree, a symlink, a hard link and a FIFO.
fn base() -> SimVfs {
    let vfs = SimVfs::new();
    vfs.create_dir_all(Path::new("/")).unwrap();
    let o = MkfsOptions {
        size: 8 << 20,
        inodes: None,
        journal: journal(),
    };
    Fs::mkfs_with(Arc::new(vfs.clone()), IMG, o).unwrap();
    let fs = mount(&vfs).unwrap();
    let mut rng = SplitMix64::new(11);
    for d in 0..4 {
        fs.mkdir_path(&format!("/d{d}")).unwrap();
        fs.mkdir_path(&format!("/d{d}/sub")).unwrap();
        for f in 0..12 {
            let ino = fs.create_path(&format!("/d{d}/f{f}")).unwrap();
            let mut v = vec![0u8; rng.range(0, 9000) as usize];
            rng.fill(&mut v);
            fs.write(ino, 0, &v).unwrap();
        }
    }
    let big = fs.create_path("/big").unwrap();
    fs.write(big, 0, &vec![0x5a; 20 * BLOCK]).unwrap();
    let sparse = fs.create_path("/sparse").unwrap();
    let far = ((DIRECT + PER_INDIRECT + 5) * BLOCK) as u64;
    fs.write(sparse, far, b"far out").unwrap();
    fs.symlink(ROOT, b"link", b"d0/f1", 0, 0).unwrap();
    fs.link(big, fs.resolve("/d1").unwrap(), b"big2").unwrap();
    fs.make_node(ROOT, b"fifo", metafs::NewNode::new(Kind::Fifo, 0o600))
        .unwrap();
    // Attributes: a few small ones, a chain of three blocks, an ACL.
    let any = metafs::XattrSet::Any;
    fs.setxattr(big, b"user.small", b"v", any).unwrap();
    fs.setxattr(big, b"trusted.t", &[1, 2, 3], any).unwrap();
    let d0 = fs.resolve("/d0").unwrap();
    fs.setxattr(d0, b"user.long", &vec![0x33; 9000], any)
        .unwrap();
    let list = metafs::acl::Acl::from_mode(0o640).encode();
    let mut named = list[..12].to_vec();
    named.extend_from_slice(&[2, 0, 5, 0, 0xe8, 3, 0, 0]); // a named user
    named.extend_from_slice(&list[12..20]);
    named.extend_from_slice(&[0x10, 0, 5, 0, 0, 0, 0, 0]); // the mask
    named.extend_from_slice(&list[20..]);
    fs.setxattr(sparse, metafs::acl::ACCESS, &named, any)
        .unwrap();
    fs.unmount().unwrap();
    vfs
}

fn field(b: &[u8], off: usize, width: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..width].copy_from_slice(&b[off..off + width]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    field(b, off, 4) as u32
}

/// Where a field that matters lives: `(byte offset in the image, width)`.
fn pick_field(img: &[u8], sb: &Super, rng: &mut SplitMix64) -> (usize, usize) {
    let inode_at = |ino: u32| {
        let (blk, off) = sb.inode_place(ino);
        blk as usize * BLOCK + off
    };
    let in_use: Vec<u32> = (1..sb.inodes).filter(|&i| img[inode_at(i)] != 0).collect();
    let pick = |rng: &mut SplitMix64, v: &[usize]| v[rng.below(v.len() as u64) as usize];
    // Blocks the inodes point at: directory blocks, tree roots, the first
    // blocks of attribute chains.
    let mut dir_blocks = Vec::new();
    let mut trees = Vec::new();
    let mut chains = Vec::new();
    for &i in &in_use {
        let at = inode_at(i);
        if u32_at(img, at + 140) != 0 {
            chains.push(u32_at(img, at + 140) as usize);
        }
        let ptrs = (0..DIRECT).map(|k| u32_at(img, at + 68 + 4 * k));
        if img[at] == 2 {
            dir_blocks.extend(ptrs.filter(|&b| b != 0).map(|b| b as usize));
        }
        trees.extend(
            (0..3)
                .map(|t| u32_at(img, at + 116 + 4 * t) as usize)
                .filter(|&b| b != 0),
        );
    }
    match rng.below(11) {
        0 => (4 + 4 * rng.below(12) as usize, 4), // a superblock word
        1..=4 => {
            let at = inode_at(in_use[rng.below(in_use.len() as u64) as usize]);
            let f = [
                (0, 1),   // kind
                (2, 2),   // mode
                (4, 4),   // link count
                (8, 4),   // uid
                (16, 8),  // size
                (24, 8),  // atime seconds
                (44, 4),  // mtime nanoseconds
                (60, 4),  // parent
                (64, 4),  // device
                (116, 4), // single-indirect root
                (120, 4), // double-indirect root
                (124, 4), // triple-indirect root
                (128, 8), // block count
                (136, 4), // next orphan (the root: the list's head)
                (140, 4), // the attribute chain
            ];
            let f = match rng.below(f.len() as u64 + 2) as usize {
                k if k < f.len() => f[k],
                _ => (68 + 4 * rng.below(DIRECT as u64) as usize, 4), // a direct pointer
            };
            (at + f.0, f.1)
        }
        5..=7 => {
            let blk = pick(rng, &dir_blocks);
            let entries = dir::entries(&img[blk * BLOCK..(blk + 1) * BLOCK]).unwrap();
            let at = match entries.len() {
                0 => blk * BLOCK,
                n => blk * BLOCK + entries[rng.below(n as u64) as usize].offset,
            };
            let f = [(0, 4), (4, 2), (6, 1), (7, 1)]; // inode, rec_len, name length, kind
            let (o, w) = f[rng.below(4) as usize];
            (at + o, w)
        }
        8 if !trees.is_empty() => {
            let blk = pick(rng, &trees);
            (blk * BLOCK + 4 * rng.below((BLOCK / 4) as u64) as usize, 4)
        }
        9 if !chains.is_empty() => {
            let blk = pick(rng, &chains);
            // magic, next, length; the first attribute's name and value
            // lengths.
            let f = [(0, 4), (4, 4), (8, 2), (12, 1), (13, 4)];
            let (o, w) = f[rng.below(5) as usize];
            (blk * BLOCK + o, w)
        }
        _ => {
            let start = if rng.chance(1, 2) {
                sb.bitmap_start
            } else {
                sb.ibitmap_start
            };
            (
                start as usize * BLOCK + 8 * rng.below((BLOCK / 8) as u64) as usize,
                8,
            )
        }
    }
}

/// One case: a copy of `base` with one to three fields made hostile.
fn mutate(base: &SimVfs, rng: &mut SplitMix64) -> SimVfs {
    let image = base.crash(CrashPolicy::DropUnsynced);
    let mut img = image.live_contents(Path::new(IMG)).unwrap();
    let sb = Super::decode(&img[..BLOCK]).unwrap();
    // Fields are found in the image as it was, not as mutated so far.
    let clean = img.clone();
    for _ in 0..rng.range(1, 3) {
        let (off, width) = pick_field(&clean, &sb, rng);
        let v = rng.hostile(field(&img, off, width), width);
        img[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
    let crc = crc32c::crc32c(&img[..52]);
    img[52..56].copy_from_slice(&crc.to_le_bytes());
    let f = image.open(Path::new(IMG), OpenOptions::write()).unwrap();
    f.write_at(&img, 0).unwrap();
    f.sync_all().unwrap();
    image
}

/// Mounts, walks the tree, runs fsck, writes and unmounts: `true` if the
/// mount succeeded. Errors are answers; a panic fails the case.
fn exercise(image: &SimVfs) -> bool {
    let Ok(fs) = mount(image) else {
        return false;
    };
    let mut todo = vec![ROOT];
    let mut seen = 0;
    let mut files = Vec::new();
    while let Some(dir) = todo.pop() {
        let Ok(entries) = fs.readdir(dir) else {
            continue;
        };
        for (name, ino, kind) in entries {
            // A cycle in a hostile tree must not walk forever.
            seen += 1;
            if seen > 10_000 {
                break;
            }
            let _ = fs.stat(ino);
            if let Ok(names) = fs.listxattr(ino) {
                for n in names {
                    let _ = fs.getxattr(ino, &n);
                }
            }
            match kind {
                Kind::Dir => todo.push(ino),
                _ => {
                    let _ = fs.read(ino, 0, 1 << 20);
                    files.push((dir, name));
                }
            }
        }
    }
    let _ = fsck(&fs);
    let _ = fs.create_path("/after").and_then(|i| fs.write(i, 0, b"x"));
    for (dir, name) in &files {
        let _ = fs
            .lookup(*dir, name)
            .and_then(|i| fs.setxattr(i, b"user.after", b"y", metafs::XattrSet::Any));
    }
    for (dir, name) in files {
        let _ = fs.unlink(dir, &name);
    }
    let _ = fs.unmount();
    true
}

#[test]
fn hostile_images_get_typed_errors_never_panics() {
    let base = base();
    let mut rng = SplitMix64::new(0x6d66);
    let run = bench_harness::hostile_campaign("a hostile image made metafs", CASES, |_| {
        let image = mutate(&base, &mut rng);
        move || exercise(&image)
    });
    let (cases, mounted) = (run.cases, run.accepted);
    println!(
        "metafs hostile images: {cases} hostile images in {:.1} s: {mounted} mounted and walked, the rest a typed error; 0 panics, 0 hangs",
        run.elapsed.as_secs_f64()
    );
}
