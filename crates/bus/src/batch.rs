//! Coalesces concurrent invocations of one Lua script into a single `EVALSHA`.
//!
//! Under load many calls reach the same ledger step at once. Each on its own costs a round trip,
//! a socket write and a script invocation in Redis; together they cost one. A [`Batcher`] queues
//! invocations, and one task runs whatever is queued as one script call, waiting on no timer: it
//! lets the tasks that are ready to run now queue theirs first (a few turns of the scheduler, see
//! [`gather`]), so a lone call goes out after one turn, the calls of one read go out together, and
//! calls that arrive while a batch is in flight form the next.
//!
//! The batch script is generated from the single-item script: its body becomes a Lua function
//! with its own `KEYS` and `ARGV`, called once per item under `pcall`, so one item's error fails
//! only that item (each reply comes back as `{1, reply}` or `{0, error}`). Redis runs the whole batch atomically, which is stronger than each item needs.
//!
//! An error raised by `redis.call` reaches `pcall` as the error reply's text (`OOM command not
//! allowed ...`) or, on Redis versions that raise error tables, as a table whose `err` field holds
//! that text; either way the item's reply carries the text, code first, and the item's error is
//! sorted by that code like a top-level error reply.
//!
//! On a Redis Cluster one script call may name keys of one slot only. Every item's keys share a
//! slot (the ledger places them so), but items of one batch need not: a batcher made
//! [`Batcher::new`] with `by_slot` splits each batch by the slot of its items' first keys and
//! runs one script call per slot, concurrently.
//!
//! A script written for batches ([`Batcher::for_batches`]) is run as it is: every call gives the
//! keys and arguments its items share once ([`Shared`]), then each item's own (an item's number of
//! keys may vary within bounds, the script reading it from the item's arguments), and the script
//! returns one reply per item, `{0, error}` for an item Redis refused (the script catches the
//! errors it expects item by item, with `redis.pcall`). Items with different shared parts go in
//! different calls. A call of several items that Redis refuses as a whole with an error retrying
//! will not mend (a script's `redis.call` meeting a key of another type) is run again item by
//! item, so that the item at fault fails alone; the script must be safe to run again for items it
//! had already written before it stopped.
//!
//! A batcher started [`Batcher::waiting`] for replicas sends `WAIT <replicas> <timeout>` after
//! each script call, in one pipeline with it on its connection (a connection kept for that
//! batcher alone, so the wait holds back nothing else): one `WAIT` covers every write of the
//! batch, and the pipeline cannot be split between two servers (a Sentinel connection rebinding
//! to a new master, a cluster client re-routing), so the count it returns is about these writes.
//! Each item's reply then comes with the number of replicas that acknowledged them
//! ([`Batcher::invoke_acked`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use redis::{Script, Value};
use tokio::sync::{mpsc, oneshot};

use crate::Error;
use crate::connection::Connection;
use crate::error::Cause;
use crate::slots;

/// Most invocations in one batch.
const MAX_BATCH: usize = 128;

/// Most turns of the scheduler a batch waits for more invocations (see [`gather`]).
const GATHER_TURNS: usize = 4;

/// The keys and arguments every item of one call of a script written for batches shares, given
/// once before the items' own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Shared {
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<String>,
}

/// One queued invocation: its keys and arguments, and where its reply goes.
struct Item {
    shared: Option<Arc<Shared>>,
    keys: Vec<String>,
    args: Vec<String>,
    reply: oneshot::Sender<Result<Acked, Error>>,
}

/// One item's reply, and how many replicas acknowledged the writes of its script call when the
/// batcher waits for replicas (`None` when it does not).
pub(crate) type Acked = (Value, Option<u32>);

/// The `WAIT` that follows every script call of a batcher started [`Batcher::waiting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    /// How many replicas must acknowledge.
    pub(crate) replicas: u32,
    /// How long the server waits for them (never 0, which `WAIT` takes as "for ever").
    pub(crate) timeout: std::time::Duration,
}

/// How a batch is laid out in one script call.
#[derive(Clone, Copy)]
enum Layout {
    /// The single-item script wrapped by [`batch_source`]: `ARGV[1]` is the number of items,
    /// each reply comes back as `{1, reply}` or `{0, error}`.
    Wrapped,
    /// A script written for batches: the shared keys and arguments, then the items'; one plain
    /// reply per item.
    Batch,
}

/// Runs invocations of one script, batched.
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Item>,
    /// The fewest and most keys an item may take.
    keys_per_item: (usize, usize),
    args_per_item: usize,
}

