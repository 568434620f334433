//! Errors of the transport, sorted by what the caller should do next.

/// A failed bus operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis could not be reached or the connection broke: back off and retry; the connection
    /// manager reconnects on the next command.
    #[error("redis unavailable: {0}")]
    Unavailable(#[source] redis::RedisError),
    /// The consumer group is gone (Redis lost its data): create it again, then retry.
    #[error("consumer group missing: {0}")]
    NoGroup(#[source] redis::RedisError),
    /// Redis refused the command: retrying the same command will not help.
    #[error("redis refused the command: {0}")]
    Refused(#[source] redis::RedisError),
    /// A plain-read cursor names a message id that is not in the topic.
    #[error("cursor {0} is neither an entry id nor a message id in the topic")]
    CursorNotFound(String),
    /// Redis answered with something this crate did not expect.
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
}

impl Error {
    /// Whether waiting and retrying the same operation can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::NoGroup(_))
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Error {
        // UNBLOCKED: the stream was deleted under a blocked XREADGROUP, so its group is gone too.
        if matches!(err.code(), Some("NOGROUP" | "UNBLOCKED")) {
            return Error::NoGroup(err);
        }
        let unavailable = err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
            // LOADING (restart with AOF), BUSY scripts, fail-over: the server will be back.
            || matches!(err.code(), Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "READONLY"))
            || matches!(
                err.retry_method(),
                redis::RetryMethod::Reconnect | redis::RetryMethod::WaitAndRetry | redis::RetryMethod::RetryImmediately
            );
        if unavailable { Error::Unavailable(err) } else { Error::Refused(err) }
    }
}
