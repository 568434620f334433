//! The operations HTTP endpoint on `[http] listen`, and the client behind `toolhost healthcheck`.
//!
//! Routes:
//! - `GET /healthz`: 200 `{"status":"ok"}` while the process runs.
//! - `GET /readyz`: 200 `{"ready":true}` while Redis answers and the consumer groups exist;
//!   otherwise 503 `{"ready":false,"reasons":[...]}`. See [`Telemetry::readiness`].
//! - `GET /metrics`: every metric in the Prometheus text format (version 0.0.4).
//! - `GET /status`: `{"ready", "reasons", "sources": [...]}`, the state of every hosted tool
//!   source (an MCP server: up, restarts, tools, pid, last error) beside readiness.
//!
//! The server runs on an OS thread of its own with a current-thread runtime, so it keeps
//! answering while the tool runtime is saturated; its handlers only read [`Telemetry`], they never
//! wait for Redis. Readiness facts come from the probe (`probe.rs`) and the dispatcher.
//!
//! Idle or stalled clients cannot starve the endpoint ([`HttpLimits`]): a connection that sends
//! no complete request header within `[http] idle_timeout_ms` (new, half-way through a header,
//! or idle between keep-alive requests) is closed, and at most `[http] max_connections` are
//! served at once. Past that a new connection is still accepted and the oldest open one is
//! closed, so a probe always gets in, and the kernel's accept queue never fills up behind idle
//! sockets.

use std::collections::VecDeque;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::telemetry::Telemetry;

/// How long open connections get to finish once the server is told to stop.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// How long the accept loop pauses after a failed accept (out of file descriptors, say), so it
/// does not spin while the cause lasts.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Bounds on the connections the endpoint serves (`[http] max_connections`, `idle_timeout_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; a new one past it closes the oldest.
    pub max_connections: usize,
    /// How long a connection may go without sending a complete request header.
    pub idle_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits { max_connections: 64, idle_timeout: Duration::from_secs(10) }
    }
}

/// The running HTTP server. Dropping it stops the server and joins its thread.
pub struct HttpServer {
    addr: SocketAddr,
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `listen` (port 0 picks a free port) and serves the routes on a thread of its own.
    ///
    /// # Errors
    /// The address cannot be bound, or the thread or its runtime cannot be started.
    pub fn start(listen: SocketAddr, telemetry: Telemetry, limits: HttpLimits) -> anyhow::Result<HttpServer> {
        let listener =
            std::net::TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
        listener.set_nonblocking(true).context("cannot make the HTTP listener non-blocking")?;
        let addr = listener.local_addr().context("cannot read the HTTP listener's address")?;
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        // The runtime is built and dropped on its own thread: dropping a runtime inside another
        // runtime's context panics, and `run` is async.
        let (started, start_result) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("toolhost-http".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = started.send(Err(err));
                        return;
                    }
                };
                let _ = started.send(Ok(()));
                runtime.block_on(serve(listener, telemetry, stopping, limits));
            })
            .context("cannot start the HTTP thread")?;
        match start_result.recv() {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(err).context("cannot build the HTTP runtime"),
            Err(_disconnected) => anyhow::bail!("the HTTP thread ended before it started serving"),
        }
        Ok(HttpServer { addr, stop, thread: Some(thread) })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The routes, over shared telemetry.
pub fn router(telemetry: Telemetry) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(telemetry)
}

/// `/status`: readiness with its reasons, and the state of every hosted tool source, as JSON.
async fn status(State(telemetry): State<Telemetry>) -> axum::Json<serde_json::Value> {
    axum::Json(telemetry.status())
}

async fn serve(
    listener: std::net::TcpListener,
    telemetry: Telemetry,
    stop: CancellationToken,
    limits: HttpLimits,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            warn!(error = %err, "cannot serve HTTP");
            return;
        }
    };
    let service = TowerToHyperService::new(router(telemetry));
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The header-read timer runs from the moment a request head is awaited, including the wait
    // for the next request on a kept-alive connection, so it is also the idle timeout.
    builder.timer(TokioTimer::new()).header_read_timeout(limits.idle_timeout);
    let open = OpenConnections::new(limits.max_connections);
    let connections = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(err) => {
                    warn!(error = %err, "cannot accept an HTTP connection");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        let (id, close) = open.admit();
        let connection = builder.serve_connection(TokioIo::new(stream), service.clone());
        let open = open.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            tokio::pin!(connection);
            let mut stopping = false;
            loop {
                tokio::select! {
                    res = connection.as_mut() => {
                        if let Err(err) = res {
                            debug!(error = %err, "HTTP connection ended");
                        }
                        break;
                    }
                    // Closed to make room: dropping the connection closes its socket.
                    () = close.cancelled() => break,
                    () = stop.cancelled(), if !stopping => {
                        stopping = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            open.remove(id);
        });
    }
    // Graceful shutdown lets open connections finish; a client that keeps one busy must not hold
    // up the daemon's exit for long.
    connections.close();
    let _ = tokio::time::timeout(STOP_GRACE, connections.wait()).await;
}

/// The connections being served, oldest first, each with the token that closes it.
#[derive(Clone)]
struct OpenConnections {
    inner: Arc<Mutex<OpenInner>>,
}

struct OpenInner {
    /// Most connections open at once.
    max: usize,
    /// Id of the next connection.
    next_id: u64,
    /// Open connections in the order they were accepted.
    open: VecDeque<(u64, CancellationToken)>,
}

impl OpenConnections {
    fn new(max: usize) -> OpenConnections {
        let inner = OpenInner { max: max.max(1), next_id: 0, open: VecDeque::new() };
        OpenConnections { inner: Arc::new(Mutex::new(inner)) }
    }

