//! A checker of recorded watch streams, in the spirit of etcd's
//! robustness tests (their watch validation): the events a watcher was
//! sent are checked against each other, against the other watchers' and
//! against what the clients were told.
//!
//! A [`Stream`] is one watcher's record from its start revision on: the
//! events of each answer, the progress notifications, where it resumed
//! after its connection broke (on another member, from the revision after
//! the last it had been sent all of), and a cancel by a compaction that
//! passed it, which ends it (a watcher then begins a new stream at the
//! compaction's revision). A stream **covers** the revisions from its
//! start to the last it was sent all of (its last event's, or a progress
//! notification's if later). The checks ([`Check`]):
//!
//! - **order**: events by revision, each `(revision, key)` once, none
//!   before the start, none at or below a revision a progress
//!   notification said was complete, nothing after a compaction's cancel,
//!   and a cancel only for a revision actually compacted;
//! - **atomic**: all the events of a revision in one answer;
//! - **resume**: a broken stream resumed at the revision after the last it
//!   covered (no hole, no overlap);
//! - **gap** (reliable): every revision in a stream's covered range that
//!   anyone saw — another watcher, a read's `mod_revision` — is in it; and
//!   with [`check`]'s `dense` on (every change of the run is in the watched
//!   range: each revision of the store is an event of it), every revision
//!   of the range is;
//! - **acked**: every put or compare-and-set acknowledged at revision `r`
//!   is an event at `r` of that key with that value in every stream
//!   covering `r`, and its value at no other revision;
//! - **agree**: the events of a revision are the same in every stream
//!   (keys, kinds, values, create and mod revisions, versions, `prev_kv`
//!   but where one may be missing, below);
//! - **prev-kv**: an event's `prev_kv` is the key's previous event in the
//!   same stream (`None` after a delete, or for a key first written in a
//!   stream that starts at the store's first change), its
//!   `create_revision` and `version` follow from it. A `prev_kv` may be
//!   missing at a revision a compaction reached (etcd reads it at the
//!   revision before the event, and leaves it out if that is compacted):
//!   below the highest compaction asked for, a missing one passes;
//! - **not-applied**: no event carries the value of a write known not to
//!   have taken effect (refused, or a compare-and-set answered failed);
//! - **twice**: no value is put at two revisions (every value written is
//!   unique: a second event of it is a write applied twice);
//! - **phantom**: no event carries a value nobody wrote;
//! - **read**: a linearizable read's value and `mod_revision` are the
//!   event at that revision in every stream covering it.
//!
//! Writes whose outcome is unknown may or may not appear — once.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The revision of a store's first change: a new store is at revision 1
/// (etcd's numbering, and raftkv's), so a stream from this revision or
/// below has seen every key from its start.
pub const FIRST_REVISION: i64 = 2;

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// A put.
    Put,
    /// A delete.
    Delete,
}

/// A version of a key, as an event carries it (`kv` or `prev_kv`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    /// The key.
    pub key: Vec<u8>,
    /// The value (empty for a delete).
    pub value: Vec<u8>,
    /// The revision that created the key.
    pub create_revision: i64,
    /// The revision of this change: the event's revision.
    pub mod_revision: i64,
    /// The key's version (1 for its first put since it was absent).
    pub version: i64,
}

/// One event of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change (a delete: its key and revision).
    pub kv: Version,
    /// The key before it, if the watch asked for it and it existed.
    pub prev: Option<Version>,
}

impl Event {
    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

/// What a stream was sent, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// The events of one answer.
    Events(Vec<Event>),
    /// A progress notification: every event up to this revision was sent.
    Progress(i64),
    /// The connection broke; the watch went on (on some member) from this
    /// revision.
    Resumed(i64),
    /// Canceled by a compaction at this revision: the stream ends.
    Compacted(i64),
}

/// One watcher's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Its name in violations.
    pub name: String,
    /// The revision it watched from.
    pub start: i64,
    /// Whether it asked for `prev_kv`.
    pub prev_kv: bool,
    /// What it was sent.
    pub items: Vec<Item>,
}

