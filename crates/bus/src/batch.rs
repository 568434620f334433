//! Coalesces concurrent invocations of one Lua script into a single `EVALSHA`.
//!
//! Under load many calls reach the same ledger step at once. Each on its own costs a round trip,
//! a socket write and a script invocation in Redis; together they cost one. A [`Batcher`] queues
//! invocations, and one task runs whatever is queued as one script call, without waiting for more:
//! a lone call goes out at once, and calls that arrive while a batch is in flight form the next.
//!
//! The batch script is generated from the single-item script: its body becomes a Lua function
//! with its own `KEYS` and `ARGV`, called once per item under `pcall`, so one item's error fails
//! only that item (each reply comes back as `{1, reply}` or `{0, error}`). Redis runs the whole batch atomically, which is stronger than each item needs.
//!
//! An error raised by `redis.call` reaches `pcall` as the error reply's text (`OOM command not
//! allowed ...`) or, on Redis versions that raise error tables, as a table whose `err` field holds
//! that text; either way the item's reply carries the text, code first, and the item's error is
//! sorted by that code like a top-level error reply.

use redis::{Script, Value};
use tokio::sync::{mpsc, oneshot};

use crate::Error;
use crate::connection::Connection;
use crate::error::Cause;

/// Most invocations in one batch.
const MAX_BATCH: usize = 128;

/// One queued invocation: its keys and arguments, and where its reply goes.
struct Item {
    keys: Vec<String>,
    args: Vec<String>,
    reply: oneshot::Sender<Result<Value, Error>>,
}

/// Runs invocations of one script, batched.
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Item>,
    keys_per_item: usize,
    args_per_item: usize,
}

impl Batcher {
    /// Starts the batching task for `script` (the single-item source), whose invocations take
    /// exactly `keys_per_item` keys and `args_per_item` arguments. Must be called inside a Tokio
    /// runtime; the task ends when the batcher is dropped.
    pub(crate) fn new(
        source: &str,
        keys_per_item: usize,
        args_per_item: usize,
        connection: Connection,
    ) -> Batcher {
        let (queue, receiver) = mpsc::unbounded_channel();
        let script = Script::new(&batch_source(source, keys_per_item, args_per_item));
        tokio::spawn(run(script, receiver, connection));
        Batcher { queue, keys_per_item, args_per_item }
    }

    /// Runs one invocation and returns its reply.
    pub(crate) async fn invoke(&self, keys: Vec<String>, args: Vec<String>) -> Result<Value, Error> {
        debug_assert_eq!(keys.len(), self.keys_per_item);
        debug_assert_eq!(args.len(), self.args_per_item);
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Item { keys, args, reply })
            .map_err(|_| Error::Protocol("the batching task has stopped".to_owned()))?;
        answer.await.map_err(|_| Error::Protocol("the batching task dropped a call".to_owned()))?
    }
}

async fn run(script: Script, mut receiver: mpsc::UnboundedReceiver<Item>, mut connection: Connection) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = receiver.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let mut invocation = script.prepare_invoke();
        invocation.arg(batch.len());
        for item in &batch {
            for key in &item.keys {
                invocation.key(key);
            }
            for arg in &item.args {
                invocation.arg(arg);
            }
        }
        let res: Result<Vec<Value>, Error> =
            invocation.invoke_async(&mut connection).await.map_err(Error::from);
        match res {
            Ok(replies) if replies.len() == batch.len() => {
                let mut demoted = false;
                for (item, reply) in batch.drain(..).zip(replies) {
                    let reply = item_reply(reply);
                    demoted |=
                        matches!(&reply, Err(Error::Unavailable(cause)) if cause.code() == Some("READONLY"));
                    let _ = item.reply.send(reply);
                }
                // A write refused inside the script: the server is a replica now.
                if demoted {
                    connection.suspect_master();
                }
            }
            Ok(replies) => {
                let message = format!("batch of {} got {} replies", batch.len(), replies.len());
                for item in batch.drain(..) {
                    let _ = item.reply.send(Err(Error::Protocol(message.clone())));
                }
            }
            Err(err) => {
                // Every item shares the fate of the call, and its kind: a retryable error stays
                // retryable.
                for item in batch.drain(..) {
                    let _ = item.reply.send(Err(err.clone()));
                }
            }
        }
    }
}

/// Unwraps one item's `{1, reply}` or `{0, error message}`.
///
/// Errors are not returned as nested error replies: the client would turn the whole batch's
/// reply into an error, failing every item for one item's fault. An item's error is sorted by its
/// Redis error code like a top-level error reply, so `OOM` inside an item is retried, not final.
fn item_reply(reply: Value) -> Result<Value, Error> {
    let Value::Array(parts) = reply else {
        return Err(Error::Protocol("malformed batch item reply".to_owned()));
    };
    let mut parts = parts.into_iter();
    match (parts.next(), parts.next()) {
        (Some(Value::Int(1)), reply) => Ok(reply.unwrap_or(Value::Nil)),
        (Some(Value::Int(0)), message) => {
            let message = message.and_then(|m| redis::from_redis_value::<String>(m).ok()).unwrap_or_default();
            Err(Error::from_cause(Cause::parse(&message)))
        }
        _ => Err(Error::Protocol("malformed batch item reply".to_owned())),
    }
}

/// The batch form of a single-item script.
fn batch_source(source: &str, keys_per_item: usize, args_per_item: usize) -> String {
    format!(
        "local function one(KEYS, ARGV)\n{source}\nend\n\
         local n = tonumber(ARGV[1])\n\
         local replies = {{}}\n\
         for i = 1, n do\n\
           local keys, argv = {{}}, {{}}\n\
           for j = 1, {keys_per_item} do keys[j] = KEYS[(i - 1) * {keys_per_item} + j] end\n\
           for j = 1, {args_per_item} do argv[j] = ARGV[1 + (i - 1) * {args_per_item} + j] end\n\
           local ok, reply = pcall(one, keys, argv)\n\
           if ok then replies[i] = {{1, reply}} else\n\
             if type(reply) == 'table' then reply = reply.err or reply.message end\n\
             replies[i] = {{0, tostring(reply)}}\n\
           end\n\
         end\n\
         return replies\n"
    )
}
