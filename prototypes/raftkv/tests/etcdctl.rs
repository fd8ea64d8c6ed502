//! Debian's `etcdctl` 3.4 (API v3), unmodified, against a 3-node raftkv:
//! one test per command of issue 59's list, each running the same
//! sequence against raftkv and against etcd 3.4 started beside it, and
//! comparing the two transcripts once what legitimately differs (member
//! and lease ids, addresses, names, versions, sizes, timings) is
//! normalized ([`etcd::Side::norm`]). Both stores start at revision 1 and
//! are sent the same changes in the same order, so revisions are
//! compared as they are.
//!
//! Needs `etcd` and `etcdctl` on `PATH` (Debian's etcd-server and
//! etcd-client; .ci/run installs them): without them each test fails
//! saying so.

mod common;
mod etcd;

use etcd::{compare, lease_id, norm_common, same, serial, sub, Kind, Out, Pair, Running, Side, T};

#[test]
fn put_with_its_flags() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("put", &p, |t| {
        t.run(&["put", "k1", "v1"]);
        t.run(&["put", "k1", "v2", "--prev-kv"]);
        t.run(&["put", "k1", "--ignore-value"]);
        t.run(&["get", "k1"]);
        t.run(&["put", "k1", "x", "--ignore-value"]);
        t.run(&["put", "nokey", "--ignore-value"]);
        let id = lease_id(&t.run(&["lease", "grant", "100"]));
        t.run(&["put", "k2", "v", &format!("--lease={id}")]);
        t.run(&["put", "k2", "w", "--ignore-lease"]);
        t.run(&["get", "k2", "-w", "json"]);
        t.run(&["put", "k3", "v", "--lease=1234abcd"]);
        t.run(&["get", "", "--prefix", "-w", "fields"]);
    });
}

#[test]
fn get_with_its_flags() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("get", &p, |t| {
        for (k, v) in [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("a", "5")] {
            t.run(&["put", k, v]);
        }
        t.run(&["get", "a"]);
        t.run(&["get", "a", "c"]);
        t.run(&["get", "", "--prefix"]);
        t.run(&["get", "--from-key", "b"]);
        t.run(&["get", "", "--prefix", "--limit=2"]);
        t.run(&["get", "", "--prefix", "--limit=1", "-w", "fields"]);
        t.run(&["get", "", "--prefix", "--sort-by=MODIFY", "--order=DESCEND"]);
        t.run(&[
            "get",
            "",
            "--prefix",
            "--sort-by=VALUE",
            "--order=ASCEND",
            "--keys-only",
        ]);
        t.run(&["get", "", "--prefix", "--print-value-only"]);
        t.run(&["get", "", "--prefix", "--count-only", "-w", "fields"]);
        t.run(&["get", "a", "--rev=2"]);
        t.run(&["get", "a", "--rev=100"]);
        t.run(&["get", "b", "--consistency=s"]);
        t.run(&["get", "", "--prefix", "--min-mod-rev=4", "--max-mod-rev=5"]);
        t.run(&[
            "get",
            "",
            "--prefix",
            "--min-create-rev=3",
            "--max-create-rev=4",
        ]);
        t.run(&["get", "a", "-w", "json"]);
    });
}

#[test]
fn del_with_its_flags() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("del", &p, |t| {
        for k in ["a", "b", "c1", "c2", "d", "e"] {
            t.run(&["put", k, &format!("v-{k}")]);
        }
        t.run(&["del", "a"]);
        t.run(&["del", "a"]);
        t.run(&["del", "b", "--prev-kv"]);
        t.run(&["del", "c", "--prefix"]);
        t.run(&["del", "--from-key", "d", "--prev-kv"]);
        t.run(&["get", "", "--prefix", "-w", "fields"]);
    });
}