/// What became of a write, as its client learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged, at this revision if the answer said.
    Applied(Option<i64>),
    /// No answer that says: it may or may not have taken effect.
    Unknown,
    /// Known not to have taken effect.
    NotApplied,
}

/// A put (or a compare-and-set's put) of a unique value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The key.
    pub key: Vec<u8>,
    /// The value (unique in the run).
    pub value: Vec<u8>,
    /// What became of it.
    pub outcome: Outcome,
}

/// A linearizable read that found a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Its `mod_revision`.
    pub mod_revision: i64,
}

/// The checks, named in violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// Events by revision, each once, none before the start or after a
    /// progress notification covering it or a compaction's cancel.
    Order,
    /// A revision's events in one answer.
    Atomic,
    /// A broken stream resumed right after what it covered.
    Resume,
    /// A revision missing from a stream that covered it.
    Gap,
    /// An acknowledged write missing or different.
    Acked,
    /// Streams that disagree on a revision.
    Agree,
    /// A `prev_kv`, `create_revision` or `version` that does not follow.
    PrevKv,
    /// A write known not applied, seen.
    NotApplied,
    /// A value put at two revisions.
    Twice,
    /// A value nobody wrote.
    Phantom,
    /// A read that the streams contradict.
    Read,
}

/// One thing wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which check.
    pub check: Check,
    /// The stream's name.
    pub stream: String,
    /// The revision it is about.
    pub revision: i64,
    /// What was wrong.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} in {} at revision {}: {}",
            self.check, self.stream, self.revision, self.what
        )
    }
}

/// What checking found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Streams checked.
    pub streams: usize,
    /// Events in them.
    pub events: usize,
    /// Revisions covered, summed over the streams.
    pub covered: u64,
    /// Streams resumed after a break (a count of resumptions).
    pub resumed: usize,
    /// Streams a compaction ended.
    pub compacted: usize,
    /// What was wrong.
    pub violations: Vec<Violation>,
}

/// A stream laid out: its events by revision, and what it covers.
struct Laid<'a> {
    name: &'a str,
    start: i64,
    /// The last revision it was sent all of (`start - 1`: none).
    done: i64,
    prev_kv: bool,
    /// Its events, in order, each with the index of its answer.
    events: Vec<(usize, &'a Event)>,
    /// Its events by revision.
    by_rev: BTreeMap<i64, Vec<&'a Event>>,
}

impl Laid<'_> {
    fn covers(&self, rev: i64) -> bool {
        rev >= self.start && rev <= self.done
    }
}

/// What the clients were told, to hold the streams to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Told {
    /// Every write of a value, and what became of it.
    pub writes: Vec<Write>,
    /// Every linearizable read that found a value.
    pub reads: Vec<Read>,
    /// The revisions of the compactions asked for (answered or not).
    pub compactions: Vec<i64>,
}

/// Checks `streams` against each other and against what the clients were
/// `told`; `dense`: every revision of the store in a stream's range is a
/// change it watches (the watched range holds every write of the run).
pub fn check(streams: &[Stream], told: &Told, dense: bool) -> Summary {
    let mut out = Summary {
        streams: streams.len(),
        ..Summary::default()
    };
    let laid: Vec<Laid> = streams.iter().map(|s| lay_out(s, &mut out)).collect();
    // A `prev_kv` may be missing where the revision before the event was
    // compacted when it was sent, as etcd's is (it reads the previous
    // version at that revision, and sends the event without it if it is
    // gone): below the highest compaction anyone asked for or met.
    let cancels = streams
        .iter()
        .flat_map(|s| &s.items)
        .filter_map(|i| match i {
            Item::Compacted(c) => Some(*c),
            _ => None,
        });
    let compacted = told
        .compactions
        .iter()
        .copied()
        .chain(cancels)
        .max()
        .unwrap_or(0);
    let gone = |rev: i64| rev <= compacted;
    for l in &laid {
        out.events += l.events.len();
        out.covered += u64::try_from(l.done.saturating_sub(l.start).saturating_add(1)).unwrap_or(0);
        prev_kvs(l, &gone, &mut out.violations);
    }
    gaps(&laid, &told.reads, dense, &mut out.violations);
    agree(&laid, &gone, &mut out.violations);
    values(&laid, &told.writes, &mut out.violations);
    acked_and_read(&laid, told, &mut out.violations);
    out
}

