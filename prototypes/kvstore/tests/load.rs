//! Sorted bulk load (`Store::bulk_load`): the tree it builds reads back
//! exactly what was pushed (several levels, overflow values, the empty
//! and one-key cases), `kvstore check` finds it sound, ordinary writes and
//! reopens go on from it; bad input is a typed error; and a crash at any
//! call of a load followed by writes and a checkpoint leaves either the
//! empty store or every key, never part of the load, and nothing
//! acknowledged lost.

use journal_core::vfs::{CrashPolicy, SimVfs, SplitMix64};
use kvstore::{Error, Options, Store};
use std::collections::BTreeMap;

mod common;

fn options() -> Options {
    common::options(64)
}

fn sim_open(vfs: &SimVfs) -> kvstore::Result<Store> {
    common::sim_open(vfs, options())
}

/// `n` sorted keys, `long` of them padded to hundreds of bytes (a branch
/// then holds a few separators, so the tree grows tall), with values of
/// every size class: empty, small, near a page's inline limit, and
/// overflow chains of several pages.
fn model(n: usize, long: bool, seed: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut rng = SplitMix64::new(seed);
    let mut m = BTreeMap::new();
    for i in 0..n {
        let mut k = format!("key-{i:07}").into_bytes();
        if long {
            k.resize(11 + rng.below(900) as usize, b'~');
        }
        let len = match rng.below(100) {
            0..=4 => 0,
            5..=84 => rng.below(200),
            85..=96 => rng.range(900, 1190),
            _ => rng.range(4000, 20_000),
        };
        let mut v = vec![0u8; len as usize];
        rng.fill(&mut v);
        m.insert(k, v);
    }
    m
}

fn load(s: &Store, m: &BTreeMap<Vec<u8>, Vec<u8>>) -> kvstore::LoadInfo {
    let mut l = s.bulk_load().unwrap();
    for (k, v) in m {
        l.push(k, v).unwrap();
    }
    l.finish().unwrap()
}

fn assert_holds(s: &Store, m: &BTreeMap<Vec<u8>, Vec<u8>>, ctx: &str) {
    let all = s.scan(..).unwrap();
    assert_eq!(all.len(), m.len(), "{ctx}: key count");
    for ((k, v), (mk, mv)) in all.iter().zip(m) {
        assert_eq!((k, v), (mk, mv), "{ctx}: scan");
    }
    for (k, v) in m.iter().step_by(37) {
        assert_eq!(s.get(k).unwrap().as_ref(), Some(v), "{ctx}: get");
    }
    assert_eq!(s.check().unwrap(), Vec::<String>::new(), "{ctx}: check");
}

