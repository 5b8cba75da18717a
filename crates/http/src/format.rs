//! The two wire families of a turn: Anthropic `tool_use` blocks in, `tool_result` blocks out;
//! OpenAI tool calls in, tool messages out.
//!
//! Bodies are parsed by hand from a `serde_json::Value` rather than derived, so that a bad body is
//! answered with what is wrong and exactly where (`calls[2].function.arguments: ...`): an agent
//! author reading a 400 should not have to guess which of twenty calls broke it.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use toolwarden_core::{ResultRenderer, json_type_name};
use toolwarden_protocol::{CallResult, Content, SessionId, ToolCall, TurnId};

use crate::error::ApiError;

/// The family of a turn's calls; its results are answered in the same family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// `{"type":"tool_use","id","name","input"}` in, `{"type":"tool_result",...}` out.
    Anthropic,
    /// `{"id","type":"function","function":{"name","arguments"}}` in,
    /// `{"role":"tool","tool_call_id","content"}` out.
    OpenAi,
}

impl Family {
    fn describe(self) -> &'static str {
        match self {
            Family::Anthropic => "an Anthropic tool_use block",
            Family::OpenAi => "an OpenAI tool call",
        }
    }
}

/// A `POST /v1/turns` body, checked.
#[derive(Debug)]
pub(crate) struct TurnBody {
    pub(crate) session_id: Option<SessionId>,
    pub(crate) parent_turn_id: Option<TurnId>,
    pub(crate) calls: Vec<ToolCall>,
    pub(crate) family: Family,
    /// `"detach": true`: answer 202 at once and let the turn run on.
    pub(crate) detach: bool,
}

/// Refuses a key of `obj` that is not one of `allowed`: a misspelt key would otherwise be
/// ignored (`session` for `session_id` ran the turn in a fresh session). The message names the
/// key where it stands and the nearest allowed one.
pub(crate) fn known_keys(
    obj: &Map<String, Value>,
    path: &str,
    allowed: &[&str],
) -> Result<(), ApiError> {
    let Some(key) = obj.keys().find(|k| !allowed.contains(&k.as_str())) else {
        return Ok(());
    };
    let at = if path.is_empty() {
        key.clone()
    } else {
        format!("{path}.{key}")
    };
    let hint = match toolwarden_core::suggest::closest(key, allowed.iter().copied()) {
        Some(near) => format!("did you mean {near:?}? "),
        None => String::new(),
    };
    Err(ApiError::invalid(format!(
        "{at}: unknown key; {hint}expected {}",
        allowed.join(", ")
    )))
}

/// The keys of a `POST /v1/turns` body.
const TURN_KEYS: &[&str] = &["session_id", "parent_turn_id", "calls", "detach"];
/// The keys of an Anthropic `tool_use` block: its own (`cache_control` and `caller` may come
/// with a block taken from a model's answer, and are ignored) and toolwarden's hints.
const ANTHROPIC_KEYS: &[&str] = &[
    "type",
    "id",
    "name",
    "input",
    "timeout_ms",
    "idle_timeout_ms",
    "cache_control",
    "caller",
];
/// The keys of an OpenAI tool call (`index` comes with streamed ones, and is ignored) and
/// toolwarden's hints.
const OPENAI_KEYS: &[&str] = &[
    "id",
    "type",
    "function",
    "index",
    "timeout_ms",
    "idle_timeout_ms",
];
const OPENAI_FUNCTION_KEYS: &[&str] = &["name", "arguments"];

/// An optional, non-empty string field (`null` counts as absent).
fn opt_string(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => {
            Err(ApiError::invalid(format!("{path}: must not be empty")))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::invalid(format!(
            "{path}: expected a string, got {}",
            json_type_name(other)
        ))),
    }
}

/// A required, non-empty string field.
fn req_string(obj: &Map<String, Value>, key: &str, path: &str) -> Result<String, ApiError> {
    opt_string(obj, key, path)?.ok_or_else(|| ApiError::invalid(format!("{path}: missing")))
}

