//! etcd's Cluster service on openraft's membership: `MemberList`,
//! `MemberAdd` (voter or learner), `MemberRemove`, `MemberPromote`,
//! `MemberUpdate`.
//!
//! A member is a Raft node: its etcd member id is its node id, its peer
//! and client URL are both `http://<its address>` (one port serves the
//! Raft RPCs and the clients), and its name is `raftkv-<id>` once it has
//! started — known to the leader as a member whose log it has matched —
//! and empty before, with no client URL, as etcd lists a member added but
//! not yet started.
//! `MemberAdd` picks the new member's id (one above the highest): start
//! the node with `raftkv serve --id <that id>` (etcdctl prints it in
//! hex). A voter is added at once (openraft's joint change), as etcd adds
//! one; a learner likewise, caught up once it starts; `MemberPromote`
//! refuses a learner more than openraft's replication lag threshold
//! (1,000 entries) behind the leader, with etcd's message. Every change
//! is the leader's (a follower forwards it) and is answered once
//! committed, within the node's admin deadline.

use super::{forward, Etcd, EtcdBackend, Leader};
use crate::types::NodeId;
use etcd_api::etcdserverpb as pb;
use etcd_api::etcdserverpb::cluster_client::ClusterClient;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, RaftMetrics};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The Cluster service on a backend.
pub struct ClusterService<B>(pub Arc<Etcd<B>>);

/// How far (entries) a learner may be behind the leader to be promoted.
const PROMOTE_LAG: u64 = 1_000;

/// `host:port` of an etcd peer URL (`http://host:port`, maybe with a
/// trailing `/`); raftkv has no TLS, so `https` is refused.
pub fn peer_addr(url: &str) -> Result<String, Status> {
    let bad = || {
        Status::invalid_argument(format!(
            "etcdserver: bad peer URL {url:?}: want http://host:port"
        ))
    };
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let addr = rest.trim_end_matches('/');
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || addr.contains('/') || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(addr.to_owned())
}

/// The members as etcd lists them, from this node's metrics.
pub fn members(me: NodeId, m: &RaftMetrics<crate::TypeConfig>) -> Vec<pb::Member> {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let matched: BTreeMap<NodeId, bool> = m
        .replication
        .iter()
        .flatten()
        .map(|(id, l)| (*id, l.is_some()))
        .collect();
    membership
        .nodes()
        .map(|(id, n)| {
            // Started: this node, or one the leader's log reached. A
            // follower (with no replication view) calls every member
            // started.
            let started = *id == me || matched.get(id).copied().unwrap_or(m.replication.is_none());
            let url = format!("http://{}", n.addr);
            pb::Member {
                id: *id,
                name: if started {
                    format!("raftkv-{id}")
                } else {
                    String::new()
                },
                peer_ur_ls: vec![url.clone()],
                // A member publishes its client URLs when it starts.
                client_ur_ls: if started { vec![url] } else { Vec::new() },
                is_learner: !voters.contains(id),
            }
        })
        .collect()
}

/// A membership change's error as etcd answers it.
fn change_error(e: RaftError<crate::TypeConfig, ClientWriteError<crate::TypeConfig>>) -> Status {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
            super::kv_status(&crate::kv::KvError::NotLeader)
        }
        RaftError::APIError(e) => Status::failed_precondition(format!("etcdserver: {e}")),
        e => Status::unavailable(e.to_string()),
    }
}

impl<B: EtcdBackend> ClusterService<B> {
    fn metrics(&self) -> RaftMetrics<crate::TypeConfig> {
        self.0.node.raft.metrics().borrow_watched().clone()
    }

    fn client(&self, addr: &str) -> Result<ClusterClient<tonic::transport::Channel>, Status> {
        Ok(ClusterClient::new(self.0.forward.channel(addr)?))
    }

    /// Runs a membership change within the admin deadline; answers the
    /// members after it.
    async fn change(
        &self,
        change: ChangeMembers<NodeId, BasicNode>,
    ) -> Result<Vec<pb::Member>, Status> {
        let node = &self.0.node;
        let run = node.raft.change_membership(change, false);
        match tokio::time::timeout(node.admin_timeout, run).await {
            Err(_) => Err(Status::deadline_exceeded(format!(
                "etcdserver: request timed out: the membership change was not done within {} s; \
                 it may still take effect",
                node.admin_timeout.as_secs()
            ))),
            Ok(Err(e)) => Err(change_error(e)),
            Ok(Ok(_)) => Ok(members(node.id, &self.metrics())),
        }
    }

    /// Lists the members: the leader's view (a follower forwards, or
    /// answers its own view while there is no leader).
    pub async fn list(
        &self,
        req: Request<pb::MemberListRequest>,
    ) -> Result<pb::MemberListResponse, Status> {
        let etcd = &self.0;
        match etcd.leader() {
            Ok(Leader::Other(_, addr)) if !req.metadata().contains_key(super::FORWARDED) => {
                let mut c = self.client(&addr)?;
                return Ok(c
                    .member_list(forward::request(req.into_inner()))
                    .await?
                    .into_inner());
            }
            _ => {}
        }
        Ok(pb::MemberListResponse {
            header: Some(etcd.header_now()),
            members: members(etcd.node.id, &self.metrics()),
        })
    }

