//! How the bus reaches Redis: the one place that knows the topology.
//!
//! [`Connector`] makes the two kinds of connection the bus uses: the shared one for every
//! non-blocking command ([`Connector::commands`]) and dedicated ones for blocking reads
//! ([`Connector::blocking`]), which hold a socket for their whole wait. [`Connection`] is what
//! both return; it speaks [`ConnectionLike`], so commands, pipelines and scripts run on it the
//! same way whatever the topology. The Sentinel topology lives in `crate::sentinel`.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};

use crate::Error;
use crate::sentinel::{SentinelConnection, Sentinels, Shared};

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Topology {
    /// One server at [`crate::RedisOptions::url`] (or a proxy in front of several).
    #[default]
    Single,
    /// A master watched by Redis Sentinel, found through the sentinels and followed across
    /// failovers; [`crate::RedisOptions::url`] gives only its credentials, database and TLS.
    Sentinel(Sentinels),
}

/// A connection to Redis, of whichever topology. Cheap to clone: clones share the socket.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server, reconnecting by itself after a failure.
    Single(ConnectionManager),
    /// Whichever server the sentinels name as master.
    Sentinel(SentinelConnection),
}

impl Connection {
    /// Says that something run on this connection was refused as by a server that is no master
    /// (inside a reply, where the connection cannot see it): the Sentinel topology looks again.
    pub(crate) fn suspect_master(&self) {
        match self {
            Connection::Single(_) => {}
            Connection::Sentinel(connection) => connection.suspect(),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
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
            Connection::Sentinel(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            Connection::Sentinel(connection) => connection.get_db(),
        }
    }
}

/// Makes connections for one topology.
pub(crate) struct Connector {
    target: Target,
    connect_timeout: Duration,
}

/// What a [`Connector`] connects to.
enum Target {
    Single(Box<Client>),
    Sentinel(Arc<Shared>),
}

impl Connector {
    /// A connector for `url` under `topology`. Nothing is connected yet.
    ///
    /// # Errors
    /// The URL cannot be parsed.
    pub(crate) fn new(url: &str, topology: &Topology, connect_timeout: Duration) -> Result<Connector, Error> {
        match topology {
            Topology::Single => Ok(Connector {
                target: Target::Single(Box::new(Client::open(url).map_err(Error::from)?)),
                connect_timeout,
            }),
            Topology::Sentinel(sentinels) => Ok(Connector {
                target: Target::Sentinel(Arc::new(Shared::new(url, sentinels, connect_timeout)?)),
                connect_timeout,
            }),
        }
    }

    /// A connection for non-blocking commands, failing a command that takes longer than
    /// `response_timeout`. Connects on first use.
    ///
    /// # Errors
    /// The connection cannot be set up.
    pub(crate) fn commands(&self, response_timeout: Duration) -> Result<Connection, Error> {
        self.single(Some(response_timeout))
    }

    /// A connection of its own for one blocking read at a time (no response timeout: the read
    /// waits as long as it blocks). Connects on first use.
    ///
    /// # Errors
    /// The connection cannot be set up.
    pub(crate) fn blocking(&self) -> Result<Connection, Error> {
        self.single(None)
    }

    fn single(&self, response_timeout: Option<Duration>) -> Result<Connection, Error> {
        match &self.target {
            Target::Single(client) => ConnectionManager::new_lazy_with_config(
                Client::clone(client),
                manager_config(self.connect_timeout, response_timeout),
            )
            .map(Connection::Single)
            .map_err(Error::from),
            Target::Sentinel(shared) => Ok(Connection::Sentinel(shared.connection(response_timeout))),
        }
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