/// An optional millisecond count.
fn opt_millis(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::invalid(format!(
                "{path}: expected a non-negative integer of milliseconds, got {v}"
            ))
        }),
    }
}

/// Parses and checks a `POST /v1/turns` body.
pub(crate) fn parse_turn(body: &[u8]) -> Result<TurnBody, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(
            "body: empty; expected a JSON object with \"calls\"",
        ));
    }
    let root: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("body: malformed JSON: {e}")))?;
    let Value::Object(root) = root else {
        return Err(ApiError::invalid(format!(
            "body: expected a JSON object, got {}",
            json_type_name(&root)
        )));
    };
    known_keys(&root, "", TURN_KEYS)?;
    let session_id = opt_string(&root, "session_id", "session_id")?.map(SessionId::from);
    let parent_turn_id = opt_string(&root, "parent_turn_id", "parent_turn_id")?.map(TurnId::from);
    let detach = match root.get("detach") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "detach: expected a boolean, got {}",
                json_type_name(other)
            )));
        }
    };
    let items = match root.get("calls") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "calls: missing; a turn needs at least one call",
            ));
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid(
                "calls: empty; a turn needs at least one call",
            ));
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "calls: expected an array, got {}",
                json_type_name(other)
            )));
        }
    };
    let mut family: Option<Family> = None;
    let mut calls: Vec<ToolCall> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("calls[{i}]");
        let Value::Object(obj) = item else {
            return Err(ApiError::invalid(format!(
                "{path}: expected an object (an Anthropic tool_use block or an OpenAI tool call), got {}",
                json_type_name(item)
            )));
        };
        let this = family_of(obj, &path)?;
        match family {
            None => family = Some(this),
            Some(first) if first != this => {
                return Err(ApiError::invalid(format!(
                    "{path}: {}, but calls[0] is {}; one family per request",
                    this.describe(),
                    first.describe()
                )));
            }
            Some(_) => {}
        }
        let call = match this {
            Family::Anthropic => anthropic_call(obj, &path)?,
            Family::OpenAi => openai_call(obj, &path)?,
        };
        if let Some(j) = calls.iter().position(|c| c.id == call.id) {
            return Err(ApiError::invalid(format!(
                "{path}.id: {:?} is already the id of calls[{j}]; ids must be unique within a turn",
                call.id.as_str()
            )));
        }
        calls.push(call);
    }
    Ok(TurnBody {
        session_id,
        parent_turn_id,
        calls,
        family: family.unwrap_or(Family::Anthropic),
        detach,
    })
}

/// Which family one call is: by its `type`, else by the presence of `function`.
fn family_of(obj: &Map<String, Value>, path: &str) -> Result<Family, ApiError> {
    match obj.get("type") {
        None | Some(Value::Null) => Ok(if obj.contains_key("function") {
            Family::OpenAi
        } else {
            Family::Anthropic
        }),
        Some(Value::String(t)) if t == "tool_use" => Ok(Family::Anthropic),
        Some(Value::String(t)) if t == "function" => Ok(Family::OpenAi),
        Some(other) => Err(ApiError::invalid(format!(
            "{path}.type: expected \"tool_use\" (Anthropic) or \"function\" (OpenAI), got {other}"
        ))),
    }
}

/// The hints every call may carry, whatever its family.
fn with_hints(
    mut call: ToolCall,
    obj: &Map<String, Value>,
    path: &str,
) -> Result<ToolCall, ApiError> {
    call.timeout_ms = opt_millis(obj, "timeout_ms", &format!("{path}.timeout_ms"))?;
    call.idle_timeout_ms = opt_millis(obj, "idle_timeout_ms", &format!("{path}.idle_timeout_ms"))?;
    Ok(call)
}

