//! Each check made to fail on a crafted stream; a good record passes.

use super::*;

/// Changes by revision (from 1, below [`FIRST_REVISION`]: the checks are
/// the same from there on): each a list of (key, value or `None` for a
/// delete).
type Changes<'a> = &'a [&'a [(&'a str, Option<&'a str>)]];

/// A run's changes: revision 5 is a transaction of two keys.
const RUN: Changes = &[
    &[("k1", Some("a"))],
    &[("k2", Some("b"))],
    &[("k1", Some("c"))],
    &[("k1", None)],
    &[("k3", Some("d")), ("k4", Some("e"))],
    &[("k2", Some("f"))],
    &[("k1", Some("g"))],
];

/// The events of `changes`, by revision, as a correct server sends them
/// (with `prev_kv`).
fn events(changes: Changes) -> Vec<Vec<Event>> {
    let mut now: HashMap<String, Version> = HashMap::new();
    let mut out = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        let rev = i as i64 + 1;
        let mut es = Vec::new();
        for &(key, value) in change.iter() {
            let prev = now.get(key).cloned();
            let e = match value {
                Some(v) => {
                    let kv = Version {
                        key: key.into(),
                        value: v.into(),
                        create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                        mod_revision: rev,
                        version: prev.as_ref().map_or(1, |p| p.version + 1),
                    };
                    now.insert(key.into(), kv.clone());
                    Event {
                        kind: EventKind::Put,
                        kv,
                        prev,
                    }
                }
                None => {
                    now.remove(key);
                    Event {
                        kind: EventKind::Delete,
                        kv: Version {
                            key: key.into(),
                            value: Vec::new(),
                            create_revision: 0,
                            mod_revision: rev,
                            version: 0,
                        },
                        prev,
                    }
                }
            };
            es.push(e);
        }
        out.push(es);
    }
    out
}

/// Every put of `changes`, acknowledged at its revision.
fn writes(changes: Changes) -> Vec<Write> {
    let mut out = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        for &(key, value) in change.iter() {
            if let Some(v) = value {
                out.push(Write {
                    key: key.into(),
                    value: v.into(),
                    outcome: Outcome::Applied(Some(i as i64 + 1)),
                });
            }
        }
    }
    out
}

/// A stream from `start` whose answers hold the revisions in `answers`.
fn stream(name: &str, start: i64, answers: &[&[i64]]) -> Stream {
    let by_rev = events(RUN);
    let items = answers
        .iter()
        .map(|revs| {
            Item::Events(
                revs.iter()
                    .flat_map(|&r| by_rev[(r - 1) as usize].clone())
                    .collect(),
            )
        })
        .collect();
    Stream {
        name: name.into(),
        start,
        prev_kv: true,
        items,
    }
}

fn good() -> Vec<Stream> {
    let mut b = stream("b", 1, &[&[1, 2, 3]]);
    b.items.push(Item::Resumed(4));
    b.items.extend(stream("", 4, &[&[4], &[5, 6], &[7]]).items);
    vec![
        stream("a", 1, &[&[1, 2], &[3], &[4, 5, 6], &[7]]),
        b,
        // From the middle: prev_kv of keys not seen yet is unknown.
        stream("c", 3, &[&[3, 4, 5, 6, 7]]),
    ]
}

fn read(key: &str, value: &str, rev: i64) -> Read {
    Read {
        key: key.into(),
        value: value.into(),
        mod_revision: rev,
    }
}

fn told(writes: &[Write], reads: &[Read]) -> Told {
    Told {
        writes: writes.to_vec(),
        reads: reads.to_vec(),
        compactions: Vec::new(),
    }
}

/// The checks that failed.
fn failed(streams: &[Stream], writes: &[Write], reads: &[Read], dense: bool) -> BTreeSet<Check> {
    let s = check(streams, &told(writes, reads), dense);
    s.violations.iter().map(|v| v.check).collect()
}

fn only(c: Check) -> BTreeSet<Check> {
    BTreeSet::from([c])
}

#[test]
fn a_good_record_passes() {
    let reads = [read("k1", "c", 3), read("k2", "f", 6)];
    let s = check(&good(), &told(&writes(RUN), &reads), true);
    assert_eq!(s.violations, vec![], "{s:#?}");
    assert_eq!((s.streams, s.resumed, s.compacted), (3, 1, 0));
    assert_eq!(s.events, 8 + 8 + 6);
    assert_eq!(s.covered, 7 + 7 + 5);
}

