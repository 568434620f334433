//! Redis Sentinel: the master is found through the sentinels, and followed when they fail over.
//!
//! redis-rs's sentinel client finds a master once; it does not notice a failover. Here one
//! [`Shared`] per bus holds the current master (its address, a client for it and a generation
//! number, swapped whole) and the [`Sentinel`] client that looks it up. Every [`SentinelConnection`]
//! binds a connection manager to the master of one generation and runs each command on it; when
//! the generation moves on, the next command binds a new one (so an idle pooled blocking connection
//! made for an old master is dropped on its next use, never used against it).
//!
//! What makes a lookup: a command that fails because the master is gone or is no master any more
//! (`READONLY` from a demoted master that still accepts connections, `UNBLOCKED` when a blocked
//! read is cut off by the role change, a refused, dropped or timed-out connection), and a periodic
//! check while the bus is in use ([`Sentinels::check_interval`]), so a switch is noticed even
//! when nothing fails. Lookups are single-flight: one runs at a time, a failure that comes while
//! one runs starts none, a lookup that finds the generation it was asked about already
//! replaced does nothing, and a caller that waited while another lookup ran takes that lookup's
//! answer, found or failed, instead of asking again (so at a cold start with unreachable
//! sentinels, commands waiting for a master do not each run a full lookup in turn). Lookups run
//! as tasks of their own, so a command that gives up waiting (its response timeout bounds the
//! wait) does not cut one short. The failed command returns its error, which [`crate::Error`] sorts as
//! `Unavailable`: the caller's retry goes to the new master.
//!
//! A lookup asks the sentinels one at a time for the masters they monitor (`SENTINEL MASTERS`)
//! and accepts the named master only once it answers `ROLE` as a master (redis-rs's
//! [`Sentinel::async_master_for`], one client per sentinel); a sentinel that does not answer in
//! time is asked last from then on. Until the sentinels have promoted a replica the old address is
//! kept, and commands keep failing as retryable.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsMode, Value,
};
use tracing::{debug, info, warn};

use crate::connection::manager_config;
use crate::{Error, Tls};

/// Where the sentinels are, which master they watch, and how to authenticate to them.
///
/// The sentinels have their own credentials and TLS: a `rediss://` sentinel URL speaks TLS to that
/// sentinel, and a sentinel URL's user and password, or else [`Sentinels::username`] and
/// [`Sentinels::password`], authenticate to it. The master is reached with the credentials,
/// database and TLS of [`crate::RedisOptions::url`], whose host and port are not used.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Sentinels {
    /// `redis://[user:password@]host:port` or `rediss://...` of each sentinel, asked in this order.
    pub urls: Vec<String>,
    /// The name the sentinels monitor the master under (`sentinel monitor <name> ...`).
    pub master_name: String,
    /// User for the sentinels whose URL names none.
    pub username: Option<String>,
    /// Password for the sentinels whose URL names none.
    pub password: Option<String>,
    /// How often the sentinels are asked for the master while the bus is in use, failure or not;
    /// `None`: only when a command fails.
    pub check_interval: Option<Duration>,
}

/// Masks every password.
impl fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|url| toolhost_settings::mask_url(url)).collect();
        f.debug_struct("Sentinels")
            .field("urls", &urls)
            .field("master_name", &self.master_name)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("check_interval", &self.check_interval)
            .finish()
    }
}

/// How long after a lookup another one is not started for a failure: failures come in bursts
/// (every in-flight command fails at once) and the callers back off anyway.
const MIN_LOOKUP_INTERVAL: Duration = Duration::from_millis(200);

/// The master of one generation.
struct Master {
    generation: u64,
    /// `host:port`, for logs and for noticing a change.
    address: String,
    client: Client,
}

/// The lookup state, used by one lookup at a time.
struct Lookup {
    /// One redis-rs client per sentinel, in the order they are asked (one that did not answer in
    /// time is moved to the end).
    sentinels: Vec<(ConnectionInfo, SentinelClient)>,
    last: Option<Instant>,
    /// What the last lookup failed with; `None` when it found a master (or none ran yet).
    failure: Option<RedisError>,
}

