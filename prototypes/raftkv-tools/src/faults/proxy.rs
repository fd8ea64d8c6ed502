//! A TCP proxy for one direction of one link between two nodes: node A
//! dials node B through it (`raftkv serve --peer-addr B=PROXY`), so the
//! requests A sends B and B's answers to them pass here, and B's own
//! requests to A do not (they take the proxy of the link B→A).
//!
//! [`Mode::Blackhole`] drops every byte both ways, on connections open at
//! the time too (an HTTP client pools its connections: refusing only new
//! ones would partition nothing); a connection that lost bytes is closed
//! when the link heals, since its stream is no longer whole, and the
//! client reconnects. [`Mode::Delay`] holds each chunk for a time before
//! passing it on, in order. Nothing here needs root: the proxy is an
//! ordinary listener on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What a link does to the bytes that cross it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Passes them on.
    Pass,
    /// Passes each chunk on after this long.
    Delay(Duration),
    /// Drops them.
    Blackhole,
}

/// One direction of one link (cheap to clone; the listener stops when the
/// last clone drops).
#[derive(Debug, Clone)]
pub struct Link {
    addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    _task: Arc<AbortOnDrop>,
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Link {
    /// A proxy on a new loopback port in front of `target`, passing bytes.
    pub async fn start(target: String) -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = watch::channel(Mode::Pass);
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                let _ = inbound.set_nodelay(true);
                conns.spawn(connection(inbound, target.clone(), rx.clone()));
                // Reap the finished ones so the set stays small.
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Link {
            addr,
            mode: Arc::new(tx),
            _task: Arc::new(AbortOnDrop(task)),
        })
    }

    /// The address to dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets what the link does from now on, to open connections too.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

/// Serves one proxied connection: dials the target once the link lets
/// bytes through, then pumps both ways until either side closes, or the
/// link heals after it dropped bytes of this connection.
async fn connection(mut inbound: TcpStream, target: String, mut mode: watch::Receiver<Mode>) {
    // While blackholed, a new connection is accepted and hears nothing.
    let lost = loop {
        if *mode.borrow_and_update() != Mode::Blackhole {
            break false;
        }
        let mut sink = [0u8; 4096];
        tokio::select! {
            r = inbound.read(&mut sink) => match r {
                Ok(0) | Err(_) => return,
                // Bytes sent into a blackhole: this stream is broken.
                Ok(_) => break true,
            },
            changed = mode.changed() => if changed.is_err() { return },
        }
    };
    if lost {
        // Wait for the heal, dropping what arrives, then close.
        let mut sink = [0u8; 4096];
        loop {
            tokio::select! {
                r = inbound.read(&mut sink) => if matches!(r, Ok(0) | Err(_)) { return },
                changed = mode.changed() => {
                    if changed.is_err() || *mode.borrow_and_update() != Mode::Blackhole {
                        return;
                    }
                }
            }
        }
    }
    let Ok(outbound) = TcpStream::connect(&target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let (ri, wi) = inbound.into_split();
    let (ro, wo) = outbound.into_split();
    // Either pump ending (a close, an error, a heal after a loss) ends the
    // connection: dropping the halves closes both sockets.
    tokio::select! {
        _ = pump(ri, wo, mode.clone()) => {}
        _ = pump(ro, wi, mode) => {}
    }
}

/// Copies `from` to `to` as the link's mode says. Returns when `from`
/// closes, a write fails, or the link heals after dropping bytes.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut lost = false;
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                if lost && *mode.borrow_and_update() != Mode::Blackhole {
                    return;
                }
                continue;
            }
        };
        let now = *mode.borrow_and_update();
        match now {
            Mode::Pass => {}
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Blackhole => {
                lost = true;
                continue;
            }
        }
        if lost {
            // Bytes were dropped before these: the stream is broken.
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    loop {
                        match s.read(&mut b).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&b[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut b = vec![0u8; msg.len()];
        match tokio::time::timeout(within, s.read_exact(&mut b)).await {
            Ok(Ok(_)) => Some(b),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_blackhole_stalls_an_open_connection_and_the_heal_closes_it() {
        let link = Link::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(link.addr()).await.unwrap();
        let short = Duration::from_millis(300);
        assert_eq!(
            roundtrip(&mut s, b"one", short).await.as_deref(),
            Some(&b"one"[..])
        );
        link.set(Mode::Blackhole);
        assert_eq!(roundtrip(&mut s, b"two", short).await, None);
        // A new connection hears nothing either.
        let mut t = TcpStream::connect(link.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut t, b"three", short).await, None);
        link.set(Mode::Pass);
        // The broken connections are closed; a new one passes.
        let mut b = [0u8; 8];
        let r = tokio::time::timeout(short, s.read(&mut b)).await.unwrap();
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
        let mut u = TcpStream::connect(link.addr()).await.unwrap();
        assert_eq!(
            roundtrip(&mut u, b"four", short).await.as_deref(),
            Some(&b"four"[..])
        );
    }

    #[tokio::test]
    async fn a_delay_holds_bytes_and_keeps_their_order() {
        let link = Link::start(echo_server().await).await.unwrap();
        link.set(Mode::Delay(Duration::from_millis(150)));
        let mut s = TcpStream::connect(link.addr()).await.unwrap();
        let start = tokio::time::Instant::now();
        let got = roundtrip(&mut s, b"abc", Duration::from_secs(5)).await;
        assert_eq!(got.as_deref(), Some(&b"abc"[..]));
        // Held once on the way there and once on the way back.
        assert!(start.elapsed() >= Duration::from_millis(300));
    }
}
