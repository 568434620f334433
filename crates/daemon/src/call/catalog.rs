//! The catalog path of the lifecycle: the hosted MCP servers' resources, resource templates,
//! prompts and completions asked for over the requests stream (`resources.list`,
//! `resources.templates.list`, `resources.read`, `prompts.list`, `prompts.get`,
//! `completion.complete`; docs/CONTRACTS.md "Resources, prompts and completion over Redis").
//!
//! Every toolbox reading the stream reads such a request in its own group. A list is the
//! fleet's (what every live toolbox publishes), answered by whichever toolbox gets there first,
//! once across them all by the entry's refusal mark, as `tools.discover` is. A read, a prompt or
//! a completion is served by the toolbox that publishes what it names (the smallest toolbox id
//! when several do); the others only ack it. It runs as a read-only, idempotent tool call does:
//! the tenant's policy and limits under the request type's name, its deadline, `tool.cancel`,
//! the lease of its entry, and the server's own `timeout_ms`, `max_concurrent` and
//! `max_response_bytes`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use toolhost_envelope::ErrorCode;
use toolhost_mcp::{Operation, Target};
use toolhost_tools::{Failure, Output, ToolError};
use tracing::warn;

use super::commit::{Answering, Finality, Record};
use super::{Call, Door, Lifecycle, Outcome, Reply};
use crate::auth::Caller;
use crate::clock::now_since_epoch;
use crate::fleet_catalog;
use crate::sources::Sources;

/// What a catalog request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CatalogAsk {
    /// `resources.list`: the fleet's resources.
    ListResources,
    /// `resources.templates.list`: the fleet's resource templates.
    ListTemplates,
    /// `prompts.list`: the fleet's prompts.
    ListPrompts,
    /// `resources.read`, `prompts.get`, `completion.complete`: sent to the server that lists
    /// what the params name.
    Send(Operation),
    /// `resources.subscribe`: take or renew a lease of a resource's updates.
    Subscribe,
    /// `resources.unsubscribe`: give a lease back.
    Unsubscribe,
}

impl CatalogAsk {
    /// Every kind, for parsing.
    const ALL: [CatalogAsk; 8] = [
        CatalogAsk::ListResources,
        CatalogAsk::ListTemplates,
        CatalogAsk::ListPrompts,
        CatalogAsk::Send(Operation::ReadResource),
        CatalogAsk::Send(Operation::GetPrompt),
        CatalogAsk::Send(Operation::Complete),
        CatalogAsk::Subscribe,
        CatalogAsk::Unsubscribe,
    ];

    /// The request type, which is also the name the tenant policy, statistics and audit know
    /// it by.
    pub(crate) fn request_type(self) -> &'static str {
        match self {
            CatalogAsk::ListResources => "resources.list",
            CatalogAsk::ListTemplates => "resources.templates.list",
            CatalogAsk::ListPrompts => "prompts.list",
            CatalogAsk::Send(Operation::ReadResource) => "resources.read",
            CatalogAsk::Send(Operation::GetPrompt) => "prompts.get",
            CatalogAsk::Send(Operation::Complete) => "completion.complete",
            CatalogAsk::Subscribe => "resources.subscribe",
            CatalogAsk::Unsubscribe => "resources.unsubscribe",
        }
    }

    /// The kind a request type names.
    pub(crate) fn of_type(event_type: &str) -> Option<CatalogAsk> {
        CatalogAsk::ALL.into_iter().find(|ask| ask.request_type() == event_type)
    }

    /// For a list: the catalog field kind and the MCP result's key.
    fn listing(self) -> Option<(&'static str, &'static str)> {
        match self {
            CatalogAsk::ListResources => Some(("resource", "resources")),
            CatalogAsk::ListTemplates => Some(("template", "resourceTemplates")),
            CatalogAsk::ListPrompts => Some(("prompt", "prompts")),
            CatalogAsk::Send(_) | CatalogAsk::Subscribe | CatalogAsk::Unsubscribe => None,
        }
    }

    /// What the params name, which routes the request.
    fn target(self, params: &Value) -> Result<Target, String> {
        match self {
            CatalogAsk::Send(operation) => toolhost_mcp::catalog::target(operation, params),
            _ => match params.get("uri") {
                Some(Value::String(uri)) if !uri.is_empty() => Ok(Target::Resource(uri.clone())),
                _ => Err(format!("{} needs 'uri', a non-empty string", self.request_type())),
            },
        }
    }
}

/// A subscription lease's time to live when the request names none.
const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The longest and shortest lease a request may ask for.
const LEASE_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(3600));

