//! `resources/list`, `resources/templates/list` and `prompts/list`: the hosted MCP servers'
//! resources, resource templates and prompts, read from what every live toolbox publishes
//! (`toolhost:catalog:<toolbox_id>`, docs/CONTRACTS.md "Hosted MCP resources and prompts").
//! `resources/read`, `prompts/get` and `completion/complete` travel as requests
//! (`resources.read`, `prompts.get`, `completion.complete`) to the toolbox that lists what they
//! name, for the request's tenant, as a tool call does.
//!
//! A URI, template or prompt name two toolboxes publish is listed once, as the smaller toolbox id
//! published it, the same rule that picks which toolbox serves it. Each list is one page, sorted
//! by URI, template or name. Lists are not filtered by tenant: the tenant policy names tools.

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, ErrorData as McpError, GetPromptRequestParams, GetPromptResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, Prompt, ReadResourceRequestParams,
    ReadResourceResult, Resource, ResourceTemplate,
};
use rmcp::service::RequestContext;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use toolhost_envelope::{ErrorCode, ResultData};

use super::handler::{Door, Session};
use crate::fleet_catalog::{items, merged, published};
use crate::fleet_client::ANSWER_MARGIN;

/// How long a read, a prompt or a completion may take on the host (its `timeout_ms`); the
/// hosted server's own `timeout_ms` applies within it.
const CATALOG_TIMEOUT: Duration = Duration::from_secs(60);

impl Session {
    async fn catalog_fields(&self) -> Result<BTreeMap<String, String>, McpError> {
        let fleet = &self.door.fleet;
        let published = published(fleet.bus().as_ref(), fleet.keys()).await.map_err(|err| {
            McpError::internal_error(format!("cannot read the fleet's resources and prompts: {err}"), None)
        })?;
        Ok(merged(published))
    }

    /// `resources/list`.
    pub(super) async fn list_fleet_resources(&self) -> Result<ListResourcesResult, McpError> {
        let fields = self.catalog_fields().await?;
        Ok(ListResourcesResult::with_all_items(items::<Resource>(&fields, "resource")))
    }

    /// `resources/templates/list`.
    pub(super) async fn list_fleet_resource_templates(
        &self,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let fields = self.catalog_fields().await?;
        Ok(ListResourceTemplatesResult::with_all_items(items::<ResourceTemplate>(&fields, "template")))
    }

    /// `prompts/list`.
    pub(super) async fn list_fleet_prompts(&self) -> Result<ListPromptsResult, McpError> {
        let fields = self.catalog_fields().await?;
        Ok(ListPromptsResult::with_all_items(items::<Prompt>(&fields, "prompt")))
    }

    /// `resources/read`, over `resources.read`.
    pub(super) async fn read_fleet_resource(
        &self,
        request: ReadResourceRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, McpError> {
        self.ask_catalog("resources.read", request, context).await
    }

    /// `prompts/get`, over `prompts.get`.
    pub(super) async fn get_fleet_prompt(
        &self,
        request: GetPromptRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<GetPromptResult, McpError> {
        self.ask_catalog("prompts.get", request, context).await
    }

    /// `completion/complete`, over `completion.complete`.
    pub(super) async fn complete_fleet(
        &self,
        request: CompleteRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        self.ask_catalog("completion.complete", request, context).await
    }

    /// `resources/subscribe`: the session watches `uri` (`resource_updates.rs`).
    pub(super) async fn subscribe_fleet_resource(
        &self,
        uri: String,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let asker = super::resource_updates::Asker {
            tenant: self.door.tenant(&context),
            via: Door::principal(&context).map(|principal| format!("token:{}", principal.token_id)),
        };
        let resources = &self.door.subscriptions.resources;
        resources.subscribe_session(&uri, self.key(), context.peer, asker).await
    }

    /// Sends MCP's `params` as a request of `event_type` for the request's tenant and waits
    /// for its answer: MCP's result, or its error as a JSON-RPC error.
    async fn ask_catalog<T: DeserializeOwned>(
        &self,
        event_type: &str,
        params: impl Serialize,
        context: &RequestContext<RoleServer>,
    ) -> Result<T, McpError> {
        let internal = |err: String| McpError::internal_error(err, None);
        let Value::Object(mut data) =
            serde_json::to_value(params).map_err(|err| internal(err.to_string()))?
        else {
            return Err(McpError::invalid_params("params must be an object", None));
        };
        data.insert("timeout_ms".to_owned(), json!(CATALOG_TIMEOUT.as_millis() as u64));
        let tenant = self.door.tenant(context);
        let via = Door::principal(context).map(|principal| format!("token:{}", principal.token_id));
        let wait = CATALOG_TIMEOUT + ANSWER_MARGIN;
        let caller = (tenant.as_deref(), via.as_deref(), None);
        let answer = self
            .door
            .fleet
            .ask_for(event_type, data, wait, caller)
            .await
            .map_err(|err| internal(format!("{event_type}: {err}")))?;
        if !answer.success {
            return Err(catalog_error(event_type, answer));
        }
        serde_json::from_value(answer.result.unwrap_or(Value::Null))
            .map_err(|err| internal(format!("{event_type}: the answer is not MCP's result: {err}")))
    }
}

/// The JSON-RPC error of a failed catalog answer: a resource no toolbox lists is `-32002`
/// (MCP's "resource not found"), other bad params `-32602`, anything else `-32603`, each with
/// the answer's `error_code` and `details` in `data`.
pub(super) fn catalog_error(event_type: &str, answer: ResultData) -> McpError {
    let code = answer.error_code.unwrap_or(ErrorCode::Internal);
    let message = format!("{}: {}", code.as_str(), answer.error.unwrap_or_default());
    let data = Some(json!({"error_code": code.as_str(), "details": answer.details}));
    let not_listed = answer.details.as_ref().and_then(|details| details.get("not_listed")).is_some();
    match code {
        ErrorCode::InvalidArguments if not_listed && event_type.starts_with("resources.") => {
            McpError::resource_not_found(message, data)
        }
        ErrorCode::InvalidArguments => McpError::invalid_params(message, data),
        _ => McpError::internal_error(message, data),
    }
}
