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
/// `{"type":"image","data":...,"mimeType":...}`, ...).
///
/// A plain text block — by far the commonest — is kept as its string; every other block (images,
/// audio, resources, links, text with annotations or `_meta`) is kept as its JSON, so that every
/// block type an MCP server sends passes through unchanged. Build blocks from JSON with
/// [`Content::from_value`], which picks the form, so that equal blocks compare equal.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// `{"type":"text","text":...}` and nothing else.
    Text(String),
    /// Any other block, as its JSON.
    Other(Value),
}

impl Content {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Content::Text(text.into())
    }

    /// A block from its JSON.
    pub fn from_value(value: Value) -> Self {
        match value {
            Value::Object(mut map)
                if map.len() == 2
                    && map.get("type").and_then(Value::as_str) == Some("text")
                    && map.get("text").is_some_and(Value::is_string) =>
            {
                match map.remove("text") {
                    Some(Value::String(text)) => Content::Text(text),
                    // Checked above.
                    _ => Content::Other(Value::Object(map)),
                }
            }
            other => Content::Other(other),
        }
    }

    /// The block's JSON.
    pub fn to_value(&self) -> Value {
        match self {
            Content::Text(text) => serde_json::json!({"type": "text", "text": text}),
            Content::Other(value) => value.clone(),
        }
    }

    /// The block's JSON, taking it.
    pub fn into_value(self) -> Value {
        match self {
            Content::Text(text) => serde_json::json!({"type": "text", "text": text}),
            Content::Other(value) => value,
        }
    }

    /// The block's `type`.
    pub fn kind(&self) -> Option<&str> {
        match self {
            Content::Text(_) => Some("text"),
            Content::Other(value) => value.get("type").and_then(Value::as_str),
        }
    }

    /// The text of a text block (annotated ones too).
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(text) => Some(text),
            Content::Other(value) => match self.kind() {
                Some("text") => value.get("text").and_then(Value::as_str),
                _ => None,
            },
        }
    }

    /// A member of the block's JSON other than a plain text block's (e.g. an image's `data`).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Content::Text(_) => None,
            Content::Other(value) => value.get(key),
        }
    }
}

impl std::fmt::Display for Content {
    /// The block's JSON.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Content::Text(_) => write!(f, "{}", self.to_value()),
            Content::Other(value) => write!(f, "{value}"),
        }
    }
}

impl Serialize for Content {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        match self {
            Content::Text(text) => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
                map.end()
            }
            Content::Other(value) => value.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Content::from_value)
    }
}

/// The result of one call: what the model sees (`content`, `is_error`) and what programs read
/// (`outcome`). Exactly one per call, whatever happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallResult {
    /// The structured outcome.
    pub outcome: Outcome,
    /// For `ok`, and for a tool's own error that came with content, the tool's own content;
    /// otherwise a text block starting with the outcome's tag (e.g. `[TIMEOUT] ...`). A note of the
    /// loop detector may follow as one more text block.
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plain_text_block_is_kept_as_its_string_and_anything_else_as_json() {
        let plain = Content::from_value(json!({"type": "text", "text": "hi"}));
        assert_eq!(plain, Content::text("hi"));
        let annotated = json!({"type": "text", "text": "hi", "annotations": {"priority": 1}});
        assert_eq!(
            Content::from_value(annotated.clone()),
            Content::Other(annotated.clone())
        );
        let image = json!({"type": "image", "data": "AA==", "mimeType": "image/png"});
        let image_block = Content::from_value(image.clone());
        assert_eq!(image_block, Content::Other(image.clone()));
        // A "text" that is not a string is not a text block.
        let odd = json!({"type": "text", "text": 5});
        assert_eq!(Content::from_value(odd.clone()), Content::Other(odd));

        assert_eq!(plain.kind(), Some("text"));
        assert_eq!(plain.as_text(), Some("hi"));
        assert_eq!(Content::from_value(annotated).as_text(), Some("hi"));
        assert_eq!(image_block.kind(), Some("image"));
        assert_eq!(image_block.as_text(), None);
        assert_eq!(image_block.get("mimeType"), Some(&json!("image/png")));
        assert_eq!(plain.get("text"), None);
    }

    #[test]
    fn blocks_serialize_as_mcp_shapes_and_round_trip() {
        let blocks = vec![
            Content::text("a \"quoted\"\nline"),
            Content::from_value(json!({"type": "image", "data": "AA==", "mimeType": "image/png"})),
        ];
        let value = serde_json::to_value(&blocks).unwrap();
        assert_eq!(
            value,
            json!([
                {"type": "text", "text": "a \"quoted\"\nline"},
                {"type": "image", "data": "AA==", "mimeType": "image/png"}
            ])
        );
        assert_eq!(blocks[0].to_value(), value[0]);
        assert_eq!(blocks[0].clone().into_value(), value[0]);
        assert_eq!(blocks[0].to_string(), value[0].to_string());
        let back: Vec<Content> =
            serde_json::from_str(&serde_json::to_string(&blocks).unwrap()).unwrap();
        assert_eq!(back, blocks);
    }
}
