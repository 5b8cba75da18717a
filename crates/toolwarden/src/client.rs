//! `toolwarden tools`, `turns` and `abort`: clients of a running `toolwarden serve` over its
//! HTTP API (and the transport of `call --url`).

use std::path::Path;

use anyhow::Context as _;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::Value;
use toolwarden_core::Config;
use toolwarden_protocol::{ActiveTurn, ProgressInfo, ToolInfo, format_duration};

use crate::cli::{AbortArgs, ClientArgs};
use crate::exit::Exit;
use crate::say::say;
use crate::stack;
use crate::table::Table;

/// How long `tools`, `turns` and `abort` wait for an answer (they read state; nothing waits).
const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A running server's HTTP API.
pub(crate) struct Api {
    base: String,
    client: reqwest::Client,
    token: Option<String>,
    /// The variable the token was read from.
    token_var: String,
}

impl Api {
    /// The API at `url`, else at the config's `[http] listen`; the bearer token from the
    /// config's `token_env`.
    pub(crate) fn new(config: &Config, url: Option<&str>) -> anyhow::Result<Api> {
        let base = match url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("http://{}", connect_address(stack::listen(config))),
        };
        // Straight to the server: a proxy from the environment has no business on loopback.
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Api {
            base,
            client,
            token: stack::token(config),
            token_var: stack::token_env(config).to_owned(),
        })
    }

    /// The server's base URL (`http://127.0.0.1:7420`).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The variable holding the bearer token, when one is used.
    pub(crate) fn token_var(&self) -> Option<&str> {
        self.token.as_ref().map(|_| self.token_var.as_str())
    }

    pub(crate) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let req = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// Sends `req`; a connection failure says where it tried.
    pub(crate) async fn send(&self, req: RequestBuilder) -> anyhow::Result<reqwest::Response> {
        req.send().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach toolwarden serve at {}: {} (is it running? --url or [http] listen say where)",
                self.base,
                error_chain(&e)
            )
        })
    }

    /// A request whose answer is JSON: the status and the body.
    pub(crate) async fn json(&self, req: RequestBuilder) -> anyhow::Result<(StatusCode, Value)> {
        let resp = self.send(req).await?;
        let status = resp.status();
        let body = resp.bytes().await.context("reading the answer")?;
        let value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).trim().to_owned()));
        Ok((status, value))
    }

    /// A GET that must succeed.
    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let req = self.request(Method::GET, path).timeout(CLIENT_TIMEOUT);
        let (status, body) = self.json(req).await?;
        if !status.is_success() {
            anyhow::bail!("{}", self.refusal(status, &body));
        }
        Ok(body)
    }

    /// What an error answer says: `GET ...: 401 unauthorized: ...`.
    pub(crate) fn refusal(&self, status: StatusCode, body: &Value) -> String {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| body.to_string());
        let hint = if status == StatusCode::UNAUTHORIZED {
            " (the server needs its bearer token: set the variable [http] token_env names)"
        } else {
            ""
        };
        format!("{} answered {status}: {message}{hint}", self.base)
    }
}

/// The address to connect to for a listen address: an unspecified IP (`0.0.0.0`, `[::]`)
/// means "every interface", reached locally through loopback.
fn connect_address(listen: &str) -> String {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(addr) if addr.ip().is_unspecified() => {
            let ip: std::net::IpAddr = if addr.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            };
            std::net::SocketAddr::new(ip, addr.port()).to_string()
        }
        _ => listen.to_owned(),
    }
}

/// An error and its causes on one line (reqwest's own message is terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// `toolwarden tools`.
pub(crate) async fn tools(config: Option<&Path>, args: ClientArgs) -> anyhow::Result<Exit> {
    let config = stack::load_config(config)?;
    let api = Api::new(&config, args.url.as_deref())?;
    let body = api.get("/v1/tools").await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(Exit::Ok);
    }
    let list = body.get("tools").cloned().unwrap_or_default();
    let text = |t: &Value, key: &str| t.get(key).and_then(Value::as_str).map(str::to_owned);
    let states: Vec<BackendColumns> = list
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| BackendColumns {
                    state: text(t, "backend_state"),
                    protocol: text(t, "backend_protocol"),
                })
                .collect()
        })
        .unwrap_or_default();
    let tools: Vec<ToolInfo> =
        serde_json::from_value(list).context("the server's tool list has an unexpected shape")?;
    print!("{}", tool_table(&tools, &states));
    Ok(Exit::Ok)
}

