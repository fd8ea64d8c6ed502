//! Long values (overflow chains) and the free list: deleting them logs a
//! few trunk pages, not every page of their chains; the freed pages are
//! used again; and a snapshot that began before the delete still reads
//! the old values while their pages are reused.

use journal_core::vfs::{SimVfs, SplitMix64};
use kvstore::{Store, MAX_VALUE};

mod common;
use common::{options, sim_open};

fn long_value(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    SplitMix64::new(seed).fill(&mut v);
    v
}

fn key(i: usize) -> Vec<u8> {
    format!("value-{i:03}").into_bytes()
}

/// Puts `n` values of `len` bytes (one transaction each).
fn put_all(s: &Store, n: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let v = long_value(seed + i as u64, len);
            s.put(&key(i), &v).unwrap();
            v
        })
        .collect()
}

#[test]
fn deleting_long_values_logs_trunks_not_chains_and_their_pages_are_reused() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(64)).unwrap();
    // 24 MiB of values through a 64-page (256 KiB) cache.
    put_all(&s, 24, MAX_VALUE, 1);
    s.checkpoint().unwrap();
    let pages_before = s.cache_stats().file_pages;

    // One transaction frees 24 chains of 257 pages. Each freed page is
    // only listed in a trunk (a trunk lists 1,016): the record holds a
    // few trunk images and the leaf changes, where writing every freed
    // page as a free page would log about 6,000 page headers (over
    // 200 KiB) and pin as many pages in the pool.
    let mut t = s.transaction();
    for i in 0..24 {
        t.delete(&key(i));
    }
    let start = t.commit().unwrap();
    // (The next record starts where the delete's ends.)
    let end = s.put(b"marker", b"x").unwrap();
    let record = end.0 - start.0;
    assert!(record < 48 << 10, "the delete logged {record} bytes");
    let stats = s.cache_stats();
    assert!(
        stats.pages <= stats.capacity_pages,
        "{} pages in a pool of {}",
        stats.pages,
        stats.capacity_pages
    );
    assert_eq!(s.check().unwrap(), Vec::<String>::new());

    // The freed pages hold the next values: the file does not grow.
    let values = put_all(&s, 24, MAX_VALUE, 100);
    assert_eq!(s.cache_stats().file_pages, pages_before);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
    // A crash: recovery replays the reuse onto the freed pages.
    let image = vfs.crash(journal_core::vfs::CrashPolicy::DropUnsynced);
    drop(s);
    let s = sim_open(&image, options(64)).unwrap();
    for (i, v) in values.iter().enumerate() {
        assert_eq!(s.get(&key(i)).unwrap().as_ref(), Some(v), "key {i}");
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

#[test]
fn a_snapshot_reads_values_whose_pages_were_freed_and_used_again() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(32)).unwrap();
    // Six values of 25 pages each, through a 32-page cache.
    let old = put_all(&s, 6, 100_000, 7);
    let mut it = s.range(..).unwrap();
    let (k, v) = it.next().unwrap().unwrap();
    assert_eq!((k, &v), (key(0), &old[0]));

    // Delete them all, write the pages home (so they leave the pool),
    // then write new values into the freed pages. Most are not in the
    // pool when taken off the free list: their old contents are kept
    // for the iterator from the disk.
    let mut t = s.transaction();
    for i in 0..6 {
        t.delete(&key(i));
    }
    t.commit().unwrap();
    s.checkpoint().unwrap();
    let pages = s.cache_stats().file_pages;
    for i in 0..6 {
        let v = long_value(1000 + i as u64, 100_000);
        s.put(format!("other-{i}").as_bytes(), &v).unwrap();
    }
    assert_eq!(
        s.cache_stats().file_pages,
        pages,
        "the freed pages are reused"
    );

    for (i, want) in old.iter().enumerate().skip(1) {
        let (k, v) = it.next().unwrap().unwrap();
        assert_eq!(k, key(i));
        assert!(&v == want, "key {i}: the snapshot read other bytes");
    }
    assert!(it.next().is_none());
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

#[test]
fn a_snapshot_keeps_at_most_one_version_of_a_page() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, options(32)).unwrap();
    let old = put_all(&s, 6, 100_000, 3);
    let mut it = s.range(..).unwrap();
    // Overwrites through a 32-page cache: each frees a chain of 25 pages
    // the pool mostly no longer holds, so transactions miss, roll back
    // and run again, replacing the same versions again each time.
    for round in 0..4u64 {
        for i in 0..6 {
            let v = long_value(round * 100 + i as u64, 100_000);
            s.put(&key(i), &v).unwrap();
        }
        s.checkpoint().unwrap();
    }
    // One snapshot needs at most one version of each page: the one it
    // read before the page's first change after it began.
    let st = s.cache_stats();
    let kept = st.version_bytes / (4096 + 128) + (st.spilled_bytes / 4096) as usize;
    assert!(
        kept <= st.file_pages as usize,
        "{kept} versions kept for {} pages",
        st.file_pages
    );
    for (i, want) in old.iter().enumerate() {
        let (k, v) = it.next().unwrap().unwrap();
        assert_eq!(k, key(i));
        assert!(&v == want, "key {i}: the snapshot read other bytes");
    }
}

