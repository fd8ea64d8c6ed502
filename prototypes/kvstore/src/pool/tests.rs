//! The pool's failure rules: a failed write or sync of the data file or
//! the double-write area poisons the store before it is answered, and
//! nothing goes home after it; and, under shuttle, a load never installs
//! a copy older than one a writer put in its slot meanwhile.

use super::*;
use journal_core::vfs::{Fault, Op, OpenOptions, SimVfs, Vfs};
use std::path::Path;

/// A pool of 64 frames over `/db/data.kv` on `vfs`, pages 10..30 dirty at
/// the LSN of a durable record, with a double-write area if `dw`; and a
/// journal beside it for the write-ahead force.
fn pool_on(vfs: &SimVfs, dw: bool) -> (Pool, Journal) {
    let v: Arc<dyn Vfs> = Arc::new(vfs.clone());
    v.create_dir_all(Path::new("/db")).unwrap();
    let journal = Journal::open_with(v.clone(), "/db/wal", journal_core::Options::default())
        .expect("journal");
    let data = v
        .open(Path::new("/db/data.kv"), OpenOptions::create())
        .unwrap();
    let spill = Spill::new(v.clone(), "/db/spill".into(), 0);
    let area = dw.then(|| DoubleWrite::open(&*v, Path::new("/db")).unwrap());
    let pool = Pool::new(
        data,
        64 * FRAME_BYTES,
        spill,
        false,
        area,
        Arc::new(Poison::default()),
    );
    // One durable record, the pages' LSN: a write home forces the log
    // over it first.
    let lsn = journal.append(b"a record").unwrap();
    journal.commit(lsn).unwrap();
    for no in 10..30 {
        pool.put(no, Page::new(no, Kind::Leaf), None);
        pool.stamp(&[(no, false)], lsn, 0);
    }
    (pool, journal)
}

/// Writes of `op` kind on `path` so far.
fn calls(vfs: &SimVfs, op: Op) -> u64 {
    vfs.calls(op)
}

/// Injects `fault`, writes pages 10..20 home (it must fail and poison),
/// then tries pages 20..30: refused, with no write of any file.
fn poisons_and_writes_nothing_after(dw: bool, fault: Fault) {
    let vfs = SimVfs::new();
    let (pool, journal) = pool_on(&vfs, dw);
    vfs.inject(fault);
    let first: Vec<PageNo> = (10..20).collect();
    assert!(pool.write_back(&first, &journal).is_err());
    assert!(pool.poison.check().is_err(), "the failure did not poison");
    // Still dirty: nothing was marked clean by a failed batch.
    assert_eq!(pool.usage().1, 20);
    vfs.clear_faults();
    let writes = calls(&vfs, Op::Write);
    let rest: Vec<PageNo> = (20..30).collect();
    assert!(pool.write_back(&rest, &journal).is_err());
    assert_eq!(
        calls(&vfs, Op::Write),
        writes,
        "a page went home (or the area was overwritten) after a failure"
    );
    assert!(
        pool.sync_data().is_err(),
        "a sync answered Ok after a failure"
    );
}

#[test]
fn a_failed_home_write_poisons_and_nothing_goes_home_after() {
    poisons_and_writes_nothing_after(false, Fault::eio(Op::Write, 3).on("/db/data.kv"));
}

#[test]
fn a_failed_home_write_through_the_area_poisons_and_the_area_is_kept() {
    poisons_and_writes_nothing_after(true, Fault::eio(Op::Write, 3).on("/db/data.kv"));
}

#[test]
fn a_failed_data_sync_through_the_area_poisons_and_the_area_is_kept() {
    poisons_and_writes_nothing_after(true, Fault::eio(Op::SyncData, 1).on("/db/data.kv"));
}

#[test]
fn a_failed_area_write_or_sync_poisons() {
    let area = "/db/doublewrite.kv";
    poisons_and_writes_nothing_after(true, Fault::eio(Op::Write, 1).on(area));
    poisons_and_writes_nothing_after(true, Fault::eio(Op::SyncData, 1).on(area));
}

