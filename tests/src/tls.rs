//! Certificates made by the tests (with the `openssl` command line) and a `redis-server` that
//! speaks TLS on a port of its own beside its plain one (which the tests use to look inside).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{RedisProcess, free_port, temp_dir, toolhost_command};

/// A private CA with a server certificate for `127.0.0.1`/`localhost` and a client certificate,
/// and a second CA nobody trusts with a server certificate of its own, as PEM files in a
/// directory of their own.
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Makes every certificate (EC P-256 keys, valid for two days).
    pub fn new() -> Pki {
        let pki = Pki { dir: temp_dir("pki") };
        pki.ca("ca", "toolhost test CA");
        pki.issue("ca", "server", "localhost", "serverAuth");
        pki.issue("ca", "client", "toolhost", "clientAuth");
        pki.ca("rogue-ca", "nobody's CA");
        pki.issue("rogue-ca", "rogue-server", "localhost", "serverAuth");
        pki
    }

    /// The path of `<name>.pem` or `<name>.key`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The path as a string, for environment variables.
    pub fn file(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    fn ca(&self, name: &str, subject: &str) {
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={subject}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }

    fn issue(&self, ca: &str, name: &str, subject: &str, usage: &str) {
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={subject}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        let extensions = self.dir.join(format!("{name}.ext"));
        std::fs::write(
            &extensions,
            format!(
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
                 keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n"
            ),
        )
        .expect("write extensions");
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let output =
        Command::new("openssl").args(args).current_dir(dir).output().expect("openssl must be installed");
    assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// A `redis-server` with a TLS port beside its plain one.
pub struct TlsRedis {
    /// The server; its plain port is for the tests' own looks inside.
    pub server: RedisProcess,
    /// The TLS port toolhost is pointed at.
    pub tls_port: u16,
}

impl TlsRedis {
    /// Starts a server presenting `<cert>.pem` (`server` or `rogue-server`), trusting the test
    /// CA for client certificates, and requiring one when `client_auth`.
    pub fn start(pki: &Pki, cert: &str, client_auth: bool) -> TlsRedis {
        let tls_port = free_port();
        let port = tls_port.to_string();
        let cert_file = pki.file(&format!("{cert}.pem"));
        let key_file = pki.file(&format!("{cert}.key"));
        let ca_file = pki.file("ca.pem");
        let server = RedisProcess::start(&[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &cert_file,
            "--tls-key-file",
            &key_file,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            if client_auth { "yes" } else { "no" },
        ]);
        TlsRedis { server, tls_port }
    }

    /// `rediss://127.0.0.1:<tls port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// `CLIENT LIST`, asked on the plain port.
    pub fn clients(&self) -> String {
        redis::cmd("CLIENT").arg("LIST").query(&mut self.server.connection()).expect("CLIENT LIST")
    }

    /// The `XREADGROUP` commands the server ran while `during` ran (and a moment after), as
    /// `MONITOR` prints them (a command run by a script is marked `lua`).
    pub fn group_reads_during(&self, during: impl FnOnce()) -> Vec<String> {
        use std::io::BufRead as _;
        let mut monitor = Command::new("redis-cli")
            .args(["-p", &self.server.port().to_string(), "monitor"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("redis-cli monitor");
        let stdout = monitor.stdout.take().expect("monitor stdout");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines = std::sync::Arc::clone(&seen);
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("\"XREADGROUP\"") {
                    lines.lock().expect("lines").push(line);
                }
            }
        });
        // MONITOR answers OK before it streams; give it that moment.
        std::thread::sleep(Duration::from_millis(200));
        during();
        std::thread::sleep(Duration::from_millis(500));
        let _ = monitor.kill();
        let _ = monitor.wait();
        let _ = reader.join();
        seen.lock().expect("lines").clone()
    }

    /// Waits until a connection to the TLS port is in a blocking `XREADGROUP` (as `CLIENT LIST`
    /// shows its last command): the group reader reads over TLS.
    pub fn wait_for_group_read_over_tls(&self) {
        let tls_addr = format!("laddr=127.0.0.1:{}", self.tls_port);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let clients = self.clients();
            if clients.lines().any(|line| line.contains(&tls_addr) && line.contains("cmd=xreadgroup")) {
                return;
            }
            assert!(Instant::now() < deadline, "no XREADGROUP on the TLS port:\n{clients}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs `toolhost <args>` with a clean environment plus `env`, for at most `timeout`; its exit
/// code (`None`: still running at the deadline, then killed) and everything it printed.
pub fn run_toolhost(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> (Option<i32>, String) {
    let dir = temp_dir("toolhost-run");
    let log = dir.join("out.log");
    let mut child = toolhost_command(args, env, &log).spawn().expect("spawn toolhost");
    let deadline = Instant::now() + timeout;
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    (code, text)
}

/// The TLS arguments of a server presenting the test CA's server certificate.
fn server_tls_args(pki: &Pki, tls_port: u16) -> Vec<String> {
    [
        ("--tls-port", tls_port.to_string()),
        ("--tls-cert-file", pki.file("server.pem")),
        ("--tls-key-file", pki.file("server.key")),
        ("--tls-ca-cert-file", pki.file("ca.pem")),
        ("--tls-auth-clients", "no".to_owned()),
    ]
    .into_iter()
    .flat_map(|(name, value)| [name.to_owned(), value])
    .collect()
}

impl TlsRedis {
    /// A one-node Redis Cluster holding every slot, whose cluster bus and announced ports are
    /// TLS (`tls-cluster yes`): the smallest cluster a TLS cluster client can be pointed at.
    pub fn start_cluster(pki: &Pki) -> TlsRedis {
        let tls_port = free_port();
        let mut args = server_tls_args(pki, tls_port);
        args.extend(
            ["--tls-cluster", "yes", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
                .map(str::to_owned),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = RedisProcess::start(&args);
        let mut connection = server.connection();
        let () = redis::cmd("CLUSTER")
            .arg(&["ADDSLOTSRANGE", "0", "16383"][..])
            .query(&mut connection)
            .expect("CLUSTER ADDSLOTSRANGE");
        crate::sentinel::poll("the one-node cluster to be ok", Duration::from_secs(20), || {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut connection).ok()?;
            info.contains("cluster_state:ok").then_some(())
        });
        TlsRedis { server, tls_port }
    }
}

/// A `redis-server --sentinel` speaking TLS on a port of its own, watching a master on its TLS
/// port over TLS (`tls-replication yes`), so that what it announces is the TLS port.
pub struct TlsSentinel {
    /// The TLS port toolhost is pointed at.
    pub tls_port: u16,
    dir: PathBuf,
    child: std::process::Child,
}

impl TlsSentinel {
    /// Starts a sentinel (quorum 1) watching the master on `master_tls_port` as
    /// [`crate::sentinel::MASTER_NAME`], and waits until it names that master.
    pub fn start(pki: &Pki, master_tls_port: u16) -> TlsSentinel {
        let (port, tls_port) = (free_port(), free_port());
        let dir = temp_dir("tls-sentinel");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\ntls-port {tls_port}\nbind 127.0.0.1\ndir {dir}\n\
                 logfile {log}\nloglevel {level}\n\
                 tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\ntls-auth-clients no\n\
                 tls-replication yes\nsentinel resolve-hostnames no\n\
                 sentinel monitor {name} 127.0.0.1 {master_tls_port} 1\n",
                dir = dir.display(),
                log = dir.join("sentinel.log").display(),
                level = crate::LOG_LEVEL,
                cert = pki.file("server.pem"),
                key = pki.file("server.key"),
                ca = pki.file("ca.pem"),
                name = crate::sentinel::MASTER_NAME,
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let sentinel = TlsSentinel { tls_port, dir, child };
        let url = format!("redis://127.0.0.1:{port}");
        crate::sentinel::poll("the TLS sentinel to name its master", Duration::from_secs(20), || {
            let mut connection = redis::Client::open(url.as_str())
                .ok()?
                .get_connection_with_timeout(Duration::from_millis(500))
                .ok()?;
            let (_, port): (String, u16) = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(crate::sentinel::MASTER_NAME)
                .query(&mut connection)
                .ok()?;
            (port == master_tls_port).then_some(())
        });
        sentinel
    }

    /// `rediss://127.0.0.1:<tls port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