/// What the tool table shows of a tool's backend: its state, and the MCP revision it was
/// reached in (MCP servers only).
#[derive(Clone, Debug, Default)]
pub(crate) struct BackendColumns {
    pub(crate) state: Option<String>,
    pub(crate) protocol: Option<String>,
}

/// Tools with their effective policy, one per line.
pub(crate) fn tool_table(tools: &[ToolInfo], states: &[BackendColumns]) -> String {
    let mut table = Table::new(&[
        "TOOL",
        "BACKEND",
        "STATE",
        "MCP",
        "BREAKER",
        "TIMEOUT",
        "IDLE",
        "ATTEMPT",
        "RETRIES",
        "IDEMPOTENT",
        "CACHE",
        "APPROVAL",
        "CONCURRENCY",
    ]);
    for (i, t) in tools.iter().enumerate() {
        let p = &t.policy;
        let backend = states.get(i).cloned().unwrap_or_default();
        table.row(vec![
            t.name.clone(),
            t.backend.clone(),
            backend.state.unwrap_or_default(),
            backend.protocol.unwrap_or_else(|| "-".to_owned()),
            snake(&t.breaker),
            off_or(p.timeout, "none"),
            off_or(p.idle_timeout, "off"),
            off_or(p.attempt_timeout, "off"),
            p.retries.to_string(),
            if p.idempotent { "yes" } else { "no" }.to_owned(),
            off_or(p.cache_ttl, "off"),
            match p.approval_timeout {
                Some(d) if p.approval != toolwarden_protocol::Approval::Auto => {
                    format!("{} ({})", snake(&p.approval), format_duration(d))
                }
                _ => snake(&p.approval),
            },
            snake(&p.concurrency),
        ]);
    }
    if table.is_empty() {
        return "no tools\n".to_owned();
    }
    table.render()
}

/// A duration, or `word` for zero.
fn off_or(d: std::time::Duration, word: &str) -> String {
    if d.is_zero() {
        word.to_owned()
    } else {
        format_duration(d)
    }
}

/// A unit enum as the wire spells it (`half_open`, `ask`).
pub(crate) fn snake<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// `toolwarden turns`.
pub(crate) async fn turns(config: Option<&Path>, args: ClientArgs) -> anyhow::Result<Exit> {
    let config = stack::load_config(config)?;
    let api = Api::new(&config, args.url.as_deref())?;
    let body = api.get("/v1/turns/active").await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(Exit::Ok);
    }
    let turns: Vec<ActiveTurn> =
        serde_json::from_value(body.get("turns").cloned().unwrap_or_default())
            .context("the server's turn list has an unexpected shape")?;
    if turns.is_empty() {
        println!("no running turns");
        return Ok(Exit::Ok);
    }
    // With several replicas (docs/SCALE-OUT.md) each turn names the replica that runs it.
    let replicas: Vec<Option<&str>> = body["turns"]
        .as_array()
        .map(|all| all.iter().map(|t| t["replica"].as_str()).collect())
        .unwrap_or_default();
    let shared = replicas.iter().any(Option::is_some);
    let mut header = vec!["TURN"];
    if shared {
        header.push("REPLICA");
    }
    header.extend([
        "SESSION", "STARTED", "CALL", "TOOL", "STATE", "ELAPSED", "PROGRESS",
    ]);
    let mut table = Table::new(&header);
    for (i, turn) in turns.iter().enumerate() {
        let session = match &turn.parent_turn_id {
            Some(parent) => format!("{} (child of {parent})", turn.session_id),
            None => turn.session_id.to_string(),
        };
        for call in &turn.calls {
            let mut cells = vec![turn.turn_id.to_string()];
            if shared {
                cells.push(
                    replicas
                        .get(i)
                        .copied()
                        .flatten()
                        .unwrap_or_default()
                        .to_owned(),
                );
            }
            cells.extend([
                session.clone(),
                turn.started_at.to_string(),
                call.call_id.to_string(),
                call.tool.clone(),
                match &call.status {
                    Some(status) => format!("{} ({status})", snake(&call.state)),
                    None => snake(&call.state),
                },
                elapsed(call.elapsed_ms),
                call.progress
                    .as_ref()
                    .map(progress_text)
                    .unwrap_or_default(),
            ]);
            table.row(cells);
        }
    }
    print!("{}", table.render());
    Ok(Exit::Ok)
}

