//! Between toolwarden's types and MCP's: the tool list, call results, the `initialize` answer.
//! Plain functions of what they convert, so that what a client sees is decided in one place and
//! can be tested without a connection.

use std::sync::Arc;

use rmcp::model::{
    CallToolResult, ContentBlock, DiscoverResult, Implementation, InitializeResult, JsonObject,
    MetaObject, PromptsCapability, ProtocolVersion, ResourcesCapability, ServerCapabilities, Tool,
    ToolAnnotations, ToolsCapability,
};
use serde_json::{Value, json};
use toolwarden_core::PREFIX_SEPARATOR;
use toolwarden_protocol::{CallResult, Content, ToolInfo};

use crate::McpServer;

use super::options::{GatewayOptions, STATUS_TOOL};

/// The key of the structured outcome in a result's `_meta`.
pub(crate) const OUTCOME_META: &str = "toolwarden/outcome";

/// Every tool the engine governs, as clients see it, plus [`STATUS_TOOL`].
pub(crate) fn list_tools(servers: &[Arc<McpServer>], infos: &[ToolInfo]) -> Vec<Tool> {
    let mut tools: Vec<Tool> = infos
        .iter()
        .filter(|info| info.name != STATUS_TOOL)
        .map(|info| match raw_tool(servers, info) {
            Some(mut raw) => {
                raw.name = info.name.clone().into();
                raw
            }
            None => tool_from_info(info),
        })
        .collect();
    tools.push(status_tool());
    tools
}

/// The server's own description of the tool (title, icons, `_meta` and all), if an MCP
/// server serves it.
fn raw_tool(servers: &[Arc<McpServer>], info: &ToolInfo) -> Option<Tool> {
    let server = servers.iter().find(|s| s.server_name() == info.backend)?;
    let own = info
        .name
        .strip_prefix(&format!("{}{PREFIX_SEPARATOR}", info.backend))
        .unwrap_or(&info.name);
    let raw = server.raw_tools();
    raw.iter()
        .find(|t| t.name == own)
        .or_else(|| raw.iter().find(|t| t.name == info.name.as_str()))
        .cloned()
}

fn tool_from_info(info: &ToolInfo) -> Tool {
    let schema = match &info.input_schema {
        Value::Object(map) => map.clone(),
        _ => object_schema(),
    };
    let mut tool = Tool::new(
        info.name.clone(),
        info.description.clone().unwrap_or_default(),
        Arc::new(schema),
    );
    if info.description.is_none() {
        tool.description = None;
    }
    tool.title = info.annotations.title.clone();
    if let Some(Value::Object(out)) = &info.output_schema {
        tool.output_schema = Some(Arc::new(out.clone()));
    }
    if info.annotations != Default::default() {
        tool.annotations = serde_json::to_value(&info.annotations)
            .and_then(serde_json::from_value::<ToolAnnotations>)
            .ok();
    }
    tool
}

fn object_schema() -> JsonObject {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), json!("object"));
    schema
}

fn status_tool() -> Tool {
    let mut schema = object_schema();
    schema.insert("properties".into(), json!({}));
    let mut tool = Tool::new(
        STATUS_TOOL,
        "How this session's tool calls are doing: the calls running now (with elapsed time and \
         last progress), how finished calls ended, the tools that timed out, the recent \
         failures, and the circuit breakers that are open. Use it to decide what to retry, \
         wait for or avoid.",
        Arc::new(schema),
    );
    tool.title = Some("toolwarden status".into());
    let mut annotations = ToolAnnotations::new();
    annotations.read_only_hint = Some(true);
    annotations.idempotent_hint = Some(true);
    annotations.open_world_hint = Some(false);
    tool.annotations = Some(annotations);
    tool
}

/// A call's result as MCP's `CallToolResult`: the engine's content, structured content and
/// `isError`, with the outcome in `_meta["toolwarden/outcome"]`. A content block that rmcp's
/// model cannot hold is sent as a text block holding its JSON.
pub(crate) fn call_result(result: &CallResult) -> CallToolResult {
    let content = result.content.iter().map(block).collect();
    let mut r = CallToolResult::success(content);
    r.structured_content = result.structured_content.clone();
    r.is_error = Some(result.is_error);
    let mut meta = MetaObject::new();
    meta.insert(
        OUTCOME_META.into(),
        serde_json::to_value(&result.outcome).unwrap_or(Value::Null),
    );
    r.meta = Some(meta);
    r
}

/// One content block as MCP's (`ContentBlock`): a text block as it is; any other through
/// `ContentBlock`, and as text when it is not one.
fn block(content: &Content) -> ContentBlock {
    match content {
        Content::Text(text) => ContentBlock::text(text.clone()),
        Content::Other(value) => serde_json::from_value::<ContentBlock>(value.clone())
            .unwrap_or_else(|_| ContentBlock::text(value.to_string())),
    }
}

