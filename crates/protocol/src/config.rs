//! The config file's shape (docs/CONFIG.md). Loading, `${VAR}` expansion, layering and the
//! invariants checked at load live in `toolwarden_core::config`; this module only says what may be
//! written.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::duration::{DurationValue, SizeValue};
use crate::policy::PolicyConfig;
use crate::with_policy_keys;

/// The whole config file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The deadline every interaction is capped at (default `"15m"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_ceiling: Option<DurationValue>,
    /// `[defaults]`: policy keys for every tool.
    #[serde(default)]
    pub defaults: PolicyConfig,
    /// `[servers.NAME]`: MCP servers, with policy keys for their tools.
    #[serde(default)]
    pub servers: BTreeMap<String, ServerConfig>,
    /// `[tools."NAME"]`: policy keys for one tool (`SERVER__TOOL`, or `exec`).
    #[serde(default)]
    pub tools: BTreeMap<String, PolicyConfig>,
    /// `[exec]`: the built-in shell tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecConfig>,
    /// `[gateway]`: how MCP tools are exposed.
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// `[http]`: the HTTP API.
    #[serde(default)]
    pub http: HttpConfig,
    /// `[store]`: the audit trail.
    #[serde(default)]
    pub store: StoreConfig,
    /// `[redis]`: state shared by replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisConfig>,
    /// `[otel]`: traces over OTLP/HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otel: Option<OtelConfig>,
    /// `[auth]`: who may call, by token or OAuth access token.
    #[serde(default, skip_serializing_if = "AuthConfig::is_empty")]
    pub auth: AuthConfig,
    /// `[[rules]]`: what may run, by tool, principal and arguments (docs/RULES.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleConfig>,
    /// `[hooks.NAME]`: external policy decisions over HTTP or a command (docs/RULES.md).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hooks: BTreeMap<String, HookConfig>,
    /// `[[quotas]]`: rates and concurrency caps (docs/RULES.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<QuotaConfig>,
}

/// `[auth]`: the principals of HTTP requests (docs/AUTH.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `[[auth.tokens]]`: a principal per bearer token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<AuthToken>,
    /// `[auth.oauth]`: JWT access tokens of an OAuth 2.1 authorization server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthConfig>,
}

impl AuthConfig {
    /// Whether nothing is configured (the table is absent).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.oauth.is_none()
    }
}

/// One `[[auth.tokens]]` entry: a bearer token and the principal it stands for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthToken {
    /// The principal's name; required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The token's SHA-256, 64 hex digits (the token itself is never written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// The environment variable holding the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// What it may do: `call`, `read`, `abort`, `approve`, `admin` (default: `["call"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
}

/// `[auth.oauth]`: toolwarden as an OAuth 2.1 resource server (the MCP authorization spec).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The authorization server; a token's `iss` must equal it. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// A token's `aud` must contain it. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Where the issuer's signing keys are (a JWKS over HTTP); or `jwks_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// A JWKS in a file (relative to the config file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<String>,
    /// This server's public URL (default: the listen URL and `/mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The claim naming the principal (default `"sub"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_claim: Option<String>,
    /// The claim holding the scopes (default `"scope"`, space-separated; `scp` arrays too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes_claim: Option<String>,
    /// Clock skew allowed on `exp` and `nbf` (default `"60s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leeway: Option<DurationValue>,
}

/// `[redis]`: replicas share breakers, the cache, aborts and events through Redis.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://HOST:PORT/DB` (or `rediss://`); required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Prepended to every key and channel, so several deployments can share one Redis (default
    /// `"toolwarden:"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Longest wait for any one Redis operation before falling back to local state (default
    /// `"250ms"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationValue>,
}

with_policy_keys! {
    /// `[servers.NAME]`: an MCP server run as a child process (`command`) or reached over
    /// Streamable HTTP (`url`), plus policy keys for its tools.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ServerConfig {
        /// The program to run (stdio transport).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub command: Option<String>,
        /// Its arguments.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub args: Vec<String>,
        /// Extra environment variables (`${VAR}` expands from toolwarden's environment).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub env: BTreeMap<String, String>,
        /// Its working directory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cwd: Option<String>,
        /// The Streamable HTTP endpoint (HTTP transport).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub url: Option<String>,
        /// Extra HTTP headers (`${VAR}` expands).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub headers: BTreeMap<String, String>,
        /// Cap of start-up: spawn or connect, `initialize` and `tools/list` (default `"20s"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub startup_timeout: Option<DurationValue>,
        /// Environment variables whose values are asked of a human (a `password` interaction).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub env_prompt: Vec<String>,
        /// `false` keeps the server configured but not started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub enabled: Option<bool>,
        /// The MCP revision to speak to it: `"auto"` (the default: the handshake era when the
        /// server speaks it, else 2026-07-28) or one of [`MCP_REVISIONS`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub protocol: Option<String>,
    }
}