#[test]
fn txn_compares_and_branches() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("txn", &p, |t| {
        // Compares, a blank line, the success requests, a blank line, the
        // failure requests, a blank line.
        t.txn("create(\"k\") = \"0\"\n\nput k v1\n\nget k\n\n");
        t.txn("create(\"k\") = \"0\"\n\nput k v1\n\nget k\n\n");
        t.txn("value(\"k\") = \"v1\"\nversion(\"k\") = \"1\"\n\nput k v2 --prev-kv\ndel missing\n\nget k\n\n");
        t.txn("mod(\"k\") > \"1\"\nvalue(\"k\") != \"v2\"\n\nput never here\n\nget k --rev=2\nput k v3\n\n");
        t.txn("lease(\"k\") = \"0\"\n\nget k --print-value-only\ndel k --prev-kv\n\n\n");
        t.txn("mod(\"k\") = \"2\"\n\nput k v4\n\n\n");
        t.run(&["get", "k"]);
    });
}

#[test]
fn watch_interactive() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    let run = |s: &Side, n: usize| -> (Vec<String>, usize) {
        let mut w = Running::start(&s.endpoints, &["watch", "-i"]);
        w.say("watch w1");
        w.say("watch w --prefix --prev-kv");
        // Let both watchers start before the changes.
        std::thread::sleep(std::time::Duration::from_millis(500));
        for args in [
            &["put", "w1", "a"][..],
            &["put", "w2", "b"],
            &["put", "w1", "c"],
            &["del", "w1"],
        ] {
            assert_eq!(s.ctl(args).code, 0, "{args:?}");
        }
        let lines = w.lines(n);
        let count = lines.len();
        (lines.iter().map(|l| s.norm(l)).collect(), count)
    };
    // etcdctl prints each watcher's events from its own goroutine, a line
    // at a time: two watchers sent one revision interleave their lines
    // as the scheduler runs them (etcd against itself differs). So the
    // lines are compared as a multiset; their number is the same.
    let (mut e, n) = run(&p.e, 26);
    let (mut r, _) = run(&p.r, n);
    e.sort();
    r.sort();
    same("watch -i", &r.join("\n"), &e.join("\n"));
}

#[test]
fn watch_from_a_revision_with_prev_kv() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    let run = |s: &Side, n: usize| -> (String, usize) {
        for args in [
            &["put", "x", "1"][..],
            &["put", "x", "2"],
            &["del", "x"],
            &["put", "x", "3"],
            &["put", "y", "9"],
        ] {
            assert_eq!(s.ctl(args).code, 0, "{args:?}");
        }
        let w = Running::start(&s.endpoints, &["watch", "--rev=2", "--prev-kv", "x"]);
        let lines = w.lines(n);
        let count = lines.len();
        let j = Running::start(&s.endpoints, &["watch", "--rev=3", "x", "-w", "json"]);
        let json: Vec<String> = j.lines(3).iter().map(|l| norm_common(s, l)).collect();
        (format!("{}\n{}", lines.join("\n"), json.join("\n")), count)
    };
    let (e, n) = run(&p.e, 11);
    let (r, _) = run(&p.r, n);
    same("watch --rev --prev-kv", &r, &e);
}

#[test]
fn lease_grant() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("lease grant", &p, |t| {
        t.run(&["lease", "grant", "100"]);
        t.run(&["lease", "grant", "7200"]);
        t.run(&["lease", "grant", "notanumber"]);
    });
}

#[test]
fn lease_keep_alive() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("lease keep-alive", &p, |t| {
        let id = lease_id(&t.run(&["lease", "grant", "100"]));
        t.run(&["lease", "keep-alive", "--once", &id]);
        t.run(&["lease", "keep-alive", "--once", "1234abcd"]);
    });
    // The stream: two answers, the second after about a third of the
    // time-to-live.
    for s in [&p.e, &p.r] {
        let id = lease_id(&s.ctl(&["lease", "grant", "3"]));
        let k = Running::start(&s.endpoints, &["lease", "keep-alive", &id]);
        let lines = k.lines(2);
        let want = format!("lease {id} keepalived with TTL(3)");
        assert_eq!(lines, vec![want.clone(), want], "{:?}", s.kind);
    }
}

