//! A private `redis-server` on a free loopback port, killed when dropped.
//!
//! Persistence is off (`--save "" --appendonly no`) so disk never enters the numbers.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// A running `redis-server` owned by the harness.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts `redis-server` from `PATH` and waits until it answers PING.
    ///
    /// # Errors
    ///
    /// When no port is free, `redis-server` is not on `PATH`, or it does not answer in 10 s.
    pub fn start() -> anyhow::Result<Self> {
        // Binding port 0 and releasing it leaves a tiny race with other processes; the
        // readiness check below catches a server that lost it.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("finding a free loopback port")?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting redis-server (is it on PATH?)")?;
        let server = RedisServer { child, port };
        server.wait_until_ready(Duration::from_secs(10))?;
        Ok(server)
    }

    /// The URL clients connect with.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id, for its CPU and memory accounting.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_until_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let started = Instant::now();
        loop {
            let pong: redis::RedisResult<String> =
                client.get_connection().and_then(|mut connection| redis::cmd("PING").query(&mut connection));
            match pong {
                Ok(_) => return Ok(()),
                Err(err) if started.elapsed() > limit => {
                    return Err(err).context(format!("redis-server on port {} did not answer", self.port));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Errors mean the server already exited, which is what we want anyway.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
