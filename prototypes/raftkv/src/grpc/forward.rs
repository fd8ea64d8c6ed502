//! Forwarding a request to the leader: one lazily connected gRPC channel
//! per member address (HTTP/2 to the same client port the member serves
//! etcdctl on), kept while the address is in use.

use super::FORWARDED;
use journal_core::sync::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

/// The channels to other members.
pub struct Forwarder {
    channels: Mutex<HashMap<String, Channel>>,
    timeout: Duration,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The most channels kept: past it, they are dropped and made again.
const MAX_CHANNELS: usize = 64;

impl Forwarder {
    /// A forwarder whose requests time out after `timeout` (the longest
    /// a forwarded call may take: a membership change's).
    pub fn new(timeout: Duration) -> Forwarder {
        Forwarder {
            channels: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// The channel to the member at `addr` (`host:port`).
    pub fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock();
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Status::unavailable(format!("the leader's address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(self.timeout)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        channels.insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }
}

/// `msg` as a request forwarded by this member (marked [`FORWARDED`]).
pub fn request<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    r
}
