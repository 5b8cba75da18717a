//! The config module against SPEC §2, area by area: one `check_*` helper per area, whole
//! objects and messages compared.

use std::time::Duration;

use pretty_assertions::assert_eq;
use proptest::prelude::*;
use toolwarden_protocol::{Approval, Backoff, Breaker, Concurrency, LoopPolicy, OnStuck};

use super::*;

const FILE: &str = "toolwarden.toml";

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

// ---------------------------------------------------------------------------------------------
// The SPEC §2.3 example

const SPEC_EXAMPLE: &str = r#"
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

#[test]
fn the_spec_example_loads_and_every_tool_gets_its_policy() {
    let config = parse_ok(SPEC_EXAMPLE, &[("REMOTE_TOKEN", "s3cret")]);
    assert_eq!(config.warnings, vec![]);
    assert_eq!(config.origin, ConfigOrigin::File(FILE.into()));
    assert_eq!(
        config.file.servers["remote"].headers["Authorization"],
        "Bearer s3cret"
    );
    assert_eq!(
        config.file.servers["everything"].command.as_deref(),
        Some("npx")
    );
    assert_eq!(config.interaction_ceiling(), secs(15 * 60));
    check_policies(
        &config,
        vec![
            (
                mcp("everything", "echo"),
                Policy {
                    timeout: secs(60),
                    ..Policy::default()
                },
            ),
            (
                mcp("everything", "trigger-long-running-operation"),
                Policy {
                    timeout: secs(30 * 60),
                    idle_timeout: secs(10),
                    ..Policy::default()
                },
            ),
            // The exposed name alone finds its server.
            (
                local("everything__trigger-long-running-operation"),
                Policy {
                    timeout: secs(30 * 60),
                    idle_timeout: secs(10),
                    ..Policy::default()
                },
            ),
            (mcp("remote", "fetch"), Policy::default()),
            (
                local("exec"),
                Policy {
                    timeout: secs(30),
                    ..Policy::default()
                },
            ),
            (local("calculator"), Policy::default()),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Layering

#[test]
fn later_layers_win_key_by_key() {
    let config = parse_ok(
        r#"
[defaults]
timeout = "90s"
retries = 1
backoff = { initial = "100ms" }
breaker = { failures = 3 }
concurrency = "exclusive"

[servers.fs]
command = "fs-server"
timeout = "45s"
retries = 2
backoff = { max = "1s" }
on_stuck = "restart"

[tools."fs__write"]
retries = 0
backoff = { multiplier = 3.0 }
breaker = { window = "10s" }
approval = "ask"
approval_timeout = "5m"
loop = { block_after = 0 }
max_input = "4KiB"

[exec]
cancel_grace = "5s"

[tools.exec]
cache_ttl = "1m"

[tools.calc]
idempotent = true

[tools."fs__ns__tool"]
retries = 5
"#,
        &[],
    );
    let defaults = Policy {
        timeout: secs(90),
        retries: 1,
        backoff: Backoff {
            initial: ms(100),
            ..Backoff::default()
        },
        breaker: Breaker {
            failures: 3,
            ..Breaker::default()
        },
        concurrency: Concurrency::Exclusive,
        ..Policy::default()
    };
    let server = Policy {
        timeout: secs(45),
        retries: 2,
        backoff: Backoff {
            initial: ms(100),
            max: secs(1),
            multiplier: 2.0,
        },
        on_stuck: OnStuck::Restart,
        ..defaults.clone()
    };
    check_policies(
        &config,
        vec![
            (mcp("fs", "read"), server.clone()),
            (
                mcp("fs", "write"),
                Policy {
                    retries: 0,
                    backoff: Backoff {
                        multiplier: 3.0,
                        ..server.backoff.clone()
                    },
                    breaker: Breaker {
                        failures: 3,
                        window: secs(10),
                        open_for: secs(30),
                    },
                    approval: Approval::Ask,
                    approval_timeout: Some(secs(300)),
                    loop_: LoopPolicy {
                        warn_after: 3,
                        block_after: 0,
                    },
                    max_input: 4096,
                    ..server.clone()
                },
            ),
            (
                local("exec"),
                Policy {
                    cancel_grace: secs(5),
                    cache_ttl: secs(60),
                    ..defaults.clone()
                },
            ),
            (
                local("calc"),
                Policy {
                    idempotent: true,
                    ..defaults.clone()
                },
            ),
            // Names are split at the first "__": the server's own name may contain more.
            (
                mcp("fs", "ns__tool"),
                Policy {
                    retries: 5,
                    ..server.clone()
                },
            ),
            (
                local("fs__ns__tool"),
                Policy {
                    retries: 5,
                    ..server.clone()
                },
            ),
            // A server that is not configured adds no layer.
            (mcp("gone", "x"), defaults.clone()),
        ],
    );
}

#[test]
fn builtin_defaults_are_the_spec_defaults() {
    let config = Config::builtin();
    assert_eq!(config.origin, ConfigOrigin::Builtin);
    check_policies(
        &config,
        vec![(
            local("anything"),
            Policy {
                timeout: secs(120),
                idle_timeout: Duration::ZERO,
                attempt_timeout: Duration::ZERO,
                max_timeout: secs(30 * 60),
                cancel_grace: secs(2),
                retries: 0,
                backoff: Backoff {
                    initial: ms(200),
                    max: secs(5),
                    multiplier: 2.0,
                },
                idempotent: false,
                cache_ttl: Duration::ZERO,
                breaker: Breaker {
                    failures: 5,
                    window: secs(60),
                    open_for: secs(30),
                },
                concurrency: Concurrency::Parallel,
                approval: Approval::Auto,
                approval_timeout: None,
                on_stuck: OnStuck::Abandon,
                loop_: LoopPolicy {
                    warn_after: 3,
                    block_after: 5,
                },
                retry_on_tool_error: false,
                breaker_counts_tool_errors: false,
                max_input: 1 << 20,
            },
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// Annotations (SPEC §2.2)

#[test]
fn annotations_fill_what_no_layer_configured() {
    let config = parse_ok(
        r#"
[servers.a]
command = "a"

[servers.b]
command = "b"
idempotent = false
approval = "auto"

[tools."a__pinned"]
approval = "deny"
"#,
        &[],
    );
    let idempotent = Policy {
        idempotent: true,
        ..Policy::default()
    };
    let confirm = Policy {
        approval: Approval::Confirm,
        ..Policy::default()
    };
    check_policies(
        &config,
        vec![
            (
                hints(mcp("a", "read"), Some(true), None, None),
                idempotent.clone(),
            ),
            (
                hints(mcp("a", "put"), None, None, Some(true)),
                idempotent.clone(),
            ),
            (hints(mcp("a", "rm"), None, Some(true), None), confirm),
            // Read-only wins over destructive.
            (
                hints(mcp("a", "odd"), Some(true), Some(true), None),
                idempotent,
            ),
            // Absent hints, and hints set to false, count for nothing.
            (
                hints(mcp("a", "plain"), None, None, None),
                Policy::default(),
            ),
            (
                hints(mcp("a", "falses"), Some(false), Some(false), Some(false)),
                Policy::default(),
            ),
            // Config wins, from whichever layer.
            (
                hints(mcp("b", "rm"), Some(true), Some(true), Some(true)),
                Policy::default(),
            ),
            (
                hints(mcp("b", "rm2"), None, Some(true), None),
                Policy::default(),
            ),
            (
                hints(mcp("a", "pinned"), None, Some(true), None),
                Policy {
                    approval: Approval::Deny,
                    ..Policy::default()
                },
            ),
        ],
    );
}

#[test]
fn defaults_configure_too() {
    let config = parse_ok("[defaults]\nidempotent = false\napproval = \"ask\"\n", &[]);
    check_policies(
        &config,
        vec![(
            hints(mcp("x", "rm"), Some(true), Some(true), Some(true)),
            Policy {
                approval: Approval::Ask,
                ..Policy::default()
            },
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// Negative numbers (SPEC §2.1: treated as 0, with a warning)

#[test]
fn negative_numbers_are_zero_with_a_warning_naming_key_and_line() {
    let src = r#"
interaction_ceiling = -1

[defaults]
timeout = "-5s"
retries = -1
breaker = { failures = -2, window = -3 }
loop = { warn_after = -1 }
max_input = -10
backoff = { multiplier = -1.5 }

[servers.s]
command = "s"
startup_timeout = -20
cache_ttl = "-1m"

[exec]
output_limit = -1

[store]
max_payload = "-1KiB"
"#;
    check_warnings(
        src,
        &[],
        &[
            "toolwarden.toml:1: interaction_ceiling: negative duration -1s is treated as 0s; write 0 or a positive duration such as \"30s\"",
            "toolwarden.toml:1: interaction_ceiling: interaction_ceiling is 0s: every approval and confirm will time out at once and its call be denied; write e.g. \"15m\"",
            "toolwarden.toml:4: defaults.timeout: negative duration -5s is treated as 0s; write 0 or a positive duration such as \"30s\"",
            "toolwarden.toml:5: defaults.retries: negative value -1 is treated as 0; write 0 or a positive number",
            "toolwarden.toml:6: defaults.breaker.failures: negative value -2 is treated as 0; write 0 or a positive number",
            "toolwarden.toml:6: defaults.breaker.window: negative duration -3s is treated as 0s; write 0 or a positive duration such as \"30s\"",
            "toolwarden.toml:7: defaults.loop.warn_after: negative value -1 is treated as 0; write 0 or a positive number",
            "toolwarden.toml:8: defaults.max_input: negative size -10 bytes is treated as 0; write 0 or a positive size such as \"1MiB\"",
            "toolwarden.toml:9: defaults.backoff.multiplier: negative value -1.5 is treated as 0; write 0 or a positive number such as 2.0",
            "toolwarden.toml:13: servers.s.startup_timeout: negative duration -20s is treated as 0s; write 0 or a positive duration such as \"30s\"",
            "toolwarden.toml:14: servers.s.cache_ttl: negative duration -1m is treated as 0s; write 0 or a positive duration such as \"30s\"",
            "toolwarden.toml:17: exec.output_limit: negative size -1 bytes is treated as 0; write 0 or a positive size such as \"1MiB\"",
            "toolwarden.toml:20: store.max_payload: negative size -1024 bytes is treated as 0; write 0 or a positive size such as \"1MiB\"",
        ],
    );
    check_policies(
        &parse_ok(src, &[]),
        vec![(
            mcp("s", "t"),
            Policy {
                timeout: Duration::ZERO,
                retries: 0,
                breaker: Breaker {
                    failures: 0,
                    window: Duration::ZERO,
                    open_for: secs(30),
                },
                loop_: LoopPolicy {
                    warn_after: 0,
                    block_after: 5,
                },
                max_input: 0,
                backoff: Backoff {
                    multiplier: 0.0,
                    ..Backoff::default()
                },
                ..Policy::default()
            },
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// Clamps (SPEC §2.1)

#[test]
fn idle_and_attempt_above_the_timeout_are_clamped_with_a_warning() {
    let src = r#"
[defaults]
timeout = "60s"
idle_timeout = "2m"

[servers.s]
command = "s"
attempt_timeout = "90s"

[tools."s__long"]
timeout = "10m"
idle_timeout = "5m"

[tools."s__short"]
timeout = "20s"

[tools."s__uncapped"]
timeout = 0
idle_timeout = "1h"
"#;
    check_warnings(
        src,
        &[],
        &[
            "toolwarden.toml:3: defaults.idle_timeout: idle_timeout 2m is longer than timeout 1m; it is clamped to 1m",
            "toolwarden.toml:7: servers.s.attempt_timeout: attempt_timeout 90s is longer than timeout 1m (from [defaults]); it is clamped to 1m",
        ],
    );
    check_policies(
        &parse_ok(src, &[]),
        vec![
            (
                mcp("s", "other"),
                Policy {
                    timeout: secs(60),
                    idle_timeout: secs(60),
                    attempt_timeout: secs(60),
                    ..Policy::default()
                },
            ),
            // Raising the timeout in a later layer lifts what was clamped by a lower one.
            (
                mcp("s", "long"),
                Policy {
                    timeout: secs(600),
                    idle_timeout: secs(300),
                    attempt_timeout: secs(90),
                    ..Policy::default()
                },
            ),
            // Lowering it clamps the inherited values (no warning: nothing was written here).
            (
                mcp("s", "short"),
                Policy {
                    timeout: secs(20),
                    idle_timeout: secs(20),
                    attempt_timeout: secs(20),
                    ..Policy::default()
                },
            ),
            // No total cap, no clamp.
            (
                mcp("s", "uncapped"),
                Policy {
                    timeout: Duration::ZERO,
                    idle_timeout: secs(3600),
                    attempt_timeout: secs(90),
                    ..Policy::default()
                },
            ),
        ],
    );
}

#[test]
fn a_table_is_checked_against_the_timeout_it_inherits() {
    check_warnings(
        r#"
[tools.build]
idle_timeout = "3m"

[servers.s]
command = "s"
timeout = "10s"

[tools."s__t"]
attempt_timeout = "11s"
"#,
        &[],
        &[
            "toolwarden.toml:2: tools.build.idle_timeout: idle_timeout 3m is longer than timeout 2m (from the built-in default); it is clamped to 2m",
            "toolwarden.toml:9: tools.s__t.attempt_timeout: attempt_timeout 11s is longer than timeout 10s (from [servers.s]); it is clamped to 10s",
        ],
    );
}

#[test]
fn interactions_are_capped_by_the_ceiling() {
    let src = r#"
interaction_ceiling = "90s"

[defaults]
approval_timeout = "5m"

[tools.ask]
approval = "ask"
approval_timeout = "30s"

[tools.asked]
approval = "ask"

[tools.confirmed]
approval = "confirm"
"#;
    check_warnings(
        src,
        &[],
        &[
            "toolwarden.toml:4: defaults.approval_timeout: approval_timeout 5m is longer than interaction_ceiling 90s; it is clamped to 90s",
        ],
    );
    let config = parse_ok(src, &[]);
    assert_eq!(config.interaction_ceiling(), secs(90));
    check_policies(
        &config,
        vec![
            (
                local("ask"),
                Policy {
                    approval: Approval::Ask,
                    approval_timeout: Some(secs(30)),
                    ..Policy::default()
                },
            ),
            (
                local("asked"),
                Policy {
                    approval: Approval::Ask,
                    approval_timeout: Some(secs(90)),
                    ..Policy::default()
                },
            ),
            (
                local("other"),
                Policy {
                    approval_timeout: Some(secs(90)),
                    ..Policy::default()
                },
            ),
        ],
    );
    // The kind's default stays implicit (None) when the ceiling is above it.
    let config = parse_ok(
        "interaction_ceiling = \"100s\"\n[tools.c]\napproval = \"confirm\"\n[tools.a]\napproval = \"ask\"\n",
        &[],
    );
    check_policies(
        &config,
        vec![
            (
                local("c"),
                Policy {
                    approval: Approval::Confirm,
                    ..Policy::default()
                },
            ),
            (
                local("a"),
                Policy {
                    approval: Approval::Ask,
                    approval_timeout: Some(secs(100)),
                    ..Policy::default()
                },
            ),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Errors that name the file, the key and the line

#[test]
fn unknown_keys_are_errors() {
    use ConfigErrorKind::UnknownKey;
    check_error(
        "# toolwarden\nlisten = \"x\"\n",
        &[],
        UnknownKey,
        "toolwarden.toml:2: listen: unknown key \"listen\": expected one of interaction_ceiling, defaults, servers, tools, exec, gateway, http, store",
    );
    check_error(
        "[servers.everything]\ncommand = \"x\"\ntimout = \"1s\"\n",
        &[],
        UnknownKey,
        "toolwarden.toml:3: servers.everything.timout: unknown key \"timout\": did you mean \"timeout\"?",
    );
    check_error(
        "[tools.\"a.b\"]\nretrys = 1\n",
        &[],
        UnknownKey,
        "toolwarden.toml:2: tools.\"a.b\".retrys: unknown key \"retrys\": did you mean \"retries\"?",
    );
    check_error(
        "[tools.x]\nbreaker = { failures = 1, open = \"1s\" }\n",
        &[],
        UnknownKey,
        "toolwarden.toml:2: tools.x.breaker.open: unknown key \"open\": did you mean \"open_for\"?",
    );
    check_error(
        "[defaults.backoff]\ninitial = 1\nmultiplyer = 2\n",
        &[],
        UnknownKey,
        "toolwarden.toml:3: defaults.backoff.multiplyer: unknown key \"multiplyer\": did you mean \"multiplier\"?",
    );
    check_error(
        "[defaults]\nloop = { warn = 1 }\n",
        &[],
        UnknownKey,
        "toolwarden.toml:2: defaults.loop.warn: unknown key \"warn\": did you mean \"warn_after\"?",
    );
    check_error(
        "[exec]\nenabled = true\nroots = [\".\"]\n",
        &[],
        UnknownKey,
        "toolwarden.toml:3: exec.roots: unknown key \"roots\": expected one of enabled, allowed_roots, output_limit, shell, timeout, idle_timeout, attempt_timeout, max_timeout, cancel_grace, retries, backoff, idempotent, cache_ttl, breaker, concurrency, approval, approval_timeout, on_stuck, loop, retry_on_tool_error, breaker_counts_tool_errors, max_input",
    );
    check_error(
        "[gateway]\nprefixed = true\n",
        &[],
        UnknownKey,
        "toolwarden.toml:2: gateway.prefixed: unknown key \"prefixed\": did you mean \"prefix\"?",
    );
    check_error(
        "[http]\nlisten = \"127.0.0.1:1\"\ntoken = \"x\"\n",
        &[],
        UnknownKey,
        "toolwarden.toml:3: http.token: unknown key \"token\": did you mean \"token_env\"?",
    );
    check_error(
        "[store]\ndurabilty = \"async\"\n",
        &[],
        UnknownKey,
        "toolwarden.toml:2: store.durabilty: unknown key \"durabilty\": did you mean \"durability\"?",
    );
    // A table header is a key too.
    check_error(
        "[servers.x]\ncommand = \"x\"\n\n[servers.x.envs]\nA = \"1\"\n",
        &[],
        UnknownKey,
        "toolwarden.toml:4: servers.x.envs: unknown key \"envs\": did you mean \"env\"?",
    );
}

#[test]
fn bad_values_are_errors() {
    use ConfigErrorKind::{InvalidValue, Syntax};
    check_error(
        "[servers.everything]\ncommand = \"x\"\n\ntimeout = \"10x\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:4: servers.everything.timeout: invalid duration \"10x\": expected a number with a unit ms, s, m or h (e.g. \"250ms\", \"30s\", \"2m\") or integer seconds",
    );
    check_error(
        "[defaults]\nmax_input = \"big\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: defaults.max_input: invalid size \"big\": expected a number with a unit B, KB, KiB, MB, MiB, GB or GiB (e.g. \"64KiB\", \"1MiB\") or integer bytes",
    );
    check_error(
        "[defaults]\napproval = \"maybe\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: defaults.approval: invalid value \"maybe\": expected one of \"auto\", \"ask\", \"confirm\", \"deny\"",
    );
    check_error(
        "[store]\ndurability = \"sync\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: store.durability: invalid value \"sync\": expected one of \"before_execution\", \"async\"",
    );
    check_error(
        "[defaults]\nretries = \"3\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: defaults.retries: invalid type: string \"3\", expected an integer",
    );
    check_error(
        "[defaults]\ntimeout = true\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: defaults.timeout: invalid type: boolean `true`, expected a duration such as \"250ms\", \"30s\", \"2m\", \"1h\" or integer seconds",
    );
    check_error(
        "[servers.x]\ncommand = \"x\"\nargs = [\"-v\",\n  2]\n",
        &[],
        InvalidValue,
        "toolwarden.toml:4: servers.x.args[1]: invalid type: integer `2`, expected a string (in quotes)",
    );
    check_error(
        "[[servers]]\ncommand = \"x\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:1: servers: invalid type: array, expected a table",
    );
    check_error(
        "[defaults]\nretries = 5000000000\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: defaults.retries: 5000000000 is too large: expected at most 4294967295",
    );
    check_error(
        "[defaults]\nbackoff = { multiplier = nan }\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: defaults.backoff.multiplier: multiplier NaN is not a finite number: write e.g. 2.0",
    );
    check_error(
        "[defaults]\ntimeout = \"1s\n",
        &[],
        Syntax,
        "toolwarden.toml:2: defaults.timeout: invalid TOML: invalid basic string, expected `\"`",
    );
    check_error(
        "[defaults]\ntimeout = 1\ntimeout = 2\n",
        &[],
        Syntax,
        "toolwarden.toml:3: defaults.timeout: duplicate key: a key may be written once per table",
    );
    check_error(
        "[servers.x\ncommand = 1\n",
        &[],
        Syntax,
        "toolwarden.toml:1: servers.x: invalid TOML: unclosed table, expected `]`",
    );
}

#[test]
fn a_tool_entry_must_name_a_configured_server() {
    use ConfigErrorKind::UnknownServer;
    let servers =
        "[servers.everything]\ncommand = \"x\"\n[servers.remote]\nurl = \"http://h/mcp\"\n";
    check_error(
        &format!("{servers}\n[tools.\"nope__x\"]\ntimeout = 1\n"),
        &[],
        UnknownServer,
        "toolwarden.toml:6: tools.nope__x: names server \"nope\" (tools are named SERVER__TOOL), which is not configured; configured servers: everything, remote",
    );
    check_error(
        &format!("{servers}\n[tools.\"everythin__echo\"]\ntimeout = 1\n"),
        &[],
        UnknownServer,
        "toolwarden.toml:6: tools.everythin__echo: names server \"everythin\" (tools are named SERVER__TOOL), which is not configured; did you mean [tools.\"everything__echo\"]?",
    );
    check_error(
        "[tools.\"a__b\"]\nretries = 1\n",
        &[],
        UnknownServer,
        "toolwarden.toml:1: tools.a__b: names server \"a\" (tools are named SERVER__TOOL), which is not configured; no servers are configured; add [servers.NAME] or fix the name",
    );
    // toolwarden's own tools and in-process tools need no server.
    parse_ok(
        "[tools.toolwarden__status]\ntimeout = 1\n[tools.calc]\ntimeout = 1\n",
        &[],
    );
}

#[test]
fn a_server_is_a_command_or_a_url() {
    use ConfigErrorKind::InvalidServer;
    check_error(
        "[servers.a]\ncommand = \"x\"\n\n[servers.b]\ntimeout = \"1s\"\n",
        &[],
        InvalidServer,
        "toolwarden.toml:4: servers.b: server \"b\" has neither command nor url: set command = \"...\" to run it as a child process, or url = \"http://...\" to reach it over Streamable HTTP",
    );
    check_error(
        "[servers.b]\ncommand = \"x\"\nurl = \"http://h/mcp\"\n",
        &[],
        InvalidServer,
        "toolwarden.toml:1: servers.b: server \"b\" has both command and url: a server is either a child process (command) or a Streamable HTTP endpoint (url); keep one",
    );
    check_error(
        "[servers.my__fs]\ncommand = \"x\"\n",
        &[],
        InvalidServer,
        "toolwarden.toml:1: servers.my__fs: server name \"my__fs\" must not contain \"__\": tools are exposed as SERVER__TOOL, split at the first \"__\"; rename it, e.g. \"my_fs\"",
    );
    check_error(
        "[servers.toolwarden]\ncommand = \"x\"\n",
        &[],
        InvalidServer,
        "toolwarden.toml:1: servers.toolwarden: server name \"toolwarden\" is reserved for toolwarden's own tools (toolwarden__status); choose another name",
    );
    check_error(
        "[servers.r]\nurl = \"127.0.0.1:3001/mcp\"\n",
        &[],
        InvalidServer,
        "toolwarden.toml:2: servers.r.url: url \"127.0.0.1:3001/mcp\" is not an http:// or https:// URL: write the server's Streamable HTTP endpoint, e.g. \"http://127.0.0.1:3001/mcp\"",
    );
    check_warnings(
        "[servers.r]\nurl = \"http://h/mcp\"\nargs = [\"x\"]\n[servers.c]\ncommand = \"c\"\nheaders = { A = \"b\" }\n",
        &[],
        &[
            "toolwarden.toml:3: servers.r.args: args is ignored: server \"r\" is reached over HTTP (url); args only applies to a server run as a child process (command)",
            "toolwarden.toml:6: servers.c.headers: headers is ignored: server \"c\" is run as a child process (command); headers only applies to a server reached over HTTP (url)",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Tools a server does not list

#[test]
fn entries_for_tools_a_server_does_not_list_are_warnings_once_known() {
    let config = parse_ok(
        r#"
[servers.everything]
command = "x"

[servers.other]
command = "y"

[tools."everything__echo"]
timeout = 1

[tools."everything__ecko"]
timeout = 1

[tools."everything__gone"]
timeout = 1

[tools."other__gone"]
timeout = 1
"#,
        &[],
    );
    assert_eq!(config.warnings, vec![]);
    let got: Vec<String> = config
        .unknown_tool_warnings("everything", &["echo", "add", "sampleLLM"])
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        vec![
            "toolwarden.toml:10: tools.everything__ecko: server \"everything\" does not list a tool \"ecko\", so these keys apply to no tool; did you mean [tools.everything__echo]?",
            "toolwarden.toml:13: tools.everything__gone: server \"everything\" does not list a tool \"gone\", so these keys apply to no tool; it lists echo, add, sampleLLM",
        ]
    );
    assert_eq!(
        config.unknown_tool_warnings("other", &[])[0].to_string(),
        "toolwarden.toml:16: tools.other__gone: server \"other\" does not list a tool \"gone\", so these keys apply to no tool; it lists no tools"
    );
}

// ---------------------------------------------------------------------------------------------
// [gateway] prefix

#[test]
fn unprefixed_tools_need_exactly_one_server() {
    check_error(
        "[gateway]\nprefix = false\n\n[servers.a]\ncommand = \"a\"\n[servers.b]\ncommand = \"b\"\n",
        &[],
        ConfigErrorKind::Prefix,
        "toolwarden.toml:2: gateway.prefix: prefix = false needs exactly one server, but 2 are configured (a, b): their tools' names could collide; remove prefix = false, or keep one server",
    );
    // A disabled server is not served, so it does not count.
    parse_ok(
        "[gateway]\nprefix = false\n[servers.a]\ncommand = \"a\"\n[servers.b]\ncommand = \"b\"\nenabled = false\n",
        &[],
    );
}

#[test]
fn unprefixed_tool_entries_apply_to_the_single_server() {
    let src = r#"
[gateway]
prefix = false

[servers.fs]
command = "fs"
timeout = "10s"

[tools.read]
retries = 2

[tools."fs__write"]
retries = 3
"#;
    check_warnings(
        src,
        &[],
        &[
            "toolwarden.toml:11: tools.fs__write: applies to no tool: with [gateway] prefix = false, tools are exposed without their server's name; write [tools.\"write\"]",
        ],
    );
    let config = parse_ok(src, &[]);
    assert_eq!(config.exposed_name("fs", "read"), "read");
    check_policies(
        &config,
        vec![
            (
                mcp("fs", "read"),
                Policy {
                    timeout: secs(10),
                    retries: 2,
                    ..Policy::default()
                },
            ),
            (
                mcp("fs", "write"),
                Policy {
                    timeout: secs(10),
                    ..Policy::default()
                },
            ),
        ],
    );
    let got: Vec<String> = config
        .unknown_tool_warnings("fs", &["read", "write"])
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(got, Vec::<String>::new());
    assert_eq!(
        config.unknown_tool_warnings("fs", &["write"])[0].to_string(),
        "toolwarden.toml:8: tools.read: server \"fs\" does not list a tool \"read\", so these keys apply to no tool; it lists write"
    );
}

// ---------------------------------------------------------------------------------------------
// Environment: ${VAR} and TOOLWARDEN_TOOL_TIMEOUT

#[test]
fn variables_expand_in_server_definitions() {
    let config = parse_ok(
        r#"
[servers.local]
command = "${HOME}/bin/server"
args = ["--token", "${TOKEN}", "$${NOT_A_VAR}", "$PLAIN", "cost: $5"]
env = { API_KEY = "${TOKEN}", LEVEL = "warn" }
cwd = "${HOME}/work"

[servers.remote]
url = "https://${HOST}/mcp"
headers = { Authorization = "Bearer ${TOKEN}" }

[servers.off]
enabled = false
command = "${UNSET_BUT_DISABLED}"
"#,
        &[
            ("HOME", "/home/me"),
            ("TOKEN", "t0k"),
            ("HOST", "example.com"),
        ],
    );
    let local = &config.file.servers["local"];
    assert_eq!(local.command.as_deref(), Some("/home/me/bin/server"));
    assert_eq!(
        local.args,
        vec!["--token", "t0k", "${NOT_A_VAR}", "$PLAIN", "cost: $5"]
    );
    assert_eq!(local.env["API_KEY"], "t0k");
    assert_eq!(local.cwd.as_deref(), Some("/home/me/work"));
    let remote = &config.file.servers["remote"];
    assert_eq!(remote.url.as_deref(), Some("https://example.com/mcp"));
    assert_eq!(remote.headers["Authorization"], "Bearer t0k");
    assert_eq!(
        config.file.servers["off"].command.as_deref(),
        Some("${UNSET_BUT_DISABLED}")
    );
}

#[test]
fn a_variable_that_is_unset_or_malformed_is_an_error() {
    use ConfigErrorKind::Variable;
    check_error(
        SPEC_EXAMPLE,
        &[],
        Variable,
        "toolwarden.toml:14: servers.remote.headers.Authorization: environment variable REMOTE_TOKEN is not set (used as ${REMOTE_TOKEN}); set it, or write $${REMOTE_TOKEN} for a literal \"${REMOTE_TOKEN}\"",
    );
    check_error(
        "[servers.x]\ncommand = \"x\"\nargs = [\n  \"a\",\n  \"${B\",\n]\n",
        &[],
        Variable,
        "toolwarden.toml:5: servers.x.args[1]: \"${\" without a closing \"}\": write ${NAME}, or $${ for a literal \"${\"",
    );
    check_error(
        "[servers.x]\ncommand = \"${1X}\"\n",
        &[],
        Variable,
        "toolwarden.toml:2: servers.x.command: ${1X} is not a variable name: expected letters, digits and _ (not starting with a digit), or $${ for a literal \"${\"",
    );
}

#[test]
fn the_tool_timeout_variable_overrides_the_defaults() {
    let src = "[defaults]\ntimeout = \"1m\"\nidle_timeout = \"50s\"\n[servers.s]\ncommand = \"s\"\ntimeout = \"5m\"\n";
    let config = parse_ok(src, &[("TOOLWARDEN_TOOL_TIMEOUT", "45")]);
    check_policies(
        &config,
        vec![
            (
                local("calc"),
                Policy {
                    timeout: secs(45),
                    idle_timeout: secs(45),
                    ..Policy::default()
                },
            ),
            // Later layers still win over [defaults], however it was set.
            (
                mcp("s", "t"),
                Policy {
                    timeout: secs(300),
                    idle_timeout: secs(50),
                    ..Policy::default()
                },
            ),
        ],
    );
    check_warnings(
        src,
        &[("TOOLWARDEN_TOOL_TIMEOUT", "45")],
        &[
            "toolwarden.toml:3: defaults.idle_timeout: idle_timeout 50s is longer than timeout 45s (from TOOLWARDEN_TOOL_TIMEOUT); it is clamped to 45s",
        ],
    );
    check_warnings(
        "",
        &[("TOOLWARDEN_TOOL_TIMEOUT", "-3s")],
        &[
            "environment: TOOLWARDEN_TOOL_TIMEOUT: negative duration -3s is treated as 0s; write 0 or a positive duration such as \"30s\"",
        ],
    );
    // Empty means unset.
    check_policies(
        &parse_ok("", &[("TOOLWARDEN_TOOL_TIMEOUT", "")]),
        vec![(local("calc"), Policy::default())],
    );
    check_error(
        src,
        &[("TOOLWARDEN_TOOL_TIMEOUT", "soon")],
        ConfigErrorKind::Environment,
        "environment: TOOLWARDEN_TOOL_TIMEOUT: invalid duration \"soon\": expected a number with a unit ms, s, m or h (e.g. \"250ms\", \"30s\", \"2m\") or integer seconds",
    );
}

// ---------------------------------------------------------------------------------------------
// Finding the file

/// A fresh, empty directory for one test.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("toolwarden-config-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_file_is_found_by_flag_then_variable_then_working_directory() {
    let dir = temp_dir("lookup");
    let flag = dir.join("flag.toml");
    let var = dir.join("var.toml");
    std::fs::write(&flag, "[defaults]\ntimeout = 1\n").unwrap();
    std::fs::write(&var, "[defaults]\ntimeout = 2\n").unwrap();
    let var_s = var.display().to_string();
    let with_var = |name: &str| (name == CONFIG_ENV).then(|| var_s.clone());
    let none = |_: &str| None;
    let timeout = |c: &Config| c.policy_for("t", None, &ToolAnnotations::default()).timeout;

    let c = Config::load_from(Some(&flag), &dir, &with_var).unwrap();
    assert_eq!(
        (c.origin.clone(), timeout(&c)),
        (ConfigOrigin::File(flag.clone()), secs(1))
    );
    let c = Config::load_from(None, &dir, &with_var).unwrap();
    assert_eq!(
        (c.origin.clone(), timeout(&c)),
        (ConfigOrigin::File(var.clone()), secs(2))
    );
    // Nothing named, no ./toolwarden.toml: built-in defaults.
    let c = Config::load_from(None, &dir, &none).unwrap();
    assert_eq!(
        (c.origin.clone(), timeout(&c)),
        (ConfigOrigin::Builtin, secs(120))
    );
    // Environment overrides apply to the built-in defaults too.
    let c = Config::load_from(None, &dir, &|n: &str| {
        (n == TOOL_TIMEOUT_ENV).then(|| "7s".to_owned())
    })
    .unwrap();
    assert_eq!(
        (c.origin.clone(), timeout(&c)),
        (ConfigOrigin::Builtin, secs(7))
    );

    let default = dir.join(DEFAULT_FILE);
    std::fs::write(&default, "[defaults]\ntimeout = 3\nbogus = 1\n").unwrap();
    assert_eq!(
        Config::load_from(None, &dir, &none)
            .unwrap_err()
            .to_string(),
        format!(
            "{}:3: defaults.bogus: unknown key \"bogus\": expected one of timeout, idle_timeout, attempt_timeout, max_timeout, cancel_grace, retries, backoff, idempotent, cache_ttl, breaker, concurrency, approval, approval_timeout, on_stuck, loop, retry_on_tool_error, breaker_counts_tool_errors, max_input",
            default.display()
        )
    );
    std::fs::write(&default, "[defaults]\ntimeout = 3\n").unwrap();
    let c = Config::load_from(None, &dir, &none).unwrap();
    assert_eq!(
        (c.origin.clone(), timeout(&c)),
        (ConfigOrigin::File(default.clone()), secs(3))
    );

    let missing = dir.join("missing.toml");
    let e = Config::load_from(Some(&missing), &dir, &none).unwrap_err();
    assert_eq!(e.kind, ConfigErrorKind::Read);
    assert!(
        e.to_string().starts_with(&format!(
            "{}: cannot read the config file named by --config: ",
            missing.display()
        )),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Per-call hints (SPEC §3.2)

#[test]
fn hints_replace_deadlines_within_max_timeout() {
    let base = Policy {
        timeout: secs(120),
        idle_timeout: secs(30),
        attempt_timeout: secs(60),
        max_timeout: secs(600),
        ..Policy::default()
    };
    type Hints = (Option<u64>, Option<u64>);
    type Deadlines = (Duration, Duration, Duration);
    // (timeout_ms, idle_timeout_ms) → (timeout, idle, attempt)
    let cases: Vec<(Hints, Deadlines)> = vec![
        ((None, None), (secs(120), secs(30), secs(60))),
        ((Some(300_000), None), (secs(300), secs(30), secs(60))),
        ((Some(3_600_000), None), (secs(600), secs(30), secs(60))),
        // 0 asks for no cap: max_timeout still caps it.
        ((Some(0), None), (secs(600), secs(30), secs(60))),
        ((Some(10_000), None), (secs(10), secs(10), secs(10))),
        ((None, Some(5_000)), (secs(120), secs(5), secs(60))),
        ((None, Some(200_000)), (secs(120), secs(120), secs(60))),
        ((None, Some(0)), (secs(120), Duration::ZERO, secs(60))),
        ((Some(20_000), Some(90_000)), (secs(20), secs(20), secs(20))),
    ];
    let got: Vec<_> = cases
        .iter()
        .map(|(hint, _)| {
            let p = apply_hints(&base, hint.0, hint.1);
            (*hint, (p.timeout, p.idle_timeout, p.attempt_timeout))
        })
        .collect();
    assert_eq!(got, cases);

    // max_timeout = 0: no ceiling, and a hint of 0 means no cap at all.
    let open = Policy {
        max_timeout: Duration::ZERO,
        ..base
    };
    let p = apply_hints(&open, Some(0), None);
    assert_eq!(
        (p.timeout, p.idle_timeout, p.attempt_timeout),
        (Duration::ZERO, secs(30), secs(60))
    );
    let p = apply_hints(&open, Some(7_200_000), None);
    assert_eq!(p.timeout, secs(7200));
}

fn any_policy() -> impl Strategy<Value = Policy> {
    let d = || prop_oneof![Just(0u64), 1u64..10_000_000];
    (d(), d(), d(), d()).prop_map(|(timeout, idle, attempt, max)| Policy {
        timeout: ms(timeout),
        idle_timeout: ms(idle),
        attempt_timeout: ms(attempt),
        max_timeout: ms(max),
        ..Policy::default()
    })
}

proptest! {
    #[test]
    fn hints_never_break_the_invariants(
        policy in any_policy(),
        timeout_ms in proptest::option::of(prop_oneof![Just(0u64), 1u64..100_000_000]),
        idle_ms in proptest::option::of(prop_oneof![Just(0u64), 1u64..100_000_000]),
    ) {
        let p = apply_hints(&policy, timeout_ms, idle_ms);
        if !p.timeout.is_zero() {
            prop_assert!(p.idle_timeout <= p.timeout, "idle {:?} > total {:?}", p.idle_timeout, p.timeout);
            prop_assert!(p.attempt_timeout <= p.timeout, "attempt {:?} > total {:?}", p.attempt_timeout, p.timeout);
        }
        if timeout_ms.is_some() && !p.max_timeout.is_zero() {
            prop_assert!(!p.timeout.is_zero(), "a hinted call is uncapped despite max_timeout");
            prop_assert!(p.timeout <= p.max_timeout, "total {:?} > max {:?}", p.timeout, p.max_timeout);
        }
        if idle_ms.is_some() && !p.max_timeout.is_zero() {
            prop_assert!(p.idle_timeout <= p.max_timeout);
        }
    }
}
