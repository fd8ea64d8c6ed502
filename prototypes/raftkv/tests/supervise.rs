//! `raftkv-tools cluster`'s supervisor (`raftkv_tools::local::supervise`,
//! driven here in-process on `raftkv serve` processes): a node that is
//! killed (`kill -9`) is restarted from its directory while the others go
//! on serving, and stopping the supervisor (what SIGTERM does to
//! `raftkv-tools cluster`) stops every node. With restarts off
//! (`--no-restart`) a killed node stays down and the others still serve.

mod common;

use common::kill;
use raftkv_tools::client::Client;
use raftkv_tools::local::{supervise, NodeCommand, Restart};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A base port with the `n - 1` after it free too (bound, released), below
/// Linux's ephemeral range (32768 and up), so that no outgoing connection
/// takes a node's port while the supervisor restarts it. Bases go out in
/// turn, so two tests of one process never share one.
fn free_ports(n: u16) -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % 12_000;
    for _ in 0..100u32 {
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = (20_000 + (start + k * 97) % 12_000) as u16;
        let all: Vec<_> = (0..n)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if all.iter().all(Result::is_ok) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports in 20000..32000");
}

struct Supervisor {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), String>>>,
    endpoints: Vec<String>,
    _tmp: tempfile::TempDir,
}

impl Supervisor {
    fn start(restart: bool) -> Supervisor {
        let tmp = tempfile::tempdir().unwrap();
        let base = free_ports(3);
        let exe = Path::new(env!("CARGO_BIN_EXE_raftkv"));
        let nodes = NodeCommand::local_of(exe, 3, tmp.path(), base).unwrap();
        let restart = Restart {
            enabled: restart,
            ..Restart::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(supervise(nodes, restart, |_| {}, async move {
            let _ = stopped.await;
        }));
        Supervisor {
            stop: Some(stop),
            task: Some(task),
            endpoints: (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect(),
            _tmp: tmp,
        }
    }

    /// Stops the supervisor, and with it every node; its result.
    async fn stop(&mut self) -> Result<(), String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.task.take() {
            Some(t) => t.await.unwrap(),
            None => Ok(()),
        }
    }

    /// Node `i`'s process id, once it answers (up to 30 s).
    async fn pid(&self, i: usize) -> u32 {
        let probe = Client::new(&self.endpoints, 0).unwrap();
        let start = Instant::now();
        loop {
            if let Ok(s) = probe.status(&self.endpoints[i]).await {
                return s.pid;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "node {i} down");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // The supervisor stops its nodes when told to; a failed test's
        // nodes are killed with the runtime (kill on drop).
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Whether a process `pid` exists.
fn alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_restarted_and_the_cluster_keeps_serving() {
    let mut sup = Supervisor::start(true);
    let mut client = Client::new(&sup.endpoints, 9).unwrap();
    client.deadline = Duration::from_secs(30);
    client.put("k", b"1").await.unwrap();
    let mut pids = Vec::new();
    for i in 0..3 {
        pids.push(sup.pid(i).await);
    }
    // Node 1 (the first leader, most likely) dies; the others serve.
    kill("KILL", pids[0]);
    client.put("k", b"2").await.unwrap();
    // The supervisor brought node 1 back: a new process, caught up.
    let start = Instant::now();
    let restarted = loop {
        let p = sup.pid(0).await;
        if p != pids[0] {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "not restarted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut at_1 = Client::new(&sup.endpoints[..1], 10).unwrap();
    at_1.deadline = Duration::from_secs(30);
    at_1.put("k", b"3").await.unwrap();
    assert_eq!(
        client.get("k", false).await.unwrap().as_deref(),
        Some(&b"3"[..])
    );
    // Stopping the supervisor stops every node.
    sup.stop().await.unwrap();
    for p in [restarted, pids[1], pids[2]] {
        assert!(!alive(p), "node process {p} outlived the cluster");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_restart_a_killed_node_stays_down_and_the_others_serve() {
    let sup = Supervisor::start(false);
    let mut client = Client::new(&sup.endpoints, 11).unwrap();
    client.deadline = Duration::from_secs(30);
    client.put("k", b"1").await.unwrap();
    let pid = sup.pid(2).await;
    kill("KILL", pid);
    client.put("k", b"2").await.unwrap();
    let probe = Client::new(&sup.endpoints, 0).unwrap();
    assert!(probe.status(&sup.endpoints[2]).await.is_err(), "node 3 up");
    assert_eq!(
        client.get("k", false).await.unwrap().as_deref(),
        Some(&b"2"[..])
    );
}
