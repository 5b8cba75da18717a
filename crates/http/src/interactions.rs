//! `GET /v1/interactions` and `POST /v1/interactions/{id}`, and the passive `http` interactor
//! that makes approvals wait for a person answering here.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde_json::{Value, json};
use toolwarden_core::{AnswerError, AnswerSender, Interactor};
use toolwarden_protocol::{
    Interaction, InteractionAction, InteractionAnswer, InteractionId, LOCAL_PRINCIPAL, Scope,
};

use crate::app::App;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::request::{body_bytes, path, require_json};

/// The name answers through this API are recorded under (`interaction_answered.by`).
pub const INTERACTOR: &str = "http";

/// A passive interactor: questions are listed by `GET /v1/interactions` and answered by
/// `POST /v1/interactions/{id}`; it can answer every kind.
pub(crate) struct HttpInteractor;

impl Interactor for HttpInteractor {
    fn name(&self) -> &str {
        INTERACTOR
    }

    fn can_answer(&self, _interaction: &Interaction) -> bool {
        true
    }

    fn present(&self, _interaction: &Interaction, _answers: AnswerSender) {}
}

/// `GET /v1/interactions`: those about the caller's own calls, or everyone's with `read` or
/// `approve`.
pub(crate) async fn list(State(app): State<App>, caller: Caller) -> Json<Value> {
    let mut pending = app.engine.interactions().pending();
    // An approver answers others' questions: it sees them.
    if !caller.may(Scope::Approve) {
        pending.retain(|i| caller.sees(i.scope.principal.as_deref().unwrap_or(LOCAL_PRINCIPAL)));
    }
    Json(json!({"interactions": pending}))
}

/// An optional string field of the answer.
fn opt_string(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::invalid(format!(
            "{key}: expected a string, got {other}"
        ))),
    }
}

/// Parses `{"action": "approve"|"deny", "value"?, "reason"?}`.
fn parse_answer(body: &[u8]) -> Result<InteractionAnswer, ApiError> {
    let root: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("body: malformed JSON: {e}")))?;
    let Value::Object(obj) = root else {
        return Err(ApiError::invalid(
            "body: expected a JSON object {\"action\": \"approve\" | \"deny\", ...}",
        ));
    };
    crate::format::known_keys(&obj, "", &["action", "value", "reason"])?;
    let action = match obj.get("action") {
        Some(Value::String(a)) if a == "approve" => InteractionAction::Approve,
        Some(Value::String(a)) if a == "deny" => InteractionAction::Deny,
        None | Some(Value::Null) => return Err(ApiError::invalid("action: missing")),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "action: expected \"approve\" or \"deny\", got {other}"
            )));
        }
    };
    Ok(InteractionAnswer {
        action,
        value: opt_string(&obj, "value")?,
        reason: opt_string(&obj, "reason")?,
        answerer: None,
    })
}

/// `POST /v1/interactions/{id}`.
pub(crate) async fn answer(
    State(app): State<App>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    // Always, even for the caller's own call: an agent must not approve its own calls.
    caller.needs(Scope::Approve, "answer approvals")?;
    let id = InteractionId::from(path(id)?);
    require_json(&headers)?;
    let answer = InteractionAnswer {
        answerer: Some(caller.name().to_owned()),
        ..parse_answer(&body_bytes(body)?)?
    };
    app.engine
        .interactions()
        .answer(&id, answer, INTERACTOR)
        .map_err(|e| match e {
            AnswerError::NotPending(_) => ApiError::not_found(e.to_string()),
            AnswerError::MissingValue(_) => ApiError::invalid(format!("value: missing; {e}")),
        })?;
    Ok(Json(json!({"ok": true, "interaction_id": id})))
}