/// The state every connection of one bus shares: the current master and the sentinels.
pub(crate) struct Shared {
    master_name: String,
    /// How the master is reached: its credentials, database and TLS.
    master: ConnectionInfo,
    /// The CA and client certificate of every `rediss://` connection, sentinels' and master's.
    tls: Tls,
    db: i64,
    connect_timeout: Duration,
    /// How long one sentinel may take to name the master, its `ROLE` check included.
    per_sentinel: Duration,
    current: ArcSwapOption<Master>,
    lookup: tokio::sync::Mutex<Lookup>,
    /// Lookups finished, counted under the `lookup` lock: a caller that sees it move while it
    /// waited for the lock takes the answer of the lookup that just finished.
    lookups: AtomicU64,
    /// A background lookup has been started and not finished.
    refreshing: AtomicBool,
    /// The periodic check has been started.
    checking: AtomicBool,
    check_interval: Option<Duration>,
    /// The last lookup failed: the next failure is logged at debug level only.
    failing: AtomicBool,
}

impl Shared {
    /// The state for the master named in `sentinels`, reached with the credentials, database and
    /// TLS of `url`; `tls` for every `rediss://` connection. Nothing is connected yet.
    ///
    /// # Errors
    /// A URL cannot be parsed, `url` is a Unix socket, or there is no sentinel.
    pub(crate) fn new(
        url: &str,
        sentinels: &Sentinels,
        tls: &Tls,
        connect_timeout: Duration,
    ) -> Result<Shared, Error> {
        let invalid = |message: String| {
            Error::from(RedisError::from((redis::ErrorKind::InvalidClientConfig, "sentinel", message)))
        };
        let master = url.into_connection_info().map_err(Error::from)?;
        if tls_mode(master.addr()).is_err() {
            return Err(invalid("the master is reached over TCP: url must be redis:// or rediss://".into()));
        }
        let infos = sentinels
            .urls
            .iter()
            .map(|url| sentinel_info(url, sentinels))
            .collect::<RedisResult<Vec<ConnectionInfo>>>()
            .map_err(Error::from)?;
        if infos.is_empty() {
            return Err(invalid("no sentinel is configured".into()));
        }
        // One client per sentinel, asked one at a time: redis-rs's client for several takes their
        // answers in order, so one that accepts connections but never answers (stopped,
        // overloaded) would hold up every lookup.
        let clients = infos
            .into_iter()
            .map(|info| Ok((info.clone(), sentinel_client(&info, &sentinels.master_name, &master, tls)?)))
            .collect::<RedisResult<Vec<_>>>()
            .map_err(Error::from)?;
        Ok(Shared {
            master_name: sentinels.master_name.clone(),
            master: master.clone(),
            tls: tls.clone(),
            db: master.redis_settings().db(),
            connect_timeout,
            // A sentinel's answer, then the master's ROLE check: a connect timeout each.
            per_sentinel: connect_timeout.saturating_mul(2),
            current: ArcSwapOption::empty(),
            lookup: tokio::sync::Mutex::new(Lookup { sentinels: clients, last: None, failure: None }),
            lookups: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            checking: AtomicBool::new(false),
            check_interval: sentinels.check_interval,
            failing: AtomicBool::new(false),
        })
    }

    /// A connection handle to the current master: clones share one socket per master.
    pub(crate) fn connection(self: &Arc<Self>, response_timeout: Option<Duration>) -> SentinelConnection {
        SentinelConnection { shared: Arc::clone(self), bound: Arc::new(Mutex::new(None)), response_timeout }
    }

    fn generation(&self) -> u64 {
        self.current.load().as_ref().map_or(0, |master| master.generation)
    }

    /// The current master, looked up first if none is known yet. The lookup runs as a task of
    /// its own: a caller that stops waiting does not cancel it half-way.
    async fn master(self: &Arc<Self>) -> RedisResult<Arc<Master>> {
        if let Some(master) = self.current.load_full() {
            return Ok(master);
        }
        let shared = Arc::clone(self);
        tokio::spawn(async move { shared.refresh(0, None).await }).await.map_err(|err| {
            RedisError::from((redis::ErrorKind::Io, "sentinel lookup ended", err.to_string()))
        })??;
        self.start_checking();
        self.current.load_full().ok_or_else(|| {
            RedisError::from((redis::ErrorKind::MasterNameNotFoundBySentinel, "no master known yet"))
        })
    }

