//! The config module, area by area (one file each): one `check_*` helper per area, whole
//! objects and messages compared. The helpers shared by every area are here.

use std::time::Duration;

use pretty_assertions::assert_eq;
use proptest::prelude::*;
use toolwarden_protocol::{Approval, Backoff, Breaker, Concurrency, LoopPolicy, OnStuck, TaskMode};

use super::*;

const FILE: &str = "toolwarden.toml";

const EXAMPLE: &str = r#"
[defaults]
timeout = "120s"
idle_timeout = "0s"

[servers.everything]                 # an MCP server run as a child process (stdio)
command = "npx"
args = ["-y", "@modelcontextprotocol/server-everything"]
env = { LOG_LEVEL = "warn" }
startup_timeout = "20s"              # initialize + tools/list
timeout = "60s"                      # any policy key may be set per server

[servers.remote]                     # an MCP server over Streamable HTTP
url = "http://127.0.0.1:3001/mcp"
headers = { Authorization = "Bearer ${REMOTE_TOKEN}" }   # ${VAR} expands from the environment

[tools."everything__trigger-long-running-operation"]
timeout = "30m"
idle_timeout = "10s"

[exec]                               # the built-in shell tool, off unless enabled
enabled = true
allowed_roots = ["."]                # cwd must lie under one of these
output_limit = "1MiB"
timeout = "30s"

[gateway]
prefix = true                        # expose MCP tools as SERVER__TOOL; false only with one server

[http]
listen = "127.0.0.1:7420"
token_env = "TOOLWARDEN_TOKEN"       # bearer token; required when listen is not loopback

[store]
path = "toolwarden.db"               # SQLite audit trail (default: the platform data dir)
durability = "before_execution"      # or "async"
"#;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Test sources start on the line after `r#"`: that line is line 1.
fn text(src: &str) -> &str {
    src.strip_prefix('\n').unwrap_or(src)
}

fn parse(src: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let env = |name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    };
    Config::parse(text(src), FILE, &env)
}

fn parse_ok(src: &str, vars: &[(&str, &str)]) -> Config {
    match parse(src, vars) {
        Ok(config) => config,
        Err(e) => panic!("config should load, got: {e}"),
    }
}

/// The error a config gives, as its kind and its one-line message.
#[track_caller]
fn check_error(src: &str, vars: &[(&str, &str)], kind: ConfigErrorKind, expected: &str) {
    match parse(src, vars) {
        Ok(config) => panic!("config should not load; warnings: {:?}", config.warnings),
        Err(e) => assert_eq!((e.kind, e.to_string()), (kind, expected.to_owned())),
    }
}

/// The warnings a config gives, as their one-line messages.
#[track_caller]
fn check_warnings(src: &str, vars: &[(&str, &str)], expected: &[&str]) {
    let config = parse_ok(src, vars);
    let got: Vec<String> = config.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(got, expected);
}

/// A tool as a front door asks for its policy.
struct Tool {
    name: &'static str,
    server: Option<&'static str>,
    annotations: ToolAnnotations,
}

fn mcp(server: &'static str, name: &'static str) -> Tool {
    Tool {
        name,
        server: Some(server),
        annotations: ToolAnnotations::default(),
    }
}

fn local(name: &'static str) -> Tool {
    Tool {
        name,
        server: None,
        annotations: ToolAnnotations::default(),
    }
}

fn hints(
    mut tool: Tool,
    read_only: Option<bool>,
    destructive: Option<bool>,
    idem: Option<bool>,
) -> Tool {
    tool.annotations = ToolAnnotations {
        read_only_hint: read_only,
        destructive_hint: destructive,
        idempotent_hint: idem,
        ..ToolAnnotations::default()
    };
    tool
}

/// The effective policy of each tool.
#[track_caller]
fn check_policies(config: &Config, expected: Vec<(Tool, Policy)>) {
    let (want, got): (Vec<_>, Vec<_>) = expected
        .into_iter()
        .map(|(tool, policy)| {
            let label = format!("{:?} of {:?}", tool.name, tool.server);
            let got = config.policy_for(tool.name, tool.server, &tool.annotations);
            ((label.clone(), policy), (label, got))
        })
        .unzip();
    assert_eq!(got, want);
}

mod environment;
mod errors;
mod example;
mod hints;
mod layering;
mod numbers;
