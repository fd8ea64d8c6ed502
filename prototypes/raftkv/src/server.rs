//! The server's connections: HTTP/1.1 (the JSON API, etcd's JSON gateway,
//! the Raft RPCs) and HTTP/2 cleartext (etcd's gRPC API, which etcdctl and
//! etcd's clients speak with prior knowledge) on one listener, told apart
//! by their first bytes (hyper-util's auto builder: HTTP/2's preface, or
//! not). A request whose `content-type` is `application/grpc…` goes to
//! the gRPC services ([`crate::grpc::GrpcRouter`]), any other to the axum
//! router, whichever protocol it came by. Deadlines bound what a client
//! holds.
//!
//! `axum::serve` sets no timer, so hyper bounds nothing: a client that
//! sends half a request's headers, or opens a connection and sends
//! nothing, holds its connection (a socket, a task, its buffers) for as
//! long as it likes. Here hyper's header deadline is on
//! ([`Timeouts::header`]): a connection is closed when a request's
//! headers are not complete that long after the connection opened or its
//! last answer went out — so it bounds both a half-sent request and an
//! idle connection between requests. A connection is also closed once it
//! has been idle ([`Timeouts::idle`]: no bytes either way, no request
//! under way) that long (an HTTP/2 connection is sent a GOAWAY first, so
//! its client opens a new one for its next call). A request under way (a
//! watch stream, a write waiting for Raft) is not cut by either. HTTP/2
//! has no header deadline of its own: a client that opens a connection
//! and sends nothing is closed as idle.

use journal_core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long a client may take to send a request's headers, counted from
/// the connection's start or its last answer (by default).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may stay idle, no request under way and no
/// bytes either way, before it is closed (by default).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The deadlines of the server's connections.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A request's headers complete within this.
    pub header: Duration,
    /// A connection idle this long is closed.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: HEADER_TIMEOUT,
            idle: IDLE_TIMEOUT,
        }
    }
}

/// A connection's activity: when bytes last moved (ms since `start`),
/// and the requests under way.
#[derive(Debug)]
struct Activity {
    start: tokio::time::Instant,
    last_ms: AtomicU64,
    busy: AtomicUsize,
}

impl Activity {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// When the connection goes idle for `idle` if nothing moves.
    fn idle_deadline(&self, idle: Duration) -> tokio::time::Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle
    }
}

/// A TCP stream that notes when bytes move on it.
struct Tracked {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Counts a request as under way until its answer is dropped (sent, or
/// its connection gone).
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: &Arc<Activity>) -> Busy {
        a.busy.fetch_add(1, Ordering::Relaxed);
        Busy(a.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the server serves: the axum router, and the gRPC services (if
/// any: without them a gRPC request is the router's to answer).
#[derive(Clone)]
pub struct Apps {
    /// The JSON API, the gateway and the Raft RPCs.
    pub http: axum::Router,
    /// etcd's gRPC services.
    pub grpc: Option<crate::grpc::GrpcRouter>,
}

/// Serves `apps` on `listener` until `stop` completes, then lets the open
/// connections finish their requests (hyper's graceful shutdown) and
/// returns once they have closed.
pub async fn run(
    listener: TcpListener,
    app: Apps,
    timeouts: Timeouts,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (closing_tx, closing_rx) = watch::channel(false);
    let (open_tx, open_rx) = watch::channel(());
    let mut stop = std::pin::pin!(stop);
    loop {
        let tcp = tokio::select! {
            r = listener.accept() => r,
            _ = &mut stop => break,
        };
        match tcp {
            Ok((tcp, _)) => {
                // Answers go out at once (no Nagle delay behind an
                // unacknowledged segment): a Raft RPC's answer is on the
                // commit path.
                let _ = tcp.set_nodelay(true);
                let open = open_rx.clone();
                let closing = closing_rx.clone();
                tokio::spawn(connection(tcp, app.clone(), timeouts, closing, open));
            }
            // Out of file descriptors, or a connection reset before it
            // was accepted: the next accept may succeed; a pause lets
            // descriptors free up meanwhile.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    drop(listener);
    let _ = closing_tx.send(true);
    drop(open_rx);
    open_tx.closed().await;
    Ok(())
}

/// Serves one connection until it closes, its deadlines pass, or the
/// server stops (then it finishes the request under way).
async fn connection(
    tcp: TcpStream,
    app: Apps,
    t: Timeouts,
    mut closing: watch::Receiver<bool>,
    _open: watch::Receiver<()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let activity = Arc::new(Activity {
        start: tokio::time::Instant::now(),
        last_ms: AtomicU64::new(0),
        busy: AtomicUsize::new(0),
    });
    let io = TokioIo::new(Tracked {
        io: tcp,
        activity: activity.clone(),
    });
    let counted = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let busy = Busy::new(&counted);
        let call: Pin<Box<dyn Future<Output = axum::response::Response> + Send>> = match &app.grpc {
            Some(g) if crate::grpc::is_grpc(&req) => {
                let call = g.call(req);
                Box::pin(async move {
                    match call.await {
                        Ok(r) => r.map(axum::body::Body::new),
                        Err(never) => match never {},
                    }
                })
            }
            _ => {
                let call = tower_service::Service::call(&mut app.http.clone(), req);
                Box::pin(async move {
                    match call.await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    }
                })
            }
        };
        async move {
            let resp = call.await;
            // The request counts as under way until its body is sent.
            Ok::<_, std::convert::Infallible>(resp.map(|b| {
                axum::body::Body::new(http_body_util::BodyExt::map_frame(b, move |f| {
                    let _ = &busy;
                    f
                }))
            }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(t.header);
    builder.http2().timer(TokioTimer::new());
    let mut conn = std::pin::pin!(builder.serve_connection(io, service));
    let mut idle_closing = false;
    let mut shutting = false;
    loop {
        // While a request is under way the connection is not idle: look
        // again an idle time later (its end moves the deadline on).
        let idle_at = match activity.busy.load(Ordering::Relaxed) {
            0 => activity.idle_deadline(t.idle),
            _ => tokio::time::Instant::now() + t.idle,
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            r = closing.wait_for(|c| *c), if !shutting => {
                shutting = true;
                if r.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = tokio::time::sleep_until(idle_at) => {
                let quiet = activity.idle_deadline(t.idle) <= tokio::time::Instant::now();
                if quiet && activity.busy.load(Ordering::Relaxed) == 0 {
                    // Idle: a GOAWAY first (HTTP/2), then closed if it is
                    // still idle an idle time later.
                    if idle_closing || shutting {
                        return;
                    }
                    idle_closing = true;
                    activity.touch();
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