/// How one batching task runs its script calls.
#[derive(Clone, Copy)]
struct Mode {
    layout: Layout,
    /// Split each batch by the cluster slot of its items' first keys.
    by_slot: bool,
    /// Scheduler turns to gather more items for ([`gather`]).
    gather_turns: usize,
    /// Follow each script call with `WAIT`, in one pipeline.
    wait: Option<ReplicaWait>,
}

impl Batcher {
    /// Starts the batching task for `script` (the single-item source), whose invocations take
    /// exactly `keys_per_item` keys and `args_per_item` arguments; with `by_slot`, a batch is
    /// split by the cluster slot of each item's first key. Must be called inside a Tokio
    /// runtime; the task ends when the batcher is dropped.
    pub(crate) fn new(
        source: &str,
        keys_per_item: usize,
        args_per_item: usize,
        connection: Connection,
        by_slot: bool,
        gather: bool,
    ) -> Batcher {
        Batcher::waiting(source, keys_per_item, args_per_item, connection, by_slot, gather, None)
    }

    /// Like [`Batcher::new`], and with `wait` each script call is followed by `WAIT` on
    /// `connection` (see the module documentation), which must then serve this batcher alone:
    /// `WAIT` counts the replicas that have every write made on its connection so far, and holds
    /// that connection until they do or its timeout passes.
    pub(crate) fn waiting(
        source: &str,
        keys_per_item: usize,
        args_per_item: usize,
        connection: Connection,
        by_slot: bool,
        gather: bool,
        wait: Option<ReplicaWait>,
    ) -> Batcher {
        let script = Script::new(&batch_source(source, keys_per_item, args_per_item));
        let keys = (keys_per_item, keys_per_item);
        let mode = Mode { layout: Layout::Wrapped, by_slot, gather_turns: turns(gather), wait };
        Batcher::start(script, mode, keys, args_per_item, connection)
    }

    /// Starts the batching task for `source`, a script written for batches (see the module
    /// documentation), whose items take between `keys_per_item.0` and `keys_per_item.1` keys
    /// and `args_per_item` arguments each.
    pub(crate) fn for_batches(
        source: &str,
        keys_per_item: (usize, usize),
        args_per_item: usize,
        connection: Connection,
        gather: bool,
    ) -> Batcher {
        let mode = Mode { layout: Layout::Batch, by_slot: false, gather_turns: turns(gather), wait: None };
        Batcher::start(Script::new(source), mode, keys_per_item, args_per_item, connection)
    }

    fn start(
        script: Script,
        mode: Mode,
        keys_per_item: (usize, usize),
        args_per_item: usize,
        connection: Connection,
    ) -> Batcher {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(script, mode, receiver, connection));
        Batcher { queue, keys_per_item, args_per_item }
    }

    /// Runs one invocation and returns its reply.
    pub(crate) async fn invoke(&self, keys: Vec<String>, args: Vec<String>) -> Result<Value, Error> {
        Ok(self.enqueue(None, keys, args).await?.0)
    }

    /// Runs one invocation and returns its reply with the number of replicas that acknowledged
    /// its writes (`None` unless the batcher was started [`Batcher::waiting`] for replicas).
    pub(crate) async fn invoke_acked(&self, keys: Vec<String>, args: Vec<String>) -> Result<Acked, Error> {
        self.enqueue(None, keys, args).await
    }

    /// Runs one item of a script written for batches, in a call with the other items that
    /// share `shared`, and returns its reply.
    pub(crate) async fn invoke_shared(
        &self,
        shared: Arc<Shared>,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, Error> {
        Ok(self.enqueue(Some(shared), keys, args).await?.0)
    }

    async fn enqueue(
        &self,
        shared: Option<Arc<Shared>>,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Acked, Error> {
        debug_assert!((self.keys_per_item.0..=self.keys_per_item.1).contains(&keys.len()));
        debug_assert_eq!(args.len(), self.args_per_item);
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Item { shared, keys, args, reply })
            .map_err(|_| Error::Protocol("the batching task has stopped".to_owned()))?;
        answer.await.map_err(|_| Error::Protocol("the batching task dropped a call".to_owned()))?
    }
}

/// The scheduler turns a batcher gathers for: [`GATHER_TURNS`], or none.
fn turns(gather: bool) -> usize {
    if gather { GATHER_TURNS } else { 0 }
}