#[test]
fn events_out_of_order_or_twice_fail() {
    let w = writes(RUN);
    let mut s = good();
    s[0] = stream("a", 1, &[&[1, 3, 2], &[4, 5, 6, 7]]);
    assert!(failed(&s, &w, &[], false).contains(&Check::Order));
    s[0] = stream("a", 1, &[&[1, 2, 2, 3, 4, 5, 6, 7]]);
    assert_eq!(failed(&s, &w, &[], false), only(Check::Order));
    // Before the start revision.
    s[0] = stream("a", 3, &[&[2, 3, 4, 5, 6, 7]]);
    assert_eq!(failed(&s, &w, &[], false), only(Check::Order));
    // At a revision a progress notification said was complete.
    s[0] = stream("a", 1, &[&[1, 2, 3, 4]]);
    s[0].items.push(Item::Progress(6));
    s[0].items.extend(stream("", 1, &[&[6, 7]]).items);
    assert!(failed(&s, &w, &[], false).contains(&Check::Order));
}

#[test]
fn a_revision_split_over_two_answers_fails() {
    let mut s = good();
    let by_rev = events(RUN);
    let mut a = stream("a", 1, &[&[1, 2, 3, 4]]);
    a.items.push(Item::Events(vec![by_rev[4][0].clone()]));
    a.items.push(Item::Events(vec![by_rev[4][1].clone()]));
    a.items.extend(stream("", 1, &[&[6, 7]]).items);
    s[0] = a;
    assert_eq!(failed(&s, &writes(RUN), &[], true), only(Check::Atomic));
}

#[test]
fn a_stream_resumed_past_what_it_had_fails() {
    let mut s = good();
    let mut b = stream("b", 1, &[&[1, 2, 3]]);
    b.items.push(Item::Resumed(5));
    b.items.extend(stream("", 5, &[&[5, 6], &[7]]).items);
    s[1] = b;
    // The hole: revision 4 is missing, and k1's delete with it.
    let f = failed(&s, &writes(RUN), &[], true);
    assert!(
        f.contains(&Check::Resume) && f.contains(&Check::Gap),
        "{f:?}"
    );
}

#[test]
fn a_missing_revision_fails() {
    let mut s = good();
    // Revision 4 (a delete: no acknowledged put) dropped from "a".
    s[0] = stream("a", 1, &[&[1, 2, 3], &[5, 6, 7]]);
    let f = failed(&s, &writes(RUN), &[], false);
    assert!(f.contains(&Check::Gap), "{f:?}");
    // Seen by nobody (revision 5, two puts whose outcome is unknown):
    // only the dense check finds it.
    let mut w = writes(RUN);
    for x in w.iter_mut().filter(|x| x.value == b"d" || x.value == b"e") {
        x.outcome = Outcome::Unknown;
    }
    let alone = [stream("a", 1, &[&[1, 2, 3, 4], &[6, 7]])];
    assert_eq!(failed(&alone, &w, &[], false), BTreeSet::new());
    assert_eq!(failed(&alone, &w, &[], true), only(Check::Gap));
}

#[test]
fn an_acknowledged_put_missing_from_every_stream_fails() {
    // The server skipped revision 6 everywhere: only the acknowledgment
    // knows of it (k2's next put would also show it in prev_kv, but
    // there is none).
    let s: Vec<Stream> = [("a", 1), ("b", 1)]
        .into_iter()
        .map(|(n, st)| stream(n, st, &[&[1, 2, 3, 4, 5], &[7]]))
        .collect();
    assert_eq!(failed(&s, &writes(RUN), &[], false), only(Check::Acked));
    // At another revision than the answer said.
    let mut w = writes(RUN);
    w[0].outcome = Outcome::Applied(Some(2));
    assert!(failed(&good(), &w, &[], false).contains(&Check::Acked));
}

#[test]
fn streams_that_disagree_fail() {
    let mut s = good();
    let Item::Events(es) = &mut s[1].items[0] else {
        unreachable!()
    };
    // The same value at a different create revision.
    es[1].kv.create_revision = 1;
    let f = failed(&s, &writes(RUN), &[], false);
    assert!(f.contains(&Check::Agree), "{f:?}");
}

#[test]
fn a_wrong_prev_kv_or_version_fails() {
    let mut s = good();
    let Item::Events(es) = &mut s[0].items[1] else {
        unreachable!()
    };
    // Revision 3 (k1 = c) with no prev_kv: k1 was "a".
    es[0].prev = None;
    let f = failed(&s, &writes(RUN), &[], false);
    assert!(f.contains(&Check::PrevKv), "{f:?}");
    let mut s = good();
    let Item::Events(es) = &mut s[0].items[2] else {
        unreachable!()
    };
    // Revision 5's k3 is new: version 1.
    es[1].kv.version = 2;
    let f = failed(&s, &writes(RUN), &[], false);
    assert!(f.contains(&Check::PrevKv), "{f:?}");
    // A stream alone (nothing to disagree with).
    assert_eq!(
        failed(&s[..1], &writes(RUN), &[], false),
        only(Check::PrevKv)
    );
}

