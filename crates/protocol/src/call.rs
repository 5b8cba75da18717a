//! A call as the engine receives it, and the result it gives back.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::CallId;
use crate::outcome::Outcome;

/// One request to run one tool with one input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Unique within its turn (the model's `tool_use` id or `tool_call_id`).
    pub id: CallId,
    /// The tool's name as exposed (e.g. `everything__echo`, `exec`).
    pub name: String,
    /// The input object.
    #[serde(default)]
    pub input: Value,
    /// Per-call hint replacing the policy's `timeout` for this call, clamped to `max_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Per-call hint replacing the policy's `idle_timeout` for this call, clamped to the total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
}

impl ToolCall {
    /// A call with no hints.
    pub fn new(id: impl Into<CallId>, name: impl Into<String>, input: Value) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            input,
            timeout_ms: None,
            idle_timeout_ms: None,
        }
    }

    /// The same call with a `timeout_ms` hint.
    pub fn with_timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = Some(ms);
        self
    }
}

/// One content block of a tool result, in MCP's shape (`{"type":"text","text":"..."}`,
/// `{"type":"image","data":...,"mimeType":...}`, ...). Kept as JSON so that every block type an
/// MCP server sends passes through unchanged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Content(pub Value);

impl Content {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Content(serde_json::json!({"type": "text", "text": text.into()}))
    }

    /// The block's `type`.
    pub fn kind(&self) -> Option<&str> {
        self.0.get("type").and_then(Value::as_str)
    }

    /// The text of a text block.
    pub fn as_text(&self) -> Option<&str> {
        match self.kind() {
            Some("text") => self.0.get("text").and_then(Value::as_str),
            _ => None,
        }
    }
}

/// The result of one call: what the model sees (`content`, `is_error`) and what programs read
/// (`outcome`). Exactly one per call, whatever happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallResult {
    /// The structured outcome.
    pub outcome: Outcome,
    /// For `ok`, the tool's own content; otherwise a text block starting with the outcome's tag
    /// (e.g. `[TIMEOUT] ...`), possibly followed by the tool's own error content.
    pub content: Vec<Content>,
    /// The tool's structured content, when it returned one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    /// Whether the model should read this as an error (every status but `ok`).
    pub is_error: bool,
}

impl CallResult {
    /// All text blocks joined by newlines.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for t in self.content.iter().filter_map(Content::as_text) {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(t);
        }
        out
    }
}
