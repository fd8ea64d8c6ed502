//! etcd beside raftkv: a local etcd 3.4 cluster (Debian's `etcd-server`),
//! `etcdctl` (Debian's `etcd-client`, API v3) run against either, and the
//! normalizing of what legitimately differs between their answers (ids,
//! addresses, names, versions, sizes, timings) so the rest is compared
//! as is. A missing tool fails the test with what to install: nothing is
//! skipped.
#![allow(dead_code)]

use crate::common::{free_port, Cluster};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A tool on `PATH`, or a failure that says which Debian package has it.
pub fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` is not installed: these tests compare raftkv with etcd 3.4 and need Debian's \
         {package} (`apt-get install etcd-server etcd-client`; .ci/run installs them)"
    );
}

/// Serializes the tests of a binary: each starts its clusters, and the
/// machine has two cores.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A local etcd cluster; its processes are killed when it drops.
pub struct EtcdCluster {
    pub tmp: tempfile::TempDir,
    /// Client addresses (`host:port`), by member.
    pub client: Vec<String>,
    /// Peer addresses, by member.
    pub peer: Vec<String>,
    pub children: Vec<Option<Child>>,
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one is healthy.
    pub fn start(n: usize) -> EtcdCluster {
        let tmp = tempfile::tempdir().unwrap();
        let client: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let peer: Vec<String> = (0..n)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let mut c = EtcdCluster {
            tmp,
            client,
            peer,
            children: Vec::new(),
        };
        let initial = c.initial_cluster(n);
        for i in 0..n {
            let child = c.spawn(i, &initial, "new");
            c.children.push(Some(child));
        }
        c.wait_healthy();
        c
    }

    /// `e1=http://peer1,…` for the first `n` members.
    pub fn initial_cluster(&self, n: usize) -> String {
        (0..n)
            .map(|i| format!("e{}=http://{}", i + 1, self.peer[i]))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts member `i` (0-based) of `initial` (state `new` or
    /// `existing`).
    pub fn spawn(&self, i: usize, initial: &str, state: &str) -> Child {
        let etcd = tool("etcd", "etcd-server");
        let log = std::fs::File::create(self.tmp.path().join(format!("e{}.log", i + 1))).unwrap();
        Command::new(etcd)
            .args(["--name", &format!("e{}", i + 1)])
            .arg("--data-dir")
            .arg(self.tmp.path().join(format!("e{}", i + 1)))
            .args([
                "--listen-client-urls",
                &format!("http://{}", self.client[i]),
            ])
            .args([
                "--advertise-client-urls",
                &format!("http://{}", self.client[i]),
            ])
            .args(["--listen-peer-urls", &format!("http://{}", self.peer[i])])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{}", self.peer[i]),
            ])
            .args(["--initial-cluster", initial])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "raftkv-compare"])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// Adds an address pair for a member that is not started yet.
    pub fn reserve_member(&mut self) -> usize {
        self.client.push(format!("127.0.0.1:{}", free_port()));
        self.peer.push(format!("127.0.0.1:{}", free_port()));
        self.children.push(None);
        self.client.len() - 1
    }

    /// Waits (up to 30 s) until every started member is healthy.
    pub fn wait_healthy(&self) {
        let eps: Vec<String> = self
            .client
            .iter()
            .zip(&self.children)
            .filter(|(_, c)| c.is_some())
            .map(|(a, _)| a.clone())
            .collect();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if ctl(&eps, &["endpoint", "health"]).code == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "etcd did not become healthy within 30 s (logs in {:?})",
            self.tmp.path()
        );
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What an etcdctl run printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Out {
    /// Its exit code.
    pub code: i32,
    pub stdout: String,
    /// The `Error: …` lines of its stderr (its logs are left out).
    pub error: String,
}

impl Out {
    /// Stdout, then the error lines, then the exit code: one transcript.
    pub fn text(&self) -> String {
        format!("{}{}[exit {}]\n", self.stdout, self.error, self.code)
    }
}