    /// Asks the sentinels for the master, unless generation `seen` has already been replaced,
    /// another lookup finished while this one waited for its turn (its answer is returned: its
    /// error, or `false`), or, when there is a master already, a lookup ran moments ago; swaps in
    /// the master they name when it is another one. `reason`: the failure that asks, if one
    /// does. Whether a lookup ran.
    async fn refresh(&self, seen: u64, reason: Option<&str>) -> RedisResult<bool> {
        let finished = self.lookups.load(Ordering::Acquire);
        let mut lookup = self.lookup.lock().await;
        let current = self.current.load_full();
        let generation = current.as_ref().map_or(0, |master| master.generation);
        if generation != seen {
            return Ok(false);
        }
        if self.lookups.load(Ordering::Acquire) != finished {
            return lookup.failure.clone().map_or(Ok(false), Err);
        }
        if current.is_some() && lookup.last.is_some_and(|last| last.elapsed() < MIN_LOOKUP_INTERVAL) {
            return Ok(false);
        }
        if let (Some(reason), Some(current)) = (reason, &current) {
            debug!(master_name = %self.master_name, master = %current.address, %reason, "asking the sentinels for the master after a failure");
        }
        let found = self.ask(&mut lookup).await;
        lookup.last = Some(Instant::now());
        lookup.failure = found.as_ref().err().cloned();
        self.lookups.fetch_add(1, Ordering::AcqRel);
        let client = found?;
        let address = address(client.get_connection_info().addr());
        match current {
            Some(current) if current.address == address => {}
            Some(current) => {
                warn!(
                    master_name = %self.master_name,
                    master = %address,
                    previous = %current.address,
                    generation = generation + 1,
                    "redis master changed; following the sentinels to it"
                );
                self.current.store(Some(Arc::new(Master { generation: generation + 1, address, client })));
            }
            None => {
                info!(master_name = %self.master_name, master = %address, "redis master found through the sentinels");
                self.current.store(Some(Arc::new(Master { generation: generation + 1, address, client })));
            }
        }
        Ok(true)
    }

    /// Asks the sentinels one at a time for the master (each checks it with `ROLE`); the first
    /// that names one wins. A sentinel that does not answer within `per_sentinel` gets a fresh
    /// connection next time and is asked last from now on.
    async fn ask(&self, lookup: &mut Lookup) -> RedisResult<Client> {
        let mut not_found = None;
        let mut failed = None;
        let mut slow = Vec::new();
        let mut found = None;
        for (index, (info, sentinel)) in lookup.sentinels.iter_mut().enumerate() {
            match tokio::time::timeout(self.per_sentinel, sentinel.async_get_client()).await {
                Ok(Ok(client)) => {
                    found = Some(client);
                    break;
                }
                Ok(Err(err)) if err.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel => {
                    not_found = Some(err)
                }
                Ok(Err(err)) => failed = Some(err),
                Err(_elapsed) => {
                    *sentinel = sentinel_client(info, &self.master_name, &self.master, &self.tls)?;
                    slow.push(index);
                    failed = Some(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "a sentinel did not name a master within {} ms",
                            self.per_sentinel.as_millis()
                        ),
                    )));
                }
            }
        }
        for index in slow.into_iter().rev() {
            let entry = lookup.sentinels.remove(index);
            lookup.sentinels.push(entry);
        }
        match (found, failed, not_found) {
            (Some(client), _, _) => Ok(client),
            // A failure (unreachable sentinel or master, timeout) says more than "not found".
            (None, Some(err), _) | (None, None, Some(err)) => Err(err),
            (None, None, None) => Err(RedisError::from((redis::ErrorKind::EmptySentinelList, "no sentinel"))),
        }
    }

    /// Starts a lookup in the background for a failure seen on generation `seen`, unless one runs.
    fn refresh_soon(self: &Arc<Self>, seen: u64, reason: &dyn fmt::Display) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let reason = reason.to_string();
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let result = shared.refresh(seen, Some(&reason)).await;
            shared.report(result);
            shared.refreshing.store(false, Ordering::Release);
        });
    }

    /// Logs a failed lookup once per run of failures (the callers retry, so one failover makes
    /// many), the rest at debug level.
    fn report(&self, result: RedisResult<bool>) {
        match result {
            Ok(false) => {}
            Ok(true) => self.failing.store(false, Ordering::Release),
            Err(err) => {
                let err = Error::from(err);
                if self.failing.swap(true, Ordering::AcqRel) {
                    debug!(master_name = %self.master_name, error = %err, "the sentinels name no reachable master yet");
                } else {
                    warn!(
                        master_name = %self.master_name,
                        error = %err,
                        "the sentinels name no reachable master yet; asking again while commands fail"
                    );
                }
            }
        }
    }

    /// Starts the periodic check, once; it ends when the last connection is dropped.
    fn start_checking(self: &Arc<Self>) {
        let Some(interval) = self.check_interval else { return };
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Shared> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                let seen = shared.generation();
                let result = shared.refresh(seen, None).await;
                shared.report(result);
            }
        });
    }
}