fn violation(check: Check, stream: &str, revision: i64, what: String) -> Violation {
    Violation {
        check,
        stream: stream.to_owned(),
        revision,
        what,
    }
}

/// Walks a stream's items: order, atomicity, resumption, compaction.
fn lay_out<'a>(s: &'a Stream, out: &mut Summary) -> Laid<'a> {
    let v = &mut out.violations;
    let mut l = Laid {
        name: &s.name,
        start: s.start,
        done: s.start.saturating_sub(1),
        prev_kv: s.prev_kv,
        events: Vec::new(),
        by_rev: BTreeMap::new(),
    };
    // Revisions at or below `sealed` may not come again: an earlier
    // answer ended there, or a progress notification said so.
    let mut sealed = s.start.saturating_sub(1);
    let mut last = sealed;
    let mut seen: BTreeSet<(i64, &[u8])> = BTreeSet::new();
    let mut ended = None;
    for (i, item) in s.items.iter().enumerate() {
        if let Some(c) = ended {
            v.push(violation(
                Check::Order,
                &s.name,
                c,
                format!("{item:?} after a compaction ended the stream"),
            ));
            continue;
        }
        match item {
            Item::Events(es) => {
                for e in es {
                    let rev = e.revision();
                    let why = if rev < s.start {
                        Some((Check::Order, format!("before the start {}", s.start)))
                    } else if rev < last {
                        Some((Check::Order, format!("after revision {last}")))
                    } else if rev <= sealed && rev == last {
                        Some((Check::Atomic, "in two answers".to_owned()))
                    } else if rev <= sealed {
                        Some((Check::Order, format!("after a notice of {sealed}")))
                    } else if !seen.insert((rev, &e.kv.key)) {
                        Some((Check::Order, "its key twice".to_owned()))
                    } else {
                        None
                    };
                    let key = String::from_utf8_lossy(&e.kv.key);
                    if let Some((check, why)) = why {
                        v.push(violation(check, &s.name, rev, format!("{key}: {why}")));
                        // An event out of order or twice is left out (the
                        // rest is checked as if it had not come); one of
                        // a split revision is kept.
                        if check != Check::Atomic || !seen.insert((rev, &e.kv.key)) {
                            continue;
                        }
                    }
                    last = rev;
                    l.events.push((i, e));
                    l.by_rev.entry(rev).or_default().push(e);
                }
                sealed = sealed.max(last);
                l.done = l.done.max(last);
            }
            Item::Progress(r) => {
                sealed = sealed.max(*r);
                l.done = l.done.max(*r);
            }
            Item::Resumed(r) => {
                out.resumed += 1;
                if *r != l.done.saturating_add(1) {
                    v.push(violation(
                        Check::Resume,
                        &s.name,
                        *r,
                        format!("resumed at {r}, having all of up to {}", l.done),
                    ));
                }
                sealed = sealed.max(r.saturating_sub(1));
                l.done = l.done.max(r.saturating_sub(1));
            }
            Item::Compacted(c) => {
                out.compacted += 1;
                // The server cancels a watcher whose next revision is
                // below the compaction.
                if *c <= l.done.saturating_add(1) {
                    v.push(violation(
                        Check::Order,
                        &s.name,
                        *c,
                        format!(
                            "canceled as compacted though {} is not",
                            l.done.saturating_add(1)
                        ),
                    ));
                }
                ended = Some(*c);
            }
        }
    }
    l
}