    /// Adds a member (voter or learner) at the peer URL given.
    pub async fn add(
        &self,
        req: Request<pb::MemberAddRequest>,
    ) -> Result<pb::MemberAddResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .member_add(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let r = req.into_inner();
        let [url] = r.peer_ur_ls.as_slice() else {
            return Err(Status::invalid_argument(
                "etcdserver: a raftkv member has one peer URL (its one address)",
            ));
        };
        let addr = peer_addr(url)?;
        let m = self.metrics();
        let membership = m.membership_config.membership();
        if membership.nodes().any(|(_, n)| n.addr == addr) {
            return Err(Status::failed_precondition(
                "etcdserver: Peer URLs already exists",
            ));
        }
        let id = membership.nodes().map(|(id, _)| *id).max().unwrap_or(0) + 1;
        let node = BasicNode { addr };
        let members = if r.is_learner {
            let add = etcd.node.raft.add_learner(id, node, false);
            match tokio::time::timeout(etcd.node.admin_timeout, add).await {
                Err(_) => return Err(Status::deadline_exceeded("etcdserver: request timed out")),
                Ok(Err(e)) => return Err(change_error(e)),
                Ok(Ok(_)) => members(etcd.node.id, &self.metrics()),
            }
        } else {
            self.change(ChangeMembers::AddVoters([(id, node)].into()))
                .await?
        };
        let member = members.iter().find(|m| m.id == id).cloned();
        Ok(pb::MemberAddResponse {
            header: Some(etcd.header_now()),
            member,
            members,
        })
    }

    /// Removes a member (voter or learner).
    pub async fn remove(
        &self,
        req: Request<pb::MemberRemoveRequest>,
    ) -> Result<pb::MemberRemoveResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .member_remove(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let id = req.into_inner().id;
        let m = self.metrics();
        let membership = m.membership_config.membership();
        if membership.get_node(&id).is_none() {
            return Err(Status::not_found("etcdserver: member not found"));
        }
        let ids: BTreeSet<NodeId> = [id].into();
        let change = if membership.voter_ids().any(|v| v == id) {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        let members = self.change(change).await?;
        Ok(pb::MemberRemoveResponse {
            header: Some(etcd.header_now()),
            members,
        })
    }

    /// Promotes a learner that has caught up.
    pub async fn promote(
        &self,
        req: Request<pb::MemberPromoteRequest>,
    ) -> Result<pb::MemberPromoteResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .member_promote(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let id = req.into_inner().id;
        let m = self.metrics();
        let membership = m.membership_config.membership();
        if membership.get_node(&id).is_none() {
            return Err(Status::not_found("etcdserver: member not found"));
        }
        if membership.voter_ids().any(|v| v == id) {
            return Err(Status::failed_precondition(
                "etcdserver: can only promote a learner member",
            ));
        }
        let last = m.last_log_index.unwrap_or(0);
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned().flatten())
            .map(|l| l.index);
        if matched.is_none_or(|i| i + PROMOTE_LAG < last) {
            return Err(Status::failed_precondition(
                "etcdserver: can only promote a learner member which is in sync with leader",
            ));
        }
        let members = self.change(ChangeMembers::AddVoterIds([id].into())).await?;
        Ok(pb::MemberPromoteResponse {
            header: Some(etcd.header_now()),
            members,
        })
    }

    /// Changes a member's address.
    pub async fn update(
        &self,
        req: Request<pb::MemberUpdateRequest>,
    ) -> Result<pb::MemberUpdateResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .member_update(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let r = req.into_inner();
        let [url] = r.peer_ur_ls.as_slice() else {
            return Err(Status::invalid_argument(
                "etcdserver: a raftkv member has one peer URL (its one address)",
            ));
        };
        let addr = peer_addr(url)?;
        let m = self.metrics();
        let membership = m.membership_config.membership();
        if membership.get_node(&r.id).is_none() {
            return Err(Status::not_found("etcdserver: member not found"));
        }
        if membership
            .nodes()
            .any(|(id, n)| n.addr == addr && *id != r.id)
        {
            return Err(Status::failed_precondition(
                "etcdserver: Peer URLs already exists",
            ));
        }
        let change = ChangeMembers::SetNodes([(r.id, BasicNode { addr })].into());
        let members = self.change(change).await?;
        Ok(pb::MemberUpdateResponse {
            header: Some(etcd.header_now()),
            members,
        })
    }
}

#[tonic::async_trait]
impl<B: EtcdBackend> pb::cluster_server::Cluster for ClusterService<B> {
    async fn member_add(
        &self,
        req: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        self.add(req).await.map(Response::new)
    }

    async fn member_remove(
        &self,
        req: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        self.remove(req).await.map(Response::new)
    }

    async fn member_update(
        &self,
        req: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        self.update(req).await.map(Response::new)
    }

    async fn member_list(
        &self,
        req: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        self.list(req).await.map(Response::new)
    }

    async fn member_promote(
        &self,
        req: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        self.promote(req).await.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn a_peer_url_is_http_host_and_port() {
        assert_eq!(
            peer_addr("http://127.0.0.1:7004").unwrap(),
            "127.0.0.1:7004"
        );
        assert_eq!(
            peer_addr("http://localhost:2380/").unwrap(),
            "localhost:2380"
        );
        for bad in [
            "https://a:1",
            "127.0.0.1:7004",
            "http://a",
            "http://:1",
            "http://a:x",
            "http://a:1/p",
        ] {
            assert_eq!(
                peer_addr(bad).unwrap_err().code(),
                Code::InvalidArgument,
                "{bad}"
            );
        }
    }
}
