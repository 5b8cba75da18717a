//! Read-only views: `GET /v1/sessions/{id}/status`, `GET /v1/tools`, `GET /metrics`,
//! `GET /healthz`, `GET /readyz`.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use toolwarden_core::StoreHealth;
use toolwarden_core::shared::SharedHealth;
use toolwarden_protocol::{Scope, ServerStateKind, SessionId, SessionKey};

use crate::ErrorCode;
use crate::app::App;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::request::path;

/// The content type of the metrics: `prometheus-client` writes the OpenMetrics text format
/// (which Prometheus scrapes natively).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /v1/sessions/{id}/status`.
pub(crate) async fn session(
    State(app): State<App>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = SessionId::from(path(id)?);
    // The caller's own session of that id: a session id is its principal's.
    let key = SessionKey::new(caller.0.name.clone(), id.clone());
    let status = app
        .engine
        .session_status(&key)
        .ok_or_else(|| ApiError::not_found(format!("session {id} is unknown")))?;
    Ok(Json(json!(status)))
}

/// `GET /v1/me`: who the caller is and what it may do (the dashboard reads it to show only what
/// its user can do).
pub(crate) async fn me(caller: Caller) -> Json<Value> {
    Json(json!({"principal": caller.0.name, "scopes": caller.0.scopes}))
}

/// `GET /.well-known/oauth-protected-resource[/…]`: the RFC 9728 metadata of this resource, so
/// that an MCP client finds the authorization server (404 without `[auth.oauth]`).
pub(crate) async fn resource_metadata(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    match &app.oauth {
        Some(oauth) => Ok(Json(oauth.metadata())),
        None => Err(ApiError::not_found(
            "this server does not accept OAuth access tokens ([auth.oauth] is not configured)",
        )),
    }
}

/// `GET /v1/replicas`: the replicas sharing this one's PostgreSQL trail, each with its state
/// (`live`, `late`, `dead`, `stopped`), last renewal of its lease, and — for a dead one — the
/// survivor that recorded its open calls. A trail of one process (SQLite, or none) answers
/// `"shared": false` and no replicas.
pub(crate) async fn replicas(
    State(app): State<App>,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    caller.needs(Scope::Read, "list the replicas")?;
    let listed = match app.engine.store() {
        Some(store) => store
            .replicas()
            .await
            .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?,
        None => None,
    };
    Ok(Json(json!({
        "shared": listed.is_some(),
        "replicas": listed.unwrap_or_default(),
    })))
}

/// `GET /v1/tools`: every tool with its effective policy, breaker, and its backend's state
/// (a server's last reported state; in-process tools and `exec` are always `up`).
pub(crate) async fn tools(State(app): State<App>, caller: Caller) -> Result<Json<Value>, ApiError> {
    if !caller.may(Scope::Read) {
        caller.needs(Scope::Call, "list the tools")?;
    }
    let servers = app.engine.servers();
    // A tool a rule denies the caller outright is not listed to it.
    let rules = app.engine.rules();
    let tools: Vec<Value> = app
        .engine
        .tools()
        .into_iter()
        .filter(|tool| {
            !rules
                .as_ref()
                .is_some_and(|r| r.hides(&tool.name, caller.name()))
        })
        .map(|tool| {
            let server = servers.get(&tool.backend);
            let state = server.map_or(ServerStateKind::Up, |s| s.state);
            let mut v = json!(tool);
            if let Value::Object(obj) = &mut v {
                obj.insert("backend_state".into(), json!(state));
                // The MCP revision its server was reached in (MCP tools only).
                if let Some(protocol) = server.and_then(|s| s.protocol.as_ref()) {
                    obj.insert("backend_protocol".into(), json!(protocol));
                }
            }
            v
        })
        .collect();
    Ok(Json(json!({"tools": tools})))
}

/// The query of `POST /v1/tools/{name}/accept`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AcceptQuery {
    /// The new definition's digest, as the person accepting saw it.
    digest: Option<String>,
}

/// `POST /v1/tools/{name}/accept[?digest=sha256:…]` (scope `admin`): pins the definition a server
/// changed tool `name` to — with `digest`, only if that is the change waiting (the server may
/// have changed it again since it was reviewed) — and the calls `on_tool_change = "block"` held
/// run again.
pub(crate) async fn accept(
    State(app): State<App>,
    caller: Caller,
    name: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<axum::extract::Query<AcceptQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.needs(Scope::Admin, "accept a tool's changed definition")?;
    let name = crate::request::path(name)?;
    let axum::extract::Query(q) =
        query.map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))?;
    // A change can wait while its server is down (its tool unlisted): it can be accepted then.
    if app.engine.tool_change(&name).is_none() && app.engine.policy_of(&name).is_none() {
        return Err(ApiError::not_found(format!("unknown tool {name:?}")));
    }
    match app
        .engine
        .accept_tool(&name, caller.name(), q.digest.as_deref())
    {
        Ok(change) => Ok(Json(json!({
            "ok": true,
            "tool": name,
            "server": change.server,
            "old_digest": change.old_digest,
            "digest": change.new.digest,
        }))),
        Err(toolwarden_core::pins::AcceptError::Nothing) => Err(ApiError::new(
            crate::error::ErrorCode::Conflict,
            format!("tool {name:?} has no changed definition waiting to be accepted"),
        )),
        Err(toolwarden_core::pins::AcceptError::Other(waiting)) => Err(ApiError::new(
            crate::error::ErrorCode::Conflict,
            format!(
                "tool {name:?} changed again: the definition waiting is {waiting}, not the one named; review its diff and accept that one"
            ),
        )),
    }
}

