//! A message from an MCP client, as the gateway reads it: parsed once, into a type of its own.
//!
//! Whatever the gateway answers itself — a `tools/call` of either era, a client's answer to a
//! request the gateway sent on a call's response, the 2025-11-25 task requests, an
//! `initialize` that declares that revision's tasks — is read here, in one pass over the
//! bytes: the message's members, and, when `method` comes before `params` (as every client
//! writes it), a `tools/call`'s parameters straight into [`CallParams`], the 2026-07-28
//! envelope in `_meta` included. Everything else is left to rmcp, which reads it itself; the
//! doors (`super::http`, `super::stdio_frames`) only look at a message here when a cheap test
//! of its bytes says it may be one of the gateway's (see [`may_be_ours`]), so that a message
//! rmcp serves is read once, by rmcp.
//!
//! A message that reads here is plain: `jsonrpc` is `"2.0"`, no member is unknown or comes
//! twice, and a `tools/call`'s `_meta` carries no key of the protocol's own
//! (`io.modelcontextprotocol/…`) but the envelope's. Anything else does not read (`None`) and
//! goes to rmcp untouched, which validates it and answers, errors included.

use std::borrow::Cow;

use rmcp::model::{
    ClientCapabilities, Icon, JsonObject, ProtocolVersion, RequestId, RequestMetaObject,
};
use serde::Deserialize;
use serde::de::{Error as _, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use super::options::ANSWER_ID_PREFIX;

/// One JSON-RPC message of a client.
pub(crate) struct Incoming<'a> {
    pub(crate) id: Option<RequestId>,
    pub(crate) method: Option<&'a str>,
    pub(crate) params: Params<'a>,
    pub(crate) result: Option<&'a RawValue>,
    pub(crate) error: Option<&'a RawValue>,
}

/// A message's `params`.
pub(crate) enum Params<'a> {
    Absent,
    /// A `tools/call`'s, read with the message.
    Call(Box<CallParams<'a>>),
    /// Any other method's, or a `tools/call`'s that came before its `method`: read when (and
    /// if) its handler needs them.
    Raw(&'a RawValue),
}

/// The parameters of a `tools/call`, of either era.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct CallParams<'a> {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) arguments: Option<JsonObject>,
    #[serde(rename = "_meta", default, borrow)]
    pub(crate) meta: Meta<'a>,
    /// The 2025-11-25 revision's task request (`{"ttl": ...}`).
    #[serde(default)]
    pub(crate) task: Option<Value>,
    /// The 2026-07-28 revision's answers to the questions of the round before.
    #[serde(default)]
    pub(crate) input_responses: Option<rmcp::model::InputResponses>,
    #[serde(default)]
    pub(crate) request_state: Option<String>,
}

/// A request's `_meta`: the 2026-07-28 envelope's keys read as what they declare, every other
/// key kept for the call (`rest`).
#[derive(Default)]
pub(crate) struct Meta<'a> {
    pub(crate) rest: RequestMetaObject,
    /// The envelope, when `_meta` carries one (`None`: a handshake client's request).
    pub(crate) envelope: Option<Envelope<'a>>,
}

/// The 2026-07-28 envelope of a request. The call needs none of its keys (its session holds the
/// capabilities), so they are not kept in its `_meta`.
pub(crate) struct Envelope<'a> {
    pub(crate) capabilities: ClientCapabilities,
    /// `clientInfo.name`: with the bearer token, it names a stateless client's session.
    pub(crate) client_name: Option<Cow<'a, str>>,
}

#[cfg(feature = "parse-count")]
static PARSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(feature = "parse-count")]
static HANDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times messages were read: by the gateway itself, and by rmcp (each message handed
/// to it, which rmcp reads once). Counted only in a build with the `parse-count` feature, for
/// the test that every message is read once.
#[cfg(feature = "parse-count")]
pub fn reads() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (PARSES.load(Relaxed), HANDED.load(Relaxed))
}