#[test]
fn lease_timetolive() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("lease timetolive", &p, |t| {
        let id = lease_id(&t.run(&["lease", "grant", "100"]));
        t.run(&["put", "a", "1", &format!("--lease={id}")]);
        t.run(&["put", "b", "2", &format!("--lease={id}")]);
        let o = t.side.ctl(&["lease", "timetolive", &id, "--keys"]);
        // The time left may differ by a second; etcd lists the attached
        // keys in its map's order, which changes from run to run: sorted.
        let stdout = sub(&o.stdout, r"remaining\(\d+s\)", "remaining(~100s)");
        let stdout = regex::Regex::new(r"attached keys\(\[([^\]]*)\]\)")
            .unwrap()
            .replace_all(&stdout, |c: &regex::Captures| {
                let mut keys: Vec<&str> = c[1].split_whitespace().collect();
                keys.sort_unstable();
                format!("attached keys([{}])", keys.join(" "))
            })
            .into_owned();
        let o = Out { stdout, ..o };
        t.note(&["lease", "timetolive", &id, "--keys"], &o);
        t.run(&["lease", "revoke", &id]);
        t.run(&["lease", "timetolive", &id]);
    });
}

#[test]
fn lease_list() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("lease list", &p, |t| {
        t.run(&["lease", "list"]);
        t.run(&["lease", "grant", "100"]);
        t.run(&["lease", "grant", "100"]);
        t.run(&["lease", "list"]);
    });
}

#[test]
fn lease_revoke() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("lease revoke", &p, |t| {
        let id = lease_id(&t.run(&["lease", "grant", "100"]));
        t.run(&["put", "a", "1", &format!("--lease={id}")]);
        t.run(&["lease", "revoke", &id]);
        t.run(&["get", "a"]);
        t.run(&["lease", "revoke", &id]);
    });
}

/// `member list`'s lines with each member's id by position, in that
/// order.
fn members(s: &Side, text: &str) -> String {
    let mut rows = Vec::new();
    let mut out = String::new();
    for l in text.lines() {
        match l.split_once(", ") {
            Some((id, rest)) if !l.starts_with('$') && !l.starts_with('[') => {
                rows.push(format!("{}, {rest}\n", s.member(id)));
            }
            _ => {
                rows.sort();
                out += &rows.concat();
                rows.clear();
                out += &format!("{l}\n");
            }
        }
    }
    rows.sort();
    out + &rows.concat()
}

#[test]
fn member_list() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    let (r, e) = p.both(&["member", "list"], |s, t| members(s, &t));
    same("member list (ids)", &r, &e);
    // The table: the same columns, a started voter a row.
    let (r, e) = p.both(&["member", "list", "-w", "table"], |_, t| {
        let header = t
            .lines()
            .nth(1)
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let rows = t
            .lines()
            .filter(|l| l.contains("| started |") && l.contains("| false |"))
            .count();
        format!("{header}\n{rows} rows\n")
    });
    same("member list -w table", &r, &e);
}

/// `member add`'s answer with the new id and the other members' names
/// normalized.
fn added(s: &Side, text: &str) -> String {
    let t = sub(text, r"Member +[0-9a-f]+ added", "Member <NEW> added");
    let t = sub(
        &t,
        r"(Member <NEW> added to cluster) +[0-9a-f]+",
        "$1 <CLUSTER>",
    );
    s.norm(&t)
}

#[test]
fn member_add() {
    let _s = serial();
    let mut p = Pair::start(3, &[]);
    let e4 = p.etcd.reserve_member();
    let r4 = format!("127.0.0.1:{}", common::free_port());
    let e_url = format!("--peer-urls=http://{}", p.etcd.peer[e4]);
    let r_url = format!("--peer-urls=http://{r4}");
    for (s, url) in [(&p.r, &r_url), (&p.e, &e_url)] {
        let o = etcd::ctl_when_healthy(s, &["member", "add", "n4", "--learner", url]);
        assert_eq!(o.code, 0, "{:?}: {o:?}", s.kind);
    }
    let norm4 = |s: &Side, t: String| {
        let t = match s.kind {
            Kind::Raftkv => t.replace(&r4, "<EP4>"),
            Kind::Etcd => t.replace(&p.etcd.peer[e4], "<EP4>"),
        };
        members(s, &added(s, &t))
    };
    let (r, e) = p.both(&["member", "list"], norm4);
    same("member list after add", &r, &e);
    // The same URL again: refused. (etcd derives a new member's id from
    // its URLs, so it meets the id first: "member ID already exist";
    // raftkv numbers members, and says what etcd says of a URL in use.)
    let o = p.r.ctl(&["member", "add", "again", &r_url]);
    assert_eq!(o.error, "Error: etcdserver: Peer URLs already exists\n");
    let o = p.e.ctl(&["member", "add", "again", &e_url]);
    assert!(
        o.error == "Error: etcdserver: member ID already exist\n"
            || o.error == "Error: etcdserver: Peer URLs already exists\n",
        "{o:?}"
    );
}

