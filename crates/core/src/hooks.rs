//! `[hooks.NAME]`: an external program or service asked about each matching call, for what rules
//! cannot know (docs/RULES.md, "Hooks").
//!
//! Core compiles the hooks and decides what their answers mean; how a hook is reached — an HTTP
//! POST or a command given JSON on its standard input — is the [`HookTransport`] the engine is
//! built with (the binary's reaches both). A hook's answer is `{"decision": "allow"|"ask"|"deny",
//! "reason"?, "args"?}`; anything else — a timeout, a transport error, a non-2xx status, JSON
//! that does not parse, an unknown decision, `args` that fail the tool's schema — is a failure,
//! and the hook's `on_error` decides instead.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use toolwarden_protocol::{HookConfig, HookOnError, RuleDecision};

use crate::backend::BoxFuture;
use crate::rules::glob;

/// A hook's default `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a hook is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookTarget {
    /// POSTed to, with the call as a JSON body.
    Url(String),
    /// Run, with the call as JSON on its standard input; its standard output is the answer.
    Command(Vec<String>),
}

/// How hooks are reached: implemented by the binary (HTTP and commands).
pub trait HookTransport: Send + Sync + 'static {
    /// Sends `body` to `target` and returns its answer's body, or what went wrong. The caller
    /// bounds the wait; an implementation must stop its work (kill the command) when the
    /// future is dropped.
    fn ask(&self, target: &HookTarget, body: Vec<u8>) -> BoxFuture<Result<Vec<u8>, String>>;
}

/// One compiled hook.
#[derive(Debug)]
pub struct Hook {
    /// Its name (`[hooks.NAME]`).
    pub name: String,
    /// Where it is reached.
    pub target: HookTarget,
    tools: Option<Vec<String>>,
    /// How long it may take.
    pub timeout: Duration,
    /// What it decides when it fails.
    pub on_error: HookOnError,
}

impl Hook {
    /// Whether calls of `tool` are sent to it.
    pub fn names_tool(&self, tool: &str) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|g| g.iter().any(|g| glob(g, tool)))
    }
}

/// An error in one `[hooks.NAME]` entry.
#[derive(Debug)]
pub struct HookError {
    /// The hook's name.
    pub name: String,
    /// The key at fault.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

/// Every configured hook, in name order (the order they are asked in).
#[derive(Debug)]
pub struct HookSet {
    list: Vec<Hook>,
}

impl HookSet {
    /// Compiles `[hooks]`; `None` when there are none.
    pub fn compile<'a>(
        configs: impl IntoIterator<Item = (&'a String, &'a HookConfig)>,
    ) -> Result<Option<HookSet>, HookError> {
        let mut list = Vec::new();
        for (name, c) in configs {
            let fail = |key, message: String| HookError {
                name: name.clone(),
                key,
                message,
            };
            let target = match (&c.url, &c.command) {
                (Some(_), Some(_)) => {
                    return Err(fail(
                        "command",
                        "a hook has either a url or a command, not both".to_owned(),
                    ));
                }
                (None, None) => {
                    return Err(fail(
                        "url",
                        "a hook needs a url (\"http://127.0.0.1:9000/decide\") or a command ([\"/usr/local/bin/decide\"])".to_owned(),
                    ));
                }
                (Some(url), None) => {
                    check_url(url, c.allow_remote.unwrap_or(false)).map_err(|m| fail("url", m))?;
                    HookTarget::Url(url.clone())
                }
                (None, Some(command)) => {
                    if command.first().is_none_or(String::is_empty) {
                        return Err(fail(
                            "command",
                            "the command is empty: name a program, then its arguments".to_owned(),
                        ));
                    }
                    HookTarget::Command(command.clone())
                }
            };
            if c.tools.as_ref().is_some_and(Vec::is_empty) {
                return Err(fail(
                    "tools",
                    "an empty list matches nothing: leave tools out to ask about every tool, or name some".to_owned(),
                ));
            }
            let timeout = c.timeout.map_or(DEFAULT_TIMEOUT, |d| d.duration());
            if timeout.is_zero() {
                return Err(fail(
                    "timeout",
                    "a hook's timeout must be more than 0s: every hook needs a bound".to_owned(),
                ));
            }
            list.push(Hook {
                name: name.clone(),
                target,
                tools: c.tools.clone(),
                timeout,
                on_error: c.on_error.unwrap_or_default(),
            });
        }
        Ok((!list.is_empty()).then_some(HookSet { list }))
    }

