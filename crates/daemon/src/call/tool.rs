//! The tool path of the lifecycle: the ledger's say before a tool call, the wait for a run slot
//! of the tool, and the run itself, under its lease, its deadline, a `tool.cancel` and forced
//! shutdown, with its progress, log messages and questions (`input.rs`) relayed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolhost_bus::{CallStart, EntryRef, KeptAnswer, call_owner};
use toolhost_envelope::ErrorCode;
use toolhost_tools::{Admit, Context, Failure, Full, LogReport, Output, ProgressReport, Registry, Running};
use tracing::{debug, warn};

use super::commit::{Answering, Finality, Record};
use super::{Call, Door, Event, Lifecycle, Outcome, Reply, input, ledger, progress};
use crate::auth::Caller;
use crate::clock::now_since_epoch;
use crate::group::Slot;

/// What the ledger decided before a tool call.
enum Begin {
    /// Run the tool; `tracked` when a call record was written for it.
    Run { tracked: bool },
    /// A holder started it and died, and the tool is not idempotent: answer `interrupted`.
    Interrupted,
    /// Nothing to answer; the entry ended this way.
    End(Outcome),
    /// Answered already, with this answer kept: answer this retry with it.
    Replay(KeptAnswer),
    /// Run nothing and answer this refusal (not final: a retry with the same request id runs);
    /// its commit deletes the call record the ledger step wrote.
    Refuse(Failure),
}

/// A tool call the ledger let run.
struct ToolRun<'a> {
    /// The tool's name.
    tool: &'a str,
    /// Its arguments, not yet validated.
    arguments: Value,
    /// Fired by a `tool.cancel` of the call.
    cancelled: &'a CancellationToken,
}