#[test]
fn member_promote() {
    let _s = serial();
    let mut p = Pair::start(3, &[]);
    let e4 = p.etcd.reserve_member();
    let r4 = format!("127.0.0.1:{}", common::free_port());
    let mut new_ids = Vec::new();
    for (s, url) in [(&p.r, r4.clone()), (&p.e, p.etcd.peer[e4].clone())] {
        let o = etcd::ctl_when_healthy(
            s,
            &[
                "member",
                "add",
                "n4",
                "--learner",
                &format!("--peer-urls=http://{url}"),
            ],
        );
        assert_eq!(o.code, 0, "{:?}: {o:?}", s.kind);
        let id = o.stdout.split_whitespace().nth(1).unwrap().to_owned();
        new_ids.push(id);
    }
    // Not started: not in sync with the leader; a voter: not a learner.
    for (s, id) in [(&p.r, &new_ids[0]), (&p.e, &new_ids[1])] {
        let o = s.ctl(&["member", "promote", id]);
        assert_eq!(
            o.error,
            "Error: etcdserver: can only promote a learner member which is in sync with leader\n",
            "{:?}",
            s.kind
        );
        let voter = format!("{:x}", s.ids[0]);
        let o = s.ctl(&["member", "promote", &voter]);
        assert_eq!(
            o.error, "Error: etcdserver: can only promote a learner member\n",
            "{:?}",
            s.kind
        );
    }
    // Started, caught up: promoted.
    let initial = format!(
        "{},n4=http://{}",
        p.etcd.initial_cluster(3),
        p.etcd.peer[e4]
    );
    let child = p.etcd.spawn(e4, &initial.replace("n4=", "e4="), "existing");
    p.etcd.children[e4] = Some(child);
    let cluster_file = std::fs::read_to_string(p.raftkv.nodes[0].dir.join("raftkv.id")).unwrap();
    let cid = cluster_file
        .lines()
        .find_map(|l| l.strip_prefix("cluster="))
        .unwrap()
        .to_owned();
    let mut node4 = std::process::Command::new(env!("CARGO_BIN_EXE_raftkv"))
        .args(["serve", "--id", "4", "--listen", &r4, "--cluster-id", &cid])
        .arg("--dir")
        .arg(p.raftkv.tmp.path().join("node-4"))
        .arg("--peer-secret-file")
        .arg(p.raftkv.secret_file())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for (s, id) in [(&p.r, &new_ids[0]), (&p.e, &new_ids[1])] {
        let start = std::time::Instant::now();
        let o = loop {
            let o = s.ctl(&["member", "promote", id]);
            if o.code == 0 || start.elapsed() > std::time::Duration::from_secs(30) {
                break o;
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        };
        let text = sub(
            &o.stdout,
            r"Member +[0-9a-f]+ promoted in cluster +[0-9a-f]+",
            "Member <NEW> promoted in cluster <CLUSTER>",
        );
        assert_eq!(
            text, "Member <NEW> promoted in cluster <CLUSTER>\n",
            "{:?}: {o:?}",
            s.kind
        );
    }
    let _ = node4.kill();
    let _ = node4.wait();
}

#[test]
fn member_remove() {
    let _s = serial();
    let mut p = Pair::start(3, &[]);
    let e4 = p.etcd.reserve_member();
    let r4 = format!("127.0.0.1:{}", common::free_port());
    let mut outs = Vec::new();
    for (s, url) in [(&p.r, r4.clone()), (&p.e, p.etcd.peer[e4].clone())] {
        let o = etcd::ctl_when_healthy(
            s,
            &[
                "member",
                "add",
                "n4",
                "--learner",
                &format!("--peer-urls=http://{url}"),
            ],
        );
        let id = o.stdout.split_whitespace().nth(1).unwrap().to_owned();
        let mut t = T::new(s);
        let o = t.side.ctl(&["member", "remove", &id]);
        let o = Out {
            stdout: sub(
                &o.stdout,
                r"Member +[0-9a-f]+ removed from cluster +[0-9a-f]+",
                "Member <NEW> removed from cluster <CLUSTER>",
            ),
            ..o
        };
        t.note(&["member", "remove", "<NEW>"], &o);
        let o = t.side.ctl(&["member", "remove", &id]);
        t.note(&["member", "remove", "<NEW>"], &o);
        let o = t.side.ctl(&["member", "list"]);
        t.note(&["member", "list"], &o);
        outs.push(members(s, &t.text));
    }
    same("member remove", &outs[0], &outs[1]);
}

/// `endpoint status` lines with what differs by server replaced.
fn status_lines(s: &Side, text: &str) -> String {
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(", ").collect();
            if f.len() < 9 {
                return format!("{l}\n");
            }
            // endpoint, id, version, db size, leader, learner, term,
            // index, applied index, errors
            format!(
                "{}, {}, V, SIZE, {}, {}, TERM, INDEX, APPLIED, {}\n",
                f[0],
                s.member(f[1]),
                f[4],
                f[5],
                f[9..].join(", ")
            )
        })
        .collect()
}

