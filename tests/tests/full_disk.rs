//! A full disk is a condition, not a catastrophe: when the next segment
//! cannot be made, appends get `NoSpace` and poison nothing; a checkpoint
//! (which needs no new space) recycles segments and appends go on; and a
//! journal opens on a disk that is still full.
#![cfg(not(loom))]

use journal_core::vfs::{CrashPolicy, SimVfs};
use journal_core::{Error, Journal, Lsn, Options};
use journal_tests::{open_sim, payload, small_options, verify};

type Acked = Vec<(Lsn, Vec<u8>)>;

fn options(background: bool) -> Options {
    Options {
        background_preallocation: background,
        max_segments: 8,
        ..small_options()
    }
}

/// Appends durable 1 KiB records until the disk is full (at most `max`):
/// returns how many made it. Everything but `NoSpace` is a failure.
fn fill(j: &Journal, acked: &mut Acked, writer: u8, max: u32) -> u32 {
    for s in 0..max {
        let p = payload(writer, s, 1024);
        match j.append_durable(&p) {
            Ok(lsn) => acked.push((lsn, p)),
            Err(Error::NoSpace { segment, .. }) => {
                assert!(segment > 0);
                return s;
            }
            Err(e) => panic!("writer {writer}, record {s}: {e}"),
        }
    }
    panic!("writer {writer}: {max} records and the disk never filled");
}

/// Full: `NoSpace`, and the journal is otherwise whole.
fn assert_full_but_whole(j: &Journal, acked: &Acked, what: &str) {
    let appended = j.appended_lsn();
    match j.append_durable(b"one more") {
        Err(Error::NoSpace { .. }) => {}
        other => panic!("{what}: {other:?}"),
    }
    assert_eq!(
        j.appended_lsn(),
        appended,
        "{what}: NoSpace handed out no LSN"
    );
    let (last, bytes) = acked.last().unwrap();
    assert_eq!(
        &j.read_at(*last).unwrap()[..],
        &bytes[..],
        "{what}: reads work"
    );
    j.force_all().unwrap();
    verify(j, acked, what);
}

#[test]
fn appends_on_a_full_disk_get_no_space_and_resume_after_a_checkpoint() {
    for background in [false, true] {
        let what = format!("background preallocation {background}");
        let vfs = SimVfs::new();
        let j = open_sim(&vfs, options(background)).unwrap();
        // Room for the segments made at open and two more.
        let segment = j.geometry().segment_size();
        vfs.set_space_limit(Some(vfs.space_used() + 2 * segment));
        let mut acked = Acked::new();
        let n = fill(&j, &mut acked, 1, 10_000);
        assert!(n > 100, "{what}: only {n} records before the disk filled");
        assert_full_but_whole(&j, &acked, &what);

        // A checkpoint needs no new space; it recycles what is below the
        // tail, and appends go on — for several more segments' worth.
        let redo = acked.last().unwrap().0;
        j.checkpoint(redo).unwrap();
        let mut more = Acked::new();
        for round in 0..6 {
            let n = fill(&j, &mut more, 2 + round, 10_000);
            assert!(
                n > 0,
                "{what}: round {round}: nothing fit after a checkpoint"
            );
            j.checkpoint(more.last().unwrap().0).unwrap();
        }
        verify(&j, &more, &what);
        j.close().unwrap();
    }
}

#[test]
fn a_journal_opens_on_a_disk_that_is_still_full() {
    let vfs = SimVfs::new();
    let opts = options(false);
    let j = open_sim(&vfs, opts).unwrap();
    vfs.set_space_limit(Some(vfs.space_used() + 2 * j.geometry().segment_size()));
    let mut acked = Acked::new();
    fill(&j, &mut acked, 1, 10_000);
    drop(j);
    // Power cut while full; the disk is just as full after it.
    let image = vfs.crash(CrashPolicy::DropUnsynced);
    image.set_space_limit(Some(image.space_used()));
    let j = open_sim(&image, opts).expect("open on a full disk");
    verify(&j, &acked, "reopened while full");
    // Whatever room the existing segments still have is used, then NoSpace.
    let mut after = Acked::new();
    fill(&j, &mut after, 2, 10_000);
    acked.extend(after);
    assert_full_but_whole(&j, &acked, "reopened while full");
    j.checkpoint(acked.last().unwrap().0).unwrap();
    let mut resumed = Acked::new();
    assert!(
        fill(&j, &mut resumed, 3, 10_000) > 0,
        "nothing fit after the checkpoint"
    );
    verify(&j, &resumed, "after the checkpoint");
}