/// A governed call's result, written straight from the engine's result: the JSON
/// [`call_result`] makes, without making it first — the content is not copied and the outcome
/// not turned into a JSON tree on the way. `resultType` (`"complete"`) only for a stateless
/// client (`complete`); a handshake client's revision has none.
pub(crate) struct ResultJson<'a> {
    pub(crate) result: &'a CallResult,
    pub(crate) complete: bool,
}

impl serde::Serialize for ResultJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        /// The content blocks: text as it is (`{"type":"text","text":...}`, as `ContentBlock`
        /// writes it), any other as [`block`] makes it.
        struct Blocks<'a>(&'a [Content]);
        impl serde::Serialize for Blocks<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeSeq as _;
                let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
                for content in self.0 {
                    match content {
                        Content::Text(_) => seq.serialize_element(content)?,
                        Content::Other(_) => seq.serialize_element(&block(content))?,
                    }
                }
                seq.end()
            }
        }
        /// `_meta`: the outcome.
        struct Meta<'a>(&'a toolwarden_protocol::Outcome);
        impl serde::Serialize for Meta<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry(OUTCOME_META, self.0)?;
                map.end()
            }
        }
        let result = self.result;
        let mut map = serializer.serialize_map(None)?;
        if self.complete {
            map.serialize_entry("resultType", "complete")?;
        }
        map.serialize_entry("content", &Blocks(&result.content))?;
        if let Some(structured) = &result.structured_content {
            map.serialize_entry("structuredContent", structured)?;
        }
        map.serialize_entry("isError", &result.is_error)?;
        map.serialize_entry("_meta", &Meta(&result.outcome))?;
        map.end()
    }
}

/// The `initialize` answer: tools always; prompts, resources, completions and logging as the
/// union of what the servers offer (those that are or were up); with one server and
/// `prefix = false`, its instructions.
pub(crate) fn initialize_result(
    servers: &[Arc<McpServer>],
    opts: &GatewayOptions,
) -> InitializeResult {
    let mut caps = ServerCapabilities::default();
    let mut tools = ToolsCapability::default();
    tools.list_changed = Some(true);
    caps.tools = Some(tools);
    let infos: Vec<_> = servers
        .iter()
        .filter_map(|s| s.info().map(|i| (s.server_name().to_owned(), i)))
        .collect();
    for (_, info) in &infos {
        let c = &info.capabilities;
        if let Some(p) = &c.prompts {
            let mine = caps.prompts.get_or_insert_with(PromptsCapability::default);
            mine.list_changed = or(mine.list_changed, p.list_changed);
        }
        if let Some(r) = &c.resources {
            let mine = caps
                .resources
                .get_or_insert_with(ResourcesCapability::default);
            mine.subscribe = or(mine.subscribe, r.subscribe);
            mine.list_changed = or(mine.list_changed, r.list_changed);
        }
        if c.completions.is_some() {
            caps.completions.get_or_insert_with(JsonObject::new);
        }
        if c.logging.is_some() {
            caps.logging.get_or_insert_with(JsonObject::new);
        }
    }
    // Tasks toward clients (`super::tasks`): for the stateless clients that declare them.
    caps.extensions.get_or_insert_with(Default::default).insert(
        rmcp::model::TASKS_EXTENSION_ID.to_owned(),
        JsonObject::new(),
    );
    let mut config = InitializeResult::new(caps);
    config.server_info = Implementation::new("toolwarden", env!("CARGO_PKG_VERSION"));
    config.instructions = if servers.len() == 1 && !opts.prefix {
        infos.first().and_then(|(_, i)| i.instructions.clone())
    } else {
        let sections: Vec<String> = infos
            .iter()
            .filter_map(|(name, i)| {
                let text = i.instructions.as_deref()?.trim();
                (!text.is_empty()).then(|| format!("## {name}\n{text}"))
            })
            .collect();
        (!sections.is_empty()).then(|| {
            format!(
                "toolwarden governs these MCP servers; their tools and prompts are named \
                 SERVER{PREFIX_SEPARATOR}NAME.\n\n{}",
                sections.join("\n\n")
            )
        })
    };
    config
}

/// The `server/discover` answer to a stateless (2026-07-28) client: the `initialize` answer's
/// capabilities without those delivered through `subscriptions/listen` (`listChanged`,
/// resource `subscribe`), which the gateway does not serve to stateless clients — advertising
/// them would promise notifications that never come.
pub(crate) fn discover_result(
    servers: &[Arc<McpServer>],
    opts: &GatewayOptions,
    versions: Vec<ProtocolVersion>,
) -> DiscoverResult {
    // The same capabilities as `initialize`'s: list changes and resource subscriptions reach a
    // stateless client on a `subscriptions/listen` stream (`listen`).
    let config = initialize_result(servers, opts);
    DiscoverResult::from_server_info(versions, config)
}

