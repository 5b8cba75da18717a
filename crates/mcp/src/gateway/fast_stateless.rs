//! The gateway's own answer to a plain stateless (2026-07-28) `tools/call` over Streamable HTTP.
//!
//! On rmcp's path a stateless request costs a handler connection of its own, rmcp's per-request
//! service and an event stream, as a handshake call did before `super::fast`. A stateless
//! `tools/call` that needs nothing but the revision's plain rules is served here instead, with
//! the same code as under rmcp: its session is chosen as `super::handler` chooses it, and the
//! call runs through `super::rounds` (so an approval or a server's question still becomes an
//! `input_required` answer, and the next round comes back the same way). Its answer is one JSON
//! body when it comes first and within the window, else an event stream carrying its progress
//! (under the client's token) and then the answer; closing that response cancels the call.
//!
//! Only the exact plain case is served: `Mcp-Protocol-Version: 2026-07-28`, `Mcp-Method:
//! tools/call` and `Mcp-Name` equal to the tool, each once, no other `Mcp-*` header; a body with
//! only `name`, `arguments` and `_meta`, whose envelope names 2026-07-28 and declares client
//! capabilities (without the tasks extension), and carries no other key of the protocol's own
//! (`io.modelcontextprotocol/…`) than those and `clientInfo`; a tool whose schema maps no
//! argument to a header. Anything else — a mismatch, a missing envelope, `inputResponses` or
//! `requestState` (the next round), a log level, header-mapped arguments — goes to rmcp
//! untouched, which validates and answers (errors included) exactly as before.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use toolwarden_protocol::Principal;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, HeaderName, Response};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientCapabilities, Icon, JsonObject,
    JsonRpcError, JsonRpcResponse, JsonRpcVersion2_0, ProgressNotificationParam, ProtocolVersion,
    RequestId, RequestMetaObject, ServerRequest, ServerResult,
};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::call::{Door, trace_from_header};
use super::channel::{ClientChannel, Sent};
use super::fast::{MCP_PROTOCOL_VERSION, MCP_SESSION_ID, plain_headers};
use super::handler::{identity_session, named_session};
use super::respond::{BoxBody, FastPath, Out, respond};
use super::rounds::{self, Driver};
use super::session::ClientSession;
use super::state::GatewayState;

/// The `Mcp-*` headers of a plain stateless call.
const HEADERS: &[&str] = &["mcp-protocol-version", "mcp-method", "mcp-name"];
const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// The envelope's keys in `_meta`; any other `io.modelcontextprotocol/` key goes to rmcp.
const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
const CLIENT_INFO_KEY: &str = "io.modelcontextprotocol/clientInfo";

/// Whether a POST could be a stateless call the gateway serves: no session, a length, and
/// `Mcp-Method: tools/call`.
pub(crate) fn candidate(headers: &HeaderMap) -> bool {
    !headers.contains_key(MCP_SESSION_ID)
        && headers.contains_key(http::header::CONTENT_LENGTH)
        && headers
            .get(MCP_METHOD)
            .is_some_and(|m| m.as_bytes() == b"tools/call")
}

