//! How the bus reaches Redis: the one place that knows the topology.
//!
//! [`Connector`] makes the two kinds of connection the bus uses: the shared one for every
//! non-blocking command ([`Connector::commands`]) and dedicated ones for blocking reads
//! ([`Connector::blocking`]), which hold a socket for their whole wait. [`Connection`] is what
//! both return; it speaks [`ConnectionLike`], so commands, pipelines and scripts run on it the
//! same way whatever the topology.
//!
//! On a Redis Cluster ([`Topology::Cluster`]) both kinds are redis-rs cluster connections: the
//! client routes every command to the primary of its key's slot and follows `MOVED`/`ASK`
//! redirections itself, and retries `CLUSTERDOWN`/`TRYAGAIN` with backoff for a while (a failover
//! or a resharding); what still fails reaches the caller as [`Error::Unavailable`], which the
//! daemon retries in turn. Each blocking read gets a cluster connection of its own (its own
//! socket to each node), since a blocked `XREADGROUP` holds its socket.
//!
//! The Sentinel topology ([`Topology::Sentinel`]) lives in `crate::sentinel`.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use crate::sentinel::{SentinelConnection, Sentinels, Shared};
use crate::{Error, Tls};

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Topology {
    /// One server at [`crate::RedisOptions::url`] (or a proxy in front of several).
    #[default]
    Single,
    /// A Redis Cluster, found through these seed nodes (`redis://host:port` or `host:port`).
    ///
    /// A node written bare (`host:port`) takes scheme (`rediss://` for TLS), credentials and
    /// database from [`crate::RedisOptions::url`]; a node written as a URL is used as written,
    /// except that credentials it does not carry are taken from that URL too.
    Cluster {
        /// The seed nodes; the client learns the others from them.
        nodes: Vec<String>,
    },
    /// A master watched by Redis Sentinel, found through the sentinels and followed across
    /// failovers; [`crate::RedisOptions::url`] gives only its credentials, database and TLS.
    Sentinel(Sentinels),
}

impl Topology {
    /// Whether keys live in slots spread over several servers.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Topology::Cluster { .. })
    }
}

/// A connection to Redis, of whichever topology. Cheap to clone: clones share the socket.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server, reconnecting by itself after a failure.
    Single(ConnectionManager),
    /// A Redis Cluster: one connection per node, commands routed by slot.
    Cluster(ClusterConnection),
    /// Whichever server the sentinels name as master.
    Sentinel(SentinelConnection),
}

impl Connection {
    /// Says that something run on this connection was refused as by a server that is no master
    /// (inside a reply, where the connection cannot see it): the Sentinel topology looks again.
    pub(crate) fn suspect_master(&self) {
        match self {
            Connection::Single(_) | Connection::Cluster(_) => {}
            Connection::Sentinel(connection) => connection.suspect(),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
            Connection::Sentinel(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
            Connection::Sentinel(connection) => connection.get_db(),
        }
    }
}

/// Makes connections for one topology.
pub(crate) struct Connector {
    kind: Kind,
    connect_timeout: Duration,
}

enum Kind {
    Single(Client),
    Cluster {
        /// The seed nodes, as URLs.
        nodes: Vec<String>,
        /// The configured URL: credentials for nodes that carry none.
        url: String,
        tls: Tls,
        /// For blocking reads: no response timeout (the bus bounds each read itself).
        blocking: Box<ClusterClient>,
    },
    Sentinel(Arc<Shared>),
}

/// How many times the cluster client retries a command that met `CLUSTERDOWN`, `TRYAGAIN` or a
/// lost node before the error reaches the bus; redirections (`MOVED`, `ASK`) are followed within
/// the same budget.
const CLUSTER_RETRIES: u32 = 8;
/// The longest wait between two of those retries, in milliseconds.
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 1000;

impl Connector {
    /// A connector for `url` under `topology`. Nothing is connected yet.
    ///
    /// `tls` applies to every `rediss://` connection: the URL's, the cluster nodes', the
    /// sentinels' and the master's they name.
    ///
    /// # Errors
    /// The URL or a cluster node cannot be parsed, the nodes disagree on credentials or TLS, or
    /// `tls` is set for a URL without TLS.
    pub(crate) fn new(
        url: &str,
        topology: &Topology,
        tls: &Tls,
        connect_timeout: Duration,
    ) -> Result<Connector, Error> {
        let kind = match topology {
            Topology::Single => Kind::Single(single_client(url, tls)?),
            Topology::Cluster { nodes } => {
                let nodes = cluster_nodes(url, nodes)?;
                // Both checked now, so a bad node list fails at start-up rather than on first use.
                cluster_client(url, &nodes, tls, connect_timeout, Some(connect_timeout))?;
                let blocking = cluster_client(url, &nodes, tls, connect_timeout, None)?;
                Kind::Cluster { nodes, url: url.to_owned(), tls: tls.clone(), blocking: Box::new(blocking) }
            }
            Topology::Sentinel(sentinels) => {
                Kind::Sentinel(Arc::new(Shared::new(url, sentinels, tls, connect_timeout)?))
            }
        };
        Ok(Connector { kind, connect_timeout })
    }

