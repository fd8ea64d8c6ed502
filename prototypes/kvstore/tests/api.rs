//! The store's API on the real filesystem and on SimVfs: reads, writes,
//! transactions, scans, checkpoints, reopening, and bad input.

use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
use kvstore::{Error, Options, Store, TornPages, MAX_KEY, MAX_VALUE};
use std::path::Path;
use std::sync::Arc;

fn small() -> Options {
    Options {
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 256 << 10,
            ..journal_core::Options::default()
        },
        checkpoint_interval: None,
        ..Options::default()
    }
}

fn sim_open(vfs: &SimVfs, o: Options) -> kvstore::Result<Store> {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    Store::open_with(v, "/db", o)
}

#[test]
fn reads_see_writes_and_a_reopen_keeps_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let s = Store::open(&dir, small()).unwrap();
    for i in 0..500u32 {
        s.put(
            format!("key-{i:04}").as_bytes(),
            &vec![i as u8; (i as usize * 37) % 3000],
        )
        .unwrap();
    }
    s.delete(b"key-0007").unwrap();
    let mut t = s.transaction();
    t.put(b"a", b"1").put(b"b", b"2").delete(b"key-0008");
    t.commit().unwrap();
    assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(s.get(b"key-0007").unwrap(), None);
    let range = s
        .scan(b"key-0005".to_vec()..b"key-0011".to_vec())
        .unwrap()
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(range, ["key-0005", "key-0006", "key-0009", "key-0010"]);
    s.checkpoint().unwrap();
    s.put(b"after", b"checkpoint").unwrap();
    // A value committed without waiting is durable after sync.
    let mut t = s.transaction();
    t.put(b"lazy", b"yes");
    t.commit_no_wait().unwrap();
    s.sync().unwrap();
    assert!(s.check().unwrap().is_empty());
    s.close().unwrap();
    assert!(matches!(s.get(b"a"), Err(Error::Closed)));
    drop(s);
    let s = Store::open(&dir, small()).unwrap();
    assert_eq!(
        s.get(b"after").unwrap().as_deref(),
        Some(&b"checkpoint"[..])
    );
    assert_eq!(s.get(b"lazy").unwrap().as_deref(), Some(&b"yes"[..]));
    assert_eq!(
        s.get(b"key-0499").unwrap().unwrap().len(),
        (499 * 37) % 3000
    );
    assert_eq!(s.scan(..).unwrap().len(), 500 - 2 + 4);
    assert!(s.check().unwrap().is_empty());
}

#[test]
fn the_default_store_repairs_torn_pages_from_full_page_images() {
    // The documented default (docs/PERFORMANCE.md, "The default goes back
    // to full-page images"): no double-write area, pages imaged in the log.
    assert_eq!(Options::default().torn_pages, TornPages::FullPageImages);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let s = Store::open(&dir, Options::default()).unwrap();
    s.put(b"k", b"v").unwrap();
    s.checkpoint().unwrap();
    s.put(b"k", b"w").unwrap();
    s.close().unwrap();
    assert!(!dir.join(kvstore::DOUBLEWRITE_FILE).exists());
}

#[test]
fn a_crash_before_the_checkpoint_is_redone_from_the_log() {
    // Full-page images: the first put after the checkpoint logged its
    // leaf's image, the other 99 are leaf operations. Double-write: all
    // 100 are leaf operations.
    for (torn_pages, want) in [
        (TornPages::FullPageImages, (99, 1)),
        (TornPages::DoubleWrite, (100, 0)),
    ] {
        let o = Options {
            torn_pages,
            ..small()
        };
        let vfs = SimVfs::new();
        let s = sim_open(&vfs, o).unwrap();
        for i in 0..300u32 {
            s.put(format!("k{i}").as_bytes(), b"v").unwrap();
        }
        s.checkpoint().unwrap();
        for i in 300..400u32 {
            s.put(format!("k{i}").as_bytes(), b"w").unwrap();
        }
        let image = vfs.crash(journal_core::CrashPolicy::DropUnsynced);
        drop(s);
        let s = sim_open(&image, o).unwrap();
        let info = s.recovery_info().clone();
        assert_eq!((info.ops_applied, info.images_restored), want, "{info:?}");
        for i in 0..400u32 {
            let want: &[u8] = if i < 300 { b"v" } else { b"w" };
            assert_eq!(
                s.get(format!("k{i}").as_bytes()).unwrap().as_deref(),
                Some(want)
            );
        }
        assert!(s.check().unwrap().is_empty());
    }
}