fn or(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(false) || b.unwrap_or(false)),
    }
}

/// Whether a tool maps an argument to an `Mcp-Param-*` header anywhere in its input schema
/// (`x-mcp-header`).
pub(crate) fn maps_headers(tool: &Tool) -> bool {
    tool.input_schema.values().any(schema_maps_headers)
}

fn schema_maps_headers(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k == "x-mcp-header" || schema_maps_headers(v)),
        Value::Array(items) => items.iter().any(schema_maps_headers),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_written_straight_reads_as_the_one_made_first() {
        use toolwarden_protocol::{CancelReason, Outcome, Status};
        let outcome = |status: Status, detail: Option<&str>| Outcome {
            status,
            attempts: 1,
            call_id: "7".into(),
            turn_id: "t_1".into(),
            tool: "s__echo".into(),
            duration_ms: 12,
            provenance: None,
            detail: detail.map(str::to_owned),
            repeat_count: Some(2),
        };
        let ok = CallResult {
            outcome: outcome(Status::Ok, None),
            content: vec![
                Content::text("hi \"there\"\n"),
                Content::Other(json!({"type": "image", "data": "AA==", "mimeType": "image/png"})),
                Content::Other(json!({"not": "a block"})),
            ],
            structured_content: Some(json!({"n": 1, "nested": [null, "x"]})),
            is_error: false,
        };
        let failed = CallResult {
            outcome: outcome(
                Status::Cancelled {
                    reason: CancelReason::User,
                },
                Some("stopped"),
            ),
            content: vec![Content::text("[CANCELLED] stopped")],
            structured_content: None,
            is_error: true,
        };
        for result in [ok, failed] {
            // A stateless client's, with its `resultType`.
            let made = rmcp::model::ServerResult::from(rmcp::model::CallToolResponse::Complete(
                call_result(&result),
            ));
            let mut made = serde_json::to_value(made).unwrap();
            let complete = ResultJson {
                result: &result,
                complete: true,
            };
            assert_eq!(serde_json::to_value(&complete).unwrap(), made);
            // A handshake client's, without.
            made.as_object_mut().unwrap().remove("resultType");
            let handshake = ResultJson {
                result: &result,
                complete: false,
            };
            assert_eq!(serde_json::to_value(&handshake).unwrap(), made);
        }
    }

    #[test]
    fn header_mapped_arguments_are_found_anywhere_in_a_schema() {
        let tool = |schema: Value| {
            Tool::new(
                "t",
                "",
                Arc::new(serde_json::from_value::<rmcp::model::JsonObject>(schema).unwrap()),
            )
        };
        assert!(!maps_headers(&tool(
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        )));
        assert!(maps_headers(&tool(
            json!({"type": "object", "properties": {
                "outer": {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "R"}}}
            }})
        )));
    }
    use pretty_assertions::assert_eq;
    use toolwarden_protocol::{CancelReason, Content, Outcome, Status, ToolAnnotations as Hints};

    #[test]
    fn governed_failures_are_error_results_with_the_outcome() {
        let result = CallResult {
            outcome: Outcome {
                status: Status::Cancelled {
                    reason: CancelReason::User,
                },
                attempts: 1,
                call_id: "7".into(),
                turn_id: "t_1".into(),
                tool: "s__sleep".into(),
                duration_ms: 12,
                provenance: None,
                detail: None,
                repeat_count: None,
            },
            content: vec![
                Content::text("[CANCELLED] ..."),
                Content::from_value(json!({"type": "hologram"})),
            ],
            structured_content: None,
            is_error: true,
        };
        let wire = serde_json::to_value(call_result(&result)).unwrap();
        assert_eq!(
            wire,
            json!({
                "content": [
                    {"type": "text", "text": "[CANCELLED] ..."},
                    {"type": "text", "text": "{\"type\":\"hologram\"}"}
                ],
                "isError": true,
                "_meta": {"toolwarden/outcome": {"status": "cancelled", "reason": "user",
                    "attempts": 1, "call_id": "7", "turn_id": "t_1", "tool": "s__sleep",
                    "duration_ms": 12}},
                "resultType": "complete"
            })
        );
    }

    #[test]
    fn tools_keep_only_the_hints_they_have() {
        let info = ToolInfo {
            name: "add".into(),
            description: Some("Adds".into()),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            annotations: Hints {
                read_only_hint: Some(true),
                ..Default::default()
            },
            backend: "inprocess".into(),
            policy: Default::default(),
            breaker: toolwarden_protocol::BreakerStateKind::Closed,
            changed: None,
        };
        let wire = serde_json::to_value(tool_from_info(&info)).unwrap();
        assert_eq!(
            wire,
            json!({"name": "add", "description": "Adds", "inputSchema": {"type": "object"},
                   "annotations": {"readOnlyHint": true}})
        );
    }
}
