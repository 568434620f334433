//! Errors of the transport, sorted by what the caller should do next.

use std::fmt;

/// A failed bus operation.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis could not be reached, the connection broke, or the server is in a passing state
    /// (loading, out of memory, failing over...): back off and retry; the connection manager
    /// reconnects on the next command.
    #[error("redis unavailable: {0}")]
    Unavailable(#[source] Cause),
    /// The consumer group is gone (Redis lost its data): create it again, then retry.
    #[error("consumer group missing: {0}")]
    NoGroup(#[source] Cause),
    /// Redis refused the command: retrying the same command will not help.
    #[error("redis refused the command: {0}")]
    Refused(#[source] Cause),
    /// A plain-read cursor names a message id that is not in the topic.
    #[error("cursor {0} is neither an entry id nor a message id in the topic")]
    CursorNotFound(String),
    /// Redis answered with something this crate did not expect.
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
    /// A TLS connection failed in a way retrying will not mend: the server's certificate is not
    /// trusted, the server refused the client certificate, or it does not speak TLS. Fix the
    /// configuration (`ca_file`, the client certificate, the URL); the message says which.
    #[error("redis {0}")]
    Tls(String),
    /// An entry was written, but fewer replicas than asked for acknowledged it within the
    /// timeout (`WAIT`, [`crate::RedisOptions::publish_acks`]): a failover now could lose it.
    /// Whether it survives is unknown; a request sent again with the same `request_id` is safe
    /// either way (the tool host runs and answers a request id once).
    #[error(
        "entry {entry_id} was written, but {acked} of the {wanted} replicas asked for acknowledged it \
         within {} ms: a failover now could lose it",
        timeout.as_millis()
    )]
    Unreplicated {
        /// The entry written on the master.
        entry_id: String,
        /// How many replicas acknowledged it in time.
        acked: u32,
        /// How many were asked for.
        wanted: u32,
        /// How long they were waited for.
        timeout: std::time::Duration,
    },
}

/// What went wrong, as Redis or the connection said it: the server's error code (`OOM`,
/// `NOGROUP`, ...) when there is one, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    code: Option<String>,
    message: String,
}

impl Cause {
    /// A server error reply: its code and the rest of its message.
    pub fn server(code: &str, message: impl Into<String>) -> Cause {
        Cause { code: Some(code.to_owned()), message: message.into() }
    }

    /// A failure without a server error code (connection, client, script runtime).
    pub fn other(message: impl Into<String>) -> Cause {
        Cause { code: None, message: message.into() }
    }

    /// Reads an error reply as Redis writes it, `CODE message`: the code is the leading word when
    /// it is upper case (Lua runtime errors such as `user_script:3: ...` have none).
    pub fn parse(reply: &str) -> Cause {
        let (first, rest) = reply.split_once(' ').unwrap_or((reply, ""));
        let is_code = !first.is_empty()
            && first.bytes().all(|byte| byte.is_ascii_uppercase() || byte.is_ascii_digit() || byte == b'_')
            && first.bytes().next().is_some_and(|byte| byte.is_ascii_uppercase());
        if is_code { Cause::server(first, rest) } else { Cause::other(reply) }
    }

