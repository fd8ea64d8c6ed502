//! etcd's Lease service: `LeaseGrant`, `LeaseRevoke`, the `LeaseKeepAlive`
//! stream, `LeaseTimeToLive`, `LeaseLeases`.
//!
//! Every call is the leader's (its lessor keeps the deadlines); a
//! follower forwards the unary calls, and pipes a keep-alive stream to the
//! leader's: each request up, each answer down, until either side ends
//! (a leader change ends the stream with `Unavailable`; etcd's clients
//! open a new one).

use super::{forward, status, BackendError, Etcd, EtcdBackend};
use crate::kv::KvError;
use etcd_api::etcdserverpb as pb;
use etcd_api::etcdserverpb::lease_client::LeaseClient;
use futures_util::StreamExt;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// The Lease service on a backend.
pub struct LeaseService<B>(pub Arc<Etcd<B>>);

/// The answers of a keep-alive stream.
pub type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

/// Keep-alive answers a stream holds before its reader takes them.
const KEEPALIVE_QUEUE: usize = 16;

impl<B: EtcdBackend> LeaseService<B> {
    fn client(&self, addr: &str) -> Result<LeaseClient<tonic::transport::Channel>, Status> {
        Ok(LeaseClient::new(self.0.forward.channel(addr)?))
    }

    /// Grants a lease.
    pub async fn grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<pb::LeaseGrantResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .lease_grant(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let g = req.into_inner();
        let a = etcd.store.lease_grant(g.id, g.ttl).await.map_err(status)?;
        Ok(pb::LeaseGrantResponse {
            header: Some(etcd.header(a.revision)),
            id: a.value.id,
            ttl: a.value.ttl,
            error: String::new(),
        })
    }

    /// Revokes a lease.
    pub async fn revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<pb::LeaseRevokeResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .lease_revoke(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let a = etcd
            .store
            .lease_revoke(req.into_inner().id)
            .await
            .map_err(status)?;
        Ok(pb::LeaseRevokeResponse {
            header: Some(etcd.header(a.revision)),
        })
    }

    /// A lease's remaining time; `TTL` -1 if it is gone, as etcd answers.
    pub async fn time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<pb::LeaseTimeToLiveResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .lease_time_to_live(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let q = req.into_inner();
        let header = Some(etcd.header_now());
        match etcd.store.lease_time_to_live(q.id, q.keys).await {
            Ok(t) => Ok(pb::LeaseTimeToLiveResponse {
                header,
                id: t.id,
                ttl: t.ttl,
                granted_ttl: t.granted_ttl,
                keys: t.keys,
            }),
            Err(BackendError::Kv(KvError::LeaseNotFound)) => Ok(pb::LeaseTimeToLiveResponse {
                header,
                id: q.id,
                ttl: -1,
                granted_ttl: 0,
                keys: vec![],
            }),
            Err(e) => Err(status(e)),
        }
    }

    /// Every lease.
    pub async fn leases(
        &self,
        req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<pb::LeaseLeasesResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            let mut c = self.client(&addr)?;
            return Ok(c
                .lease_leases(forward::request(req.into_inner()))
                .await?
                .into_inner());
        }
        let ids = etcd.store.lease_leases().await.map_err(status)?;
        Ok(pb::LeaseLeasesResponse {
            header: Some(etcd.header_now()),
            leases: ids.into_iter().map(|id| pb::LeaseStatus { id }).collect(),
        })
    }

    /// One keep-alive: the new time-to-live, or 0 if the lease is gone
    /// (etcd answers a missing lease so, not with an error).
    pub async fn keep_alive_once(&self, id: i64) -> Result<pb::LeaseKeepAliveResponse, Status> {
        let etcd = &self.0;
        let ttl = match etcd.store.lease_keep_alive(id).await {
            Ok(ttl) => ttl,
            Err(BackendError::Kv(KvError::LeaseNotFound)) => 0,
            Err(e) => return Err(status(e)),
        };
        Ok(pb::LeaseKeepAliveResponse {
            header: Some(etcd.header_now()),
            id,
            ttl,
        })
    }

    /// Serves a keep-alive stream (the leader) or pipes it to the
    /// leader's (a follower; unless the stream was `forwarded` here).
    pub async fn keep_alive_on(
        &self,
        inbound: impl Stream<Item = Result<pb::LeaseKeepAliveRequest, Status>> + Send + Unpin + 'static,
        forwarded: bool,
    ) -> Result<KeepAliveStream, Status> {
        let etcd = self.0.clone();
        if let Some(addr) = etcd.route_marked(forwarded).await? {
            let mut c = self.client(&addr)?;
            // Up: the client's requests until it ends its side (or one
            // fails to decode).
            let up = inbound
                .take_while(|r| std::future::ready(r.is_ok()))
                .filter_map(|r| std::future::ready(r.ok()));
            let down = c.lease_keep_alive(forward::request(up)).await?.into_inner();
            // Ended when this node stops, so its shutdown does not wait
            // for the leader's stream.
            let mut stopping = etcd.node.stopping.subscribe();
            let stop = async move { super::watch::stopped(&mut stopping).await };
            return Ok(Box::pin(down.take_until(stop)));
        }
        let mut inbound = inbound;
        let (tx, rx) = tokio::sync::mpsc::channel(KEEPALIVE_QUEUE);
        let service = LeaseService(etcd.clone());
        let mut stopping = etcd.node.stopping.subscribe();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = inbound.next() => m,
                    _ = super::watch::stopped(&mut stopping) => return,
                };
                let answer = match next {
                    Some(Ok(r)) => service.keep_alive_once(r.id).await,
                    // The client closed its side, or the stream broke.
                    None | Some(Err(_)) => return,
                };
                let last = answer.is_err();
                if tx.send(answer).await.is_err() || last {
                    return;
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    /// A gateway's keep-alive stream (never marked forwarded).
    pub async fn keep_alive_local(
        &self,
        inbound: impl Stream<Item = Result<pb::LeaseKeepAliveRequest, Status>> + Send + Unpin + 'static,
    ) -> Result<KeepAliveStream, Status> {
        self.keep_alive_on(inbound, false).await
    }
}

#[tonic::async_trait]
impl<B: EtcdBackend> pb::lease_server::Lease for LeaseService<B> {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        self.grant(req).await.map(Response::new)
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        self.revoke(req).await.map(Response::new)
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let forwarded = req.metadata().contains_key(super::FORWARDED);
        self.keep_alive_on(req.into_inner(), forwarded)
            .await
            .map(Response::new)
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.time_to_live(req).await.map(Response::new)
    }

    async fn lease_leases(
        &self,
        req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        self.leases(req).await.map(Response::new)
    }
}