/// Counts `n` messages handed to rmcp, which reads them itself.
#[cfg_attr(not(feature = "parse-count"), allow(unused_variables))]
pub(crate) fn handed_to_rmcp(n: usize) {
    #[cfg(feature = "parse-count")]
    HANDED.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
}

impl<'a> Incoming<'a> {
    /// The message in `bytes`, if it is a plain one (see the module's docs).
    pub(crate) fn parse(bytes: &'a [u8]) -> Option<Incoming<'a>> {
        #[cfg(feature = "parse-count")]
        PARSES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // UTF-8 checked at once, not string by string.
        serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()
    }

    /// A request (an id and a method, no `result` or `error`).
    pub(crate) fn is_request(&self) -> bool {
        self.id.is_some() && self.method.is_some() && self.result.is_none() && self.error.is_none()
    }

    /// A `tools/call`'s parameters; `None` for another message, or parameters that are not a
    /// plain call's.
    pub(crate) fn call_params(&mut self) -> Option<CallParams<'a>> {
        if self.method != Some("tools/call") || !self.is_request() {
            return None;
        }
        match std::mem::replace(&mut self.params, Params::Absent) {
            Params::Call(params) => Some(*params),
            // `params` came before `method`: read now, for the first time.
            Params::Raw(raw) => serde_json::from_str(raw.get()).ok(),
            Params::Absent => None,
        }
    }

    /// Another method's `_meta` (empty when it has none, or none that reads as one).
    pub(crate) fn meta(&self) -> RequestMetaObject {
        self.params_value()
            .ok()
            .and_then(|mut params| params.get_mut("_meta").map(Value::take))
            .and_then(|meta| serde_json::from_value(meta).ok())
            .unwrap_or_default()
    }

    /// Another method's parameters as JSON (an empty object when there are none).
    pub(crate) fn params_value(&self) -> Result<Value, serde_json::Error> {
        match &self.params {
            Params::Raw(raw) => serde_json::from_str(raw.get()),
            _ => Ok(Value::Object(serde_json::Map::new())),
        }
    }
}

/// Whether a message may be one the gateway answers itself, told from its bytes without
/// reading it: it names `tools/call`, or answers one of the gateway's own requests (whose ids
/// start with [`ANSWER_ID_PREFIX`]). `tasks` adds the 2025-11-25 task requests and
/// `tools/list`, for a session that declared tasks.
pub(crate) fn may_be_ours(bytes: &[u8], tasks: bool) -> bool {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // Searchers made once: making one costs more than a search of a small body.
    static CALL: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"tools/call"));
    static ANSWER: LazyLock<Finder<'static>> =
        LazyLock::new(|| Finder::new(ANSWER_ID_PREFIX.as_bytes()));
    let has = |needle: &[u8]| memchr::memmem::find(bytes, needle).is_some();
    CALL.find(bytes).is_some()
        || ANSWER.find(bytes).is_some()
        || (tasks && (has(b"tasks/") || has(b"tools/list")))
}

/// Whether a line of a stdio session that declared the 2025-11-25 tasks may be one the gateway
/// answers there: a task request, `tools/list`, or a `tools/call` that asks for a task.
pub(crate) fn may_be_task_request(bytes: &[u8]) -> bool {
    let has = |needle: &[u8]| memchr::memmem::find(bytes, needle).is_some();
    has(b"tasks/") || has(b"tools/list") || has(b"\"task\"")
}

impl<'de: 'a, 'a> Deserialize<'de> for Incoming<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(IncomingVisitor)
    }
}

struct IncomingVisitor;

