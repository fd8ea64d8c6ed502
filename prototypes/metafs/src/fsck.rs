//! `fsck`: the filesystem checked against itself.
//!
//! Walks the tree from the root and checks:
//! - every directory entry names a live inode of the kind the entry
//!   records, and no directory holds a name twice;
//! - a directory is reached exactly once (a second path is a cycle or a
//!   cross-link), its recorded parent is the directory holding it, its
//!   link count is 2 + its subdirectories, it has no holes;
//! - any other inode's link count is the number of entries naming it;
//! - a symlink's target is 1..=4095 bytes with no NUL; FIFOs, sockets and
//!   devices own no blocks;
//! - no live inode is unreachable but the orphans (unlinked while open:
//!   link count 0, on the orphan list; a directory among them empty), and
//!   the inode bitmap marks exactly the live inodes;
//! - an inode's extended attributes are a well-formed chain of attribute
//!   blocks whose run decodes, its ACLs valid;
//! - no block is owned twice, lies outside the data area, or is mapped
//!   past its inode's size (a file's preallocated ones excepted); an
//!   inode's block count is what its map and
//!   its attribute chain hold;
//!   and the block bitmap equals exactly the blocks owned (plus the fixed
//!   metadata).

use crate::acl;
use crate::layout::{Inode, Kind, BLOCK, ROOT};
use crate::volume::{Fs, Inspector};
use crate::Result;
use std::collections::{HashMap, HashSet};

/// Checks a mounted filesystem; returns one line per problem (none: clean).
pub fn fsck(fs: &Fs) -> Result<Vec<String>> {
    fs.inspect(check)
}

struct Walk {
    problems: Vec<String>,
    /// Block → owning inode.
    owner: HashMap<u32, u32>,
    /// Inode → entries naming it.
    names: HashMap<u32, u32>,
}

fn check(x: &mut Inspector<'_>) -> Result<Vec<String>> {
    let sb = x.sb();
    let mut w = Walk {
        problems: Vec::new(),
        owner: HashMap::new(),
        names: HashMap::new(),
    };
    let mut stack = vec![(ROOT, ROOT)];
    let mut inodes: HashMap<u32, Inode> = HashMap::new();
    while let Some((ino, parent)) = stack.pop() {
        let i = x.inode(ino)?;
        check_blocks(x, ino, &i, &mut w)?;
        match i.kind {
            Kind::Dir => {
                if i.parent != parent {
                    w.problems.push(format!(
                        "directory inode {ino} records parent {}, but is in {parent}",
                        i.parent
                    ));
                }
                if i.size % BLOCK as u64 != 0 {
                    w.problems
                        .push(format!("directory inode {ino} has size {}", i.size));
                }
                let subdirs = check_entries(x, ino, &mut w, &mut stack)?;
                if i.nlink as u64 != 2 + subdirs {
                    w.problems.push(format!(
                        "directory inode {ino} has link count {}, expected {}",
                        i.nlink,
                        2 + subdirs
                    ));
                }
            }
            Kind::Symlink => {
                let target = x.data(&i)?;
                if target.is_empty() || target.contains(&0) {
                    w.problems
                        .push(format!("symlink inode {ino} has target {target:?}"));
                }
            }
            Kind::Free => w.problems.push(format!("inode {ino} is reached but free")),
            _ => {}
        }
        inodes.insert(ino, i);
    }
    // Orphans (unlinked while open): unnamed, not directories, their
    // blocks owned like any inode's.
    match x.orphans() {
        Ok(list) => {
            for ino in list {
                let i = x.inode(ino)?;
                if inodes.contains_key(&ino) || i.nlink != 0 || i.kind == Kind::Free {
                    w.problems.push(format!(
                        "orphan inode {ino} is still named, linked ({}) or free",
                        i.nlink
                    ));
                    continue;
                }
                if i.kind == Kind::Dir && !x.entries(ino)?.is_empty() {
                    w.problems
                        .push(format!("orphan directory {ino} holds entries"));
                }
                check_blocks(x, ino, &i, &mut w)?;
                inodes.insert(ino, i);
            }
        }
        Err(e) => w.problems.push(format!("the orphan list: {e}")),
    }
    for (&ino, i) in &inodes {
        let named = w.names.get(&ino).copied().unwrap_or(0);
        if i.kind != Kind::Dir && i.nlink != named {
            w.problems.push(format!(
                "inode {ino} has link count {}, but {named} entries name it",
                i.nlink
            ));
        }
    }
    for ino in 0..sb.inodes {
        let live = ino == 0 || x.inode(ino)?.kind != Kind::Free;
        if ino > ROOT && live && !inodes.contains_key(&ino) {
            w.problems
                .push(format!("inode {ino} is in use but unreachable"));
        }
        if x.ibit(ino)? != live {
            w.problems.push(format!(
                "inode {ino} is {} but its bitmap bit says otherwise",
                if live { "in use" } else { "free" }
            ));
        }
    }
    check_bitmap(x, &w.owner, &mut w.problems)?;
    Ok(w.problems)
}