/// `GET /v1/tools/{name}/explain?principal=P&input=JSON` (scope `read`): what `[[rules]]` decide
/// for a call of the tool by `principal` (default: the caller) with `input` (default `{}`).
pub(crate) async fn explain(
    State(app): State<App>,
    caller: Caller,
    name: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<axum::extract::Query<ExplainQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.needs(Scope::Read, "explain the rules")?;
    let name = crate::request::path(name)?;
    let axum::extract::Query(q) =
        query.map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))?;
    let Some(policy) = app.engine.policy_of(&name) else {
        return Err(ApiError::not_found(format!("unknown tool {name:?}")));
    };
    let input: Value = match q.input.as_deref() {
        None => json!({}),
        Some(text) => match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(other) => {
                return Err(ApiError::invalid(format!(
                    "input: expected a JSON object, got {other}"
                )));
            }
            Err(e) => return Err(ApiError::invalid(format!("input: malformed JSON: {e}"))),
        },
    };
    // The principal named, with the caller's scopes when it is the caller and none otherwise
    // (the server knows a token principal's scopes only when it presents its token).
    let principal = match q.principal {
        Some(p) if p.is_empty() => return Err(ApiError::invalid("principal: must not be empty")),
        Some(p) if p != caller.name() => {
            toolwarden_protocol::Principal::new(p, toolwarden_protocol::Scopes::NONE)
        }
        _ => caller.0.clone(),
    };
    let backing = app.engine.tool_backing(&name);
    let tool = app.engine.tools().into_iter().find(|t| t.name == name);
    let server = backing
        .as_ref()
        .and_then(|b| b.server.as_deref())
        .map(str::to_owned);
    let facts = toolwarden_core::rules::Facts {
        tool: &name,
        args: &input,
        principal: &principal,
        session_id: None,
        annotations: tool.as_ref().map(|t| &t.annotations),
        server: server.as_deref(),
    };
    let rules = app.engine.rules();
    let e = toolwarden_core::rules::explain(rules.as_deref(), &facts, policy.approval);
    // What decides past the rules: the hooks asked (which may make it stricter) and the quotas
    // taken from.
    let (hooks, quotas) = app.engine.guards_of(&name, &principal.name);
    let mut body = json!(e);
    body["hooks"] = json!(hooks);
    body["quotas"] = json!(quotas);
    Ok(Json(body))
}

/// The query of `GET /v1/tools/{name}/explain`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExplainQuery {
    principal: Option<String>,
    input: Option<String>,
}

/// `GET /metrics` (scope `read`: they count every principal's calls).
pub(crate) async fn metrics(State(app): State<App>, caller: Caller) -> Response {
    if let Err(e) = caller.needs(Scope::Read, "read the metrics") {
        return e.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(METRICS_CONTENT_TYPE),
        )],
        app.engine.metrics_text(),
    )
        .into_response()
}

/// `GET /healthz`: 200 while the process serves, its audit trail can write and (when replicas
/// share state) Redis answers; 503 with `"status": "degraded"` when either fails (`store_error`,
/// `redis_error` say why). `store` and `redis` are `skipped` when the server runs without them.
/// A down MCP server shows in `servers` without changing the status.
pub(crate) async fn healthz(State(app): State<App>) -> Response {
    let (store, store_error) = match app.engine.store().map(|s| s.health()) {
        None => ("skipped", None),
        Some(StoreHealth::Ok) => ("ok", None),
        Some(StoreHealth::Degraded(why)) => ("degraded", Some(why)),
    };
    let (redis, redis_error) = match app.engine.shared_health() {
        None => ("skipped", None),
        Some(SharedHealth::Ok) => ("ok", None),
        Some(SharedHealth::Degraded(why)) => ("degraded", Some(why)),
    };
    let degraded = store_error.is_some() || redis_error.is_some();
    let mut body = json!({
        "status": if degraded { "degraded" } else { "ok" },
        "store": store,
        "redis": redis,
        "servers": app.engine.servers(),
    });
    if let Value::Object(obj) = &mut body {
        if let Some(why) = store_error {
            obj.insert("store_error".into(), json!(why));
        }
        if let Some(why) = redis_error {
            obj.insert("redis_error".into(), json!(why));
        }
    }
    let code = if degraded {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, Json(body)).into_response()
}

/// `GET /readyz`: 200 when every configured server is up, else 503 — both with every server's
/// state, so a deployment can wait for readiness (and see which server holds it back).
pub(crate) async fn readyz(State(app): State<App>) -> Response {
    let servers = app.engine.servers();
    let ready = servers.values().all(|s| s.state == ServerStateKind::Up);
    let (code, status) = if ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not_ready")
    };
    (code, Json(json!({"status": status, "servers": servers}))).into_response()
}