    /// Registers a new connection, closing the oldest ones past the limit; returns its id and
    /// the token that closes it.
    fn admit(&self) -> (u64, CancellationToken) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while inner.open.len() >= inner.max {
            let Some((_, oldest)) = inner.open.pop_front() else { break };
            debug!("HTTP connection limit reached; closing the oldest connection");
            oldest.cancel();
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let close = CancellationToken::new();
        inner.open.push_back((id, close.clone()));
        (id, close)
    }

    /// Forgets a connection that has ended.
    fn remove(&self, id: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.open.retain(|(other, _)| *other != id);
    }
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn readyz(State(telemetry): State<Telemetry>) -> Response {
    let readiness = telemetry.readiness();
    if readiness.is_ready() {
        json_response(StatusCode::OK, &json!({"ready": true}))
    } else {
        json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"ready": false, "reasons": readiness.reasons}))
    }
}

async fn metrics(State(telemetry): State<Telemetry>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], telemetry.render()).into_response()
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], format!("{body}\n")).into_response()
}

/// Where a client on this host reaches a server listening on `listen`: the loopback address
/// when it listens on all interfaces.
pub fn local_target(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()),
        _ => listen,
    }
}

/// `GET path` over plain HTTP/1.0 with a raw TCP connection; returns the status code. Small on
/// purpose: `toolhost healthcheck` needs no HTTP client library, and slim images have no curl.
///
/// # Errors
/// Connecting, writing or reading failed or timed out, or the reply is not HTTP.
pub fn get_status(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut head = [0_u8; 64];
    let mut len = 0;
    while len < 12 {
        let read = stream.read(&mut head[len..])?;
        if read == 0 {
            break;
        }
        len += read;
    }
    let text = String::from_utf8_lossy(&head[..len]);
    text.strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP reply"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_health_readiness_and_metrics() {
        let telemetry = Telemetry::new();
        let server =
            HttpServer::start("127.0.0.1:0".parse().unwrap(), telemetry.clone(), HttpLimits::default())
                .unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let timeout = Duration::from_secs(5);
        assert_eq!(get_status(addr, "/healthz", timeout).unwrap(), 200);
        assert_eq!(get_status(addr, "/readyz", timeout).unwrap(), 503);
        telemetry.set_redis_up(true);
        telemetry.set_groups_ready(true);
        assert_eq!(get_status(addr, "/readyz", timeout).unwrap(), 200);
        assert_eq!(get_status(addr, "/metrics", timeout).unwrap(), 200);
        assert_eq!(get_status(addr, "/nope", timeout).unwrap(), 404);
        drop(server);
        assert!(get_status(addr, "/healthz", timeout).is_err());
    }

    /// Whether the server has closed `stream`: end of file (or a reset) within `within`.
    fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
        stream.set_read_timeout(Some(within)).unwrap();
        let mut byte = [0_u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(err) => err.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }

    /// Whether `stream` is still open and silent right now.
    fn still_open(stream: &mut TcpStream) -> bool {
        stream.set_nonblocking(true).unwrap();
        let mut byte = [0_u8; 1];
        let res = stream.read(&mut byte);
        stream.set_nonblocking(false).unwrap();
        matches!(res, Err(err) if err.kind() == std::io::ErrorKind::WouldBlock)
    }

    #[test]
    fn idle_sockets_past_the_cap_never_starve_health_and_metrics() {
        // An idle timeout far longer than the test: only the cap can close sockets here.
        let limits = HttpLimits { max_connections: 4, idle_timeout: Duration::from_secs(120) };
        let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), Telemetry::new(), limits).unwrap();
        let addr = server.local_addr();
        let mut idle: Vec<TcpStream> = (0..12).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let asked = std::time::Instant::now();
        assert_eq!(get_status(addr, "/healthz", Duration::from_secs(5)).unwrap(), 200);
        assert!(asked.elapsed() < Duration::from_secs(2), "/healthz took {:?}", asked.elapsed());
        // The health check's connection closed the oldest of the idle ones still open; the three
        // newest idle ones fill the cap with it.
        for (index, stream) in idle.iter_mut().enumerate().take(9) {
            assert!(closed_by_server(stream, Duration::from_secs(5)), "idle socket {index} is still open");
        }
        for (index, stream) in idle.iter_mut().enumerate().skip(9) {
            assert!(still_open(stream), "idle socket {index} was closed");
        }
        assert_eq!(get_status(addr, "/metrics", Duration::from_secs(5)).unwrap(), 200);
    }

    #[test]
    fn idle_and_stalled_connections_are_closed() {
        let limits = HttpLimits { max_connections: 64, idle_timeout: Duration::from_millis(300) };
        let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), Telemetry::new(), limits).unwrap();
        let addr = server.local_addr();
        let mut silent = TcpStream::connect(addr).unwrap();
        let mut stalled = TcpStream::connect(addr).unwrap();
        stalled.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
        let mut kept_alive = TcpStream::connect(addr).unwrap();
        kept_alive.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut reply = vec![0_u8; 256];
        kept_alive.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let read = kept_alive.read(&mut reply).unwrap();
        assert!(reply[..read].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&reply[..read]));
        for (name, stream) in
            [("silent", &mut silent), ("stalled", &mut stalled), ("kept alive", &mut kept_alive)]
        {
            assert!(closed_by_server(stream, Duration::from_secs(5)), "the {name} connection is still open");
        }
    }

    #[test]
    fn all_interfaces_are_reached_on_loopback() {
        assert_eq!(local_target("0.0.0.0:9464".parse().unwrap()), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(local_target("[::]:9464".parse().unwrap()), "[::1]:9464".parse().unwrap());
        assert_eq!(local_target("10.0.0.5:80".parse().unwrap()), "10.0.0.5:80".parse().unwrap());
    }
}