#[test]
fn large_values_span_pages_and_oversized_input_writes_nothing() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs, small()).unwrap();
    let big = vec![7u8; MAX_VALUE];
    s.put(b"big", &big).unwrap();
    s.put(&vec![b'k'; MAX_KEY], b"longest key").unwrap();
    let before = s.journal().appended_lsn();
    assert!(matches!(
        s.put(&vec![0; MAX_KEY + 1], b"x"),
        Err(Error::KeyTooLarge { len, max }) if len == MAX_KEY + 1 && max == MAX_KEY
    ));
    assert!(matches!(
        s.put(b"x", &vec![0; MAX_VALUE + 1]),
        Err(Error::ValueTooLarge { .. })
    ));
    let mut t = s.transaction();
    t.put(b"fine", b"1").put(b"y", &vec![0; MAX_VALUE + 1]);
    assert!(matches!(t.commit(), Err(Error::ValueTooLarge { .. })));
    assert_eq!(s.journal().appended_lsn(), before, "nothing written");
    assert_eq!(s.get(b"fine").unwrap(), None);
    s.checkpoint().unwrap();
    drop(s);
    let s = sim_open(&vfs.crash(journal_core::CrashPolicy::DropUnsynced), small()).unwrap();
    assert_eq!(s.get(b"big").unwrap().unwrap(), big);
    assert!(s.check().unwrap().is_empty());
}

#[test]
fn bad_stores_are_typed_errors_that_change_nothing() {
    let vfs = SimVfs::new();
    // A directory that is not a store.
    vfs.create_dir_all(Path::new("/notes")).unwrap();
    let f = vfs
        .open(Path::new("/notes/todo.txt"), OpenOptions::create())
        .unwrap();
    f.write_at(b"milk", 0).unwrap();
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    assert!(matches!(
        Store::open_with(v.clone(), "/notes", small()),
        Err(Error::NotAStore { .. })
    ));
    assert_eq!(vfs.read_dir(Path::new("/notes")).unwrap(), ["todo.txt"]);
    // A store that does not exist, without creation.
    let no_create = Options {
        create_if_missing: false,
        ..small()
    };
    assert!(matches!(
        Store::open_with(v.clone(), "/nothing", no_create),
        Err(Error::NotAStore { .. })
    ));
    // Opened twice.
    let s = sim_open(&vfs, small()).unwrap();
    s.put(b"k", b"v").unwrap();
    assert!(matches!(sim_open(&vfs, small()), Err(Error::Locked { .. })));
    s.close().unwrap();
    drop(s);
    // A data file from another store.
    let other = sim_open(&vfs, small()).unwrap();
    drop(other);
    let t = Store::open_with(v.clone(), "/other", small()).unwrap();
    t.close().unwrap();
    drop(t);
    let theirs = vfs.live_contents(Path::new("/other/data.kv")).unwrap();
    let ours = vfs.live_contents(Path::new("/db/data.kv")).unwrap();
    let f = vfs
        .open(Path::new("/db/data.kv"), OpenOptions::write())
        .unwrap();
    f.write_at(&theirs, 0).unwrap();
    assert!(matches!(
        sim_open(&vfs, small()),
        Err(Error::ForeignDataFile { .. })
    ));
    f.write_at(&ours, 0).unwrap();
    let s = sim_open(&vfs, small()).unwrap();
    assert_eq!(s.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_creation_cut_short_by_a_crash_is_created_again() {
    // Crash at every mutating call of the creation in turn.
    let mut k = 1;
    loop {
        let vfs = SimVfs::new();
        vfs.arm_crash(k, journal_core::CrashPolicy::DropUnsynced);
        let s = sim_open(&vfs, small()).unwrap();
        drop(s);
        let Some(image) = vfs.take_crash() else { break };
        let s = sim_open(&image, small()).unwrap_or_else(|e| panic!("crash at call {k}: {e}"));
        s.put(b"k", b"v").unwrap();
        assert!(s.check().unwrap().is_empty(), "crash at call {k}");
        k += 1;
    }
    assert!(k > 5, "the creation makes several calls");
}

#[test]
fn a_transaction_of_many_mebibytes_commits_as_one_chained_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let s = Store::open(&dir, small()).unwrap();
    // ~24 MiB in one transaction: far more than a 256 KiB log buffer.
    let value = |i: u32| vec![(i % 251) as u8; MAX_VALUE.min(60_000)];
    let n = (24 << 20) / MAX_VALUE.min(60_000) as u32;
    let mut t = s.transaction();
    for i in 0..n {
        t.put(format!("big-{i:05}").as_bytes(), &value(i));
    }
    t.commit().unwrap();
    s.close().unwrap();
    drop(s);
    let s = Store::open(&dir, small()).unwrap();
    for i in (0..n).step_by(97) {
        assert_eq!(
            s.get(format!("big-{i:05}").as_bytes()).unwrap(),
            Some(value(i))
        );
    }
    assert!(s.check().unwrap().is_empty());
    // Beyond the journal's record limit: a typed error, nothing applied.
    let mut t = s.transaction();
    let huge = vec![1u8; MAX_VALUE.min(60_000)];
    let over = (65 << 20) / huge.len() as u32;
    for i in 0..over {
        t.put(format!("huge-{i:05}").as_bytes(), &huge);
    }
    assert!(matches!(t.commit(), Err(Error::TransactionTooLarge { .. })));
    assert_eq!(s.get(b"huge-00000").unwrap(), None);
}

/// A full disk: the put that needs a new log segment fails with the
/// journal's `NoSpace` and changes nothing; the store is not poisoned; a
/// checkpoint (which writes the buckets home in place — the keys are
/// overwritten, so the data file does not grow — and recycles segments)
/// makes room, and writes go on.
#[test]
fn a_full_disk_refuses_a_put_whole_and_a_checkpoint_makes_room() {
    let vfs = SimVfs::new();
    let o = Options {
        journal: journal_core::Options {
            segment_size: 1 << 20,
            logbsize: 256 << 10,
            background_preallocation: false,
            ..journal_core::Options::default()
        },
        checkpoint_log_bytes: u64::MAX,
        ..small()
    };
    let s = sim_open(&vfs, o).unwrap();
    let key = |i: u32| format!("key-{:02}", i % 50).into_bytes();
    let value = |i: u32| vec![i as u8; 2000];
    // Every key written once, and home, before the disk is made full.
    for i in 0..50 {
        s.put(&key(i), &value(i)).unwrap();
    }
    s.checkpoint().unwrap();
    vfs.set_space_limit(Some(vfs.space_used() + (3 << 20)));
    let mut n = 50u32;
    let full = loop {
        match s.put(&key(n), &value(n)) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100_000, "the disk never filled");
    };
    assert!(
        matches!(full, Error::Journal(journal_core::Error::NoSpace { .. })),
        "{full}"
    );
    assert!(n > 500, "{n}");
    assert_eq!(
        s.get(&key(n)).unwrap(),
        Some(value(n - 50)),
        "the refused put changed nothing"
    );
    s.checkpoint().unwrap();
    for i in n..n + 1000 {
        s.put(&key(i), &value(i)).unwrap();
    }
    assert_eq!(s.get(&key(n)).unwrap(), Some(value(n + 950)));
}