impl<'de> Visitor<'de> for IncomingVisitor {
    type Value = Incoming<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Incoming<'de>, A::Error> {
        let mut jsonrpc = false;
        let mut message = Incoming {
            id: None,
            method: None,
            params: Params::Absent,
            result: None,
            error: None,
        };
        let mut params = false;
        while let Some(key) = map.next_key::<&'de str>()? {
            let twice = || A::Error::custom(format_args!("`{key}` twice"));
            match key {
                "jsonrpc" => {
                    if jsonrpc || map.next_value::<&'de str>()? != "2.0" {
                        return Err(A::Error::custom("not JSON-RPC 2.0"));
                    }
                    jsonrpc = true;
                }
                "id" if message.id.is_none() => message.id = Some(map.next_value()?),
                "method" if message.method.is_none() => message.method = Some(map.next_value()?),
                "params" if !params => {
                    params = true;
                    message.params = if message.method == Some("tools/call") {
                        Params::Call(Box::new(map.next_value()?))
                    } else {
                        Params::Raw(map.next_value()?)
                    };
                }
                "result" if message.result.is_none() => message.result = Some(map.next_value()?),
                "error" if message.error.is_none() => message.error = Some(map.next_value()?),
                "id" | "method" | "params" | "result" | "error" => return Err(twice()),
                other => return Err(A::Error::custom(format_args!("unknown member `{other}`"))),
            }
        }
        if !jsonrpc {
            return Err(A::Error::custom("not JSON-RPC 2.0"));
        }
        Ok(message)
    }
}

/// The envelope's keys in `_meta`; any other `io.modelcontextprotocol/` key is for rmcp.
const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
const CLIENT_INFO_KEY: &str = "io.modelcontextprotocol/clientInfo";

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