/// The TLS mode of a TCP address (`None`: plain TCP); `Err` for a Unix socket.
fn tls_mode(addr: &ConnectionAddr) -> Result<Option<TlsMode>, ()> {
    match addr {
        ConnectionAddr::Tcp(..) => Ok(None),
        ConnectionAddr::TcpTls { insecure: true, .. } => Ok(Some(TlsMode::Insecure)),
        ConnectionAddr::TcpTls { insecure: false, .. } => Ok(Some(TlsMode::Secure)),
        _ => Err(()),
    }
}

/// A client of the sentinel at `sentinel` for the master `master_name`, which it reaches with
/// the credentials, database and TLS of `master`; `tls` for the sentinel and the master alike
/// where they speak TLS.
fn sentinel_client(
    sentinel: &ConnectionInfo,
    master_name: &str,
    master: &ConnectionInfo,
    tls: &Tls,
) -> RedisResult<SentinelClient> {
    let settings = master.redis_settings();
    let mut builder =
        SentinelClientBuilder::new([sentinel.addr().clone()], master_name, SentinelServerType::Master)?
            .set_client_to_redis_db(settings.db())
            .set_client_to_redis_protocol(settings.protocol());
    if let Some(username) = settings.username() {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = settings.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    // Checked in `Shared::new`: the master is reached over TCP.
    if let Ok(Some(mode)) = tls_mode(master.addr()) {
        builder = builder.set_client_to_redis_tls_mode(mode);
    }
    let own = sentinel.redis_settings();
    if let Some(username) = own.username() {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = own.password() {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(certificates) = tls.certificates() {
        if matches!(tls_mode(master.addr()), Ok(Some(_))) {
            builder = builder.set_client_to_redis_certificates(certificates.clone());
        }
        // redis-rs refuses certificates for a sentinel reached over plain TCP.
        if matches!(tls_mode(sentinel.addr()), Ok(Some(_))) {
            builder = builder.set_client_to_sentinel_certificates(certificates);
        }
    }
    builder.build()
}

/// A sentinel's connection information, with the configured user and password when its URL
/// names none.
fn sentinel_info(url: &str, sentinels: &Sentinels) -> RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if settings.username().is_none()
        && let Some(username) = &sentinels.username
    {
        settings = settings.set_username(username);
    }
    if settings.password().is_none()
        && let Some(password) = &sentinels.password
    {
        settings = settings.set_password(password);
    }
    Ok(info.set_redis_settings(settings))
}

/// `host:port` of a TCP address.
fn address(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

/// Whether a failure says the master is gone or is no master any more.
fn points_elsewhere(err: &RedisError) -> bool {
    matches!(err.code(), Some("READONLY" | "MASTERDOWN"))
        || (err.code() == Some("UNBLOCKED")
            && err.detail().is_some_and(|detail| detail.contains("state changed")))
        || err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
}

/// The error reply in a reply (or among a pipeline's replies) that says the master is no master
/// any more, as `CODE detail`: server errors come back as such values, not as `Err`.
fn refusal_in(value: &Value) -> Option<String> {
    match value {
        Value::ServerError(err) if matches!(err.code(), "READONLY" | "MASTERDOWN") => {
            Some(format!("{} {}", err.code(), err.details().unwrap_or_default()))
        }
        Value::Array(items) => {
            items.iter().filter(|item| matches!(item, Value::ServerError(_))).find_map(refusal_in)
        }
        _ => None,
    }
}

/// A connection to whichever server the sentinels name as master.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<Shared>,
    /// The connection manager for the master of one generation, shared by this handle's clones.
    bound: Arc<Mutex<Option<(u64, ConnectionManager)>>>,
    response_timeout: Option<Duration>,
}

impl SentinelConnection {
    /// The connection to the current master, made when the master changed. Waiting for a
    /// master to be found is bounded by the response timeout, when there is one.
    async fn current(&self) -> RedisResult<(u64, ConnectionManager)> {
        let master = match self.response_timeout {
            Some(limit) => {
                tokio::time::timeout(limit, self.shared.master()).await.map_err(|_elapsed| {
                    RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the sentinels named no master within {} ms", limit.as_millis()),
                    ))
                })??
            }
            None => self.shared.master().await?,
        };
        // A poisoned lock only means a panic while the slot was replaced; the slot is still whole.
        let mut bound = self.bound.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((generation, connection)) = bound.as_ref()
            && *generation == master.generation
        {
            return Ok((*generation, connection.clone()));
        }
        let config = manager_config(self.shared.connect_timeout, self.response_timeout);
        let connection = ConnectionManager::new_lazy_with_config(master.client.clone(), config)?;
        *bound = Some((master.generation, connection.clone()));
        Ok((master.generation, connection))
    }

    /// Starts a lookup when `result` says the master of `generation` is gone or demoted.
    fn check<T>(&self, generation: u64, result: &RedisResult<T>, refusal: impl Fn(&T) -> Option<String>) {
        match result {
            Ok(reply) => {
                if let Some(refusal) = refusal(reply) {
                    self.shared.refresh_soon(generation, &refusal);
                }
            }
            Err(err) if points_elsewhere(err) => self.shared.refresh_soon(generation, err),
            Err(_) => {}
        }
    }

    /// Starts a lookup: something this connection ran was refused as by a server that is no
    /// master (an error inside a script's reply, which the connection cannot see).
    pub(crate) fn suspect(&self) {
        let bound = self.bound.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((generation, _)) = bound.as_ref() {
            self.shared.refresh_soon(*generation, &"a write refused inside a script (READONLY)");
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut connection) = self.current().await?;
            let result = connection.req_packed_command(cmd).await;
            self.check(generation, &result, refusal_in);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut connection) = self.current().await?;
            let result = connection.req_packed_commands(pipeline, offset, count).await;
            self.check(generation, &result, |replies: &Vec<Value>| replies.iter().find_map(refusal_in));
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_masks_every_password() {
        let sentinels = Sentinels {
            urls: vec!["redis://:s3cret@10.0.0.1:26379".into(), "rediss://ops:s3cret@10.0.0.2:26379".into()],
            master_name: "mymaster".into(),
            username: Some("ops".into()),
            password: Some("hunter2".into()),
            check_interval: None,
        };
        let printed = format!("{sentinels:?}");
        assert!(!printed.contains("s3cret") && !printed.contains("hunter2"), "{printed}");
        assert!(
            printed.contains("redis://:***@10.0.0.1:26379") && printed.contains("rediss://ops:***@"),
            "{printed}"
        );
    }

    #[test]
    fn sentinels_get_the_configured_credentials_unless_their_url_has_some() {
        let sentinels = Sentinels {
            urls: vec![],
            master_name: "m".into(),
            username: Some("ops".into()),
            password: Some("pw".into()),
            check_interval: None,
        };
        let plain = sentinel_info("redis://127.0.0.1:26379", &sentinels).unwrap();
        assert_eq!(
            (plain.redis_settings().username(), plain.redis_settings().password()),
            (Some("ops"), Some("pw"))
        );
        let own = sentinel_info("rediss://me:mine@127.0.0.1:26379", &sentinels).unwrap();
        assert_eq!(
            (own.redis_settings().username(), own.redis_settings().password()),
            (Some("me"), Some("mine"))
        );
        assert!(matches!(own.addr(), ConnectionAddr::TcpTls { .. }));
    }

    #[test]
    fn the_master_url_must_be_tcp_and_a_sentinel_is_required() {
        let sentinels = Sentinels {
            urls: vec!["redis://127.0.0.1:26379".into()],
            master_name: "m".into(),
            ..Sentinels::default()
        };
        assert!(
            Shared::new("unix:///run/redis.sock", &sentinels, &Tls::default(), Duration::from_secs(1))
                .is_err()
        );
        assert!(
            Shared::new(
                "redis://127.0.0.1:6379",
                &Sentinels::default(),
                &Tls::default(),
                Duration::from_secs(1)
            )
            .is_err()
        );
        let shared =
            Shared::new("rediss://:pw@ignored:1/3", &sentinels, &Tls::default(), Duration::from_secs(1))
                .unwrap();
        assert_eq!(shared.db, 3);
    }

    /// A handle made before a switch (a pooled blocking connection, the batchers' clone of the
    /// command connection) binds to the new master on its next use, and its clones with it.
    #[tokio::test]
    async fn connections_rebind_when_the_master_changes() {
        let sentinels = Sentinels {
            urls: vec!["redis://127.0.0.1:1".into()],
            master_name: "m".into(),
            ..Sentinels::default()
        };
        let shared = Arc::new(
            Shared::new("redis://127.0.0.1:2", &sentinels, &Tls::default(), Duration::from_secs(1)).unwrap(),
        );
        let switch = |generation: u64, port: u16| {
            let client = Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            shared.current.store(Some(Arc::new(Master {
                generation,
                address: format!("127.0.0.1:{port}"),
                client,
            })));
        };
        switch(1, 7001);
        let commands = shared.connection(Some(Duration::from_secs(1)));
        let batcher = commands.clone();
        let blocking = shared.connection(None);
        assert_eq!(commands.current().await.unwrap().0, 1);
        assert_eq!(blocking.current().await.unwrap().0, 1);
        switch(2, 7002);
        assert_eq!(batcher.current().await.unwrap().0, 2);
        assert_eq!(blocking.current().await.unwrap().0, 2);
        // The clones share one binding: the command connection is one socket per master.
        assert_eq!(commands.bound.lock().unwrap().as_ref().map(|(generation, _)| *generation), Some(2));
        assert!(!Arc::ptr_eq(&commands.bound, &blocking.bound));
    }

    /// At a cold start with sentinels that accept connections and never answer, commands waiting
    /// for a master share the lookup that runs instead of each running one in turn, and a command
    /// with a response timeout stops waiting after it.
    #[tokio::test]
    async fn callers_waiting_for_a_lookup_take_its_answer() {
        // Bound and listening, never accepting: connections complete and nothing is answered.
        let silent = [
            std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
            std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        ];
        let sentinels = Sentinels {
            urls: silent
                .iter()
                .map(|listener| format!("redis://{}", listener.local_addr().unwrap()))
                .collect(),
            master_name: "m".into(),
            ..Sentinels::default()
        };
        // Two sentinels of 2 x 100 ms each: one lookup takes about 400 ms.
        let shared = Arc::new(
            Shared::new("redis://127.0.0.1:2", &sentinels, &Tls::default(), Duration::from_millis(100))
                .unwrap(),
        );
        let started = Instant::now();
        let waiting: Vec<_> = (0..6)
            .map(|_| {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move { shared.master().await.map(|_| ()) })
            })
            .collect();
        for waiter in waiting {
            let err = waiter.await.unwrap().unwrap_err();
            assert!(err.is_timeout() || err.is_io_error(), "{err:?}");
        }
        let took = started.elapsed();
        // In turn, six lookups would take about 2.4 s; shared, one or two.
        assert!(took < Duration::from_millis(1_300), "took {took:?}");
        assert!(shared.lookups.load(Ordering::Acquire) <= 2, "{}", shared.lookups.load(Ordering::Acquire));

        let commands = shared.connection(Some(Duration::from_millis(150)));
        let started = Instant::now();
        let err = commands.current().await.map(|_| ()).unwrap_err();
        assert!(err.is_timeout(), "{err:?}");
        assert!(started.elapsed() < Duration::from_millis(350), "took {:?}", started.elapsed());
    }

    #[test]
    fn failures_that_say_the_master_moved_are_recognised() {
        let readonly = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "READONLY",
            "You can't write against a read only replica.".to_owned(),
        ));
        assert!(points_elsewhere(&readonly), "{readonly:?}");
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(points_elsewhere(&refused));
        let wrongtype = RedisError::from((redis::ErrorKind::Client, "WRONGTYPE", "nope".to_owned()));
        assert!(!points_elsewhere(&wrongtype));
    }
}
