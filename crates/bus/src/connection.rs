//! How the bus reaches Redis: the one place that knows the topology.
//!
//! [`Connector`] makes the two kinds of connection the bus uses: the shared one for every
//! non-blocking command ([`Connector::commands`]) and dedicated ones for blocking reads
//! ([`Connector::blocking`]), which hold a socket for their whole wait. [`Connection`] is what
//! both return; it speaks [`ConnectionLike`], so commands, pipelines and scripts run on it the
//! same way whatever the topology.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};

use crate::Error;

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Topology {
    /// One server at [`crate::RedisOptions::url`] (or a proxy in front of several).
    #[default]
    Single,
}

/// A connection to Redis, of whichever topology. Cheap to clone: clones share the socket.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server, reconnecting by itself after a failure.
    Single(ConnectionManager),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
        }
    }
}

/// Makes connections for one topology.
pub(crate) struct Connector {
    client: Client,
    connect_timeout: Duration,
}

impl Connector {
    /// A connector for `url` under `topology`. Nothing is connected yet.
    ///
    /// # Errors
    /// The URL cannot be parsed.
    pub(crate) fn new(url: &str, topology: &Topology, connect_timeout: Duration) -> Result<Connector, Error> {
        match topology {
            Topology::Single => {
                Ok(Connector { client: Client::open(url).map_err(Error::from)?, connect_timeout })
            }
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
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(response_timeout)
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map(Connection::Single)
            .map_err(Error::from)
    }
}