#[test]
fn a_sync_after_someone_elses_failed_sync_is_not_ok() {
    // Linux reports a writeback error once: the second sync of the file
    // succeeds with the pages dropped. The pool's own sync must not.
    let vfs = SimVfs::new();
    let (pool, _journal) = pool_on(&vfs, false);
    pool.write_data(&[1u8; 4096], 4096 * 40).unwrap();
    vfs.inject(Fault::eio(Op::SyncData, 1).on("/db/data.kv"));
    assert!(pool.sync_data().is_err());
    vfs.clear_faults();
    assert!(pool.sync_data().is_err());
    assert!(pool.write_data(&[2u8; 4096], 4096 * 41).is_err());
}

/// Under shuttle (`cargo xtask shuttle`; `--cfg shuttle`, run by the test
/// name filter `shuttle_`): a load racing a writer that replaces the page
/// in its slot, writes it home and evicts it.
#[cfg(shuttle)]
mod shuttle_models {
    use super::*;
    use journal_core::sync::shuttle::scheduler::{PctScheduler, RandomScheduler};
    use journal_core::sync::shuttle::{Config, Runner};
    use journal_core::sync::thread;

    /// Page 10 holding one cell whose key is `tag`.
    fn tagged(tag: &[u8]) -> Page {
        let mut p = Page::new(10, Kind::Leaf);
        let cell = crate::page::leaf_cell(tag, crate::page::Value::Inline(b"v"));
        assert!(p.put_cell(0, &cell, false));
        p
    }

    fn tag_of(p: &Page) -> Vec<u8> {
        p.key(0).to_vec()
    }

    /// Page 10 is "old" at home and not in the pool. A reader fetches it
    /// while a writer (holding the "old" copy it read before the page was
    /// evicted) installs "new", writes it home and evicts everything. The
    /// pool must end with "new": a load that read "old" before the write
    /// home and installed it after the eviction would bring the old page
    /// back, and every later change would be made to it.
    fn scenario() {
        let vfs = SimVfs::new();
        let (pool, journal) = pool_on(&vfs, false);
        let pool = Arc::new(pool);
        // (The dirty pages the set-up made: home, and out of the pool.)
        let all: Vec<PageNo> = (10..30).collect();
        pool.write_back(&all, &journal).unwrap();
        let mut sealed = Box::new([0u8; PAGE_SIZE]);
        let old = tagged(b"old");
        old.seal_into(&mut sealed);
        pool.write_data(&sealed[..], 10 * PAGE_SIZE as u64).unwrap();
        pool.evict_to(&mut pool.state.lock(), 0);
        let journal = Arc::new(journal);
        let (p2, j2) = (pool.clone(), journal.clone());
        let reader = thread::spawn(move || {
            let p = p2.fetch(10, &j2).unwrap();
            assert!(matches!(&tag_of(&p)[..], b"old" | b"new"));
        });
        let read = Arc::new(old);
        pool.put(10, tagged(b"new"), Some(&read));
        let lsn = journal.append(b"the writer's record").unwrap();
        journal.commit(lsn).unwrap();
        pool.stamp(&[(10, false)], lsn, 0);
        pool.write_back(&[10], &journal).unwrap();
        pool.evict_to(&mut pool.state.lock(), 0);
        reader.join().unwrap();
        let now = pool.fetch(10, &journal).unwrap();
        assert_eq!(
            tag_of(&now),
            b"new",
            "a load installed a copy older than the one a writer put home"
        );
    }

    fn iterations() -> usize {
        std::env::var("KVSTORE_SHUTTLE_ITERATIONS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(200)
    }

    #[test]
    fn shuttle_a_load_never_installs_a_copy_older_than_a_writers_random() {
        let s = RandomScheduler::new_from_seed(0x10ad, iterations());
        Runner::new(s, Config::new()).run(scenario);
    }

    /// PCT finds the interleaving (the writer's five steps between the
    /// load's read and its install) where random schedules rarely do:
    /// with the stale-load check removed, this seed's 1,500 schedules fail
    /// (checked once).
    #[test]
    fn shuttle_a_load_never_installs_a_copy_older_than_a_writers_pct() {
        let s = PctScheduler::new_from_seed(0x10ad, 3, iterations().max(1500));
        Runner::new(s, Config::new()).run(scenario);
    }
}