fn anthropic_call(obj: &Map<String, Value>, path: &str) -> Result<ToolCall, ApiError> {
    known_keys(obj, path, ANTHROPIC_KEYS)?;
    let id = req_string(obj, "id", &format!("{path}.id"))?;
    let name = req_string(obj, "name", &format!("{path}.name"))?;
    let input = match obj.get("input") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "{path}.input: expected an object, got {}",
                json_type_name(other)
            )));
        }
    };
    with_hints(ToolCall::new(id, name, input), obj, path)
}

fn openai_call(obj: &Map<String, Value>, path: &str) -> Result<ToolCall, ApiError> {
    known_keys(obj, path, OPENAI_KEYS)?;
    let id = req_string(obj, "id", &format!("{path}.id"))?;
    let function = match obj.get("function") {
        Some(Value::Object(f)) => f,
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(format!("{path}.function: missing")));
        }
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "{path}.function: expected an object, got {}",
                json_type_name(other)
            )));
        }
    };
    let fpath = format!("{path}.function");
    known_keys(function, &fpath, OPENAI_FUNCTION_KEYS)?;
    let name = req_string(function, "name", &format!("{fpath}.name"))?;
    let apath = format!("{fpath}.arguments");
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => s,
        None | Some(Value::Null) => return Err(ApiError::invalid(format!("{apath}: missing"))),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "{apath}: expected a string holding JSON, got {}",
                json_type_name(other)
            )));
        }
    };
    let input = if arguments.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str::<Value>(arguments)
            .map_err(|e| ApiError::invalid(format!("{apath}: expected JSON, {e}")))?
    };
    if !input.is_object() {
        return Err(ApiError::invalid(format!(
            "{apath}: expected a JSON object, got {}",
            json_type_name(&input)
        )));
    }
    with_hints(ToolCall::new(id, name, input), obj, path)
}

/// The renderer of a family: the same function makes the JSON answer and `turn_end.results`.
pub(crate) fn renderer(family: Family) -> ResultRenderer {
    match family {
        Family::Anthropic => Arc::new(anthropic_result),
        Family::OpenAi => Arc::new(openai_result),
    }
}

/// The structured outcome, as the `toolwarden` field.
fn outcome_json(result: &CallResult) -> Value {
    serde_json::to_value(&result.outcome).unwrap_or(Value::Null)
}

/// An Anthropic `tool_result` block.
pub(crate) fn anthropic_result(call: &ToolCall, result: &CallResult) -> Value {
    json!({
        "type": "tool_result",
        "tool_use_id": call.id,
        "content": result.content.iter().map(anthropic_block).collect::<Vec<_>>(),
        "is_error": result.is_error,
        "toolwarden": outcome_json(result),
    })
}

/// An MCP content block as an Anthropic one: text as text, a base64 image as an image source,
/// anything else (audio, resources, links) as its JSON in a text block — the model still sees it.
fn anthropic_block(block: &Content) -> Value {
    if let Some(text) = block.as_text() {
        return json!({"type": "text", "text": text});
    }
    if let Some((data, mime)) = image_parts(block) {
        return json!({
            "type": "image",
            "source": {"type": "base64", "media_type": mime, "data": data},
        });
    }
    json!({"type": "text", "text": block.to_string()})
}

/// The data and MIME type of an MCP image block.
fn image_parts(block: &Content) -> Option<(&str, &str)> {
    if block.kind() != Some("image") {
        return None;
    }
    let data = block.get("data")?.as_str()?;
    let mime = block.get("mimeType")?.as_str()?;
    Some((data, mime))
}

