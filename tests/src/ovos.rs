//! The OpenVoiceOS messagebus of the suites that talk to it (`ovos`, `telemetry`): the real
//! `ovos-messagebus` from the venv `just test-ovos` makes (`scripts/ensure-ovos-venv.sh`;
//! `TOOLHOST_OVOS_VENV` names another), on a free loopback port.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::json;

use crate::{free_port, temp_dir};

/// The venv with the bus, its client and the plugin manager.
pub fn venv() -> PathBuf {
    crate::venv("TOOLHOST_OVOS_VENV", "venv-ovos", "ensure-ovos-venv.sh", "test-ovos")
}

/// A Python process of the venv with the OVOS configuration of `dir` (its XDG directories), so
/// nothing reads or writes the user's own.
pub fn python(dir: &Path) -> Command {
    let mut command = Command::new(venv().join("bin/python"));
    for (name, sub) in [
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_STATE_HOME", "state"),
    ] {
        command.env(name, dir.join(sub));
    }
    command.env("MYCROFT_SYSTEM_CONFIG", dir.join("no-system.conf")).current_dir(dir);
    command
}

/// `ovos-messagebus` on a free loopback port, taking messages up to 32 MiB (so a 10 MiB frame
/// reaches the door's own cap).
pub struct Bus {
    /// Its XDG directories (the bus's configuration and log).
    pub dir: PathBuf,
    /// Its port.
    pub port: u16,
    child: Option<Child>,
}

impl Bus {
    /// Starts the bus.
    pub fn start() -> Bus {
        let dir = temp_dir("ovos-bus");
        let mut bus = Bus { dir, port: 0, child: None };
        for _ in 0..4 {
            bus.port = free_port();
            if bus.spawn() {
                return bus;
            }
        }
        panic!("ovos-messagebus did not start on four free ports");
    }

    fn spawn(&mut self) -> bool {
        let config = self.dir.join("config/mycroft");
        std::fs::create_dir_all(&config).expect("create the bus's configuration directory");
        std::fs::write(
            config.join("mycroft.conf"),
            json!({"websocket": {"host": "127.0.0.1", "port": self.port, "route": "/core", "max_msg_size": 32}})
                .to_string(),
        )
        .expect("write the bus's configuration");
        let log = std::fs::File::create(self.dir.join("bus.log")).expect("create the bus's log");
        let child = python(&self.dir)
            .args(["-m", "ovos_messagebus"])
            .stdout(log.try_clone().expect("share the bus's log"))
            .stderr(log)
            .spawn()
            .expect("start ovos-messagebus");
        let child = self.child.insert(child);
        let port = self.port;
        crate::wait_until_ready(child, Duration::from_secs(20), Duration::from_millis(50), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
    }

    /// Its `ws://` URL.
    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/core", self.port)
    }

    /// Stops it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.spawn(), "ovos-messagebus did not start again on port {}", self.port);
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