impl<'de: 'a, 'a> Deserialize<'de> for Meta<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MetaVisitor)
    }
}

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = Meta<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a request's _meta object")
    }

    /// Does not read — so the request goes to rmcp — if the protocol version is not 2026-07-28,
    /// only one of it and the capabilities is there, the capabilities or a `clientInfo` are
    /// malformed, a key comes twice, or another key of the protocol's own is there.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Meta<'de>, A::Error> {
        let mut rest = RequestMetaObject::new();
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
                    let value = map.next_value::<Value>()?;
                    if rest.contains_key(key.as_ref()) {
                        return Err(twice());
                    }
                    rest.insert(key.into_owned(), value);
                }
            }
        }
        let envelope = match (version, capabilities, client_name) {
            (true, Some(capabilities), client_name) => Some(Envelope {
                capabilities,
                client_name,
            }),
            (false, None, None) => None,
            _ => return Err(A::Error::custom("an incomplete 2026-07-28 envelope")),
        };
        Ok(Meta { rest, envelope })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(m: &str) -> Result<Meta<'_>, serde_json::Error> {
        serde_json::from_str(m)
    }

    #[test]
    fn only_the_envelopes_own_keys_are_plain() {
        let base = r#""io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}"#;
        assert!(meta(&format!("{{{base}}}")).unwrap().envelope.is_some());
        let with = format!(
            r#"{{{base}, "io.modelcontextprotocol/clientInfo": {{"name": "c", "version": "1"}},
               "progressToken": 7, "toolwarden/session": "s"}}"#
        );
        let with = meta(&with).unwrap();
        let envelope = with.envelope.as_ref().unwrap();
        assert_eq!(envelope.client_name.as_deref(), Some("c"));
        // The call keeps the other keys, not the envelope's.
        let mut keys: Vec<&String> = with.rest.keys().collect();
        keys.sort();
        assert_eq!(keys, ["progressToken", "toolwarden/session"]);
        assert_eq!(with.rest.get("progressToken"), Some(&json!(7)));
        // A handshake client's `_meta`: no envelope.
        let plain = meta(r#"{"progressToken": 1}"#).unwrap();
        assert!(plain.envelope.is_none());
        // Anything else goes to rmcp: another key of the protocol's own, another version, no
        // capabilities, a malformed clientInfo, a key twice.
        for bad in [
            format!(r#"{{{base}, "io.modelcontextprotocol/logLevel": "info"}}"#),
            r#"{"io.modelcontextprotocol/protocolVersion": "2025-11-25",
                "io.modelcontextprotocol/clientCapabilities": {}}"#
                .to_owned(),
            r#"{"io.modelcontextprotocol/protocolVersion": "2026-07-28"}"#.to_owned(),
            r#"{"io.modelcontextprotocol/clientCapabilities": {}}"#.to_owned(),
            format!(r#"{{{base}, "io.modelcontextprotocol/clientInfo": null}}"#),
            format!(r#"{{{base}, "io.modelcontextprotocol/clientCapabilities": {{}}}}"#),
            format!(r#"{{{base}, "progressToken": 1, "progressToken": 2}}"#),
        ] {
            assert!(meta(&bad).is_err(), "{bad}");
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
    fn a_call_reads_in_one_pass_whatever_the_order() {
        let call = |extra: &str, params: &str| {
            format!(
                r#"{{"jsonrpc": "2.0", "id": 3, "method": "tools/call"{extra}, "params": {{"name": "echo",
                    "arguments": {{"text": "hi"}}{params}, "_meta": {{
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {{}}}}}}}}"#
            )
        };
        let plain = call("", "");
        let mut message = Incoming::parse(plain.as_bytes()).unwrap();
        assert!(matches!(message.params, Params::Call(_)));
        assert_eq!(message.id, Some(RequestId::Number(3)));
        let params = message.call_params().unwrap();
        assert_eq!(params.name, "echo");
        assert!(params.meta.envelope.is_some());
        // The next round's members read too.
        let next = call("", r#", "inputResponses": {"a": {}}, "requestState": "s""#);
        let params = Incoming::parse(next.as_bytes())
            .unwrap()
            .call_params()
            .unwrap();
        assert_eq!(params.request_state.as_deref(), Some("s"));
        // `params` before `method`: read when asked for.
        let late =
            r#"{"params": {"name": "echo"}, "jsonrpc": "2.0", "id": "x", "method": "tools/call"}"#;
        let mut message = Incoming::parse(late.as_bytes()).unwrap();
        assert!(matches!(message.params, Params::Raw(_)));
        assert_eq!(message.call_params().unwrap().name, "echo");
        // Not plain: rmcp's.
        for other in [
            call(r#", "extra": {}"#, ""),
            call("", r#", "unknown": 1"#),
            r#"{"jsonrpc": "1.0", "id": 1, "method": "ping"}"#.to_owned(),
            r#"{"id": 1, "method": "ping"}"#.to_owned(),
            r#"{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "ping"}"#.to_owned(),
            "not json".to_owned(),
        ] {
            assert!(Incoming::parse(other.as_bytes()).is_none(), "{other}");
        }
        // An answer to a request.
        let answer = r#"{"jsonrpc": "2.0", "id": "toolwarden-1", "result": {}}"#;
        let message = Incoming::parse(answer.as_bytes()).unwrap();
        assert!(!message.is_request() && message.result.is_some());
    }

    /// Another method's `_meta` (a list's deadline hint), and none when it has none.
    #[test]
    fn another_methods_meta_is_read_when_asked_for() {
        let list = r#"{"jsonrpc": "2.0", "id": 4, "method": "tools/list",
                       "params": {"_meta": {"timeout_ms": 300}}}"#;
        let meta = Incoming::parse(list.as_bytes()).unwrap().meta();
        assert_eq!(meta.get("timeout_ms"), Some(&serde_json::json!(300)));
        for bare in [
            r#"{"jsonrpc": "2.0", "id": 4, "method": "tools/list"}"#,
            r#"{"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}}"#,
            r#"{"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"_meta": 1}}"#,
        ] {
            assert!(
                Incoming::parse(bare.as_bytes()).unwrap().meta().is_empty(),
                "{bare}"
            );
        }
    }

    #[test]
    fn only_what_may_be_ours_is_looked_at() {
        assert!(may_be_ours(br#"{"method":"tools/call"}"#, false));
        assert!(may_be_ours(br#"{"id":"toolwarden-3","result":{}}"#, false));
        assert!(!may_be_ours(br#"{"method":"tools/list"}"#, false));
        assert!(may_be_ours(br#"{"method":"tools/list"}"#, true));
        assert!(may_be_ours(br#"{"method":"tasks/get"}"#, true));
        assert!(!may_be_ours(
            br#"{"method":"notifications/initialized"}"#,
            true
        ));
    }
}