fn elapsed(ms: u64) -> String {
    let secs = ms / 1000;
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}.{}s", secs, (ms % 1000) / 100)
    }
}

fn progress_text(p: &ProgressInfo) -> String {
    let mut out = p.message.clone().unwrap_or_default();
    if let Some(done) = p.progress {
        if !out.is_empty() {
            out.push(' ');
        }
        match p.total {
            Some(total) => out.push_str(&format!("({done}/{total})")),
            None => out.push_str(&format!("({done})")),
        }
    }
    out
}

/// `toolwarden abort TURN [CALL]`.
pub(crate) async fn abort(config: Option<&Path>, args: AbortArgs) -> anyhow::Result<Exit> {
    let config = stack::load_config(config)?;
    let api = Api::new(&config, args.url.as_deref())?;
    let (path, what) = match &args.call {
        Some(call) => (
            format!(
                "/v1/turns/{}/calls/{}/abort",
                segment(&args.turn),
                segment(call)
            ),
            format!("call {call} of turn {}", args.turn),
        ),
        None => (
            format!("/v1/turns/{}/abort", segment(&args.turn)),
            format!("turn {}", args.turn),
        ),
    };
    let req = api.request(Method::POST, &path).timeout(CLIENT_TIMEOUT);
    let (status, body) = api.json(req).await?;
    if status.is_success() && body.get("ok") == Some(&Value::Bool(true)) {
        println!("aborted {what}");
        return Ok(Exit::Ok);
    }
    if status == StatusCode::NOT_FOUND {
        say!("error: {what} is not running (it finished, or never existed)");
        return Ok(Exit::Error);
    }
    anyhow::bail!("{}", api.refusal(status, &body))
}

/// `toolwarden tools accept NAME`: pins the definition a server changed the tool to.
pub(crate) async fn accept(
    config: Option<&Path>,
    name: &str,
    url: Option<&str>,
    digest: Option<&str>,
) -> anyhow::Result<Exit> {
    let config = stack::load_config(config)?;
    let api = Api::new(&config, url)?;
    let mut path = format!("/v1/tools/{}/accept", segment(name));
    if let Some(digest) = digest {
        path.push_str(&format!("?digest={}", segment(digest)));
    }
    let req = api.request(Method::POST, &path).timeout(CLIENT_TIMEOUT);
    let (status, body) = api.json(req).await?;
    if status.is_success() && body.get("ok") == Some(&Value::Bool(true)) {
        let text = |k: &str| {
            body.get(k)
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned()
        };
        println!(
            "accepted {name}: {} replaces {} (server {})",
            text("digest"),
            text("old_digest"),
            text("server")
        );
        return Ok(Exit::Ok);
    }
    if status == StatusCode::CONFLICT || status == StatusCode::NOT_FOUND {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("nothing to accept");
        say!("error: {message}");
        return Ok(Exit::Error);
    }
    anyhow::bail!("{}", api.refusal(status, &body))
}

/// A path segment, percent-encoded (ids are the caller's and may hold anything).
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_listen_addresses_are_reached_through_loopback() {
        assert_eq!(connect_address("0.0.0.0:7420"), "127.0.0.1:7420");
        assert_eq!(connect_address("[::]:7420"), "[::1]:7420");
        assert_eq!(connect_address("127.0.0.1:9"), "127.0.0.1:9");
        assert_eq!(connect_address("localhost:7420"), "localhost:7420");
    }

    #[test]
    fn ids_are_encoded_in_paths() {
        assert_eq!(segment("t_01ABC"), "t_01ABC");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
