//! What a backend says about one of its tools.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Behaviour hints of a tool, as MCP defines them. Only hints a server sets explicitly are kept:
/// an absent hint is `None`, never MCP's default (which would make every tool destructive).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// A display title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tool does not modify its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may perform destructive updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling the tool repeatedly with the same input has no additional effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool interacts with an open world of external entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

/// A named operation with a JSON input schema, served by a backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// The tool's name within its backend (the gateway prefixes it with `SERVER__`).
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema its input must match.
    pub input_schema: Value,
    /// The JSON schema of its structured output, if declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Behaviour hints.
    #[serde(default)]
    pub annotations: ToolAnnotations,
}

impl ToolSpec {
    /// A tool with a description and input schema and no annotations.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        Self {
            name: name.into(),
            description: Some(description.into()),
            input_schema,
            output_schema: None,
            annotations: ToolAnnotations::default(),
        }
    }
}

/// The name of the built-in shell tool, and of its `[exec]` table.
pub const EXEC_TOOL: &str = "exec";