    /// A connection for non-blocking commands, failing a command that takes longer than
    /// `response_timeout`. Connects on first use.
    ///
    /// # Errors
    /// The connection cannot be set up.
    pub(crate) fn commands(&self, response_timeout: Duration) -> Result<Connection, Error> {
        match &self.kind {
            Kind::Single(client) => self.single(client, Some(response_timeout)),
            Kind::Sentinel(shared) => Ok(Connection::Sentinel(shared.connection(Some(response_timeout)))),
            Kind::Cluster { nodes, url, tls, .. } => {
                let client = cluster_client(url, nodes, tls, self.connect_timeout, Some(response_timeout))?;
                Ok(Connection::Cluster(
                    client.get_pending_async_connection_with_config(
                        ClusterConfig::new()
                            .set_connection_timeout(self.connect_timeout)
                            .set_response_timeout(response_timeout),
                    ),
                ))
            }
        }
    }

    /// A connection of its own for one blocking read at a time (no response timeout: the read
    /// waits as long as it blocks). Connects on first use.
    ///
    /// # Errors
    /// The connection cannot be set up.
    pub(crate) fn blocking(&self) -> Result<Connection, Error> {
        match &self.kind {
            Kind::Single(client) => self.single(client, None),
            Kind::Sentinel(shared) => Ok(Connection::Sentinel(shared.connection(None))),
            Kind::Cluster { blocking, .. } => {
                Ok(Connection::Cluster(blocking.get_pending_async_connection_with_config(
                    ClusterConfig::new().set_connection_timeout(self.connect_timeout),
                )))
            }
        }
    }

    /// On a cluster, how to reach a node the cluster names (`CLUSTER SLOTS`): the URL of `host`
    /// and `port` with the scheme (TLS or not, `#insecure` included), credentials and database the
    /// cluster client uses for every node, which are those of the first seed node, or of the
    /// configured URL for seed nodes that carry none. `None` on other topologies, and for a node
    /// that cannot be written as a URL.
    pub(crate) fn cluster_node_url(&self, host: &str, port: u16) -> Option<String> {
        let Kind::Cluster { nodes, url, .. } = &self.kind else { return None };
        node_url(url, nodes, host, port)
    }

    /// On a cluster, the seed nodes' hosts and ports (port 6379 where a seed names none); empty
    /// on other topologies.
    pub(crate) fn cluster_seeds(&self) -> Vec<(String, u16)> {
        let Kind::Cluster { nodes, .. } = &self.kind else { return Vec::new() };
        nodes
            .iter()
            .filter_map(|node| {
                let node = redis::parse_redis_url(node)?;
                let host = node.host_str()?.trim_start_matches('[').trim_end_matches(']').to_owned();
                Some((host, node.port().unwrap_or(6379)))
            })
            .collect()
    }