/// The MCP revisions a server's `protocol` may pin, newest first: the stateless 2026-07-28 and
/// the revisions with an `initialize` handshake.
pub const MCP_REVISIONS: &[&str] = &[
    "2026-07-28",
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

with_policy_keys! {
    /// `[exec]`: the built-in shell tool, off unless enabled, plus policy keys for it.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ExecConfig {
        /// Whether the `exec` tool is offered.
        #[serde(default)]
        pub enabled: bool,
        /// A command's `cwd` must lie under one of these (default `["."]`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub allowed_roots: Option<Vec<String>>,
        /// Output kept per call (stdout and stderr together; default `"1MiB"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub output_limit: Option<SizeValue>,
        /// The shell (default `"sh"`, run as `sh -c COMMAND`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub shell: Option<String>,
    }
}

/// `[gateway]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Expose MCP tools as `SERVER__TOOL` (default `true`; `false` only with one server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<bool>,
    /// The deadline of a request the gateway forwards to a server (`resources/*`, `prompts/*`,
    /// `completion/complete`, `logging/setLevel`) when the client's request gives none
    /// (default `"30s"`; must be positive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<DurationValue>,
}

/// `[http]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on (default `"127.0.0.1:7420"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Environment variable holding the bearer token (default `"TOOLWARDEN_TOKEN"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// Largest accepted request body (default `"4MiB"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body: Option<SizeValue>,
    /// Extra `Origin`s allowed on `/mcp` besides loopback ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
    /// Extra `Host`s allowed on `/mcp` besides loopback ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
}

/// When a call's `tool_start` is made durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreDurability {
    /// Committed before the backend is invoked.
    #[default]
    BeforeExecution,
    /// Written in the background.
    Async,
}

/// `[store]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `false` runs without an audit trail (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// SQLite file (default: the platform data dir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A PostgreSQL database (`postgres://…`) instead of the SQLite file, shared by replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `before_execution` or `async`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<StoreDurability>,
    /// Inputs and outputs are stored truncated to this (default `"64KiB"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_payload: Option<SizeValue>,
    /// Keys whose values are masked (default `password`, `token`, `secret`, `api_key`,
    /// `authorization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_keys: Option<Vec<String>>,
    /// How long rows are kept (default `"30d"`; `0` = forever).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<DurationValue>,
    /// How long a call waits for a trail that cannot write (the database restarts, the disk is
    /// full) before it ends `error{store}` without running (default `"5s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<DurationValue>,
    /// PostgreSQL: how long a replica may go without renewing its lease before the others
    /// declare it dead and record its open calls as `interrupted` (default `"5s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<DurationValue>,
}

/// `[otel]`: every turn, call and attempt exported as a span over OTLP/HTTP.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`); spans go to
    /// `ENDPOINT/v1/traces`. Unset: no spans are made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// One `[[rules]]` entry: every call whose tool, principal and `when` match gets `decision`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Globs over the tool names agents call (`exec`, `github__*`); required.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Globs over principal names; absent: every principal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principals: Option<Vec<String>>,
    /// A CEL expression over the call; absent: always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// What happens to a matching call; required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<RuleDecision>,
    /// Why: shown to the model on a denial, named in an approval's question, recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A rule's decision, from least to most restrictive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleDecision {
    /// Run without asking (whatever the tool's `approval` says).
    Allow,
    /// Ask a person first (an `approval` interaction).
    Ask,
    /// Ask a person to confirm first (a `confirm` interaction).
    Confirm,
    /// Never run.
    Deny,
}

impl RuleDecision {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleDecision::Allow => "allow",
            RuleDecision::Ask => "ask",
            RuleDecision::Confirm => "confirm",
            RuleDecision::Deny => "deny",
        }
    }
}

/// One `[hooks.NAME]` entry: an external program or service asked about each matching call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// An HTTP(S) URL the call is POSTed to as JSON (exactly one of `url` and `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A program and its arguments, given the call as JSON on its standard input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Globs over the tool names agents call; absent: every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// How long the hook may take to answer (default `"2s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationValue>,
    /// What a hook that fails (times out, errs, answers garbage) decides (default `deny`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<HookOnError>,
    /// Whether `url` may name a host other than this machine's loopback (default `false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_remote: Option<bool>,
}

/// What a failing hook decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookOnError {
    /// The call is denied (`reason: hook_error`).
    #[default]
    Deny,
    /// A person is asked.
    Ask,
    /// The call goes on as if the hook had allowed it.
    Allow,
}

impl HookOnError {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            HookOnError::Deny => "deny",
            HookOnError::Ask => "ask",
            HookOnError::Allow => "allow",
        }
    }
}

/// One `[[quotas]]` entry: a token-bucket rate, a concurrency cap, or both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Globs over principal names; absent: every principal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principals: Option<Vec<String>>,
    /// Globs over tool names; absent: every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// `"N/PERIOD"` (`"60/min"`, `"5/s"`, `"1000/h"`, `"10/30s"`): N calls per period, bursting to N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// At most this many matching calls running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<i64>,
    /// Whose bucket a call takes from (default `principal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<QuotaPer>,
}

/// Whose bucket a quota counts a call in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaPer {
    /// Each principal its own.
    #[default]
    Principal,
    /// Each session its own.
    Session,
    /// Each tool its own.
    Tool,
    /// One for every call the quota matches.
    Global,
}

impl QuotaPer {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaPer::Principal => "principal",
            QuotaPer::Session => "session",
            QuotaPer::Tool => "tool",
            QuotaPer::Global => "global",
        }
    }
}