/// Every revision someone saw (or, `dense`, every revision) in each
/// stream's covered range is in it.
fn gaps(laid: &[Laid], reads: &[Read], dense: bool, v: &mut Vec<Violation>) {
    let mut known: BTreeMap<i64, String> = BTreeMap::new();
    for l in laid {
        for &rev in l.by_rev.keys() {
            known.entry(rev).or_insert_with(|| l.name.to_owned());
        }
    }
    for r in reads {
        known
            .entry(r.mod_revision)
            .or_insert_with(|| "a read".to_owned());
    }
    for l in laid {
        if dense {
            // Each run of missing revisions (a server may claim any
            // revision: the holes between the events, not every number).
            let from = l.start.max(FIRST_REVISION);
            let mut next = from;
            let present = l.by_rev.range(from..=l.done.max(from)).map(|(r, _)| *r);
            for rev in present.chain((l.done >= from).then_some(l.done.saturating_add(1))) {
                if rev > next {
                    let last = rev.saturating_sub(1);
                    let by = known.range(next..=last).next();
                    let what = match by {
                        Some((r, by)) => format!("{next}..={last} missing ({r} seen by {by})"),
                        None => format!("{next}..={last} missing: no event at revisions covered"),
                    };
                    v.push(violation(Check::Gap, l.name, next, what));
                }
                next = rev.saturating_add(1);
            }
        } else if l.done >= l.start {
            for (&rev, by) in known.range(l.start..=l.done) {
                if !l.by_rev.contains_key(&rev) {
                    v.push(violation(
                        Check::Gap,
                        l.name,
                        rev,
                        format!("missing (seen by {by})"),
                    ));
                }
            }
        }
    }
}

/// The events of a revision are the same in every stream that has it
/// (`prev_kv` compared between streams that asked for it; one without it
/// where it may be `gone` is not compared).
fn agree(laid: &[Laid], gone: &dyn Fn(i64) -> bool, v: &mut Vec<Violation>) {
    let sorted = |l: &Laid, rev: i64| -> Vec<Event> {
        let mut es: Vec<Event> = l
            .by_rev
            .get(&rev)
            .into_iter()
            .flatten()
            .map(|e| (*e).clone())
            .collect();
        if !l.prev_kv {
            es.iter_mut().for_each(|e| e.prev = None);
        }
        es.sort_by(|a, b| a.kv.key.cmp(&b.kv.key));
        es
    };
    let mut first: BTreeMap<i64, usize> = BTreeMap::new();
    for (i, l) in laid.iter().enumerate() {
        for &rev in l.by_rev.keys() {
            let Some(&j) = first.get(&rev) else {
                first.insert(rev, i);
                continue;
            };
            let (mut mine, mut theirs) = (sorted(l, rev), sorted(&laid[j], rev));
            let both = l.prev_kv && laid[j].prev_kv;
            for (a, b) in mine.iter_mut().zip(theirs.iter_mut()) {
                if !both || (gone(rev) && (a.prev.is_none() || b.prev.is_none())) {
                    a.prev = None;
                    b.prev = None;
                }
            }
            if mine != theirs {
                v.push(violation(
                    Check::Agree,
                    l.name,
                    rev,
                    format!("{mine:?}, but {} has {theirs:?}", laid[j].name),
                ));
            }
        }
    }
}

/// Each event's `prev_kv`, `create_revision` and `version` against the
/// key's previous event in the stream (a `prev_kv` missing where it may
/// be `gone` passes).
fn prev_kvs(l: &Laid, gone: &dyn Fn(i64) -> bool, v: &mut Vec<Violation>) {
    // The key's version before the next event: `Some(None)` absent, `None`
    // unknown (not seen in a stream that started later than revision 1).
    let mut last: HashMap<&[u8], Option<&Version>> = HashMap::new();
    for &(_, e) in &l.events {
        let rev = e.revision();
        let key = e.kv.key.as_slice();
        let name = String::from_utf8_lossy(key);
        let before = last
            .get(key)
            .copied()
            .or((l.start <= FIRST_REVISION).then_some(None));
        if let Some(p) = &e.prev {
            if p.key != e.kv.key || p.mod_revision >= rev {
                v.push(violation(
                    Check::PrevKv,
                    l.name,
                    rev,
                    format!("{name}: prev_kv {p:?}"),
                ));
            }
        }
        if let Some(before) = before {
            let missing = e.prev.is_none() && gone(rev);
            if l.prev_kv && e.prev.as_ref() != before && !missing {
                v.push(violation(
                    Check::PrevKv,
                    l.name,
                    rev,
                    format!(
                        "{name}: prev_kv {:?}, the stream's previous {before:?}",
                        e.prev
                    ),
                ));
            }
            let (create, version) = match before {
                Some(p) => (p.create_revision, p.version.saturating_add(1)),
                None => (rev, 1),
            };
            if e.kind == EventKind::Put
                && (e.kv.create_revision != create || e.kv.version != version)
            {
                v.push(violation(
                    Check::PrevKv,
                    l.name,
                    rev,
                    format!(
                        "{name}: create_revision {} version {}, expected {create} and {version}",
                        e.kv.create_revision, e.kv.version
                    ),
                ));
            }
        }
        last.insert(key, (e.kind == EventKind::Put).then_some(&e.kv));
    }
}