    /// On a cluster, whether connecting fails for a TLS reason no retry mends, found by
    /// connecting once more at once: the lazily connected cluster connection reports only that it
    /// has no connection, and logs the cause. `None` elsewhere (one server and Sentinel report the
    /// cause with the command) and for any other failure.
    pub(crate) async fn tls_failure(&self) -> Option<Error> {
        let Kind::Cluster { nodes, url, tls, .. } = &self.kind else { return None };
        let client =
            cluster_client(url, nodes, tls, self.connect_timeout, Some(self.connect_timeout)).ok()?;
        let connecting = client.get_async_connection();
        match tokio::time::timeout(self.connect_timeout * 2, connecting).await {
            Ok(Err(err)) => Some(Error::from(err)).filter(|err| matches!(err, Error::Tls(_))),
            _ => None,
        }
    }

    fn single(&self, client: &Client, response_timeout: Option<Duration>) -> Result<Connection, Error> {
        ConnectionManager::new_lazy_with_config(
            client.clone(),
            manager_config(self.connect_timeout, response_timeout),
        )
        .map(Connection::Single)
        .map_err(Error::from)
    }
}

/// A client for the one server at `url`, with `tls`'s CA and client certificate when set.
///
/// # Errors
/// The URL cannot be parsed, or `tls` is set and the URL is not `rediss://`.
pub(crate) fn single_client(url: &str, tls: &Tls) -> Result<Client, Error> {
    match tls.certificates() {
        None => Client::open(url).map_err(Error::from),
        Some(certificates) => Client::build_with_tls(url, certificates).map_err(Error::from),
    }
}

/// How every connection manager connects and reconnects.
pub(crate) fn manager_config(
    connect_timeout: Duration,
    response_timeout: Option<Duration>,
) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(response_timeout)
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(2))
}

/// The seed nodes as URLs: a bare `host:port` takes the scheme, credentials and database of
/// `url` (`redis://` when `url` is a `unix://` one).
///
/// # Errors
/// There are no nodes.
pub(crate) fn cluster_nodes(url: &str, nodes: &[String]) -> Result<Vec<String>, Error> {
    if nodes.is_empty() {
        return Err(Error::Protocol("a cluster needs at least one node".to_owned()));
    }
    let base = redis::parse_redis_url(url).filter(|base| matches!(base.scheme(), "redis" | "rediss"));
    Ok(nodes
        .iter()
        .map(|node| {
            if node.contains("://") {
                return node.clone();
            }
            match &base {
                Some(base) => {
                    let userinfo = match (base.username(), base.password()) {
                        ("", None) => String::new(),
                        (user, None) => format!("{user}@"),
                        (user, Some(password)) => format!("{user}:{password}@"),
                    };
                    format!("{}://{userinfo}{node}{}", base.scheme(), base.path())
                }
                None => format!("redis://{node}"),
            }
        })
        .collect())
}

/// A cluster client for `nodes`: each attempt bounded by `response_timeout` (none when `None`),
/// and retries through a failover bounded to a few times that in all.
fn cluster_client(
    url: &str,
    nodes: &[String],
    tls: &Tls,
    connect_timeout: Duration,
    response_timeout: Option<Duration>,
) -> Result<ClusterClient, Error> {
    let mut builder = ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(connect_timeout)
        .retries(CLUSTER_RETRIES)
        .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS);
    if let Some(certificates) = tls.certificates() {
        builder = builder.certs(certificates);
    }
    if let Some(timeout) = response_timeout {
        builder = builder
            .response_timeout(timeout)
            .overall_response_timeout(Some((timeout * 4).max(Duration::from_secs(10))));
    }
    with_credentials(builder, url, nodes)?.build().map_err(Error::from)
}

/// The URL of a node at `host:port` of the cluster of seed `nodes` (as [`cluster_nodes`] wrote
/// them) configured with `url`, connecting as the cluster client does: with the first seed's
/// scheme and fragment, and with `url`'s credentials when no seed carries its own (see
/// [`with_credentials`]), else the first seed's. A cluster has only database 0, so no path.
fn node_url(url: &str, nodes: &[String], host: &str, port: u16) -> Option<String> {
    let mut node = redis::parse_redis_url(nodes.first()?)?;
    if !matches!(node.scheme(), "redis" | "rediss" | "valkey" | "valkeys") {
        return None;
    }
    if takes_url_credentials(url, nodes)
        && let Some(base) = redis::parse_redis_url(url)
    {
        node.set_username(base.username()).ok()?;
        node.set_password(base.password()).ok()?;
    }
    // An IPv6 address is written in brackets in a URL.
    let host = match host.contains(':') && !host.starts_with('[') {
        true => format!("[{host}]"),
        false => host.to_owned(),
    };
    node.set_host(Some(&host)).ok()?;
    node.set_port(Some(port)).ok()?;
    node.set_path("");
    Some(node.to_string())
}

