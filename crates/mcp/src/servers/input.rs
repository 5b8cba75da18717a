//! `input_required` (MCP 2026-07-28): a server that needs its client's user, model or roots
//! answers a request with `inputRequests` instead of sending requests of its own, and expects
//! the request again with `inputResponses` (and its `requestState` echoed). The backend has no
//! user or model: each input request is handed across the `link`, exactly as a handshake
//! server's `elicitation/create`, `sampling/createMessage` or `roots/list` request would be, so
//! the gateway asks whichever client is calling, in that client's own era.

#![allow(
    deprecated,
    reason = "sampling and roots are deprecated by SEP-2577 (MCP 2026-07-28), but input \
              requests still carry them"
)]

use rmcp::model::{ClientResult, InputRequest, InputRequiredResult, InputResponses, ServerRequest};
use tokio_util::sync::CancellationToken;
use toolwarden_core::AttemptError;

use super::link::{Link, no_client, server_request_method};

/// How many `input_required` rounds one call may take (the same cap as rmcp's own client).
pub(crate) const MAX_ROUNDS: usize = rmcp::model::DEFAULT_MRTR_MAX_ROUNDS;

/// What the next round sends: the responses, keyed as the server keyed its requests, and the
/// request state to echo.
pub(crate) struct Retry {
    pub(crate) responses: Option<InputResponses>,
    pub(crate) request_state: Option<String>,
}

/// Gets every input request of `asked` answered by the attached client. Dropping the future
/// cancels the client's requests still open.
pub(crate) async fn fulfil(
    link: &Link,
    server: &std::sync::Arc<str>,
    asked: InputRequiredResult,
) -> Result<Retry, AttemptError> {
    let InputRequiredResult {
        input_requests,
        request_state,
        ..
    } = asked;
    let requests = input_requests.unwrap_or_default();
    if requests.is_empty() && request_state.is_none() {
        return Err(AttemptError::Transport(format!(
            "MCP server {server:?} answered input_required with neither inputRequests nor \
             requestState"
        )));
    }
    let cancel = CancellationToken::new();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let asks = requests.into_iter().map(|(key, request)| {
        let cancel = cancel.clone();
        async move {
            let Some(request) = server_request(request) else {
                return Err(refused(server, "an unknown input request", "not supported"));
            };
            let method = server_request_method(&request);
            let Some(upstream) = link.get() else {
                return Err(refused(server, &method, &no_client(&method).message));
            };
            match upstream.request(server.clone(), request, cancel).await {
                Ok(answer) => Ok((key, answer_json(answer))),
                Err(e) => Err(refused(server, &method, &e.message)),
            }
        }
    });
    let answers = futures::future::try_join_all(asks).await?;
    Ok(Retry {
        responses: (!answers.is_empty()).then(|| answers.into_iter().collect()),
        request_state,
    })
}

/// The request a handshake server would have sent for the same need.
fn server_request(request: InputRequest) -> Option<ServerRequest> {
    Some(match request {
        InputRequest::CreateMessage(r) => ServerRequest::CreateMessageRequest(r),
        InputRequest::Elicitation(r) => ServerRequest::ElicitRequest(r),
        InputRequest::ListRoots(r) => ServerRequest::ListRootsRequest(r),
        _ => return None,
    })
}

fn answer_json(answer: ClientResult) -> serde_json::Value {
    serde_json::to_value(answer).unwrap_or(serde_json::Value::Null)
}

/// The call cannot go on without an answer the client did not give: like a server that
/// refused the call (not retried).
fn refused(server: &str, method: &str, why: &str) -> AttemptError {
    AttemptError::Rejected(format!(
        "MCP server {server:?} needs input ({method}) that no client gave: {why}"
    ))
}
