//! openraft's network over HTTP: each Raft RPC is a `POST` of its request
//! in postcard to `/raft/{append,vote,snapshot}` on the target's address,
//! answered with the postcard of `Result<response, RaftError>`.
//!
//! Every RPC carries the cluster id (header [`CLUSTER_HEADER`]); a node of
//! another cluster refuses it (409), so a misconfigured address cannot mix
//! two clusters' logs. Each RPC is bounded by the timeout openraft gives
//! it (the heartbeat interval for appends and votes); a refused connection
//! is `Unreachable`, on which openraft backs off, so a node that is down
//! costs the others one timeout, not a stall.

use crate::types::{NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The header carrying the cluster id (16 hex digits) on every Raft RPC.
pub const CLUSTER_HEADER: &str = "x-raftkv-cluster";

/// The largest body a Raft RPC may have (an append of many large entries,
/// a snapshot chunk): 64 MiB.
pub const MAX_RPC_BODY: usize = 64 << 20;

/// Makes a [`Peer`] per target node; they share one connection pool.
#[derive(Debug, Clone)]
pub struct Network {
    client: reqwest::Client,
    cluster: u64,
    /// Where this node dials a peer instead of the address in the
    /// membership (`raftkv serve --peer-addr`): a proxy in front of it, so
    /// a fault test can cut or slow one direction of one link.
    dial: Arc<BTreeMap<NodeId, String>>,
}

impl Network {
    /// A network for the cluster `cluster`, dialing the peers in `dial` at
    /// the addresses given there instead of their membership addresses.
    pub fn new(cluster: u64, dial: BTreeMap<NodeId, String>) -> Result<Network, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .pool_max_idle_per_host(4)
            .build()?;
        Ok(Network {
            client,
            cluster,
            dial: Arc::new(dial),
        })
    }
}

/// The connection to one target node.
#[derive(Debug)]
pub struct Peer {
    client: reqwest::Client,
    cluster: u64,
    target: NodeId,
    base: String,
}

#[derive(Debug)]
struct BadStatus(String);

impl std::fmt::Display for BadStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadStatus {}

impl Peer {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = postcard::to_stdvec(req).map_err(|e| net(&e))?;
        self.send(path, body, option, None).await
    }

    /// Posts `body` to `path`. `entries` is the number of entries of an
    /// append: a body over [`MAX_RPC_BODY`], or a `413` from the target, is
    /// then openraft's `PayloadTooLarge` with half as many entries as a
    /// hint, so replication splits the batch instead of resending it
    /// forever.
    async fn send<Resp, E>(
        &self,
        path: &str,
        body: Vec<u8>,
        option: &RPCOption,
        entries: Option<u64>,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let too_large =
            |n: u64| RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint((n / 2).max(1)));
        if let Some(n) = entries.filter(|_| body.len() > MAX_RPC_BODY) {
            return Err(too_large(n));
        }
        let sent = self
            .client
            .post(format!("{}{path}", self.base))
            .header(CLUSTER_HEADER, format!("{:016x}", self.cluster))
            .timeout(option.hard_ttl())
            .body(body)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => return Err(net(&e)),
        };
        let status = resp.status();
        if let Some(n) = entries.filter(|_| status == reqwest::StatusCode::PAYLOAD_TOO_LARGE) {
            return Err(too_large(n));
        }
        let bytes = resp.bytes().await.map_err(|e| net(&e))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
            return Err(net(&BadStatus(format!(
                "node {} answered {status}: {text}",
                self.target
            ))));
        }
        let r: Result<Resp, RaftError<NodeId, E>> =
            postcard::from_bytes(&bytes).map_err(|e| net(&e))?;
        r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// A network error carrying `e`'s message.
fn net<E: std::error::Error>(
    e: &dyn std::error::Error,
) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
    RPCError::Network(NetworkError::new(&BadStatus(e.to_string())))
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            client: self.client.clone(),
            cluster: self.cluster,
            target,
            base: format!("http://{}", self.dial.get(&target).unwrap_or(&node.addr)),
        }
    }
}

type Rpc<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpc<AppendEntriesResponse<NodeId>> {
        let entries = rpc.entries.len() as u64;
        let body = postcard::to_stdvec(&rpc).map_err(|e| net(&e))?;
        self.send("/raft/append", body, &option, Some(entries))
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call("/raft/snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Rpc<VoteResponse<NodeId>> {
        self.call("/raft/vote", &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Batch, Command};
    use openraft::{Entry, EntryPayload, LogId, Vote};

    #[tokio::test]
    async fn an_append_over_the_body_limit_asks_openraft_to_split_it() {
        // Nothing listens there: the append must be refused before it is
        // sent, not fail on the network.
        let mut net = Network::new(1, BTreeMap::new()).unwrap();
        let mut peer = net
            .new_client(
                2,
                &BasicNode {
                    addr: "127.0.0.1:9".into(),
                },
            )
            .await;
        let big = |index| Entry::<TypeConfig> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Batch(vec![Command::Put {
                key: b"k".to_vec(),
                value: vec![7; MAX_RPC_BODY / 3],
                id: None,
            }])),
        };
        let rpc = AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: (1..=4).map(big).collect(),
        };
        let option = RPCOption::new(Duration::from_secs(1));
        match peer.append_entries(rpc, option).await {
            Err(RPCError::PayloadTooLarge(p)) => assert_eq!(p.entries_hint(), 2),
            other => panic!("not PayloadTooLarge: {other:?}"),
        }
    }
}
