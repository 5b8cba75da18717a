//! 2026-07-28 has no requests from a server to its client: a tool that needs the client's
//! user, model or roots answers `input_required` with `inputRequests`, and the client calls
//! again with `inputResponses` (and the `requestState` echoed). `elicit`, `sample` and `roots`
//! do that here when the request speaks 2026-07-28; they ask through a request otherwise
//! (`tools.rs`). The one input request is keyed `ask`; the request state says which tool
//! asked, and a retry whose state does not match is refused.

#![allow(
    deprecated,
    reason = "sampling and roots are deprecated by SEP-2577 (MCP 2026-07-28), but input \
              requests still carry them"
)]

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResponse, CreateMessageRequest, ElicitRequest, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, JsonObject, ListRootsRequest,
};
use serde_json::{Value, json};

use crate::tools::{json_result, text, wire};

const KEY: &str = "ask";

/// Whether `name` asks its client for something.
pub(crate) fn asks(name: &str) -> bool {
    matches!(name, "elicit" | "sample" | "roots")
}

/// One round of `name`: `input_required` at first, the answer once the client responded.
pub(crate) fn round(
    name: &str,
    args: &JsonObject,
    responses: Option<&InputResponses>,
    state: Option<&str>,
) -> Result<CallToolResponse, McpError> {
    let expected_state = format!("{name}:1");
    let Some(answer) = responses.and_then(|r| r.get(KEY)) else {
        let mut requests = InputRequests::new();
        requests.insert(KEY.to_owned(), ask(name, args)?);
        return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
            Some(requests),
            Some(expected_state),
        )));
    };
    if state != Some(expected_state.as_str()) {
        return Err(McpError::invalid_params(
            format!("requestState {state:?} does not belong to {name}"),
            None,
        ));
    }
    let result = match name {
        "elicit" => json_result(json!({"action": answer.get("action"),
            "content": answer.get("content")})),
        "sample" => text(
            answer
                .pointer("/content/text")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        ),
        _ => json_result(answer.clone()),
    };
    Ok(CallToolResponse::Complete(result))
}

fn ask(name: &str, args: &JsonObject) -> Result<InputRequest, McpError> {
    Ok(match name {
        "elicit" => {
            let message = args.get("message").and_then(Value::as_str).unwrap_or("?");
            InputRequest::Elicitation(ElicitRequest::new(wire(json!({
                "mode": "form",
                "message": message,
                "requestedSchema": {"type": "object",
                    "properties": {"answer": {"type": "string"}}}
            }))?))
        }
        "sample" => {
            let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or("hi");
            InputRequest::CreateMessage(CreateMessageRequest::new(wire(json!({
                "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                "maxTokens": 100
            }))?))
        }
        _ => InputRequest::ListRoots(ListRootsRequest::default()),
    })
}
