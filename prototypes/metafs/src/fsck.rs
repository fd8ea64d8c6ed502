//! `fsck`: the filesystem checked against itself.
//!
//! Walks the tree from the root and checks: every directory entry names a
//! live inode; each inode is reached exactly once (no hard links, so a
//! second path is a cycle or a cross-link); a directory's recorded parent
//! is the directory holding it and its link count is 2 + its
//! subdirectories; a file's link count is 1; no live inode is unreachable;
//! no block is owned twice or lies outside the data area; and the bitmap
//! equals exactly the set of blocks reached (plus the fixed metadata).

use crate::layout::{Inode, Kind, BLOCK, DIRECT, PER_INDIRECT, ROOT};
use crate::volume::{Fs, Inspector};
use crate::Result;
use std::collections::HashMap;

/// Checks a mounted filesystem; returns one line per problem (none: clean).
pub fn fsck(fs: &Fs) -> Result<Vec<String>> {
    fs.inspect(check)
}

fn check(x: &mut Inspector<'_>) -> Result<Vec<String>> {
    let sb = x.sb();
    let mut problems = Vec::new();
    // Block → owning inode.
    let mut owner: HashMap<u32, u32> = HashMap::new();
    let mut own = |b: u32, ino: u32, problems: &mut Vec<String>| {
        if b < sb.data_start || b >= sb.blocks {
            problems.push(format!(
                "inode {ino} points to block {b}, outside the data area"
            ));
        } else if let Some(prev) = owner.insert(b, ino) {
            problems.push(format!("block {b} is owned by inodes {prev} and {ino}"));
        }
    };
    let mut seen: HashMap<u32, u32> = HashMap::new(); // inode → times reached
    let mut stack = vec![(ROOT, ROOT)];
    seen.insert(ROOT, 1);
    while let Some((ino, parent)) = stack.pop() {
        let i = x.inode(ino)?;
        // Blocks of this inode.
        let n = i.size.div_ceil(BLOCK as u64) as usize;
        let mut mapped = 0;
        for idx in 0..DIRECT.max(n).min(DIRECT + PER_INDIRECT) {
            let b = x.bmap(&i, idx)?;
            if b != 0 {
                if idx >= n {
                    problems.push(format!("inode {ino} maps block {b} past its size"));
                }
                own(b, ino, &mut problems);
                mapped += 1;
            }
        }
        let _ = mapped;
        if i.indirect != 0 {
            own(i.indirect, ino, &mut problems);
        }
        match i.kind {
            Kind::File => {
                if i.nlink != 1 {
                    problems.push(format!(
                        "file inode {ino} has link count {}, expected 1",
                        i.nlink
                    ));
                }
            }
            Kind::Dir => {
                if i.parent != parent {
                    problems.push(format!(
                        "directory inode {ino} records parent {}, but is in {parent}",
                        i.parent
                    ));
                }
                if i.size % BLOCK as u64 != 0 {
                    problems.push(format!("directory inode {ino} has size {}", i.size));
                }
                let subdirs = check_entries(x, ino, &mut seen, &mut stack, &mut problems)?;
                if i.nlink != 2 + subdirs {
                    problems.push(format!(
                        "directory inode {ino} has link count {}, expected {}",
                        i.nlink,
                        2 + subdirs
                    ));
                }
            }
            Kind::Free => problems.push(format!("inode {ino} is reached but free")),
        }
    }
    for ino in ROOT + 1..sb.inodes {
        if x.inode(ino)?.kind != Kind::Free && !seen.contains_key(&ino) {
            problems.push(format!("inode {ino} is in use but unreachable"));
        }
    }
    check_bitmap(x, &owner, &mut problems)?;
    Ok(problems)
}

/// The entries of directory `ino`: each names a live inode reached once
/// (children queued on `stack` to visit). Returns its subdirectories.
fn check_entries(
    x: &mut Inspector<'_>,
    ino: u32,
    seen: &mut HashMap<u32, u32>,
    stack: &mut Vec<(u32, u32)>,
    problems: &mut Vec<String>,
) -> Result<u16> {
    let mut subdirs = 0u16;
    for (name, child) in x.entries(ino)? {
        let shown = String::from_utf8_lossy(&name).into_owned();
        let c: Inode = match x.inode(child) {
            Ok(c) => c,
            Err(_) => {
                problems.push(format!(
                    "entry {shown:?} in directory {ino} names inode {child}, which does not exist"
                ));
                continue;
            }
        };
        if c.kind == Kind::Free {
            problems.push(format!(
                "entry {shown:?} in directory {ino} names free inode {child}"
            ));
            continue;
        }
        let times = seen.entry(child).or_insert(0);
        *times += 1;
        if *times > 1 {
            problems.push(format!(
                "inode {child} is reached a second time (entry {shown:?} in {ino}): a cycle or cross-link"
            ));
            continue;
        }
        if c.kind == Kind::Dir {
            subdirs += 1;
        }
        stack.push((child, ino));
    }
    Ok(subdirs)
}

/// The block bitmap against what was reached: every block in use is owned
/// (or fixed), every owned block is marked in use.
fn check_bitmap(
    x: &mut Inspector<'_>,
    owner: &HashMap<u32, u32>,
    problems: &mut Vec<String>,
) -> Result<()> {
    let sb = x.sb();
    for b in 0..sb.blocks {
        let used = x.bit(b)?;
        let fixed = b < sb.data_start;
        let reached = fixed || owner.contains_key(&b);
        if used && !reached {
            problems.push(format!("block {b} is marked in use but nothing owns it"));
        } else if !used && reached {
            problems.push(format!("block {b} is in use but marked free"));
        }
    }
    Ok(())
}