/// The blocks inode `ino` maps: owned once, inside the data area, none
/// past its size (nor any for a kind without data), counted right.
fn check_blocks(x: &mut Inspector<'_>, ino: u32, i: &Inode, w: &mut Walk) -> Result<()> {
    let sb = x.sb();
    let (data, trees) = match x.walk(i) {
        Ok(m) => m,
        Err(e) => {
            w.problems.push(format!("inode {ino}'s block map: {e}"));
            return Ok(());
        }
    };
    let chain = check_xattrs(x, ino, i, w)?;
    let n = i.size.div_ceil(BLOCK as u64);
    if !i.kind.has_data() && (!data.is_empty() || !trees.is_empty()) {
        w.problems
            .push(format!("inode {ino} ({:?}) owns blocks", i.kind));
    }
    let mut hole = false;
    for (k, &(idx, b)) in data.iter().enumerate() {
        // (A file's preallocated blocks may lie past its end.)
        if idx >= n && i.kind != Kind::File {
            w.problems
                .push(format!("inode {ino} maps block {b} past its size"));
        }
        hole |= k as u64 != idx;
    }
    if i.kind == Kind::Dir && (hole || data.len() as u64 != n) {
        w.problems
            .push(format!("directory inode {ino} has a hole in its blocks"));
    }
    let total = (data.len() + trees.len() + chain.len()) as u64;
    if total != i.blocks {
        w.problems.push(format!(
            "inode {ino} counts {} blocks, its map holds {total}",
            i.blocks
        ));
    }
    for b in data.into_iter().map(|(_, b)| b).chain(trees).chain(chain) {
        if b < sb.data_start || b >= sb.blocks {
            w.problems.push(format!(
                "inode {ino} points to block {b}, outside the data area"
            ));
        } else if let Some(prev) = w.owner.insert(b, ino) {
            w.problems
                .push(format!("block {b} is owned by inodes {prev} and {ino}"));
        }
    }
    Ok(())
}

/// Inode `ino`'s extended attributes: a well-formed chain whose run
/// decodes, every ACL among them valid (a default one on a directory
/// only). Returns the chain's blocks (none when it is damaged).
fn check_xattrs(x: &mut Inspector<'_>, ino: u32, i: &Inode, w: &mut Walk) -> Result<Vec<u32>> {
    let chain = match x.xattr_chain(i) {
        Ok(c) => c,
        Err(e) => {
            w.problems.push(format!("inode {ino}'s attributes: {e}"));
            return Ok(Vec::new());
        }
    };
    match x.xattrs(i) {
        Ok(attrs) => {
            for (name, value) in attrs {
                let is_acl = name == acl::ACCESS || name == acl::DEFAULT;
                if is_acl && acl::Acl::decode(&value).is_err() {
                    w.problems.push(format!("inode {ino} holds an invalid ACL"));
                }
                if name == acl::DEFAULT && i.kind != Kind::Dir {
                    w.problems
                        .push(format!("inode {ino} is no directory but has a default ACL"));
                }
            }
        }
        Err(e) => w.problems.push(format!("inode {ino}'s attributes: {e}")),
    }
    Ok(chain)
}

/// The entries of directory `ino`: each names a live inode of the kind it
/// records, no name twice; directories are queued on `stack` (a second
/// path to one is a problem), the rest counted. Returns its
/// subdirectories.
fn check_entries(
    x: &mut Inspector<'_>,
    ino: u32,
    w: &mut Walk,
    stack: &mut Vec<(u32, u32)>,
) -> Result<u64> {
    let mut subdirs = 0u64;
    let mut seen_names = HashSet::new();
    for (name, child, kind) in x.entries(ino)? {
        let shown = String::from_utf8_lossy(&name).into_owned();
        if !seen_names.insert(name) {
            w.problems
                .push(format!("directory {ino} holds {shown:?} twice"));
        }
        let c: Inode = match x.inode(child) {
            Ok(c) if c.kind != Kind::Free => c,
            _ => {
                w.problems.push(format!(
                    "entry {shown:?} in directory {ino} names inode {child}, which is not in use"
                ));
                continue;
            }
        };
        if c.kind != kind {
            w.problems.push(format!(
                "entry {shown:?} in directory {ino} records {kind:?}, inode {child} is {:?}",
                c.kind
            ));
        }
        let times = w.names.entry(child).or_insert(0);
        *times += 1;
        if c.kind == Kind::Dir {
            if *times > 1 || child == ROOT {
                w.problems.push(format!(
                    "directory {child} is reached a second time (entry {shown:?} in {ino}): a cycle or cross-link"
                ));
                continue;
            }
            subdirs += 1;
        } else if *times > 1 {
            continue; // a hard link: its inode is checked once
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
