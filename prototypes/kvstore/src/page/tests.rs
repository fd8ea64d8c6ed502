//! Unit tests of the page: cells kept sorted, round trips through disk
//! and log images, hostile fields refused.

use super::*;

#[test]
fn cells_stay_sorted_through_puts_replaces_and_removes() {
    let mut p = Page::new(5, Kind::Leaf);
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for i in (0..100u32).rev() {
        let k = format!("key{i:03}").into_bytes();
        let c = leaf_cell(&k, Value::Inline(&[i as u8; 40]));
        let at = p.search(&k).unwrap_err();
        if !p.put_cell(at, &c, false) {
            break;
        }
        keys.insert(0, k);
    }
    assert!(keys.len() > 60 && keys.len() < 100, "{}", keys.len());
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(p.key(i), &k[..]);
    }
    // Replace with a longer value, remove every other: still sorted,
    // and the page refills (compaction reclaims the fragments).
    let k = keys[3].clone();
    assert!(p.put_cell(3, &leaf_cell(&k, Value::Inline(&[9; 41])), true));
    assert_eq!(p.value(3), Value::Inline(&[9; 41]));
    for i in (0..p.count()).rev().step_by(2) {
        p.remove_cell(i);
    }
    let before = p.count();
    let mut added = 0;
    for i in 0..100u32 {
        let k = format!("zz{i:03}").into_bytes();
        let at = p.search(&k).unwrap_err();
        if p.put_cell(at, &leaf_cell(&k, Value::Inline(&[1; 40])), false) {
            added += 1;
        }
    }
    assert!(added >= before - 1, "{added} vs {before}");
    p.validate(5).unwrap();
    for i in 1..p.count() {
        assert!(p.key(i - 1) < p.key(i));
    }
}

#[test]
fn pages_round_trip_through_disk_and_images_and_every_bit_flip_is_caught() {
    let mut p = Page::new(7, Kind::Branch);
    p.set_link(3);
    assert!(p.put_cell(0, &branch_cell(b"m", 9), false));
    p.set_lsn(Lsn(99));
    let disk = Page::from_disk(p.sealed().into_buffer(), 7).unwrap();
    assert_eq!(disk.child(0), 9);
    assert_eq!(disk.nth_child(0), 3);
    assert_eq!(
        Page::from_disk(p.sealed().into_buffer(), 8).unwrap_err(),
        Invalid::Structure("the page's number is another page's")
    );
    for bit in [0usize, 37, 64, 130, 8 * 200, 8 * 4095 + 7] {
        let mut q = p.sealed();
        q.0[bit / 8] ^= 1 << (bit % 8);
        assert!(Page::from_disk(q.into_buffer(), 7).is_err(), "bit {bit}");
    }
    let (head, tail) = p.image();
    assert_eq!(head.len() + tail.len(), HEADER + 2 + 7);
    let back = Page::from_image(7, head, tail, Lsn(100)).unwrap();
    assert_eq!(
        (back.lsn(), back.child(0), back.key(0)),
        (Lsn(100), 9, &b"m"[..])
    );
}

#[test]
fn hostile_cells_are_refused_by_validate() {
    let mut p = Page::new(4, Kind::Leaf);
    assert!(p.put_cell(0, &leaf_cell(b"k", Value::Inline(b"v")), false));
    let off = p.slot(0);
    // A value length running past the page.
    let mut q = p.clone();
    q.0[off + 3..off + 7].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(q.validate(4).is_err());
    // A slot pointing into the header.
    let mut q = p.clone();
    q.set_slot(0, 2);
    assert!(q.validate(4).is_err());
    // A count past the slot array.
    let mut q = p.clone();
    q.set_count(900);
    assert!(q.validate(4).is_err());
}

/// A leaf of `n` cells of 100-byte values, keys k00, k01, …
fn leaf_of(n: u8) -> Page {
    let mut p = Page::new(4, Kind::Leaf);
    for i in 0..n {
        let k = format!("k{i:02}").into_bytes();
        assert!(p.put_cell(i as usize, &leaf_cell(&k, Value::Inline(&[i; 100])), false));
    }
    p
}

#[test]
fn overlapping_cells_are_refused_by_validate() {
    // Every slot at the largest cell: each cell is inside the cell area,
    // but together they claim 30 × 110 bytes of a page that has 4 KiB —
    // the free space would underflow and compaction overrun the page.
    let p = leaf_of(30);
    assert!(p.validate(4).is_ok());
    let mut q = p.clone();
    let last = q.slot(29);
    for i in 0..30 {
        q.set_slot(i, last);
    }
    assert_eq!(q.validate(4), Err(Invalid::Structure("two cells overlap")));
    // Two cells overlapping by a byte.
    let mut q = p.clone();
    let (a, b) = (q.slot(0), q.slot(1));
    q.set_slot(1, a.max(b) - 1);
    assert!(q.validate(4).is_err());
    // Through the disk path too, with the CRC re-sealed.
    let mut q = p.clone();
    q.set_slot(3, q.slot(2));
    assert!(Page::from_disk(q.sealed().into_buffer(), 4).is_err());
}

#[test]
fn keys_out_of_order_are_refused_by_validate() {
    let mut q = leaf_of(5);
    let (a, b) = (q.slot(1), q.slot(3));
    q.set_slot(1, b);
    q.set_slot(3, a);
    assert_eq!(q.validate(4), Err(Invalid::Structure("keys out of order")));
    // A key twice.
    let mut q = leaf_of(2);
    let c = leaf_cell(b"k00", Value::Inline(b"again"));
    assert!(q.put_cell(2, &c, false));
    assert!(q.validate(4).is_err());
}
