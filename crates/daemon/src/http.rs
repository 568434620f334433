//! The operations HTTP endpoint on `[http] listen`, and the client behind `toolhost healthcheck`.
//!
//! Routes:
//! - `GET /healthz`: 200 `{"status":"ok"}` while the process runs.
//! - `GET /readyz`: 200 `{"ready":true}` while Redis answers and the consumer groups exist;
//!   otherwise 503 `{"ready":false,"reasons":[...]}`. See [`Telemetry::readiness`].
//! - `GET /metrics`: every metric in the Prometheus text format (version 0.0.4).
//!
//! The server runs on an OS thread of its own with a current-thread runtime, so it keeps
//! answering while the tool runtime is saturated; its handlers only read [`Telemetry`], they never
//! wait for Redis. Readiness facts come from the probe (`probe.rs`) and the dispatcher.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::telemetry::Telemetry;

/// How long open connections get to finish once the server is told to stop.
const STOP_GRACE: Duration = Duration::from_secs(1);

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
    pub fn start(listen: SocketAddr, telemetry: Telemetry) -> anyhow::Result<HttpServer> {
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
                runtime.block_on(serve(listener, telemetry, stopping));
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
        .with_state(telemetry)
}

async fn serve(listener: std::net::TcpListener, telemetry: Telemetry, stop: CancellationToken) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            warn!(error = %err, "cannot serve HTTP");
            return;
        }
    };
    let server =
        axum::serve(listener, router(telemetry)).with_graceful_shutdown(stop.clone().cancelled_owned());
    // Graceful shutdown waits for open connections; a client that keeps one busy must not hold
    // up the daemon's exit for long.
    let deadline = async {
        stop.cancelled().await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::select! {
        res = server => if let Err(err) = res {
            warn!(error = %err, "HTTP server failed");
        },
        () = deadline => {}
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
        let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), telemetry.clone()).unwrap();
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

    #[test]
    fn all_interfaces_are_reached_on_loopback() {
        assert_eq!(local_target("0.0.0.0:9464".parse().unwrap()), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(local_target("[::]:9464".parse().unwrap()), "[::1]:9464".parse().unwrap());
        assert_eq!(local_target("10.0.0.5:80".parse().unwrap()), "10.0.0.5:80".parse().unwrap());
    }
}