    /// The server's error code, if the error came from the server.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The message, without the code.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) if self.message.is_empty() => f.write_str(code),
            Some(code) => write!(f, "{code} {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Cause {}

/// Server error codes that say "not now": the server loads its data (`LOADING`), runs a long
/// script (`BUSY`), fails over or resharding (`TRYAGAIN`, `MASTERDOWN`, `READONLY`,
/// `CLUSTERDOWN`), moved a slot the client had not heard of yet (`MOVED`, `ASK`: the cluster
/// client follows these itself, so one reaches the bus only when its retries ran out), is out of
/// memory under `noeviction` (`OOM`), cannot persist (`MISCONF`) or has too few replicas in sync
/// under `min-replicas-to-write` (`NOREPLICAS`), or lacks a script (`NOSCRIPT`: a replica just
/// promoted, or a `SCRIPT FLUSH`; the script is loaded again on the next attempt, also when the
/// load of the failed attempt went to a node the cluster client had not yet learnt was gone).
/// Each passes without anyone changing the command.
const RETRYABLE_CODES: &[&str] = &[
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "MASTERDOWN",
    "READONLY",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "OOM",
    "MISCONF",
    "NOREPLICAS",
    "NOSCRIPT",
];

impl Error {
    /// Whether waiting and retrying the same operation can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::NoGroup(_))
    }

    /// The error a server error reply stands for, by its code; the same rule for a top-level
    /// reply and for an error raised inside a script.
    pub fn from_cause(cause: Cause) -> Error {
        match cause.code() {
            // A blocked read cut off because the server turned replica (a failover): "UNBLOCKED
            // force unblock from blocking operation, instance state changed (master -> replica?)".
            Some("UNBLOCKED") if cause.message().contains("state changed") => Error::Unavailable(cause),
            // UNBLOCKED: the stream was deleted under a blocked XREADGROUP, so its group is gone too.
            Some("NOGROUP" | "UNBLOCKED") => Error::NoGroup(cause),
            Some(code) if RETRYABLE_CODES.contains(&code) => Error::Unavailable(cause),
            _ => Error::Refused(cause),
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Error {
        if let Some(problem) = crate::tls::problem(&err) {
            return Error::Tls(problem);
        }
        let cause = match err.code() {
            Some(code) => Cause::server(code, err.detail().unwrap_or_default()),
            None => Cause::other(err.to_string()),
        };
        let unreachable = err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
            || matches!(
                err.retry_method(),
                redis::RetryMethod::Reconnect
                    | redis::RetryMethod::WaitAndRetry
                    | redis::RetryMethod::RetryImmediately
            );
        match Error::from_cause(cause) {
            Error::Refused(cause) if unreachable => Error::Unavailable(cause),
            err => err,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_are_sorted_by_their_code() {
        for reply in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "MISCONF Redis is configured to save RDB snapshots",
            "CLUSTERDOWN The cluster is down",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
            "NOREPLICAS Not enough good replicas to write.",
            "NOSCRIPT No matching script. Please use EVAL.",
        ] {
            assert!(Error::from_cause(Cause::parse(reply)).is_retryable(), "{reply}");
        }
        let nogroup = Error::from_cause(Cause::parse("NOGROUP No such key 'x' or consumer group 'g'"));
        assert!(matches!(nogroup, Error::NoGroup(_)));
        for reply in
            ["WRONGTYPE Operation against a key holding the wrong kind of value", "user_script:3: boom"]
        {
            assert!(matches!(Error::from_cause(Cause::parse(reply)), Error::Refused(_)), "{reply}");
        }
        let demoted = Error::from_cause(Cause::parse(
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
        ));
        assert!(matches!(demoted, Error::Unavailable(_)), "{demoted}");
        let deleted = Error::from_cause(Cause::parse("UNBLOCKED the stream key no longer exists"));
        assert!(matches!(deleted, Error::NoGroup(_)), "{deleted}");
        let cause = Cause::parse("OOM command not allowed");
        assert_eq!((cause.code(), cause.message()), (Some("OOM"), "command not allowed"));
        assert_eq!(cause.to_string(), "OOM command not allowed");
        assert_eq!(Cause::parse("user_script:3: boom").code(), None);
    }

    /// A demoted master answers writes with READONLY: the caller must retry (on the new master),
    /// whether the reply comes as a client error or as a server error value.
    #[test]
    fn readonly_from_a_demoted_master_is_retryable() {
        let err = Error::from(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "READONLY",
            "You can't write against a read only replica.".to_owned(),
        )));
        assert!(matches!(err, Error::Unavailable(_)) && err.is_retryable(), "{err:?}");
    }
}