/// Serves the POST if it is a plain stateless `tools/call`; `None` sends it to rmcp.
pub(crate) async fn serve(
    gw: &Arc<GatewayState>,
    fast: &FastPath,
    principal: &Principal,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Response<BoxBody>> {
    if !plain_headers(headers, &fast.hosts, HEADERS) {
        return None;
    }
    // `candidate` saw `Mcp-Method: tools/call`; `plain_headers` a protocol version the gateway
    // speaks, but not that it is 2026-07-28, nor that each header comes once.
    if single(headers, &MCP_PROTOCOL_VERSION)? != ProtocolVersion::V_2026_07_28.as_str().as_bytes()
        || single(headers, &MCP_METHOD).is_none()
    {
        return None;
    }
    let name_header = single(headers, &MCP_NAME)?;
    // The whole body in one pass, the envelope included; anything else goes to rmcp. (Its
    // UTF-8 checked at once, not string by string.)
    let message: Message<'_> = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
    if message.jsonrpc != "2.0" || message.method != "tools/call" {
        return None;
    }
    let params = message.params;
    if params.name.as_bytes() != name_header {
        return None;
    }
    let Envelope {
        mut meta,
        capabilities,
        client_name,
    } = params.meta?;
    if capabilities.supports_tasks() || gw.maps_headers(&params.name) {
        return None;
    }

    let session_id = match named_session(&meta) {
        Some(name) => toolwarden_protocol::SessionId::new(name),
        None => identity_session(headers, client_name.as_deref()),
    };
    let session = gw.stateless_session(principal, session_id, &fast.shutdown);
    session.declare(capabilities);
    session.touch();
    trace_from_header(headers, &mut meta);
    let mut call = CallToolRequestParams::new(params.name);
    call.arguments = params.arguments;
    let (out, rx) = mpsc::unbounded_channel();
    let ct = CancellationToken::new();
    let driver = Driver {
        id: message.id,
        meta,
        progress: Arc::new(Progress(out.clone())),
        ct: ct.clone(),
        door: Door::Stream(fast.shutdown.clone()),
    };
    let run = run(gw.clone(), session, call, driver, ct, out, fast.keep_alive);
    Some(respond(gw, Box::pin(run), rx, fast).await)
}

/// A plain stateless `tools/call`, read in one pass: no `result` or `error`, nothing unknown.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Message<'a> {
    jsonrpc: &'a str,
    id: RequestId,
    method: &'a str,
    #[serde(borrow)]
    params: Params<'a>,
}

/// The parameters of a plain stateless `tools/call`: no `inputResponses`, no `requestState`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params<'a> {
    name: String,
    #[serde(default)]
    arguments: Option<JsonObject>,
    #[serde(rename = "_meta", default, borrow)]
    meta: Option<Envelope<'a>>,
}

/// A plain call's `_meta`, read in one pass: the envelope's keys as what they declare, every
/// other key kept for the call (`meta`). It does not read — so the request goes to rmcp — if
/// the protocol version is not 2026-07-28, the client capabilities or a `clientInfo` are
/// malformed, a key comes twice, or another key of the protocol's own
/// (`io.modelcontextprotocol/…`) is there. The call itself needs none of the envelope's keys
/// (its session holds the capabilities), so they are not kept in its `_meta`.
struct Envelope<'a> {
    meta: RequestMetaObject,
    capabilities: ClientCapabilities,
    /// `clientInfo.name`: with the bearer token, it names the client's session.
    client_name: Option<Cow<'a, str>>,
}

/// A `clientInfo` (`Implementation`), checked as rmcp reads it but kept only for its name:
/// a call needs nothing else of it, and borrowing spares its strings.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[expect(dead_code, reason = "read only to check the clientInfo as rmcp would")]
struct ClientInfo<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    version: Cow<'a, str>,
    #[serde(default, borrow)]
    title: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    description: Option<Cow<'a, str>>,
    #[serde(default)]
    icons: Option<Vec<Icon>>,
    #[serde(default, borrow)]
    website_url: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Envelope<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EnvelopeVisitor)
    }
}

struct EnvelopeVisitor;