/// An OpenAI tool message. Its `content` is one string: text blocks joined by newlines, an image
/// as a short placeholder (a tool message cannot carry one, and base64 would only cost tokens),
/// anything else as its JSON.
pub(crate) fn openai_result(call: &ToolCall, result: &CallResult) -> Value {
    let parts: Vec<String> = result
        .content
        .iter()
        .map(|block| {
            if let Some(text) = block.as_text() {
                text.to_owned()
            } else if let Some((data, mime)) = image_parts(block) {
                format!("[image {mime}, {} bytes of base64, not shown]", data.len())
            } else {
                block.to_string()
            }
        })
        .collect();
    json!({
        "role": "tool",
        "tool_call_id": call.id,
        "content": parts.join("\n"),
        "toolwarden": outcome_json(result),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use toolwarden_protocol::{Outcome, Status};

    fn result(content: Vec<Content>) -> CallResult {
        CallResult {
            outcome: Outcome {
                status: Status::Ok,
                attempts: 1,
                call_id: "c1".into(),
                turn_id: "t_1".into(),
                tool: "pic".into(),
                duration_ms: 3,
                provenance: None,
                detail: None,
                repeat_count: None,
            },
            content,
            structured_content: None,
            is_error: false,
        }
    }

    fn blocks() -> Vec<Content> {
        vec![
            Content::from_value(
                json!({"type": "text", "text": "a chart", "annotations": {"priority": 1}}),
            ),
            Content::from_value(
                json!({"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}),
            ),
            Content::from_value(json!({"type": "resource_link", "uri": "file:///x", "name": "x"})),
        ]
    }

    #[test]
    fn mcp_content_becomes_anthropic_blocks() {
        let call = ToolCall::new("c1", "pic", json!({}));
        assert_eq!(
            anthropic_result(&call, &result(blocks())),
            json!({
                "type": "tool_result",
                "tool_use_id": "c1",
                "content": [
                    {"type": "text", "text": "a chart"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}},
                    {"type": "text", "text": r#"{"name":"x","type":"resource_link","uri":"file:///x"}"#},
                ],
                "is_error": false,
                "toolwarden": {"status": "ok", "attempts": 1, "call_id": "c1", "turn_id": "t_1",
                               "tool": "pic", "duration_ms": 3},
            })
        );
    }

    #[test]
    fn mcp_content_becomes_one_openai_string() {
        let call = ToolCall::new("c1", "pic", json!({}));
        assert_eq!(
            openai_result(&call, &result(blocks())),
            json!({
                "role": "tool",
                "tool_call_id": "c1",
                "content": "a chart\n[image image/png, 8 bytes of base64, not shown]\n{\"name\":\"x\",\"type\":\"resource_link\",\"uri\":\"file:///x\"}",
                "toolwarden": {"status": "ok", "attempts": 1, "call_id": "c1", "turn_id": "t_1",
                               "tool": "pic", "duration_ms": 3},
            })
        );
    }

    #[test]
    fn both_families_parse_to_the_same_calls() {
        let anthropic = parse_turn(
            br#"{"session_id":"s","calls":[{"type":"tool_use","id":"a","name":"echo","input":{"x":1},"timeout_ms":50}]}"#,
        )
        .unwrap();
        let openai = parse_turn(
            br#"{"session_id":"s","calls":[{"id":"a","type":"function","function":{"name":"echo","arguments":"{\"x\":1}"},"timeout_ms":50}]}"#,
        )
        .unwrap();
        assert_eq!(anthropic.family, Family::Anthropic);
        assert_eq!(openai.family, Family::OpenAi);
        assert_eq!(anthropic.calls, openai.calls);
        assert_eq!(
            anthropic.calls,
            vec![ToolCall::new("a", "echo", json!({"x": 1})).with_timeout_ms(50)]
        );
    }

    #[test]
    fn empty_arguments_and_absent_input_are_an_empty_object() {
        let openai = parse_turn(
            br#"{"calls":[{"id":"a","type":"function","function":{"name":"f","arguments":""}}]}"#,
        )
        .unwrap();
        let anthropic = parse_turn(br#"{"calls":[{"id":"a","name":"f"}]}"#).unwrap();
        assert_eq!(openai.calls[0].input, json!({}));
        assert_eq!(anthropic.calls[0].input, json!({}));
    }
}