/// Each put's value: written by someone, not by a write known not
/// applied, at one revision only, the acknowledged one if known.
fn values(laid: &[Laid], writes: &[Write], v: &mut Vec<Violation>) {
    let by_value: HashMap<&[u8], &Write> = writes.iter().map(|w| (w.value.as_slice(), w)).collect();
    // A value's revision, and the stream that first had it.
    let mut at: HashMap<&[u8], (i64, &str)> = HashMap::new();
    for l in laid {
        for &(_, e) in &l.events {
            if e.kind != EventKind::Put {
                continue;
            }
            let rev = e.revision();
            let value = e.kv.value.as_slice();
            let show = String::from_utf8_lossy(value);
            match by_value.get(value) {
                None => v.push(violation(
                    Check::Phantom,
                    l.name,
                    rev,
                    format!("{show}: written by nobody"),
                )),
                Some(w) if w.outcome == Outcome::NotApplied => v.push(violation(
                    Check::NotApplied,
                    l.name,
                    rev,
                    format!("{show}: a write known not applied"),
                )),
                Some(w) if w.key != e.kv.key => v.push(violation(
                    Check::Phantom,
                    l.name,
                    rev,
                    format!("{show}: written to {}", String::from_utf8_lossy(&w.key)),
                )),
                Some(w) => {
                    if let Outcome::Applied(Some(r)) = w.outcome {
                        if r != rev {
                            v.push(violation(
                                Check::Acked,
                                l.name,
                                rev,
                                format!("{show}: acknowledged at revision {r}"),
                            ));
                        }
                    }
                }
            }
            match at.get(value) {
                Some(&(r, by)) if r != rev => v.push(violation(
                    Check::Twice,
                    l.name,
                    rev,
                    format!("{show}: also at revision {r} in {by}"),
                )),
                Some(_) => {}
                None => {
                    at.insert(value, (rev, l.name));
                }
            }
        }
    }
}

/// Every acknowledged write and every read, in every stream covering its
/// revision.
fn acked_and_read(laid: &[Laid], told: &Told, v: &mut Vec<Violation>) {
    let has = |l: &Laid, rev: i64, key: &[u8], value: &[u8]| {
        l.by_rev.get(&rev).is_some_and(|es| {
            es.iter()
                .any(|e| e.kind == EventKind::Put && e.kv.key == key && e.kv.value == value)
        })
    };
    let acked = told.writes.iter().filter_map(|w| match w.outcome {
        Outcome::Applied(Some(r)) => Some((Check::Acked, r, &w.key, &w.value)),
        _ => None,
    });
    let read = told
        .reads
        .iter()
        .map(|r| (Check::Read, r.mod_revision, &r.key, &r.value));
    for (check, rev, key, value) in acked.chain(read) {
        for l in laid.iter().filter(|l| l.covers(rev)) {
            if !has(l, rev, key, value) {
                v.push(violation(
                    check,
                    l.name,
                    rev,
                    format!(
                        "{} = {} not in the stream's {:?}",
                        String::from_utf8_lossy(key),
                        String::from_utf8_lossy(value),
                        l.by_rev.get(&rev)
                    ),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests;