/// Who holds a subscription lease and for how long: `subscriber` (else the request's `source`,
/// else `"-"`) and `ttl_ms` (60 s by default, 1 s to 1 h).
fn lease(params: &Value, source: Option<&str>) -> Result<(String, Duration), String> {
    let holder = match params.get("subscriber") {
        None | Some(Value::Null) => source.unwrap_or("-").to_owned(),
        Some(Value::String(holder)) if !holder.is_empty() => holder.clone(),
        Some(_) => return Err("'subscriber' must be a non-empty string".to_owned()),
    };
    let ttl = match params.get("ttl_ms") {
        None | Some(Value::Null) => DEFAULT_LEASE,
        Some(ttl) => match ttl.as_u64() {
            Some(ms) => Duration::from_millis(ms),
            None => return Err("'ttl_ms' must be a whole number of milliseconds".to_owned()),
        },
    };
    let (least, most) = LEASE_RANGE;
    if ttl < least || ttl > most {
        return Err(format!("'ttl_ms' must be between {} and {}", least.as_millis(), most.as_millis()));
    }
    Ok((holder, ttl))
}

/// This toolbox's hosted sources, once the daemon has made them; a toolbox that hosts no MCP
/// server has none, and serves nothing.
#[derive(Default)]
pub(crate) struct HostedCatalog(OnceLock<Arc<Sources>>);

impl HostedCatalog {
    /// Sets the sources (once; later calls change nothing).
    pub(crate) fn set(&self, sources: Arc<Sources>) {
        let _ = self.0.set(sources);
    }

    fn get(&self) -> Option<&Arc<Sources>> {
        self.0.get()
    }
}

/// What a request for one server does there.
type ServerWork<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'a>>;

/// Where a request for one server goes.
enum Served {
    /// This toolbox serves it.
    Here,
    /// Another live toolbox does.
    Elsewhere,
    /// Nobody lists it: the sentence says what.
    Nowhere(String),
}

