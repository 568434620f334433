//! Issue 12: idle and stalled sockets cannot starve the daemon's `/healthz` and `/metrics`.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::{Daemon, RedisServer, http_addr, http_get};

/// Whether the server closed `stream` (end of file or a reset) within `within`.
fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut byte = [0_u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(err) => err.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_idle_sockets_never_starve_health_and_are_closed() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(
        &redis,
        &[("TOOLHOST__HTTP__MAX_CONNECTIONS", "8"), ("TOOLHOST__HTTP__IDLE_TIMEOUT_MS", "1000")],
    );
    let addr = http_addr(&daemon.log());
    // Five times the cap, some silent, some stopped half-way through a request header.
    let mut idle: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for stream in idle.iter_mut().step_by(2) {
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
    }
    for path in ["/healthz", "/metrics"] {
        let asked = Instant::now();
        let (status, _) = http_get(addr, path);
        assert_eq!(status, 200, "{path}");
        assert!(asked.elapsed() < Duration::from_secs(2), "{path} took {:?}", asked.elapsed());
    }
    // Every idle socket is closed by the server: past the cap at once, the rest after the idle
    // timeout.
    for (index, stream) in idle.iter_mut().enumerate() {
        assert!(closed_by_server(stream, Duration::from_secs(5)), "idle socket {index} is still open");
    }
}