/// The etcdctl command on `endpoints`.
pub fn command(endpoints: &[String], args: &[&str]) -> Command {
    let mut cmd = Command::new(tool("etcdctl", "etcd-client"));
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["--dial-timeout=5s", "--command-timeout=20s"])
        .args(args);
    cmd
}

fn out(o: std::process::Output) -> Out {
    let stderr = String::from_utf8_lossy(&o.stderr);
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        error: stderr
            .lines()
            .filter(|l| l.starts_with("Error:"))
            .map(|l| format!("{l}\n"))
            .collect(),
    }
}

/// Runs etcdctl on `endpoints` (it ends by its own command timeout).
pub fn ctl(endpoints: &[String], args: &[&str]) -> Out {
    out(command(endpoints, args).output().unwrap())
}

/// Runs etcdctl with `input` on its stdin (a `txn`).
pub fn ctl_input(endpoints: &[String], args: &[&str], input: &str) -> Out {
    let mut child = command(endpoints, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    out(child.wait_with_output().unwrap())
}

/// A long-running etcdctl (watch, keep-alive): its stdout lines as they
/// come, its stdin to write to; killed when dropped.
pub struct Running {
    child: Child,
    pub stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Running {
    pub fn start(endpoints: &[String], args: &[&str]) -> Running {
        Running::spawn(endpoints, args, false)
    }

    /// As [`Running::start`], with its stderr's lines (but its logs)
    /// among the lines.
    pub fn start_with_stderr(endpoints: &[String], args: &[&str]) -> Running {
        Running::spawn(endpoints, args, true)
    }

    fn spawn(endpoints: &[String], args: &[&str], stderr: bool) -> Running {
        let mut child = command(endpoints, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let out = tx.clone();
        std::thread::spawn(move || forward_lines(stdout, out));
        if let Some(err) = child.stderr.take() {
            std::thread::spawn(move || forward_lines(err, tx));
        }
        let stdin = child.stdin.take();
        Running {
            child,
            stdin,
            lines,
        }
    }

    /// Writes a line to its stdin.
    pub fn say(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
    }

    /// The next `n` lines, waiting up to 20 s in all (fewer if it ends or
    /// the time runs out: the comparison then shows what is missing).
    pub fn lines(&self, n: usize) -> Vec<String> {
        let end = Instant::now() + Duration::from_secs(20);
        let mut got = Vec::new();
        while got.len() < n {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => got.push(l),
                Err(_) => break,
            }
        }
        got
    }
}

/// Sends the lines of `from` that are not JSON logs to `to`.
fn forward_lines(from: impl std::io::Read, to: mpsc::Sender<String>) {
    for l in BufReader::new(from).lines() {
        let Ok(l) = l else { return };
        if l.starts_with('{') && l.contains("\"level\"") {
            continue;
        }
        if to.send(l).is_err() {
            return;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which server a transcript is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Raftkv,
    Etcd,
}

/// One side of a comparison: its endpoints and what to normalize.
pub struct Side {
    pub kind: Kind,
    /// Client endpoints, by member.
    pub endpoints: Vec<String>,
    /// Peer URLs' addresses, by member (raftkv: the same as the client's).
    pub peers: Vec<String>,
    /// Member ids, by member (filled by [`Side::learn_ids`]).
    pub ids: Vec<u64>,
    /// The cluster id.
    pub cluster: u64,
}

impl Side {
    /// raftkv's side of `c`.
    pub fn raftkv(c: &Cluster) -> Side {
        let endpoints = c.endpoints();
        Side {
            kind: Kind::Raftkv,
            peers: endpoints.clone(),
            ids: c.nodes.iter().map(|p| p.id).collect(),
            endpoints,
            cluster: 0,
        }
        .learn_ids()
    }

    /// etcd's side of `e`.
    pub fn etcd(e: &EtcdCluster) -> Side {
        Side {
            kind: Kind::Etcd,
            endpoints: e.client.clone(),
            peers: e.peer.clone(),
            ids: Vec::new(),
            cluster: 0,
        }
        .learn_ids()
    }

    /// Reads the member ids and the cluster id from `endpoint status -w
    /// json` of every started member.
    pub fn learn_ids(mut self) -> Side {
        let mut ids = vec![0; self.endpoints.len()];
        for (i, ep) in self.endpoints.iter().enumerate() {
            let o = ctl(
                std::slice::from_ref(ep),
                &["endpoint", "status", "-w", "json"],
            );
            if o.code != 0 {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
            let h = &v[0]["Status"]["header"];
            ids[i] = h["member_id"].as_u64().unwrap();
            self.cluster = h["cluster_id"].as_u64().unwrap();
        }
        self.ids = ids;
        self
    }

    /// etcdctl on every member.
    pub fn ctl(&self, args: &[&str]) -> Out {
        ctl(&self.endpoints, args)
    }

    /// etcdctl on member `i`.
    pub fn ctl_at(&self, i: usize, args: &[&str]) -> Out {
        ctl(std::slice::from_ref(&self.endpoints[i]), args)
    }

    /// `text` with this side's ids, addresses, names and versions
    /// replaced by neutral names, and `extra` regexes applied after.
    pub fn norm(&self, text: &str) -> String {
        let mut s = text.to_owned();
        for (i, ep) in self.endpoints.iter().enumerate() {
            s = s.replace(ep, &format!("<EP{}>", i + 1));
        }
        for (i, p) in self.peers.iter().enumerate() {
            s = s.replace(p, &format!("<EP{}>", i + 1));
        }
        for i in 0..self.endpoints.len() {
            let name = match self.kind {
                Kind::Raftkv => format!("raftkv-{}", i + 1),
                Kind::Etcd => format!("e{}", i + 1),
            };
            // Only where a name stands (a hex id may hold `e1`).
            let to = format!("<NAME{}>", i + 1);
            s = s.replace(&format!(", {name},"), &format!(", {to},"));
            s = s.replace(&format!("{name}="), &format!("{to}="));
            s = s.replace(&format!("\"{name}\""), &format!("\"{to}\""));
            s = s.replace(&format!("| {name} |"), &format!("| {to} |"));
        }
        s = s.replace(&format!("{:x}", self.cluster), "<CLUSTER>");
        s
    }

    /// The neutral name of a member id printed in hex.
    pub fn member(&self, hex: &str) -> String {
        let id = u64::from_str_radix(hex.trim(), 16).unwrap_or(u64::MAX);
        match self.ids.iter().position(|x| *x == id) {
            Some(i) => format!("<M{}>", i + 1),
            None => "<M?>".to_owned(),
        }
    }
}

/// `s` with every match of `re` replaced by `with`.
pub fn sub(s: &str, re: &str, with: &str) -> String {
    regex::Regex::new(re)
        .unwrap()
        .replace_all(s, with)
        .into_owned()
}

/// Replaces lease ids by `<LEASE>`: in hex after `lease ` (as etcdctl's
/// lease commands print them), in decimal as a JSON `lease` field.
pub fn leases(s: &str) -> String {
    let s = sub(s, r"lease [0-9a-f]{16}\b", "lease <LEASE>");
    // `lease list`'s lines.
    let s = sub(&s, r"(?m)^[0-9a-f]{16}$", "<LEASE>");
    let s = sub(&s, r#""lease":[1-9][0-9]*"#, r#""lease":<LEASE>"#);
    // `-w fields`.
    sub(&s, r#""Lease" : [1-9][0-9]*"#, r#""Lease" : <LEASE>"#)
}

/// Runs `args` until etcd stops answering "unhealthy cluster" (a
/// membership change right after a start: etcd waits until every member
/// has been connected a while), up to 30 s.
pub fn ctl_when_healthy(s: &Side, args: &[&str]) -> Out {
    let start = Instant::now();
    loop {
        let o = s.ctl(args);
        if !o.error.contains("unhealthy cluster") || start.elapsed() > Duration::from_secs(30) {
            return o;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A raftkv cluster and an etcd cluster side by side.
pub struct Pair {
    pub raftkv: Cluster,
    pub etcd: EtcdCluster,
    pub r: Side,
    pub e: Side,
}

impl Pair {
    /// Three raftkv nodes (with `extra` serve flags) and `etcd_members`
    /// etcd members, each ready (a leader elected, every member healthy).
    /// raftkv's election timeout is etcd's default (1 s, randomized up to
    /// twice it) unless `extra` sets one: a busy machine's slow heartbeats
    /// then bring no more elections to one side than to the other.
    pub fn start(etcd_members: usize, extra: &[&str]) -> Pair {
        let etcd = EtcdCluster::start(etcd_members);
        let mut args = extra.to_vec();
        if !args.contains(&"--election-timeout-ms") {
            args.extend(["--election-timeout-ms", "1000"]);
        }
        let raftkv = Cluster::start(3, &args);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(raftkv.leader(None));
        let r = Side::raftkv(&raftkv);
        let e = Side::etcd(&etcd);
        Pair { raftkv, etcd, r, e }
    }

    /// Runs `args` on both (every member), normalized by `f`, and returns
    /// both transcripts.
    pub fn both(&self, args: &[&str], f: impl Fn(&Side, String) -> String) -> (String, String) {
        let r = f(&self.r, self.r.norm(&self.r.ctl(args).text()));
        let e = f(&self.e, self.e.norm(&self.e.ctl(args).text()));
        (r, e)
    }
}

/// Asserts two transcripts are equal, printing both.
#[track_caller]
pub fn same(what: &str, raftkv: &str, etcd: &str) {
    assert_eq!(
        raftkv, etcd,
        "{what}: raftkv's output (left) differs from etcd 3.4's (right)\n--- raftkv\n{raftkv}--- etcd\n{etcd}"
    );
}

/// A transcript of commands run on one side.
pub struct T<'a> {
    /// The side it runs on.
    pub side: &'a Side,
    /// What was run and answered, normalized.
    pub text: String,
}

impl<'a> T<'a> {
    pub fn new(side: &'a Side) -> T<'a> {
        T {
            side,
            text: String::new(),
        }
    }

    /// Notes `o` (of `args`) normalized.
    pub fn note(&mut self, args: &[&str], o: &Out) {
        let lease = args.first() == Some(&"lease");
        let shown: Vec<String> = args
            .iter()
            .map(|a| {
                let a = self.side.norm(a);
                match a.strip_prefix("--lease=") {
                    Some(_) => "--lease=<LEASE>".to_owned(),
                    None if lease => sub(&a, r"^[0-9a-f]{16}$", "<LEASE>"),
                    None => a,
                }
            })
            .collect();
        self.text += &format!("$ etcdctl {}\n", shown.join(" "));
        self.text += &norm_common(self.side, &o.text());
    }

    /// Runs `args` on every member and notes it.
    pub fn run(&mut self, args: &[&str]) -> Out {
        let o = self.side.ctl(args);
        self.note(args, &o);
        o
    }

    /// Runs a `txn` with `input` and notes it.
    pub fn txn(&mut self, input: &str) -> Out {
        let o = ctl_input(&self.side.endpoints, &["txn"], input);
        self.note(&["txn", "<<", &input.replace('\n', "\\n")], &o);
        o
    }
}

/// What differs between any two clusters: ids and terms in headers,
/// lease ids, sizes and timings.
pub fn norm_common(side: &Side, s: &str) -> String {
    let s = side.norm(s);
    let s = leases(&s);
    let s = sub(&s, r#""(cluster_id|member_id|raft_term)":\d+"#, r#""$1":N"#);
    let s = sub(
        &s,
        r#""(ClusterID|MemberID|RaftTerm)" : \d+"#,
        r#""$1" : N"#,
    );
    sub(&s, r"took = [0-9.]+[µmn]?s", "took = T")
}

/// The id a `lease grant` printed.
pub fn lease_id(o: &Out) -> String {
    o.stdout.split_whitespace().nth(1).unwrap_or("").to_owned()
}

/// Runs `f` on raftkv and on etcd and compares the transcripts.
pub fn compare(what: &str, p: &Pair, f: impl Fn(&mut T)) {
    let mut e = T::new(&p.e);
    f(&mut e);
    let mut r = T::new(&p.r);
    f(&mut r);
    same(what, &r.text, &e.text);
}
