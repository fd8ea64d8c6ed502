//! `raftkv`: serve one node of a replicated key-value store (the local
//! cluster, the benchmarks and the fault matrix that start and drive
//! such nodes are `raftkv-tools`).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod serve_cmd;

use clap::{Parser, Subcommand};
use raftkv::NodeId;
use std::collections::BTreeMap;
use std::process::ExitCode;

/// mimalloc, not glibc's malloc: docs/PERFORMANCE.md ("mimalloc for the
/// raftkv binary") has the interleaved runs that decided it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    version,
    about = "A replicated key-value store on openraft and the journal"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs one node until SIGINT or SIGTERM.
    Serve(serve_cmd::ServeArgs),
}

fn parse_peers(s: &str) -> Result<BTreeMap<NodeId, String>, String> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("--peers: {part:?} is not ID=ADDR"))?;
        let id: NodeId = id
            .parse()
            .map_err(|_| format!("--peers: {id:?} is not a node id"))?;
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(format!("--peers: node {id} twice"));
        }
    }
    Ok(peers)
}

async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Cmd::Serve(args) = cli.command;
    let mut builder = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if args.threads > 1 {
        builder.worker_threads(args.threads);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("raftkv: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve_cmd::serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raftkv: {e}");
            ExitCode::FAILURE
        }
    }
}