async fn run(
    script: Script,
    mode: Mode,
    mut receiver: mpsc::UnboundedReceiver<Item>,
    connection: Connection,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = receiver.recv().await {
        batch.push(first);
        take_queued(&mut receiver, &mut batch);
        gather(&mut receiver, &mut batch, mode.gather_turns).await;
        let one_call = !mode.by_slot && batch.iter().all(|item| item.shared == batch[0].shared);
        if one_call {
            invoke(&script, mode, std::mem::take(&mut batch), connection.clone()).await;
            continue;
        }
        // One call per slot (on a cluster) and per shared part.
        let mut groups: BTreeMap<(u16, Option<Arc<Shared>>), Vec<Item>> = BTreeMap::new();
        for item in batch.drain(..) {
            let slot = match item.keys.first() {
                Some(key) if mode.by_slot => slots::slot(key.as_bytes()),
                _ => 0,
            };
            groups.entry((slot, item.shared.clone())).or_default().push(item);
        }
        let calls = groups.into_values().map(|group| invoke(&script, mode, group, connection.clone()));
        futures::future::join_all(calls).await;
    }
}

/// Moves what is queued into `batch`, up to [`MAX_BATCH`], without waiting.
fn take_queued(receiver: &mut mpsc::UnboundedReceiver<Item>, batch: &mut Vec<Item>) {
    while batch.len() < MAX_BATCH {
        match receiver.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

/// Lets the tasks that are ready to run now queue their invocations before the batch goes out,
/// for as long as each turn of the scheduler brings more (at most `turns` turns: [`GATHER_TURNS`],
/// or none where the bus was asked not to gather).
///
/// The first invocation wakes this task, and the runtime runs a task just woken next (Tokio's
/// LIFO slot), before the other calls of the same read have run: without this hold a read of n
/// entries became a batch of one and a batch of n − 1. A yield puts this task behind every task
/// that is ready, so those calls are queued by the time it runs again; a turn that brings nothing
/// ends the hold, so a lone call waits one turn of the scheduler and no time on a timer.
async fn gather(receiver: &mut mpsc::UnboundedReceiver<Item>, batch: &mut Vec<Item>, turns: usize) {
    for _ in 0..turns {
        if batch.len() >= MAX_BATCH {
            return;
        }
        let before = batch.len();
        tokio::task::yield_now().await;
        take_queued(receiver, batch);
        if batch.len() == before {
            return;
        }
    }
}

/// Runs one script call for `batch` and hands each item its reply.
async fn invoke(script: &Script, mode: Mode, batch: Vec<Item>, mut connection: Connection) {
    let layout = mode.layout;
    let res = call(script, mode, &batch, &mut connection).await;
    match res {
        Err(Error::Refused(_)) if matches!(layout, Layout::Batch) && batch.len() > 1 => {
            // One item broke the whole call (see the module documentation): run each on its own,
            // so only that item fails.
            for item in batch {
                let single = [item];
                let res = call(script, mode, &single, &mut connection).await;
                deliver(layout, single.into(), res, &mut connection);
            }
        }
        res => deliver(layout, batch, res, &mut connection),
    }
}

/// Runs one script call for `batch` and returns its replies, one per item, with the replicas
/// that acknowledged its writes when `mode` waits for them.
async fn call(
    script: &Script,
    mode: Mode,
    batch: &[Item],
    connection: &mut Connection,
) -> Result<(Vec<Value>, Option<u32>), Error> {
    let mut invocation = script.prepare_invoke();
    match mode.layout {
        Layout::Wrapped => {
            invocation.arg(batch.len());
        }
        Layout::Batch => {
            if let Some(shared) = batch.first().and_then(|item| item.shared.as_deref()) {
                for key in &shared.keys {
                    invocation.key(key);
                }
                for arg in &shared.args {
                    invocation.arg(arg);
                }
            }
        }
    }
    for item in batch {
        for key in &item.keys {
            invocation.key(key);
        }
        for arg in &item.args {
            invocation.arg(arg);
        }
    }
    match mode.wait {
        None => Ok((invocation.invoke_async(connection).await.map_err(Error::from)?, None)),
        Some(wait) => {
            let (replies, acked) = call_and_wait(&invocation, wait, connection).await?;
            Ok((replies, Some(acked)))
        }
    }
}

/// Runs `invocation` and `WAIT` in one pipeline: the script's replies, and how many replicas
/// acknowledged its writes. A server without the script gets it loaded (on the same connection)
/// and the pipeline again.
async fn call_and_wait(
    invocation: &redis::ScriptInvocation<'_>,
    wait: ReplicaWait,
    connection: &mut Connection,
) -> Result<(Vec<Value>, u32), Error> {
    // `WAIT 0` means for ever: the configuration refuses it, and this keeps it out regardless.
    let timeout_ms = wait.timeout.as_millis().max(1) as u64;
    let mut pipe = redis::pipe();
    pipe.invoke_script(invocation).cmd("WAIT").arg(wait.replicas).arg(timeout_ms);
    // Each command's reply on its own: an error of the script is the script's, not the pipeline's.
    pipe.ignore_errors();
    for attempt in 0..2 {
        let replies: Vec<Value> = pipe.query_async(connection).await.map_err(Error::from)?;
        let mut replies = replies.into_iter();
        let (Some(script_reply), Some(wait_reply)) = (replies.next(), replies.next()) else {
            return Err(Error::Protocol("a script and WAIT pipeline got fewer than two replies".to_owned()));
        };
        let script_reply = match script_reply {
            Value::ServerError(err) if err.code() == "NOSCRIPT" && attempt == 0 => {
                invocation.load_async(connection).await.map_err(Error::from)?;
                continue;
            }
            Value::ServerError(err) => return Err(Error::from(redis::RedisError::from(err))),
            reply => reply,
        };
        let acked = match wait_reply {
            Value::Int(acked) => u32::try_from(acked).unwrap_or(0),
            // A demoted master: the script met READONLY too (reported per item), or ran before
            // the role change. Either way the write is not known to be anywhere safe: retry on the
            // master the connection finds next.
            Value::ServerError(err) if err.details().is_some_and(|detail| detail.contains("replica")) => {
                connection.suspect_master();
                return Err(Error::Unavailable(crate::error::Cause::server(
                    "READONLY",
                    format!("WAIT refused by a replica: {}", err.details().unwrap_or_default()),
                )));
            }
            Value::ServerError(err) => return Err(Error::from(redis::RedisError::from(err))),
            other => return Err(Error::Protocol(format!("unexpected WAIT reply {other:?}"))),
        };
        let replies: Vec<Value> =
            redis::from_redis_value(script_reply).map_err(|err| Error::Protocol(err.to_string()))?;
        return Ok((replies, acked));
    }
    Err(Error::Unavailable(crate::error::Cause::server(
        "NOSCRIPT",
        "the script was flushed again while loading it",
    )))
}

/// Hands each item of `batch` its reply from `res`, the outcome of their script call.
fn deliver(
    layout: Layout,
    batch: Vec<Item>,
    res: Result<(Vec<Value>, Option<u32>), Error>,
    connection: &mut Connection,
) {
    match res {
        Ok((replies, acked)) if replies.len() == batch.len() => {
            let mut demoted = false;
            for (item, reply) in batch.into_iter().zip(replies) {
                let reply = match layout {
                    Layout::Wrapped => item_reply(reply),
                    Layout::Batch => batch_item_reply(reply),
                };
                demoted |=
                    matches!(&reply, Err(Error::Unavailable(cause)) if cause.code() == Some("READONLY"));
                let _ = item.reply.send(reply.map(|reply| (reply, acked)));
            }
            // A write refused inside the script: the server is a replica now.
            if demoted {
                connection.suspect_master();
            }
        }
        Ok((replies, _)) => {
            let message = format!("batch of {} got {} replies", batch.len(), replies.len());
            for item in batch {
                let _ = item.reply.send(Err(Error::Protocol(message.clone())));
            }
        }
        Err(err) => {
            // Every item shares the fate of the call, and its kind: a retryable error stays
            // retryable. A refused write as a whole is seen by the connection itself.
            for item in batch {
                let _ = item.reply.send(Err(err.clone()));
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
        (Some(Value::Int(0)), message) => Err(item_error(message)),
        _ => Err(Error::Protocol("malformed batch item reply".to_owned())),
    }
}

/// One item's reply from a script written for batches: the reply itself, or `{0, error}` when
/// Redis refused one of the item's writes (sorted by its code, like [`item_reply`]).
fn batch_item_reply(reply: Value) -> Result<Value, Error> {
    match reply {
        Value::Array(parts) if matches!(parts.first(), Some(Value::Int(0))) => {
            Err(item_error(parts.into_iter().nth(1)))
        }
        reply => Ok(reply),
    }
}

/// The error of an item whose reply is `{0, message}`, sorted by the message's code.
fn item_error(message: Option<Value>) -> Error {
    let message =
        message.and_then(|message| redis::from_redis_value::<String>(message).ok()).unwrap_or_default();
    Error::from_cause(Cause::parse(&message))
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