#[test]
fn a_loaded_tree_reads_back_what_was_pushed_and_takes_writes_and_reopens() {
    for (n, long) in [
        (0, false),
        (1, false),
        (5, false),
        (6000, false),
        (1500, true),
    ] {
        let ctx = format!("{n} keys, long {long}");
        let vfs = SimVfs::new();
        let s = sim_open(&vfs).unwrap();
        let mut m = model(n, long, n as u64);
        let info = load(&s, &m);
        assert_eq!(info.keys, n as u64, "{ctx}");
        if n == 6000 || long {
            assert!(info.height >= 3, "{ctx}: height {}", info.height);
        }
        assert_holds(&s, &m, &ctx);
        // Ordinary writes go on from the loaded tree: overwrites, inserts
        // between loaded keys (splits of full leaves), deletes.
        let mut rng = SplitMix64::new(7);
        let keys: Vec<Vec<u8>> = m.keys().cloned().collect();
        for i in 0..300u32 {
            let mut t = s.transaction();
            match (i % 3, keys.is_empty()) {
                (0, false) => {
                    let k = &keys[rng.below(keys.len() as u64) as usize];
                    t.delete(k);
                    m.remove(k);
                }
                (1, false) => {
                    let k = keys[rng.below(keys.len() as u64) as usize].clone();
                    let v = vec![i as u8; rng.below(400) as usize];
                    t.put(&k, &v);
                    m.insert(k, v);
                }
                _ => {
                    let k = format!("key-{:07}+{i}", rng.below(n as u64 + 1)).into_bytes();
                    let v = vec![i as u8; rng.below(1500) as usize];
                    t.put(&k, &v);
                    m.insert(k, v);
                }
            }
            t.commit().unwrap();
        }
        assert_holds(&s, &m, &format!("{ctx}, after writes"));
        s.close().unwrap();
        drop(s);
        let s = sim_open(&vfs).unwrap();
        assert_holds(&s, &m, &format!("{ctx}, reopened"));
        s.checkpoint().unwrap();
        drop(s);
        let s = sim_open(&vfs.crash(CrashPolicy::DropUnsynced)).unwrap();
        assert_holds(&s, &m, &format!("{ctx}, after a crash"));
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let vfs = SimVfs::new();
    let s = sim_open(&vfs).unwrap();
    let mut l = s.bulk_load().unwrap();
    l.push(b"b", b"1").unwrap();
    assert!(matches!(l.push(b"b", b"2"), Err(Error::OutOfOrder)));
    assert!(matches!(l.push(b"a", b"2"), Err(Error::OutOfOrder)));
    let long_key = vec![b'z'; kvstore::MAX_KEY + 1];
    assert!(matches!(
        l.push(&long_key, b""),
        Err(Error::KeyTooLarge { .. })
    ));
    let long_value = vec![0u8; kvstore::MAX_VALUE + 1];
    assert!(matches!(
        l.push(b"c", &long_value),
        Err(Error::ValueTooLarge { .. })
    ));
    // A refused key is not kept; the load goes on.
    l.push(b"c", b"3").unwrap();
    l.finish().unwrap();
    assert_eq!(
        s.scan(..).unwrap(),
        vec![
            (b"b".to_vec(), b"1".to_vec()),
            (b"c".to_vec(), b"3".to_vec())
        ]
    );
    assert!(matches!(s.bulk_load(), Err(Error::NotEmpty)));
    // Refused, it holds nothing: the store goes on.
    s.put(b"d", b"4").unwrap();
    // Dropped unfinished, a load leaves the store as it was.
    let vfs = SimVfs::new();
    let s = sim_open(&vfs).unwrap();
    let mut l = s.bulk_load().unwrap();
    for i in 0..3000u32 {
        l.push(format!("{i:06}").as_bytes(), &[1; 100]).unwrap();
    }
    drop(l);
    assert_eq!(s.scan(..).unwrap(), vec![]);
    s.put(b"x", b"y").unwrap();
    s.close().unwrap();
    drop(s);
    let s = sim_open(&vfs).unwrap();
    assert_eq!(s.scan(..).unwrap(), vec![(b"x".to_vec(), b"y".to_vec())]);
    assert_eq!(s.check().unwrap(), Vec::<String>::new());
}

/// Loads `m`, then overwrites a key in every twentieth leaf's worth of
/// keys (durably) and checkpoints; returns the model as acknowledged when
/// the crash `vfs` was armed for cut the run (`None`: the load itself was
/// not acknowledged).
fn run(vfs: &SimVfs, m: &BTreeMap<Vec<u8>, Vec<u8>>) -> Option<BTreeMap<Vec<u8>, Vec<u8>>> {
    let s = sim_open(vfs).unwrap();
    let mut l = s.bulk_load().unwrap();
    for (k, v) in m {
        l.push(k, v).unwrap();
    }
    l.finish().unwrap();
    if vfs.crash_captured() {
        return None;
    }
    let mut acked = m.clone();
    for (i, k) in m.keys().enumerate().step_by(60) {
        let v = format!("overwritten-{i}").into_bytes();
        s.put(k, &v).unwrap();
        if vfs.crash_captured() {
            return Some(acked);
        }
        acked.insert(k.clone(), v);
    }
    s.checkpoint().unwrap();
    Some(acked)
}

#[test]
fn a_crash_anywhere_in_a_load_leaves_nothing_or_everything() {
    let m = model(2500, false, 11);
    let mut cut = 0;
    for after in 1u64.. {
        let seed = after * 7919;
        let vfs = SimVfs::new();
        vfs.arm_crash(after, CrashPolicy::TornSectors { seed });
        let acked = run(&vfs, &m);
        let Some(image) = vfs.take_crash() else {
            break;
        };
        cut += 1;
        let s = sim_open(&image).unwrap_or_else(|e| panic!("call {after}: open: {e}"));
        let got = s.scan(..).unwrap();
        match &acked {
            // Not acknowledged: all of it or none of it.
            None if got.is_empty() => {}
            None => assert_holds(&s, &m, &format!("call {after}, load not acknowledged")),
            // Acknowledged: every key, with every acknowledged overwrite
            // (a later unacknowledged one may be there too).
            Some(acked) => {
                assert_eq!(got.len(), m.len(), "call {after}: key count");
                for ((i, k), (gk, v)) in m.keys().enumerate().zip(&got) {
                    assert_eq!(k, gk, "call {after}: keys");
                    let in_flight = format!("overwritten-{i}").into_bytes();
                    let ok = Some(v) == acked.get(k) || *v == in_flight;
                    assert!(ok, "call {after}: key {i} lost its overwrite or is damaged");
                }
                assert_eq!(s.check().unwrap(), Vec::<String>::new(), "call {after}");
            }
        }
    }
    assert!(cut > 20, "the crash cut only {cut} calls");
}