#[test]
fn endpoint_status() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    let (r, e) = p.both(&["endpoint", "status"], |s, t| {
        // Who leads differs: the leader's line says true, the others false.
        let t = status_lines(s, &t);
        let leaders = t.matches(", true, false,").count();
        assert_eq!(leaders, 1, "{:?}: one leader in {t}", s.kind);
        sub(&t, r", (true|false), false, TERM", ", L, false, TERM")
    });
    same("endpoint status", &r, &e);
    let (r, e) = p.both(&["endpoint", "status", "-w", "json"], |s, t| {
        let v: serde_json::Value = serde_json::from_str(t.split("[exit").next().unwrap()).unwrap();
        let keys: Vec<String> = v[0]["Status"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        format!(
            "{} entries, keys {keys:?}, {}",
            v.as_array().unwrap().len(),
            s.norm(v[0]["Endpoint"].as_str().unwrap())
        )
    });
    same("endpoint status -w json", &r, &e);
}

#[test]
fn endpoint_health() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    let (r, e) = p.both(&["endpoint", "health"], |s, t| {
        let mut lines: Vec<String> = norm_common(s, &t).lines().map(str::to_owned).collect();
        lines.sort();
        lines.join("\n")
    });
    same("endpoint health", &r, &e);
}

#[test]
fn endpoint_hashkv() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    for s in [&p.r, &p.e] {
        for (k, v) in [("a", "1"), ("b", "2"), ("a", "3")] {
            assert_eq!(s.ctl(&["put", k, v]).code, 0);
        }
    }
    let (r, e) = p.both(&["endpoint", "hashkv", "--rev=3"], |s, t| {
        // The hashes are each server's own, but equal on every member.
        let hashes: std::collections::BTreeSet<&str> =
            t.lines().filter_map(|l| l.split(", ").nth(1)).collect();
        assert_eq!(hashes.len(), 1, "{:?}: members disagree: {t}", s.kind);
        sub(&t, r", \d+\n", ", HASH\n")
    });
    same("endpoint hashkv", &r, &e);
}

