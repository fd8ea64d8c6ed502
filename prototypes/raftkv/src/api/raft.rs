//! The Raft RPCs' endpoints (`/raft/{append,vote,snapshot}`): each is
//! authenticated ([`authenticated`], before its body is read), checks
//! that it is addressed to this node of this cluster, decodes its
//! postcard body and hands it to openraft; a snapshot is written to a
//! file as it arrives (removed if the transfer fails or is abandoned).

use super::text;
use crate::network::{CLUSTER_HEADER, MAX_RPC_BODY, TARGET_HEADER};
use crate::node::Node;
use crate::types::TypeConfig;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use serde::Serialize;
use std::sync::Arc;

/// Lets a Raft RPC through only with the cluster's peer secret (if the
/// node has one): `401` without an `Authorization` header, `403` with
/// another secret — before its body is read or decoded. A node whose disk
/// is nearly full ([`crate::space::Space::exhausted`]) answers an append
/// carrying data, or a snapshot, `507` (the leader retries it later).
pub(super) async fn authenticated(
    State(node): State<Arc<Node>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(secret) = &node.peer_secret {
        match req.headers().get(crate::auth::AUTH_HEADER) {
            None => {
                return text(
                    StatusCode::UNAUTHORIZED,
                    "a Raft RPC needs the cluster's peer secret",
                )
            }
            Some(v) if secret.admits(v.as_bytes()) => {}
            Some(_) => return text(StatusCode::FORBIDDEN, "not this cluster's peer secret"),
        }
    }
    if carries_data(&req) && node.space.exhausted() {
        return super::write::no_space();
    }
    next.run(req).await
}

/// Whether a Raft RPC carries data a follower must store: a snapshot, or
/// an append over [`crate::space::APPEND_FLOOR`] bytes (a heartbeat does
/// not), by its declared length (a streamed body counts as large).
fn carries_data(req: &axum::extract::Request) -> bool {
    let len = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    match req.uri().path() {
        "/raft/snapshot" => true,
        "/raft/append" => len.is_none_or(|l| l > crate::space::APPEND_FLOOR),
        _ => false,
    }
}

/// A Raft RPC's headers name this node's cluster and this node: a message
/// for another cluster, or for another node whose address this one now
/// has (a reused port, a stale address book), is refused with `409`
/// before openraft sees it.
fn addressed_here(node: &Node, headers: &HeaderMap) -> Result<(), Response> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let cluster = header(CLUSTER_HEADER).and_then(|v| u64::from_str_radix(v, 16).ok());
    if cluster != Some(node.cluster) {
        return Err(text(
            StatusCode::CONFLICT,
            format!("node {} belongs to cluster {:016x}", node.id, node.cluster),
        ));
    }
    let target = header(TARGET_HEADER).and_then(|v| v.parse::<u64>().ok());
    if target != Some(node.id) {
        return Err(text(
            StatusCode::CONFLICT,
            format!(
                "this is node {}; the RPC is for node {}",
                node.id,
                header(TARGET_HEADER).unwrap_or("(none)")
            ),
        ));
    }
    Ok(())
}

/// An RPC's request: for this node of this cluster, and well formed.
fn request<T: serde::de::DeserializeOwned>(
    node: &Node,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, Response> {
    addressed_here(node, headers)?;
    postcard::from_bytes(body)
        .map_err(|e| text(StatusCode::BAD_REQUEST, format!("bad RPC body: {e}")))
}

fn encode<T: Serialize>(r: &T) -> Response {
    match postcard::to_stdvec(r) {
        Ok(b) => (StatusCode::OK, b).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

pub(super) async fn append(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match request::<AppendEntriesRequest<TypeConfig>>(&node, &headers, &body) {
        Ok(req) => encode(&node.raft.append_entries(req).await),
        Err(r) => r,
    }
}

pub(super) async fn vote(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match request::<VoteRequest<TypeConfig>>(&node, &headers, &body) {
        Ok(req) => encode(&node.raft.vote(req).await),
        Err(r) => r,
    }
}

/// The leader hands its leadership to this node: it campaigns now
/// (openraft's transfer-leader; etcd's `MoveLeader`).
pub(super) async fn transfer_leader(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match request::<TransferLeaderRequest<TypeConfig>>(&node, &headers, &body) {
        Ok(req) => encode(
            &node
                .raft
                .handle_transfer_leader(req)
                .await
                .map_err(RaftError::<TypeConfig>::Fatal),
        ),
        Err(r) => r,
    }
}

/// A snapshot streamed by the leader (see `network.rs`): its head (the
/// vote and the meta), then the file's bytes, written into a new file as
/// they arrive, which openraft then installs. Memory holds a piece of the
/// body at a time, at any snapshot size.
pub(super) async fn snapshot(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    if let Err(r) = addressed_here(&node, &headers) {
        return r;
    }
    match receive_snapshot(&node, body).await {
        Ok((head, file)) => {
            let snapshot = crate::machine::Snapshot {
                meta: head.meta,
                snapshot: file,
            };
            match node.raft.install_full_snapshot(head.vote, snapshot).await {
                Ok(resp) => encode(&Ok::<_, RaftError<TypeConfig>>(resp)),
                Err(fatal) => encode(&Err::<openraft::raft::SnapshotResponse<TypeConfig>, _>(
                    RaftError::<TypeConfig>::Fatal(fatal),
                )),
            }
        }
        Err(e) => text(StatusCode::BAD_REQUEST, format!("bad snapshot body: {e}")),
    }
}

/// Reads a streamed snapshot's head and writes the rest into a new file.
async fn receive_snapshot(
    node: &Node,
    body: axum::body::Body,
) -> Result<(crate::network::SnapshotHead, crate::machine::SnapshotFile), String> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut head_buf: Vec<u8> = Vec::new();
    let mut head: Option<crate::network::SnapshotHead> = None;
    let mut file = node.machine.receive().map_err(|e| e.to_string())?;
    while let Some(piece) = stream.next().await {
        let mut piece: &[u8] = &piece.map_err(|e| e.to_string())?;
        // The head: a 4-byte length, then that many bytes (bounded); a
        // piece may hold part of it, or all of it and file bytes after.
        while head.is_none() && !piece.is_empty() {
            let total = match head_buf.get(..4) {
                Some(l) => match u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize {
                    // Nothing to read would be taken forever.
                    0 => return Err("an empty snapshot head".into()),
                    n => 4 + n,
                },
                None => 4,
            };
            if total > MAX_RPC_BODY {
                return Err(format!("a snapshot head of {total} bytes"));
            }
            let take = (total - head_buf.len()).min(piece.len());
            head_buf.extend_from_slice(&piece[..take]);
            piece = &piece[take..];
            if head_buf.len() == total && total > 4 {
                head = Some(postcard::from_bytes(&head_buf[4..]).map_err(|e| e.to_string())?);
            }
        }
        if head.is_none() {
            continue;
        }
        file.write_piece(piece).map_err(|e| e.to_string())?;
    }
    let head = head.ok_or("a snapshot body without its head")?;
    Ok((head, file))
}
