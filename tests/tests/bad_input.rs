//! Bad input gets a clear, typed error and loses nothing.
#![cfg(not(loom))]

use journal_core::vfs::{OpenOptions, SimVfs, Vfs};
use journal_core::{Error, Journal, Lsn, Options, CONTROL_FILE};
use journal_tests::{open_sim, payload, replay, sim_dir, small_options};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn a_record_over_the_maximum_is_refused_and_nothing_is_written() {
    let vfs = SimVfs::new();
    let opts = Options {
        max_record_size: 1000,
        ..small_options()
    };
    let j = open_sim(&vfs, opts).unwrap();
    let before = j.appended_lsn();
    match j.append(&[0u8; 1001]) {
        Err(Error::RecordTooLarge {
            len: 1001,
            max: 1000,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        j.append_durable(&[0u8; 5000]),
        Err(Error::RecordTooLarge { .. })
    ));
    assert_eq!(j.appended_lsn(), before);
    j.append_durable(&[1u8; 1000]).unwrap(); // not poisoned
}

#[test]
fn a_directory_locked_by_another_journal_is_refused() {
    let vfs = SimVfs::new();
    let _j = open_sim(&vfs, small_options()).unwrap();
    assert!(matches!(
        open_sim(&vfs, small_options()),
        Err(Error::Locked { .. })
    ));
}

#[test]
fn a_directory_locked_by_another_process_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let mut child = Command::new(env!("CARGO_BIN_EXE_journal-child"))
        .arg(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    lines.next().unwrap().unwrap(); // the child has the journal open
    let r = Journal::open(&dir, small_options());
    child.kill().unwrap();
    child.wait().unwrap();
    match r {
        Err(Error::Locked { dir: d }) => assert_eq!(d, dir),
        other => panic!("{other:?}"),
    }
    Journal::open(&dir, small_options()).unwrap(); // free again once it died
}

fn control_bytes(vfs: &SimVfs) -> Vec<u8> {
    vfs.live_contents(&sim_dir().join(CONTROL_FILE)).unwrap()
}

fn write_control(vfs: &SimVfs, bytes: &[u8]) {
    let f = vfs
        .open(&sim_dir().join(CONTROL_FILE), OpenOptions::write())
        .unwrap();
    f.write_at(bytes, 0).unwrap();
}

#[test]
fn a_newer_format_version_is_refused_and_nothing_is_modified() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, small_options()).unwrap();
    j.append_durable(&payload(1, 1, 100)).unwrap();
    drop(j);
    let mut c = control_bytes(&vfs);
    for slot in [0usize, 512] {
        if c[slot..slot + 4] == *b"JCTL" {
            c[slot + 4..slot + 6].copy_from_slice(&2u16.to_le_bytes());
            let crc = crc32c::crc32c(&c[slot..slot + 76]);
            c[slot + 76..slot + 80].copy_from_slice(&crc.to_le_bytes());
        }
    }
    write_control(&vfs, &c);
    let seg = vfs
        .live_contents(&sim_dir().join("0000000000000000.seg"))
        .unwrap();
    match open_sim(&vfs, small_options()) {
        Err(Error::UnsupportedVersion { found: 2, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(control_bytes(&vfs), c, "nothing modified");
    assert_eq!(
        vfs.live_contents(&sim_dir().join("0000000000000000.seg"))
            .unwrap(),
        seg
    );
}

#[test]
fn foreign_files_are_refused() {
    // A control file that is not ours.
    let vfs = SimVfs::new();
    drop(open_sim(&vfs, small_options()).unwrap());
    write_control(&vfs, &[0x42; 1024]);
    assert!(matches!(
        open_sim(&vfs, small_options()),
        Err(Error::NotAJournal { .. })
    ));
    // Segment files without a control file.
    let vfs = SimVfs::new();
    open_sim(&vfs, small_options())
        .unwrap()
        .append_durable(b"x")
        .unwrap();
    vfs.remove_file(&sim_dir().join(CONTROL_FILE)).unwrap();
    assert!(matches!(
        open_sim(&vfs, small_options()),
        Err(Error::NotAJournal { .. })
    ));
    // A segment of another journal.
    let a = SimVfs::new();
    let b = SimVfs::new();
    open_sim(&a, small_options())
        .unwrap()
        .append_durable(b"x")
        .unwrap();
    open_sim(&b, small_options())
        .unwrap()
        .append_durable(b"x")
        .unwrap();
    let foreign = b
        .live_contents(&sim_dir().join("0000000000000000.seg"))
        .unwrap();
    let f = a
        .open(
            &sim_dir().join("0000000000000000.seg"),
            OpenOptions::write(),
        )
        .unwrap();
    f.write_at(&foreign, 0).unwrap();
    match open_sim(&a, small_options()) {
        Err(Error::Segment(e)) => assert!(e.to_string().contains("another journal"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_options_are_typed_errors_and_create_nothing() {
    let vfs = SimVfs::new();
    let bad = [
        (
            "logbufs",
            Options {
                logbufs: 1,
                ..small_options()
            },
        ),
        (
            "alignment",
            Options {
                alignment: 3,
                ..small_options()
            },
        ),
        (
            "file_mode",
            Options {
                file_mode: 0o400,
                ..small_options()
            },
        ),
        (
            "file_mode",
            Options {
                file_mode: 0o10600,
                ..small_options()
            },
        ),
        // More than a 64 KiB segment's data area.
        (
            "logbsize",
            Options {
                logbsize: 128 << 10,
                ..small_options()
            },
        ),
        (
            "segment_size",
            Options {
                segment_size: 3 << 20,
                ..small_options()
            },
        ),
        (
            "min_batch",
            Options {
                min_batch: std::time::Duration::from_secs(1),
                ..small_options()
            },
        ),
        (
            "commits_in_flight",
            Options {
                commits_in_flight: 0,
                ..small_options()
            },
        ),
        (
            "commits_in_flight",
            Options {
                commits_in_flight: 5, // small_options has 4 log buffers
                ..small_options()
            },
        ),
        (
            "max_record_size",
            Options {
                max_record_size: (1 << 30) + 1,
                ..small_options()
            },
        ),
        (
            "write_ahead",
            Options {
                write_ahead: (64 << 20) + 1,
                ..small_options()
            },
        ),
        (
            "preallocate_ahead",
            Options {
                preallocate_ahead: 0,
                ..small_options()
            },
        ),
    ];
    for (field, o) in bad {
        match open_sim(&vfs, o) {
            Err(Error::InvalidOptions { option, reason }) => {
                assert_eq!(option, field, "{reason}");
                assert!(
                    Error::InvalidOptions { option, reason }
                        .to_string()
                        .contains(field),
                    "the message names the option"
                );
            }
            other => panic!("{o:?}: {other:?}"),
        }
    }
    assert!(!vfs.exists(&sim_dir()).unwrap());
    let missing = Options {
        create_if_missing: false,
        ..small_options()
    };
    assert!(matches!(
        open_sim(&vfs, missing),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn options_fixed_at_creation_must_match() {
    let vfs = SimVfs::new();
    drop(open_sim(&vfs, small_options()).unwrap());
    let other = Options {
        segment_size: 128 << 10,
        ..small_options()
    };
    assert!(matches!(
        open_sim(&vfs, other),
        Err(Error::OptionMismatch {
            option: "segment_size",
            ..
        })
    ));
    let other = Options {
        alignment: 4096,
        ..small_options()
    };
    assert!(matches!(
        open_sim(&vfs, other),
        Err(Error::OptionMismatch {
            option: "alignment",
            ..
        })
    ));
}

#[test]
fn bad_lsns_and_closed_journals() {
    let vfs = SimVfs::new();
    let j = open_sim(&vfs, small_options()).unwrap();
    let l = j.append_durable(&payload(1, 0, 100)).unwrap();
    assert!(matches!(
        j.commit(Lsn(1 << 40)),
        Err(Error::LsnNotAppended { .. })
    ));
    j.append_durable(&payload(1, 1, 100)).unwrap(); // not poisoned by bad input
    j.checkpoint(Lsn(l.0 + 200)).unwrap();
    assert!(matches!(j.read_from(l), Err(Error::LsnNotInLog { .. })));
    assert_eq!(replay(&j).len(), 1);
    j.close().unwrap();
    assert!(matches!(j.append(b"x"), Err(Error::Closed)));
}

/// Files a journal creates are its owner's alone (0o600, the directory
/// 0o700); a journal file that is a symbolic link, and a directory owned by
/// another user, are refused before anything is read or created.
#[test]
fn journal_files_are_private_and_links_and_foreign_owners_are_refused() {
    use journal_core::vfs::OsVfs;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("j");
    let opts = Options {
        background_preallocation: false,
        ..small_options()
    };
    let vfs: Arc<dyn Vfs> = Arc::new(OsVfs::new());
    let j = Journal::open_with(vfs.clone(), &dir, opts).unwrap();
    j.append_durable(b"mine").unwrap();
    j.close().unwrap();
    drop(j);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "the journal directory");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }

    // The control file replaced by a link to a copy of itself.
    let control = dir.join(CONTROL_FILE);
    let copy = tmp.path().join("control-copy");
    std::fs::copy(&control, &copy).unwrap();
    std::fs::remove_file(&control).unwrap();
    std::os::unix::fs::symlink(&copy, &control).unwrap();
    match Journal::open_with(vfs.clone(), &dir, opts) {
        Err(e) => assert!(e.to_string().contains("symbolic link"), "{e}"),
        Ok(_) => panic!("a control file that is a link was followed"),
    }
    std::fs::remove_file(&control).unwrap();
    std::fs::rename(&copy, &control).unwrap();
    let j = Journal::open_with(vfs.clone(), &dir, opts).unwrap();
    let got: Vec<Vec<u8>> = replay(&j).into_iter().map(|(_, p)| p).collect();
    assert_eq!(got, vec![b"mine".to_vec()]);
    j.close().unwrap();
    drop(j);

    // A directory of another user: as root, one handed to `nobody`; as
    // anyone else, one that root owns.
    let foreign = if effective_uid() == 0 {
        let d = tmp.path().join("theirs");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        d
    } else {
        std::path::PathBuf::from("/")
    };
    let before: Vec<_> = std::fs::read_dir(&foreign)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    match Journal::open_with(vfs.clone(), &foreign, opts) {
        Err(e) => assert!(e.to_string().contains("owned by uid"), "{e}"),
        Ok(_) => panic!("a journal opened in a directory another user owns"),
    }
    let after: Vec<_> = std::fs::read_dir(&foreign)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before, after, "nothing created in the foreign directory");
}

/// The effective uid of this process, from the owner of a file it creates.
fn effective_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid()
}