#[test]
fn a_store_of_format_2_is_refused_with_a_typed_error() {
    // Format 2 chained free pages one by one; its free list means
    // something else, so a store of it is refused, not misread.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let s = Store::open(&dir, options(64)).unwrap();
    s.put(b"k", b"v").unwrap();
    s.close().unwrap();
    drop(s);
    let path = dir.join(kvstore::DATA_FILE);
    let mut data = std::fs::read(&path).unwrap();
    for page in data.chunks_mut(4096).take(2) {
        if page.iter().all(|&b| b == 0) {
            continue;
        }
        page[8..10].copy_from_slice(&2u16.to_le_bytes());
        seal(page);
    }
    std::fs::write(&path, &data).unwrap();
    match Store::open(&dir, options(64)) {
        Err(kvstore::Error::UnsupportedVersion { found: 2 }) => {}
        other => panic!("a format-2 store opened: {:?}", other.map(|_| ())),
    }
}

/// A value that says which key and version it is, all through: a reader
/// that mixes pages of two versions, or of another value, is caught.
fn versioned(k: usize, version: u64, len: usize) -> Vec<u8> {
    let mut v = long_value(version * 1000 + k as u64, len);
    v[..8].copy_from_slice(&version.to_le_bytes());
    v[8..16].copy_from_slice(&(k as u64).to_le_bytes());
    v
}

#[test]
fn gets_of_long_values_beside_writers_never_mix_versions() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    // A 32-page cache: chains are read from disk, around the pool, while
    // writers replace them and reuse their pages.
    let s = Store::open(tmp.path().join("db"), options(32)).unwrap();
    let len = 60_000;
    for k in 0..6 {
        s.put(&key(k), &versioned(k, 0, len)).unwrap();
    }
    let version = AtomicU64::new(1);
    let checked = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for w in 0..2usize {
            let (s, version) = (&s, &version);
            sc.spawn(move || {
                for i in 0..600usize {
                    let k = (i * 5 + w) % 6;
                    let v = version.fetch_add(1, Ordering::Relaxed);
                    s.put(&key(k), &versioned(k, v, len)).unwrap();
                }
            });
        }
        for _ in 0..2 {
            let (s, checked) = (&s, &checked);
            sc.spawn(move || {
                for i in 0..1500usize {
                    let k = i % 6;
                    let got = s.get(&key(k)).unwrap().expect("a key present");
                    let v = u64::from_le_bytes(got[..8].try_into().unwrap());
                    assert!(
                        got == versioned(k, v, len),
                        "key {k}: a value mixing versions (header says version {v})"
                    );
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(checked.load(Ordering::Relaxed), 3000);
}

/// Re-seals a page's CRC (CRC32C of the page with its CRC field zero).
fn seal(page: &mut [u8]) {
    let c = crc32c::crc32c(&page[..4]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    let c = crc32c::crc32c_append(c, &page[8..]);
    page[4..8].copy_from_slice(&c.to_le_bytes());
}

#[test]
fn a_tree_pointer_to_a_free_list_trunk_is_a_typed_error() {
    // A trunk's count is of the pages it lists, not of cells: a damaged
    // root pointing at one must not be read as a node.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let s = Store::open(&dir, options(64)).unwrap();
    put_all(&s, 4, 100_000, 9);
    for i in 0..4 {
        s.delete(&key(i)).unwrap();
    }
    s.put(b"k", b"v").unwrap();
    s.close().unwrap();
    drop(s);
    let path = dir.join(kvstore::DATA_FILE);
    let mut data = std::fs::read(&path).unwrap();
    let trunk = (2..data.len() / 4096)
        .find(|&p| {
            let b = &data[p * 4096..];
            &b[..4] == b"KVB2" && b[20] == 4 && u16::from_le_bytes([b[22], b[23]]) > 0
        })
        .expect("a trunk listing free pages");
    // Both meta pages name the trunk as the root.
    for meta in data.chunks_mut(4096).take(2) {
        if meta.iter().any(|&b| b != 0) {
            meta[40..44].copy_from_slice(&(trunk as u32).to_le_bytes());
            seal(meta);
        }
    }
    std::fs::write(&path, &data).unwrap();
    let s = Store::open(&dir, options(64)).unwrap();
    assert!(s.get(b"k").is_err(), "a trunk read as a tree node");
    let problems = s.check().unwrap();
    assert!(!problems.is_empty(), "check found the damage");
}
