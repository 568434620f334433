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
    reply: oneshot::Sender<Result<Value, Error>>,
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
        let script = Script::new(&batch_source(source, keys_per_item, args_per_item));
        let keys = (keys_per_item, keys_per_item);
        Batcher::start(script, Layout::Wrapped, keys, args_per_item, connection, by_slot, gather)
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
        Batcher::start(
            Script::new(source),
            Layout::Batch,
            keys_per_item,
            args_per_item,
            connection,
            false,
            gather,
        )
    }

    fn start(
        script: Script,
        layout: Layout,
        keys_per_item: (usize, usize),
        args_per_item: usize,
        connection: Connection,
        by_slot: bool,
        gather: bool,
    ) -> Batcher {
        let (queue, receiver) = mpsc::unbounded_channel();
        let turns = if gather { GATHER_TURNS } else { 0 };
        tokio::spawn(run(script, layout, receiver, connection, by_slot, turns));
        Batcher { queue, keys_per_item, args_per_item }
    }

    /// Runs one invocation and returns its reply.
    pub(crate) async fn invoke(&self, keys: Vec<String>, args: Vec<String>) -> Result<Value, Error> {
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
        self.enqueue(Some(shared), keys, args).await
    }

    async fn enqueue(
        &self,
        shared: Option<Arc<Shared>>,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, Error> {
        debug_assert!((self.keys_per_item.0..=self.keys_per_item.1).contains(&keys.len()));
        debug_assert_eq!(args.len(), self.args_per_item);
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Item { shared, keys, args, reply })
            .map_err(|_| Error::Protocol("the batching task has stopped".to_owned()))?;
        answer.await.map_err(|_| Error::Protocol("the batching task dropped a call".to_owned()))?
    }
}

async fn run(
    script: Script,
    layout: Layout,
    mut receiver: mpsc::UnboundedReceiver<Item>,
    connection: Connection,
    by_slot: bool,
    gather_turns: usize,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = receiver.recv().await {
        batch.push(first);
        take_queued(&mut receiver, &mut batch);
        gather(&mut receiver, &mut batch, gather_turns).await;
        let one_call = !by_slot && batch.iter().all(|item| item.shared == batch[0].shared);
        if one_call {
            invoke(&script, layout, std::mem::take(&mut batch), connection.clone()).await;
            continue;
        }
        // One call per slot (on a cluster) and per shared part.
        let mut groups: BTreeMap<(u16, Option<Arc<Shared>>), Vec<Item>> = BTreeMap::new();
        for item in batch.drain(..) {
            let slot = match item.keys.first() {
                Some(key) if by_slot => slots::slot(key.as_bytes()),
                _ => 0,
            };
            groups.entry((slot, item.shared.clone())).or_default().push(item);
        }
        let calls = groups.into_values().map(|group| invoke(&script, layout, group, connection.clone()));
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
async fn invoke(script: &Script, layout: Layout, batch: Vec<Item>, mut connection: Connection) {
    let res = call(script, layout, &batch, &mut connection).await;
    match res {
        Err(Error::Refused(_)) if matches!(layout, Layout::Batch) && batch.len() > 1 => {
            // One item broke the whole call (see the module documentation): run each on its own,
            // so only that item fails.
            for item in batch {
                let single = [item];
                let res = call(script, layout, &single, &mut connection).await;
                deliver(layout, single.into(), res, &mut connection);
            }
        }
        res => deliver(layout, batch, res, &mut connection),
    }
}

/// Runs one script call for `batch` and returns its replies, one per item.
async fn call(
    script: &Script,
    layout: Layout,
    batch: &[Item],
    connection: &mut Connection,
) -> Result<Vec<Value>, Error> {
    let mut invocation = script.prepare_invoke();
    match layout {
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
    invocation.invoke_async(connection).await.map_err(Error::from)
}

/// Hands each item of `batch` its reply from `res`, the outcome of their script call.
fn deliver(layout: Layout, batch: Vec<Item>, res: Result<Vec<Value>, Error>, connection: &mut Connection) {
    match res {
        Ok(replies) if replies.len() == batch.len() => {
            let mut demoted = false;
            for (item, reply) in batch.into_iter().zip(replies) {
                let reply = match layout {
                    Layout::Wrapped => item_reply(reply),
                    Layout::Batch => batch_item_reply(reply),
                };
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