impl<D: Door> Lifecycle<D> {
    /// Answers a catalog request (see the module documentation).
    pub(super) async fn catalog(
        &self,
        call: &Call<'_, D::Request>,
        caller: Caller<'_>,
        ask: CatalogAsk,
        params: Value,
    ) -> Outcome {
        let entry = call.entry;
        if self.poisoned(entry) {
            return self.poison(call).await;
        }
        if let Some(failure) = self.expired(call) {
            return self.answer_catalog(call, Err(failure), None, false).await;
        }
        if ask.listing().is_some() {
            let result = match self.police(call, caller, ask.request_type(), &params).await {
                Ok(_in_flight) => self.list(ask).await,
                Err(failure) => Err(failure),
            };
            return self.answer_catalog(call, result, None, false).await;
        }
        let invalid = |reason: String| Failure::new(ErrorCode::InvalidArguments, reason);
        let checked = ask.target(&params).and_then(|target| match ask {
            CatalogAsk::Subscribe | CatalogAsk::Unsubscribe => {
                lease(&params, call.admitted.source.as_deref()).map(|held| (target, Some(held)))
            }
            _ => Ok((target, None)),
        });
        let (target, held) = match checked {
            Ok(checked) => checked,
            Err(reason) => return self.answer_catalog(call, Err(invalid(reason)), None, false).await,
        };
        match self.served(&target).await {
            None => Outcome::LeftPending,
            Some(Served::Elsewhere) => {
                self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate)
            }
            Some(Served::Nowhere(reason)) => {
                let failure = invalid(reason).with_details(json!({"not_listed": target.to_string()}));
                self.answer_catalog(call, Err(failure), None, false).await
            }
            Some(Served::Here) => {
                // Held while the request runs: the tenant's count of calls in flight.
                let _in_flight = match self.police(call, caller, ask.request_type(), &params).await {
                    Ok(in_flight) => in_flight,
                    Err(failure) => return self.answer_catalog(call, Err(failure), None, false).await,
                };
                // Registered so that a `tool.cancel` of the request id finds it.
                let (cancelled, registration) =
                    self.services.calls.register(&self.settings.ledger, &call.admitted.ledger_id);
                let Some(sources) = self.services.hosted.get() else {
                    let failure = invalid("this toolbox hosts no MCP server".to_owned());
                    return self.answer_catalog(call, Err(failure), Some(registration), false).await;
                };
                let uri = match &target {
                    Target::Resource(uri) => uri.as_str(),
                    Target::Prompt(name) => name.as_str(),
                };
                let (work, fin): (ServerWork<'_>, bool) = match (ask, held) {
                    (CatalogAsk::Subscribe, Some((holder, ttl))) => (
                        Box::pin(
                            async move { sources.subscribe(uri, &holder, ttl).await.map(|()| json!({})) },
                        ),
                        false,
                    ),
                    (CatalogAsk::Unsubscribe, Some((holder, _))) => (
                        Box::pin(async move {
                            sources.unsubscribe(uri, &holder).await;
                            Ok(json!({}))
                        }),
                        false,
                    ),
                    (CatalogAsk::Send(operation), _) => (Box::pin(sources.request(operation, params)), true),
                    _ => (
                        Box::pin(std::future::ready(Err(ToolError::Failed(
                            "not a request for one server".to_owned(),
                        )))),
                        false,
                    ),
                };
                match self.run_here(call, ask.request_type(), &cancelled, work).await {
                    Some(result) => self.answer_catalog(call, result, Some(registration), fin).await,
                    None => Outcome::LeftPending,
                }
            }
        }
    }

    /// Which toolbox serves `target`: the smallest live toolbox id that publishes it, else this
    /// one when its own servers list it (a catalog not published yet). `None` when the fleet
    /// cannot be read: the entry is left pending.
    async fn served(&self, target: &Target) -> Option<Served> {
        let services = &self.services;
        let published = match fleet_catalog::published(services.bus.as_ref(), &services.keys).await {
            Ok(published) => published,
            Err(err) => {
                crate::outage::redis_warn!(&err, error = %err, "cannot read the fleet's resources and prompts to route a request; left pending");
                return None;
            }
        };
        let here = match services.hosted.get() {
            Some(sources) => sources.serves(target).await,
            None => false,
        };
        Some(match fleet_catalog::server(&published, target) {
            Some(toolbox) if toolbox == self.settings.group => Served::Here,
            Some(_) => Served::Elsewhere,
            None if here => Served::Here,
            None => Served::Nowhere(format!("no live toolbox lists {target}")),
        })
    }

    /// The fleet's list of one kind, as MCP's list result (one page, sorted by key).
    async fn list(&self, ask: CatalogAsk) -> Result<Output, Failure> {
        let Some((kind, key)) = ask.listing() else {
            return Err(Failure::new(ErrorCode::Internal, "not a list"));
        };
        let services = &self.services;
        let published =
            fleet_catalog::published(services.bus.as_ref(), &services.keys).await.map_err(|err| {
                Failure::new(
                    ErrorCode::Internal,
                    format!("cannot read the fleet's resources and prompts: {err}"),
                )
                .with_details(json!({"retry_after_ms": 1000}))
            })?;
        let fields = fleet_catalog::merged(published);
        let items: Vec<Value> = fleet_catalog::items(&fields, kind);
        Ok(json!({ key: items }).into())
    }

    /// Runs `work` for a request this toolbox serves, under the request's deadline, its
    /// cancellation and forced shutdown, keeping the entry's lease meanwhile. `None` when
    /// shutdown was forced: the entry is left to a replica.
    async fn run_here(
        &self,
        call: &Call<'_, D::Request>,
        what: &str,
        cancelled: &tokio_util::sync::CancellationToken,
        work: impl Future<Output = Result<Value, ToolError>>,
    ) -> Option<Result<Output, Failure>> {
        let left = call.admitted.deadline.map(|deadline| deadline.saturating_sub(now_since_epoch()));
        let run = async {
            let answered = match left {
                Some(left) => tokio::time::timeout(left, work).await.map_err(|_elapsed| {
                    Failure::new(
                        ErrorCode::Timeout,
                        format!("{what} did not finish before the request's deadline"),
                    )
                })?,
                None => work.await,
            };
            answered.map(Output::from).map_err(failure)
        };
        let forced = self.services.shutdown.forced();
        tokio::select! {
            biased;
            result = run => Some(result),
            never = self.renew(call, None) => match never {},
            () = cancelled.cancelled() => Some(Err(Failure::new(
                ErrorCode::Cancelled,
                format!("the {what} request was cancelled by a tool.cancel request"),
            ))),
            () = forced.cancelled() => {
                warn!(entry_id = %call.entry.entry_id, what, "grace period over; request abandoned, left to a replica");
                None
            }
        }
    }

    /// Answers a catalog request: final as a tool's answer is (a success, or an error after the
    /// server was asked) when `finishes` (a read, a prompt, a completion), else never (lists,
    /// refusals, subscriptions, which leave the request id free).
    async fn answer_catalog(
        &self,
        call: &Call<'_, D::Request>,
        result: Result<Output, Failure>,
        held: Option<super::cancel::Registration<'_>>,
        finishes: bool,
    ) -> Outcome {
        let finality = if finishes { Finality::of(&result) } else { Finality::NotFinal };
        let record = if call.entry.deliveries <= 1 { Record::Absent } else { Record::MayExist };
        self.conclude(call, Answering { result, reply: Reply::Result, finality, record }, held).await
    }
}

/// The wire failure of a server's error.
fn failure(err: ToolError) -> Failure {
    Failure { code: err.code(), message: err.to_string(), details: err.details() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_types_name_each_ask_once() {
        for ask in CatalogAsk::ALL {
            assert_eq!(CatalogAsk::of_type(ask.request_type()), Some(ask));
        }
        assert_eq!(CatalogAsk::of_type("resources.write"), None);
        assert_eq!(CatalogAsk::of_type("tools.discover"), None);
        assert_eq!(CatalogAsk::ListTemplates.listing(), Some(("template", "resourceTemplates")));
        assert_eq!(CatalogAsk::Send(Operation::GetPrompt).listing(), None);
    }
}