#[test]
fn a_prev_kv_missing_passes_only_where_a_compaction_reached() {
    // k1's put at 3 sent without its previous version (k1 = a, at 1),
    // in "c" (which starts at 3) and then in "a" (which saw k1 = a).
    for i in [2, 0] {
        let mut s = good();
        let (j, e) = if i == 2 { (0, 0) } else { (1, 0) };
        let Item::Events(es) = &mut s[i].items[j] else {
            unreachable!()
        };
        es[e].prev = None;
        let mut t = told(&writes(RUN), &[]);
        let f: BTreeSet<Check> = check(&s, &t, false)
            .violations
            .iter()
            .map(|v| v.check)
            .collect();
        let want = if i == 2 {
            only(Check::Agree)
        } else {
            BTreeSet::from([Check::Agree, Check::PrevKv])
        };
        assert_eq!(f, want, "stream {i}");
        // Compacted at 2, the version at revision 2 (k1 = a) is kept.
        t.compactions = vec![2];
        assert_eq!(
            check(&s, &t, false).violations.len(),
            want.len() + usize::from(i == 0)
        );
        // A compaction at 3 (asked for, or met by a stream) explains it.
        t.compactions = vec![3];
        assert_eq!(check(&s, &t, false).violations, vec![], "stream {i}");
        t.compactions = vec![];
        s[1].items.push(Item::Compacted(9));
        assert_eq!(check(&s, &t, false).violations, vec![], "stream {i}");
        // A prev_kv present must still be right.
        let Item::Events(es) = &mut s[i].items[j] else {
            unreachable!()
        };
        es[e].prev = Some(es[e].kv.clone());
        let f: BTreeSet<Check> = check(&s, &t, false)
            .violations
            .iter()
            .map(|v| v.check)
            .collect();
        assert!(f.contains(&Check::Agree), "{f:?}");
    }
}

#[test]
fn a_write_known_not_applied_seen_fails() {
    let mut w = writes(RUN);
    w[2].outcome = Outcome::NotApplied;
    assert_eq!(failed(&good(), &w, &[], false), only(Check::NotApplied));
    // Unknown may appear.
    w[2].outcome = Outcome::Unknown;
    assert_eq!(failed(&good(), &w, &[], false), BTreeSet::new());
}

#[test]
fn a_value_applied_twice_fails() {
    // k1 = a again at revision 7: one write applied twice.
    let twice: Changes = &[
        &[("k1", Some("a"))],
        &[("k2", Some("b"))],
        &[("k1", Some("c"))],
        &[("k1", None)],
        &[("k3", Some("d")), ("k4", Some("e"))],
        &[("k2", Some("f"))],
        &[("k1", Some("a"))],
    ];
    let by_rev = events(twice);
    let s = [Stream {
        name: "a".into(),
        start: 1,
        prev_kv: true,
        items: vec![Item::Events(by_rev.into_iter().flatten().collect())],
    }];
    let mut w = writes(twice);
    w.pop();
    w[0].outcome = Outcome::Unknown;
    assert_eq!(failed(&s, &w, &[], true), only(Check::Twice));
}

#[test]
fn a_value_nobody_wrote_fails() {
    let mut w = writes(RUN);
    w.retain(|w| w.value != b"f");
    assert_eq!(failed(&good(), &w, &[], false), only(Check::Phantom));
}

#[test]
fn a_read_the_streams_contradict_fails() {
    assert_eq!(
        failed(&good(), &writes(RUN), &[read("k1", "a", 3)], false),
        only(Check::Read)
    );
    // Covered by none: nothing to say.
    let s = [stream("a", 1, &[&[1, 2]])];
    assert_eq!(
        failed(&s, &writes(RUN), &[read("k1", "a", 3)], false),
        BTreeSet::new()
    );
}

#[test]
fn a_compaction_ends_a_stream_and_only_a_real_one() {
    let w = writes(RUN);
    let mut s = good();
    // "c" was canceled by a compaction at 6 after revision 4: it covers
    // 3..=4, the acknowledged puts after it are not its to show.
    s[2] = stream("c", 3, &[&[3, 4]]);
    s[2].items.push(Item::Compacted(6));
    let r = check(&s, &told(&w, &[]), true);
    assert_eq!(r.violations, vec![]);
    assert_eq!(r.compacted, 1);
    // Something after the cancel.
    s[2].items.extend(stream("", 3, &[&[6]]).items);
    assert_eq!(failed(&s, &w, &[], true), only(Check::Order));
    // A cancel though the next revision was not compacted.
    s[2] = stream("c", 3, &[&[3, 4]]);
    s[2].items.push(Item::Compacted(5));
    assert_eq!(failed(&s, &w, &[], true), only(Check::Order));
}

#[test]
fn a_progress_claim_far_ahead_is_one_gap_not_a_hang() {
    let mut s = good();
    s[0].items.push(Item::Progress(i64::MAX));
    let r = check(&s, &told(&writes(RUN), &[]), true);
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
    assert_eq!(r.violations[0].check, Check::Gap);
    assert_eq!(r.violations[0].revision, 8);
}