impl<D: Door> Lifecycle<D> {
    /// Takes a tool call through the ledger, runs it when the ledger says so, and answers it.
    pub(super) async fn call_tool(
        &self,
        call: &Call<'_, D::Request>,
        registry: &Registry,
        caller: Caller<'_>,
        slot: &Slot,
        name: String,
        arguments: Value,
    ) -> Outcome {
        let entry = call.entry;
        // Registered before the ledger step, so a cancel that finds the call record also finds
        // the call here; held until the call's answer is committed.
        let (cancelled, registration) =
            self.services.calls.register(&self.settings.ledger, &call.admitted.ledger_id);
        // A read-only, idempotent tool runs without a call record, so without a lease to own: no
        // owner (its renewal only keeps its entry).
        let owner =
            (!self.untracked(&name, registry)).then(|| call_owner(&self.settings.consumer, &entry.entry_id));
        // While the shard count changes, a request answered under the previous count is
        // answered with that answer, not run again.
        if let Some(former) = &call.admitted.former_ledger {
            let services = &self.services;
            match ledger::former_answer(&*services.bus, &services.keys, former, &call.admitted.ledger_id)
                .await
            {
                Err(err) => {
                    warn!(error = %err, entry_id = %entry.entry_id, former, "cannot read the previous shard's ledger; left pending");
                    return Outcome::LeftPending;
                }
                Ok(Some(Some(kept))) if D::TRAITS.keeps_answers && kept.entry_id != entry.entry_id => {
                    // The answered entry may be the very one this entry was moved from: its
                    // mover stalled past the lease between the move and the ack, and a replica
                    // of the previous count reclaimed the original and answered it. This is then
                    // a copy of that request, not a retry: acked, not answered a second time.
                    let ours = (self.settings.ledger.as_str(), entry.entry_id.as_str());
                    let source = (former.as_str(), kept.entry_id.as_str());
                    match ledger::moved_from(&*services.bus, &services.keys, ours, source).await {
                        Ok(false) => return self.replay(call, kept).await,
                        Ok(true) => {
                            return self
                                .ack(entry, None)
                                .await
                                .map_or(Outcome::LeftPending, |_| Outcome::Duplicate);
                        }
                        Err(err) => {
                            warn!(error = %err, entry_id = %entry.entry_id, former, "cannot read the move's mark; left pending");
                            return Outcome::LeftPending;
                        }
                    }
                }
                Ok(Some(_)) => {
                    return self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate);
                }
                Ok(None) => {}
            }
        }
        let begun = self.begin(call, &name, owner.as_deref(), registry).await;
        // A redelivered entry may have a record its earlier holder wrote.
        let record = match begun {
            Begin::Run { tracked: false } if entry.deliveries <= 1 => Record::Absent,
            _ => Record::MayExist,
        };
        // Whether this handling holds the call from here until its answer is committed: a run, or
        // an answer of its own (the record it wrote is deleted by that commit).
        let holds = matches!(begun, Begin::Run { .. } | Begin::Interrupted | Begin::Refuse(_));
        let answered = async {
            let result = match begun {
                Begin::End(outcome) => return outcome,
                Begin::Replay(kept) => return self.replay(call, kept).await,
                _ if self.poisoned(entry) => return self.poison(call).await,
                Begin::Interrupted => {
                    let result = Err(ledger::interrupted(&name));
                    let finished = Event::Finished {
                        request: call.request(),
                        result: &result,
                        duration: Duration::ZERO,
                    };
                    self.door.observe(finished).await;
                    result
                }
                Begin::Refuse(failure) => Err(failure),
                Begin::Run { .. } => match self.expired(call) {
                    Some(failure) => Err(failure),
                    None => {
                        if registry.annotations(&name).is_some_and(|a| a.destructive) {
                            let reason = "a tool annotated destructive";
                            self.audit(call, caller, &name, "allowed", reason, Some(&arguments)).await;
                        }
                        let run = ToolRun { tool: &name, arguments, cancelled: &cancelled };
                        match self.run_tool(call, registry, run, slot).await {
                            Some(result) => result,
                            // Shutdown was forced: the entry stays pending with a lapsing lease, and
                            // a replica takes it over.
                            None => return Outcome::LeftPending,
                        }
                    }
                },
            };
            let finality = Finality::of(&result);
            self.conclude(
                call,
                Answering { result, reply: Reply::Result, finality, record },
                Some(registration),
            )
            .await
        };
        if !holds {
            return answered.await;
        }
        // The lease (for a call without a record, its entry's idle time) is renewed from the
        // ledger step until the answer is committed, not only while the tool runs: a commit or
        // a step before the run that takes longer than the lease (Redis slow or refusing writes,
        // a starved process) must not let a replica take this live holder's call for a dead
        // one's, and answer it `interrupted` or run it again. Polled first, the call ends on the
        // poll where its commit returns; the renewal never ends on its own.
        tokio::select! {
            biased;
            outcome = answered => outcome,
            never = self.renew(call, owner.as_deref()) => match never {},
        }
    }

    /// Consults the ledger before running a tool; a call without an `owner` is not recorded.
    async fn begin(
        &self,
        call: &Call<'_, D::Request>,
        tool: &str,
        owner: Option<&str>,
        registry: &Registry,
    ) -> Begin {
        let Some(owner) = owner else {
            return Begin::Run { tracked: false };
        };
        let entry = call.entry;
        let annotations = registry.annotations(tool);
        let forced = self.services.shutdown.forced();
        let bus = &*self.services.bus;
        let ledger_id = &call.admitted.ledger_id;
        let Some(start) = ledger::begin(bus, &call.keys, owner, &entry.entry_id, ledger_id, forced).await
        else {
            return Begin::End(Outcome::LeftPending);
        };
        match start {
            CallStart::Fresh => Begin::Run { tracked: true },
            // The owner is alive and will ack this very entry.
            CallStart::Busy { entry_id } if entry_id == entry.entry_id => Begin::End(Outcome::LeftPending),
            CallStart::AnsweredKept(kept) if D::TRAITS.keeps_answers => Begin::Replay(kept),
            // Answered, or a re-sent copy while the original runs: the original's answer is the one.
            CallStart::Answered | CallStart::AnsweredKept(_) | CallStart::Busy { .. } => {
                Begin::End(self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate))
            }
            CallStart::StartedBefore { holder } => {
                let idempotent = annotations.is_some_and(|a| a.idempotent);
                warn!(
                    request_id = %ledger_id,
                    entry_id = %entry.entry_id,
                    deliveries = entry.deliveries,
                    tool,
                    holder,
                    idempotent,
                    "the call was started by a holder whose lease lapsed; {}",
                    if idempotent { "running it again" } else { "answering interrupted" }
                );
                if idempotent { Begin::Run { tracked: true } } else { Begin::Interrupted }
            }
            // Too few replicas have the record: a failover could lose it and run the tool again.
            // A call started before whose tool is not idempotent runs nothing anyway.
            CallStart::Unreplicated { started_before: true, .. }
                if !annotations.is_some_and(|a| a.idempotent) =>
            {
                Begin::Interrupted
            }
            CallStart::Unreplicated { acked, wanted, timeout, .. } => {
                warn!(
                    request_id = %ledger_id,
                    tool,
                    acked,
                    wanted,
                    "too few replicas acknowledged the call record; not run, answered overloaded"
                );
                Begin::Refuse(ledger::unreplicated(tool, acked, wanted, timeout))
            }
            _ => Begin::End(Outcome::LeftPending),
        }
    }

    /// Whether a call of `tool` runs without a call record: a read-only, idempotent tool, unless
    /// the door tracks every call. Running such a tool twice has no effect a caller can see, and
    /// its answer is still published once, because the answered mark is checked when the answer
    /// is committed; this saves a script and five commands per call.
    fn untracked(&self, tool: &str, registry: &Registry) -> bool {
        !D::TRAITS.tracks_every_call
            && registry.annotations(tool).is_some_and(|a| a.read_only && a.idempotent)
    }

    /// Runs a tool: waits for a run slot of the tool, renewing the lease while it waits and runs
    /// (for a call without a record, only its entry's idle time), and reports its steps to the
    /// door. `None` when shutdown was forced first: the tool is cancelled and nothing is
    /// answered.
    async fn run_tool(
        &self,
        call: &Call<'_, D::Request>,
        registry: &Registry,
        run: ToolRun<'_>,
        slot: &Slot,
    ) -> Option<Result<Output, Failure>> {
        let services = &self.services;
        let ToolRun { tool, cancelled, .. } = run;
        let mut context = call.admitted.ids.context();
        // The run's span, whose context the tool's source passes on.
        let run_span = call.span.map(|span| span.run(tool, registry.remote(tool).as_ref()));
        let record_arguments = call.span.is_some_and(|span| span.record_arguments);
        if let Some(run_span) = &run_span {
            context.trace = Some(run_span.passed_on(&call.admitted.ids.trace));
            if record_arguments {
                let arguments = services.gate.redact_json(run.arguments.clone()).to_string();
                run_span.set(KeyValue::new("gen_ai.tool.call.arguments", arguments));
            }
        }
        context.cancel = services.shutdown.forced().child_token();
        let relay = progress::Relay::<ProgressReport>::new(services.progress_per_second);
        // Log messages have a budget of their own, so a chatty tool does not starve its progress.
        let log_relay = progress::Relay::<LogReport>::new(services.progress_per_second);
        // The call's questions to its caller, and when its run ends at the latest (set as the
        // run starts), which a question's `expires_at_ms` says.
        let (input, questions) = input::channel();
        let expires = Mutex::new(None);
        if D::TRAITS.relays_progress {
            context.progress = relay.handle();
            context.log = log_relay.log_handle();
            context.input = input;
        }
        let write_progress = |report: ProgressReport| async move {
            let Some(entry) = self.door.progress(call.request(), &report) else { return };
            if let Err(err) = services.bus.publish(&entry.topic, &entry.id, &entry.payload).await {
                debug!(error = %err, entry_id = %entry.id, "cannot write a progress entry; dropped");
            }
        };
        let write_log = |report: LogReport| async move {
            let Some(entry) = self.door.log(call.request(), &report) else { return };
            if let Err(err) = services.bus.publish(&entry.topic, &entry.id, &entry.payload).await {
                debug!(error = %err, entry_id = %entry.id, "cannot write a log entry; dropped");
            }
        };
        let relay_stop = CancellationToken::new();
        let started = Instant::now();
        let run = self.start_tool(call, registry, run, &context, (slot, &expires));
        // Polled in this order: a tool that answers at once (most read-only tools) ends the call
        // on the first poll, before the shutdown watch registers a waiter. A cancel drops the
        // tool's future, which stops it (a command's process group is killed, an MCP server gets
        // `notifications/cancelled`), also while it waits in the tool's queue. The lease is
        // renewed around the whole call (`call_tool`), this run included.
        let forced = services.shutdown.forced();
        let supervised = async {
            let result = tokio::select! {
                biased;
                res = run => Some(res),
                () = cancelled.cancelled() => {
                    context.cancel.cancel();
                    Some(Err(cancelled_failure(tool)))
                }
                () = forced.cancelled() => {
                    context.cancel.cancel();
                    warn!(entry_id = %call.entry.entry_id, tool, "grace period over; call abandoned, left to a replica");
                    None
                }
            };
            relay_stop.cancel();
            result
        };
        // The relay stops with the call, finishing a write under way and writing the report
        // still waiting, before the answer is committed: the last step reaches the caller, and
        // no progress entry is written after the answer.
        let (result, (), (), ()) = tokio::join!(
            supervised,
            relay.run(&relay_stop, write_progress),
            log_relay.run(&relay_stop, write_log),
            self.relay_questions(call, questions, slot, &expires, &relay_stop)
        );
        let result = result?;
        match (run_span, &result) {
            (Some(run_span), Ok(value)) if record_arguments => {
                let value = services.gate.redact_json(value.result.clone()).to_string();
                run_span.set(KeyValue::new("gen_ai.tool.call.result", value));
            }
            (Some(run_span), Err(failure)) => {
                // The MCP conventions' name for an error the tool itself reported.
                let error_type = match failure.code {
                    ErrorCode::ToolFailed if registry.remote(tool).is_some_and(|r| r.system == "mcp") => {
                        "tool_error"
                    }
                    code => code.as_str(),
                };
                run_span.fail(error_type, &failure.message);
            }
            _ => {}
        }
        let finished =
            Event::Finished { request: call.request(), result: &result, duration: started.elapsed() };
        self.door.observe(finished).await;
        Some(result)
    }

    /// The run of a tool from its start: unless a `tool.cancel` came first, tells the door it
    /// starts, validates its arguments, waits for a run slot of the tool, and runs it under the
    /// request's deadline.
    async fn start_tool(
        &self,
        call: &Call<'_, D::Request>,
        registry: &Registry,
        run: ToolRun<'_>,
        context: &Context,
        (slot, expires): (&Slot, &Mutex<Option<Duration>>),
    ) -> Result<Output, Failure> {
        let ToolRun { tool, arguments, cancelled, .. } = run;
        // Cancelled before it started (while its ledger step waited out a Redis outage): it
        // never starts.
        if cancelled.is_cancelled() {
            return Err(cancelled_failure(tool));
        }
        self.door.observe(Event::Started { request: call.request() }).await;
        // Arguments are checked before the call waits: a bad request never takes a queue slot.
        let arguments = registry.prepare(tool, arguments)?;
        let deadline = call.admitted.deadline;
        let _running = self.wait_for_tool(tool, deadline, slot).await?;
        let _in_flight = self.services.telemetry.in_flight_guard();
        let now = now_since_epoch();
        let left = deadline.map(|deadline| deadline.saturating_sub(now));
        let timeout = registry.timeout(tool);
        let ends = match (deadline, timeout) {
            (Some(deadline), Some(timeout)) => Some(deadline.min(now + timeout)),
            (deadline, timeout) => deadline.or(timeout.map(|timeout| now + timeout)),
        };
        *expires.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = ends;
        registry.run(tool, arguments, context, left).await
    }

    /// Keeps the call's lease (or, for a call without a record, its entry) while it runs; never
    /// returns (see [`ledger::renew`]).
    pub(super) async fn renew(
        &self,
        call: &Call<'_, D::Request>,
        owner: Option<&str>,
    ) -> std::convert::Infallible {
        let settings = &self.settings;
        let entry =
            EntryRef { topic: &settings.topic, group: &settings.group, entry_id: &call.entry.entry_id };
        let (bus, ledger_id) = (&*self.services.bus, &call.admitted.ledger_id);
        ledger::renew(bus, &call.keys, owner, &entry, &settings.consumer, ledger_id).await
    }

    /// Takes a run slot of `tool`: at once, or after a wait in its queue during which the call
    /// gives back its global slot, so calls of other tools are not held up behind it.
    ///
    /// # Errors
    /// `overloaded` when the tool's queue is full, `expired` when `deadline` passes first.
    async fn wait_for_tool(
        &self,
        tool: &str,
        deadline: Option<Duration>,
        slot: &Slot,
    ) -> Result<Running, Failure> {
        let waiting = match self.services.limits.admit(tool) {
            Admit::Run(running) => return Ok(running),
            Admit::Full(full) => return Err(self.overloaded(tool, full)),
            Admit::Wait(waiting) => waiting,
        };
        slot.release();
        let Some(until) = deadline else { return Ok(waiting.ready().await) };
        let left = until.saturating_sub(now_since_epoch());
        tokio::time::timeout(left, waiting.ready()).await.map_err(|_elapsed| {
            Failure::new(
                ErrorCode::Expired,
                format!("the request's deadline passed while it waited for a free slot of '{tool}'"),
            )
        })
    }

    /// The `overloaded` answer for a tool whose queue is full, with a hint of when a retry may
    /// find room: the time the calls ahead take at the tool's recent mean duration.
    fn overloaded(&self, tool: &str, full: Full) -> Failure {
        let settings = full.settings;
        let mean = self.services.stats.mean(tool).unwrap_or(Duration::from_millis(100));
        let ahead = (settings.max_queue + settings.max_concurrent) as u32;
        let retry_after = (mean * ahead / settings.max_concurrent.max(1) as u32)
            .clamp(Duration::from_millis(100), Duration::from_secs(30));
        Failure {
            code: ErrorCode::Overloaded,
            message: format!(
                "'{tool}' is at its limit of {} running and {} waiting calls; retry later",
                settings.max_concurrent, settings.max_queue
            ),
            details: Some(json!({
                "retry_after_ms": retry_after.as_millis() as u64,
                "max_concurrent": settings.max_concurrent,
                "max_queue": settings.max_queue,
            })),
        }
    }
}

/// The answer of a call stopped by a `tool.cancel`.
fn cancelled_failure(tool: &str) -> Failure {
    Failure::new(ErrorCode::Cancelled, format!("the call of '{tool}' was cancelled by a tool.cancel request"))
}