    /// The hooks asked about calls of `tool`, in order.
    pub fn for_tool<'a>(&'a self, tool: &'a str) -> impl Iterator<Item = &'a Hook> + 'a {
        self.list.iter().filter(move |h| h.names_tool(tool))
    }

    /// Every hook.
    pub fn list(&self) -> &[Hook] {
        &self.list
    }
}

/// Whether `url` is an http(s) URL whose host is this machine's loopback (or `allow_remote`).
/// The URL is read as the HTTP client will read it (WHATWG rules: `\\` is a `/`, userinfo is
/// dropped), so that what is checked is what is reached.
fn check_url(url: &str, allow_remote: bool) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    }
    let loopback = match parsed.host() {
        None => return Err(format!("{url:?} names no host")),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
    };
    if !loopback && !allow_remote {
        return Err(format!(
            "{url:?} is not on this machine's loopback: every call's arguments would leave the machine. Set allow_remote = true on this hook if that is meant"
        ));
    }
    Ok(())
}

/// A hook's answer, as it must be written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HookAnswer {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    args: Option<Value>,
}

/// What a hook said, read.
#[derive(Debug, PartialEq)]
pub struct Said {
    /// Its decision.
    pub decision: RuleDecision,
    /// Its reason.
    pub reason: Option<String>,
    /// The arguments it gave in place of the call's.
    pub args: Option<Value>,
}

/// Reads a hook's answer body; `Err` says what is wrong with it.
pub fn read_answer(body: &[u8]) -> Result<Said, String> {
    let answer: HookAnswer = serde_json::from_slice(body).map_err(|e| {
        let shown: String = String::from_utf8_lossy(body).chars().take(80).collect();
        format!("answered {shown:?}, which is not {{\"decision\": \"allow\"|\"ask\"|\"deny\", \"reason\"?, \"args\"?}}: {e}")
    })?;
    let decision = match answer.decision.as_str() {
        "allow" => RuleDecision::Allow,
        "ask" => RuleDecision::Ask,
        "deny" => RuleDecision::Deny,
        other => {
            return Err(format!(
                "answered the decision {other:?}; a hook decides \"allow\", \"ask\" or \"deny\""
            ));
        }
    };
    if let Some(args) = &answer.args
        && !args.is_object()
    {
        return Err("answered args that are not a JSON object".to_owned());
    }
    Ok(Said {
        decision,
        reason: answer.reason,
        args: answer.args,
    })
}

/// The decision `on_error` stands for.
pub fn on_error_decision(on_error: HookOnError) -> RuleDecision {
    match on_error {
        HookOnError::Deny => RuleDecision::Deny,
        HookOnError::Ask => RuleDecision::Ask,
        HookOnError::Allow => RuleDecision::Allow,
    }
}

/// Runs one hook under `bound`: its answer, or why it failed (`timeout` when the bound passed).
pub async fn ask(
    transport: Option<&Arc<dyn HookTransport>>,
    hook: &Hook,
    body: Vec<u8>,
    bound: Duration,
) -> Result<Said, (&'static str, String)> {
    let Some(transport) = transport else {
        return Err((
            "error",
            "no way to reach hooks in this process (an embedding that configures hooks must give the engine a hook transport)".to_owned(),
        ));
    };
    match tokio::time::timeout(bound, transport.ask(&hook.target, body)).await {
        Err(_) => Err((
            "timeout",
            format!(
                "no answer within {}",
                toolwarden_protocol::format_duration(bound)
            ),
        )),
        Ok(Err(e)) => Err(("error", e)),
        Ok(Ok(body)) => read_answer(&body).map_err(|e| ("bad_answer", e)),
    }
}

#[cfg(test)]
mod tests;