/// Runs `f(t)` on `threads` threads and waits for all of them, failing
/// (not hanging) if one has not returned within a minute: a lost wake-up
/// leaves a thread asleep for ever. The bound is generous: this is
/// liveness, not speed.
fn all_return(threads: u64, f: impl Fn(u64) + Send + Sync + 'static) {
    let f = Arc::new(f);
    let (done, finished) = std::sync::mpsc::channel();
    for t in 0..threads {
        let (f, done) = (f.clone(), done.clone());
        std::thread::spawn(move || {
            f(t);
            done.send(t).unwrap();
        });
    }
    for _ in 0..threads {
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a thread never returned: its wake-up was lost");
    }
}

/// Durable committers racing through the combiner all get their outcome:
/// whoever applies a batch wakes the committers sleeping on it.
#[test]
fn racing_durable_committers_all_return() {
    const PUTS: u64 = 400;
    let tmp = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::open(tmp.path().join("db"), small()).unwrap());
    let w = s.clone();
    all_return(8, move |t| {
        for i in 0..PUTS {
            let k = format!("t{t}-{i:05}");
            w.put(k.as_bytes(), &i.to_le_bytes()).unwrap();
        }
    });
    for t in 0..8 {
        for i in (0..PUTS).step_by(37) {
            let k = format!("t{t}-{i:05}");
            assert_eq!(s.get(k.as_bytes()).unwrap(), Some(i.to_le_bytes().to_vec()));
        }
    }
}

/// Readers racing for the same pages of a store larger than its cache,
/// beside checkpoints writing pages home, all return: a thread that finds
/// a page being read in, or being written, sleeps until the pool wakes it.
#[test]
fn readers_racing_for_uncached_pages_all_return() {
    const KEYS: u64 = 20_000;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let o = Options {
        cache_bytes: 256 << 10,
        ..small()
    };
    let s = Store::open(&dir, o).unwrap();
    let value = [7u8; 200];
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let mut txn = s.transaction();
        for i in chunk {
            txn.put(format!("k{i:06}").as_bytes(), &value);
        }
        txn.commit().unwrap();
    }
    s.close().unwrap();
    drop(s);
    let r = Arc::new(Store::open(&dir, o).unwrap());
    all_return(4, move |t| {
        for i in 0..KEYS {
            if t == 3 {
                // A writer dirtying pages and checkpointing beside them.
                if i % 50 == 0 {
                    r.put(format!("k{i:06}").as_bytes(), &value).unwrap();
                }
                if i % 2000 == 0 {
                    r.checkpoint().unwrap();
                }
                continue;
            }
            let got = r.get(format!("k{i:06}").as_bytes()).unwrap();
            assert_eq!(got.as_deref(), Some(&value[..]));
        }
    });
}