/// Whether a cluster's nodes connect with `url`'s credentials: it has some, and no seed node
/// carries its own.
fn takes_url_credentials(url: &str, nodes: &[String]) -> bool {
    let own = nodes.iter().any(|node| {
        redis::parse_redis_url(node)
            .is_some_and(|node| !node.username().is_empty() || node.password().is_some())
    });
    !own && url.contains('@')
}

/// Credentials from `url` for nodes that carry none of their own.
fn with_credentials(
    builder: ClusterClientBuilder,
    url: &str,
    nodes: &[String],
) -> Result<ClusterClientBuilder, Error> {
    if !takes_url_credentials(url, nodes) {
        return Ok(builder);
    }
    let Ok(info) = url.into_connection_info() else { return Ok(builder) };
    let settings = info.redis_settings();
    let mut builder = builder;
    if let Some(username) = settings.username() {
        builder = builder.username(username);
    }
    if let Some(password) = settings.password() {
        builder = builder.password(password);
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_nodes_take_scheme_and_credentials_from_the_url() {
        let nodes = ["10.0.0.1:7000".to_owned(), "redis://other:7001".to_owned()];
        assert_eq!(
            cluster_nodes("rediss://app:s3cret@seed:6379/0", &nodes).unwrap(),
            ["rediss://app:s3cret@10.0.0.1:7000/0", "redis://other:7001"]
        );
        assert_eq!(cluster_nodes("unix:///run/redis.sock", &nodes[..1]).unwrap(), ["redis://10.0.0.1:7000"]);
        assert!(cluster_nodes("redis://x", &[]).is_err());
        // Nodes written as URLs without credentials still authenticate with the URL's.
        let connector = Connector::new(
            "redis://app:s3cret@seed:6379",
            &Topology::Cluster { nodes: vec!["redis://127.0.0.1:1".to_owned()] },
            &Tls::default(),
            Duration::from_millis(100),
        );
        assert!(connector.is_ok());
    }

    #[test]
    fn announced_nodes_connect_as_the_seed_nodes_do() {
        let seeds = |url: &str, nodes: &[&str]| {
            cluster_nodes(url, &nodes.iter().map(|node| (*node).to_owned()).collect::<Vec<_>>()).unwrap()
        };
        let url = "rediss://app:s3cret@seed:6379/0";
        let nodes = seeds(url, &["10.0.0.1:7000"]);
        assert_eq!(node_url(url, &nodes, "10.0.0.9", 7005).unwrap(), "rediss://app:s3cret@10.0.0.9:7005");
        // Seeds written as URLs without credentials take the URL's, as the cluster client does.
        let nodes = seeds(url, &["redis://10.0.0.1:7000/#insecure"]);
        assert_eq!(
            node_url(url, &nodes, "node-b.internal", 7001).unwrap(),
            "redis://app:s3cret@node-b.internal:7001#insecure"
        );
        // A seed with credentials of its own gives them to every node.
        let nodes = seeds(url, &["redis://other:pw@10.0.0.1:7000"]);
        assert_eq!(node_url(url, &nodes, "::1", 7002).unwrap(), "redis://other:pw@[::1]:7002");
        let target = node_url("redis://h", &seeds("redis://h", &["h:1"]), "10.0.0.2", 7003).unwrap();
        assert_eq!(target, "redis://10.0.0.2:7003");
        let connector = Connector::new(
            "redis://app:s3cret@seed:6379/0",
            &Topology::Cluster { nodes: vec!["10.0.0.1:7000".to_owned(), "seed-b".to_owned()] },
            &Tls::default(),
            Duration::from_millis(100),
        )
        .unwrap();
        assert_eq!(connector.cluster_seeds(), [("10.0.0.1".to_owned(), 7000), ("seed-b".to_owned(), 6379)]);
    }
}