impl<'de> serde::de::Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a request's _meta object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Envelope<'de>, A::Error> {
        use serde::de::Error as _;
        let mut meta = RequestMetaObject::new();
        let mut version = false;
        let mut capabilities = None;
        let mut client_name = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let twice = || A::Error::custom(format_args!("`{key}` twice"));
            match key.as_ref() {
                PROTOCOL_VERSION_KEY => {
                    let value = map.next_value::<Cow<'de, str>>()?;
                    if version || value != ProtocolVersion::V_2026_07_28.as_str() {
                        return Err(A::Error::custom("not a plain 2026-07-28 envelope"));
                    }
                    version = true;
                }
                CAPABILITIES_KEY => {
                    if capabilities.is_some() {
                        return Err(twice());
                    }
                    capabilities = Some(map.next_value::<ClientCapabilities>()?);
                }
                CLIENT_INFO_KEY => {
                    if client_name.is_some() {
                        return Err(twice());
                    }
                    client_name = Some(map.next_value::<ClientInfo<'de>>()?.name);
                }
                other if other.starts_with("io.modelcontextprotocol/") => {
                    return Err(A::Error::custom(format_args!("`{other}` is for rmcp")));
                }
                _ => {
                    let value = map.next_value::<serde_json::Value>()?;
                    if meta.contains_key(key.as_ref()) {
                        return Err(twice());
                    }
                    meta.insert(key.into_owned(), value);
                }
            }
        }
        match (version, capabilities) {
            (true, Some(capabilities)) => Ok(Envelope {
                meta,
                capabilities,
                client_name,
            }),
            _ => Err(A::Error::custom("no 2026-07-28 envelope")),
        }
    }
}

/// The one value of a header, if it has exactly one.
fn single<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h [u8]> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => Some(value.as_bytes()),
        _ => None,
    }
}

/// The call's task: its first round (`super::rounds`), stopped (`ct`) when its response is
/// closed; its answer sent last.
async fn run(
    gw: Arc<GatewayState>,
    session: Arc<ClientSession>,
    call: CallToolRequestParams,
    driver: Driver,
    ct: CancellationToken,
    out: mpsc::UnboundedSender<Out>,
    keep_alive: Duration,
) {
    let id = driver.id.clone();
    // A plain call: no `inputResponses` or `requestState` (`Params`), no tasks declared, and
    // `ct` is cancelled below only while the answer is awaited.
    let result = rounds::first_round(&gw, &session, call, driver);
    tokio::pin!(result);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
    let mut watching = true;
    let result = loop {
        tokio::select! {
            biased;
            result = &mut result => break result,
            () = out.closed(), if watching => {
                // The revision's cancel: the client closed the request's response.
                watching = false;
                ct.cancel();
            }
            _ = ticks.tick(), if watching => {
                let _ = out.send(Out::KeepAlive);
            }
        }
    };
    let answer = match result {
        Ok(response) => serde_json::to_vec(&JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id,
            result: ServerResult::from(response),
        }),
        Err(error) => serde_json::to_vec(&JsonRpcError::new(Some(id), error)),
    };
    match answer {
        Ok(answer) => {
            let _ = out.send(Out::Answer(answer.into()));
        }
        Err(e) => tracing::error!(session = %session.id, error = %e,
            "cannot serialize a stateless call's answer"),
    }
}

/// The call's response, as `super::rounds` sees it: progress goes on it. Nothing else may
/// reach a stateless client but the answer; a question is asked through `input_required`
/// (`super::rounds` never sends one here).
struct Progress(mpsc::UnboundedSender<Out>);

