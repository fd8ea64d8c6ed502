//! etcd's KV service: `Range`, `Put`, `DeleteRange`, `Txn`, `Compact`.
//!
//! A serializable range is this member's; every other call needs the
//! leader, and a follower forwards it ([`super::Etcd::route`]).

use super::{convert, forward, status, Etcd, EtcdBackend};
use etcd_api::etcdserverpb as pb;
use etcd_api::etcdserverpb::kv_client::KvClient;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The KV service on a backend.
pub struct KvService<B>(pub Arc<Etcd<B>>);

/// Forwards `$req` (consumed) with `$method` to the leader at `$addr`.
macro_rules! forwarded {
    ($etcd:expr, $addr:expr, $method:ident, $req:expr) => {{
        let channel = $etcd.forward.channel(&$addr)?;
        KvClient::new(channel)
            .$method(forward::request($req.into_inner()))
            .await
    }};
}

impl<B: EtcdBackend> KvService<B> {
    /// Serves a range: the answer and the revision read.
    pub async fn range(&self, req: Request<pb::RangeRequest>) -> Result<pb::RangeResponse, Status> {
        let etcd = &self.0;
        if !req.get_ref().serializable {
            if let Some(addr) = etcd.route(&req).await? {
                return Ok(forwarded!(etcd, addr, range, req)?.into_inner());
            }
        }
        let r = convert::range_in(req.into_inner())?;
        let a = etcd.store.range(r).await.map_err(status)?;
        Ok(convert::range_out(a.value, Some(etcd.header(a.revision))))
    }

    /// Serves a put.
    pub async fn put(&self, req: Request<pb::PutRequest>) -> Result<pb::PutResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            return Ok(forwarded!(etcd, addr, put, req)?.into_inner());
        }
        let a = etcd
            .store
            .put(convert::put_in(req.into_inner()))
            .await
            .map_err(status)?;
        Ok(convert::put_out(a.value, Some(etcd.header(a.revision))))
    }

    /// Serves a delete.
    pub async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<pb::DeleteRangeResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            return Ok(forwarded!(etcd, addr, delete_range, req)?.into_inner());
        }
        let a = etcd
            .store
            .delete_range(convert::delete_in(req.into_inner()))
            .await
            .map_err(status)?;
        Ok(convert::delete_out(a.value, Some(etcd.header(a.revision))))
    }

    /// Serves a transaction.
    pub async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<pb::TxnResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            return Ok(forwarded!(etcd, addr, txn, req)?.into_inner());
        }
        let t = convert::txn_in(req.into_inner())?;
        let a = etcd.store.txn(t).await.map_err(status)?;
        Ok(convert::txn_out(a.value, Some(etcd.header(a.revision))))
    }

    /// Serves a compaction.
    pub async fn compact(
        &self,
        req: Request<pb::CompactionRequest>,
    ) -> Result<pb::CompactionResponse, Status> {
        let etcd = &self.0;
        if let Some(addr) = etcd.route(&req).await? {
            return Ok(forwarded!(etcd, addr, compact, req)?.into_inner());
        }
        let c = req.into_inner();
        let revision = etcd
            .store
            .compact(c.revision, c.physical)
            .await
            .map_err(status)?;
        Ok(pb::CompactionResponse {
            header: Some(etcd.header(revision)),
        })
    }
}

#[tonic::async_trait]
impl<B: EtcdBackend> pb::kv_server::Kv for KvService<B> {
    async fn range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        KvService::range(self, req).await.map(Response::new)
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        KvService::put(self, req).await.map(Response::new)
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        KvService::delete_range(self, req).await.map(Response::new)
    }

    async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        KvService::txn(self, req).await.map(Response::new)
    }

    async fn compact(
        &self,
        req: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        KvService::compact(self, req).await.map(Response::new)
    }
}