#[test]
fn compaction() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    compare("compaction", &p, |t| {
        for v in ["1", "2", "3", "4"] {
            t.run(&["put", "k", v]);
        }
        t.run(&["compaction", "3"]);
        t.run(&["get", "k", "--rev=2"]);
        t.run(&["get", "k", "--rev=3"]);
        t.run(&["compaction", "2"]);
        t.run(&["compaction", "--physical", "4"]);
        t.run(&["compaction", "100"]);
        // Behind the compaction: told on stderr, and the watch ends.
        let w = Running::start_with_stderr(&t.side.endpoints, &["watch", "--rev=2", "k"]);
        let lines = w.lines(2);
        t.text += &format!("watch --rev=2 k: {lines:?}\n");
    });
}

/// A raftkv cluster each of whose nodes keeps more free space than any
/// disk has: every one's NOSPACE alarm is raised.
fn full_disks() -> common::Cluster {
    let c = common::Cluster::start(3, &["--space-reserve-mib", "100000000"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(c.leader(None));
    c
}

#[test]
fn alarm_list() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    let (r, e) = p.both(&["alarm", "list"], |_, t| t);
    same("alarm list", &r, &e);
    // A full disk raises NOSPACE, listed as etcd lists it.
    drop(p);
    let full = full_disks();
    let o = etcd::ctl(&full.endpoints(), &["alarm", "list"]);
    let want: String = (1..=3)
        .map(|id| format!("memberID:{id} alarm:NOSPACE \n"))
        .collect();
    let mut got: Vec<&str> = o.stdout.lines().collect();
    got.sort();
    assert_eq!(
        got.iter().map(|l| format!("{l}\n")).collect::<String>(),
        want,
        "{o:?}"
    );
}

#[test]
fn alarm_disarm() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    let (r, e) = p.both(&["alarm", "disarm"], |_, t| t);
    same("alarm disarm", &r, &e);
    drop(p);
    // Still full: disarmed, raised again at once.
    let full = full_disks();
    let o = etcd::ctl(&full.endpoints(), &["alarm", "disarm"]);
    assert_eq!(o.code, 0, "{o:?}");
    let o = etcd::ctl(&full.endpoints(), &["alarm", "list"]);
    assert_eq!(o.stdout.lines().count(), 3, "{o:?}");
}

#[test]
fn defrag() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    let (r, e) = p.both(&["defrag"], |_, t| t);
    same("defrag", &r, &e);
}

#[test]
fn move_leader() {
    let _s = serial();
    let p = Pair::start(3, &[]);
    let mut outs = Vec::new();
    for s in [&p.r, &p.e] {
        let status = s.ctl(&["endpoint", "status"]);
        let lines: Vec<&str> = status.stdout.lines().collect();
        let leader = lines
            .iter()
            .position(|l| l.contains(", true, false,"))
            .unwrap();
        let target = (leader + 1) % lines.len();
        let target_id = format!("{:x}", s.ids[target]);
        let mut t = T::new(s);
        let o = s.ctl_at((leader + 2) % 3, &["move-leader", &target_id]);
        t.note(&["move-leader", "<TARGET>", "(at a follower only)"], &o);
        let o = s.ctl(&["move-leader", &target_id]);
        let o = Out {
            stdout: sub(
                &o.stdout,
                r"from ([0-9a-f]+) to ([0-9a-f]+)",
                "from <A> to <B>",
            ),
            ..o
        };
        t.note(&["move-leader", "<TARGET>"], &o);
        let status = s.ctl(&["endpoint", "status"]);
        let now = status
            .stdout
            .lines()
            .position(|l| l.contains(", true, false,"));
        t.text += &format!("the target leads: {}\n", now == Some(target));
        outs.push(sub(&t.text, r"<EP\d>", "<EP>"));
    }
    same("move-leader", &outs[0], &outs[1]);
}

#[test]
fn snapshot_save() {
    let _s = serial();
    let p = Pair::start(1, &[]);
    let mut outs = Vec::new();
    for s in [&p.r, &p.e] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.db");
        let path_s = path.to_str().unwrap();
        let o = s.ctl_at(0, &["snapshot", "save", path_s]);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(len > 32 && len % 512 == 32, "{:?}: {len} bytes", s.kind);
        outs.push(o.text().replace(path_s, "<PATH>"));
    }
    same("snapshot save", &outs[0], &outs[1]);
}