impl ClientChannel for Progress {
    fn notify_progress(
        &self,
        param: ProgressNotificationParam,
    ) -> BoxFuture<'_, Result<(), String>> {
        let sent = serde_json::to_vec(&serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": param,
        }))
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            self.0
                .send(Out::Message(bytes.into()))
                .map_err(|_| "the client closed the call's response".to_owned())
        });
        Box::pin(std::future::ready(sent))
    }

    fn send_request(&self, _request: ServerRequest) -> BoxFuture<'_, Result<Sent, ErrorData>> {
        Box::pin(std::future::ready(Err(ErrorData::internal_error(
            "a stateless client is asked through input_required, never by a request",
            None,
        ))))
    }

    fn withdraw(&self, _param: CancelledNotificationParam) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envelope(m: &str) -> Result<Envelope<'_>, serde_json::Error> {
        serde_json::from_str(m)
    }

    #[test]
    fn only_the_envelopes_own_keys_are_plain() {
        let base = r#""io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}"#;
        assert!(envelope(&format!("{{{base}}}")).is_ok());
        let with = format!(
            r#"{{{base}, "io.modelcontextprotocol/clientInfo": {{"name": "c", "version": "1"}},
               "progressToken": 7, "toolwarden/session": "s"}}"#
        );
        let with = envelope(&with).unwrap();
        assert_eq!(with.client_name.as_deref(), Some("c"));
        // The call keeps the other keys, not the envelope's.
        let mut keys: Vec<&String> = with.meta.keys().collect();
        keys.sort();
        assert_eq!(keys, ["progressToken", "toolwarden/session"]);
        assert_eq!(with.meta.get("progressToken"), Some(&json!(7)));
        // Anything else goes to rmcp: another key of the protocol's own, another version, no
        // capabilities, a malformed clientInfo, a key twice.
        for bad in [
            format!(r#"{{{base}, "io.modelcontextprotocol/logLevel": "info"}}"#),
            r#"{"io.modelcontextprotocol/protocolVersion": "2025-11-25",
                "io.modelcontextprotocol/clientCapabilities": {}}"#
                .to_owned(),
            r#"{"io.modelcontextprotocol/protocolVersion": "2026-07-28"}"#.to_owned(),
            format!(r#"{{{base}, "io.modelcontextprotocol/clientInfo": null}}"#),
            format!(r#"{{{base}, "io.modelcontextprotocol/clientCapabilities": {{}}}}"#),
            format!(r#"{{{base}, "progressToken": 1, "progressToken": 2}}"#),
        ] {
            assert!(envelope(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_client_info_reads_exactly_when_rmcps_does() {
        for info in [
            r#"{"name": "c", "version": "1"}"#,
            r#"{"name": "c\u00e9", "version": "1", "title": null, "websiteUrl": "https://x"}"#,
            r#"{"name": "c", "version": "1", "icons": [{"src": "https://x/i.png"}], "more": 1}"#,
            r#"{"name": "c", "version": "1", "icons": [{"nosrc": 1}]}"#,
            r#"{"name": "c"}"#,
            r#"{"name": 1, "version": "1"}"#,
            r#"{"name": "c", "version": "1", "title": 7}"#,
            r#"{"name": "c", "version": "1", "description": []}"#,
            r#"[]"#,
        ] {
            assert_eq!(
                serde_json::from_str::<ClientInfo<'_>>(info).is_ok(),
                serde_json::from_str::<rmcp::model::Implementation>(info).is_ok(),
                "{info}"
            );
        }
    }

    #[test]
    fn only_a_plain_call_reads_as_one() {
        let call = |extra: &str, params: &str| {
            format!(
                r#"{{"jsonrpc": "2.0", "id": 3, "method": "tools/call"{extra}, "params": {{"name": "echo",
                    "arguments": {{"text": "hi"}}{params}, "_meta": {{
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {{}}}}}}}}"#
            )
        };
        let plain = call("", "");
        let message: Message<'_> = serde_json::from_str(&plain).unwrap();
        assert_eq!(message.id, RequestId::Number(3));
        assert_eq!(message.params.name, "echo");
        assert!(message.params.meta.is_some());
        for other in [
            call(r#", "result": {}"#, ""),
            call("", r#", "inputResponses": {}"#),
            call("", r#", "requestState": "s""#),
        ] {
            assert!(
                serde_json::from_str::<Message<'_>>(&other).is_err(),
                "{other}"
            );
        }
    }

    #[test]
    fn candidates_have_no_session_a_length_and_name_tools_call() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(*k, http::HeaderValue::from_static(v));
            }
            h
        };
        assert!(candidate(&h(&[
            ("content-length", "10"),
            ("mcp-method", "tools/call")
        ])));
        assert!(!candidate(&h(&[
            ("content-length", "10"),
            ("mcp-method", "tools/list")
        ])));
        assert!(!candidate(&h(&[
            ("content-length", "10"),
            ("mcp-method", "tools/call"),
            ("mcp-session-id", "s")
        ])));
        assert!(!candidate(&h(&[("mcp-method", "tools/call")])));
    }
}
