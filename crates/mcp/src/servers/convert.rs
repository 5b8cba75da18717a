//! Between rmcp's model and toolwarden's: tools, results, errors. The engine never sees an rmcp
//! type, and the translation's rules (a hint only when the server set it, content blocks passed
//! through, which failure is which) are in one place.

use rmcp::ServiceError;
use rmcp::model::{ContentBlock, CustomResult, JsonObject, ServerResult, Tool};
use serde_json::Value;
use toolwarden_core::{AttemptError, ToolOutput, json_type_name};
use toolwarden_protocol::{Content, ToolAnnotations, ToolSpec};

/// A server's tool as toolwarden describes it. Only the hints the server set are kept: an
/// absent hint stays `None` (MCP's defaults would make every unannotated tool destructive).
pub(crate) fn tool_spec(tool: &Tool) -> ToolSpec {
    let annotations = tool.annotations.as_ref();
    ToolSpec {
        name: tool.name.to_string(),
        description: tool.description.as_ref().map(|d| d.to_string()),
        input_schema: Value::Object((*tool.input_schema).clone()),
        output_schema: tool
            .output_schema
            .as_ref()
            .map(|s| Value::Object((**s).clone())),
        annotations: ToolAnnotations {
            title: annotations
                .and_then(|a| a.title.clone())
                .or_else(|| tool.title.clone()),
            read_only_hint: annotations.and_then(|a| a.read_only_hint),
            destructive_hint: annotations.and_then(|a| a.destructive_hint),
            idempotent_hint: annotations.and_then(|a| a.idempotent_hint),
            open_world_hint: annotations.and_then(|a| a.open_world_hint),
        },
    }
}

/// A call's input as MCP `arguments`: an object, or nothing for `null`.
pub(crate) fn arguments(input: &Value) -> Result<Option<JsonObject>, AttemptError> {
    match input {
        Value::Object(map) => Ok(Some(map.clone())),
        Value::Null => Ok(None),
        other => Err(AttemptError::Rejected(format!(
            "MCP tool input must be a JSON object, not {}",
            json_type_name(other)
        ))),
    }
}

/// A `tools/call` answer as a tool output. Content blocks pass through as JSON.
pub(crate) fn tool_output(result: ServerResult) -> Result<ToolOutput, AttemptError> {
    match result {
        ServerResult::CallToolResult(r) => {
            let content = r
                .content
                .into_iter()
                .map(|block| match block {
                    // The commonest block moves over as its string.
                    ContentBlock::Text(text)
                        if text.meta.is_none() && text.annotations.is_none() =>
                    {
                        Ok(Content::Text(text.text))
                    }
                    other => serde_json::to_value(&other).map(Content::from_value),
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    AttemptError::Transport(format!("cannot re-encode a content block: {e}"))
                })?;
            Ok(ToolOutput {
                content,
                structured_content: r.structured_content,
                is_error: r.is_error.unwrap_or(false),
            })
        }
        // rmcp falls back to a raw value when a block type is unknown to it: pass it on as is.
        ServerResult::CustomResult(CustomResult(Value::Object(map))) => {
            let content = match map.get("content") {
                Some(Value::Array(blocks)) => {
                    blocks.iter().cloned().map(Content::from_value).collect()
                }
                None => Vec::new(),
                Some(_) => {
                    return Err(AttemptError::Transport(
                        "the server answered tools/call with a `content` that is not an array"
                            .into(),
                    ));
                }
            };
            Ok(ToolOutput {
                content,
                structured_content: map.get("structuredContent").cloned(),
                is_error: map.get("isError").and_then(Value::as_bool).unwrap_or(false),
            })
        }
        ServerResult::EmptyResult(_) => Ok(ToolOutput::default()),
        other => Err(AttemptError::Transport(format!(
            "the server answered tools/call with an unexpected result: {}",
            short_json(&other)
        ))),
    }
}

fn short_json(v: &impl serde::Serialize) -> String {
    let mut s = serde_json::to_string(v).unwrap_or_default();
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// What went wrong with a request, when it is not the connection's end.
pub(crate) fn service_error(e: &ServiceError) -> AttemptError {
    match e {
        ServiceError::McpError(err) => AttemptError::Rejected(format!(
            "the server rejected the call: {} (JSON-RPC error {})",
            err.message, err.code.0
        )),
        other => AttemptError::Transport(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn tool(v: Value) -> Tool {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_explicit_hints_are_kept() {
        let t = tool(json!({"name": "a", "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": true}}));
        assert_eq!(
            tool_spec(&t),
            ToolSpec {
                name: "a".into(),
                description: None,
                input_schema: json!({"type": "object"}),
                output_schema: None,
                annotations: ToolAnnotations {
                    read_only_hint: Some(true),
                    ..Default::default()
                },
            }
        );
        let bare = tool(json!({"name": "b", "inputSchema": {"type": "object"}}));
        assert_eq!(tool_spec(&bare).annotations, ToolAnnotations::default());
    }

    #[test]
    fn results_pass_content_through() {
        let r: ServerResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "hi"}],
            "structuredContent": {"a": 1},
            "isError": true
        }))
        .unwrap();
        assert_eq!(
            tool_output(r).unwrap(),
            ToolOutput {
                content: vec![Content::from_value(json!({"type": "text", "text": "hi"}))],
                structured_content: Some(json!({"a": 1})),
                is_error: true,
            }
        );
        // A block type rmcp does not know still passes through unchanged.
        let odd = json!({"type": "hologram", "frames": 3});
        let r: ServerResult = serde_json::from_value(json!({"content": [odd.clone()]})).unwrap();
        assert_eq!(
            tool_output(r).unwrap().content,
            vec![Content::from_value(odd)]
        );
    }

    #[test]
    fn non_object_input_is_rejected() {
        assert_eq!(arguments(&Value::Null), Ok(None));
        assert!(matches!(
            arguments(&json!([1])),
            Err(AttemptError::Rejected(_))
        ));
    }
}
