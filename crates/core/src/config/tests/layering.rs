//! Layering (later layers win key by key) and MCP tool annotations (they fill only what no layer configured).

use pretty_assertions::assert_eq;

use super::*;

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
task_after = "30s"

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
task = "always"

[exec]
cancel_grace = "5s"

[tools.exec]
cache_ttl = "1m"

[tools.calc]
idempotent = true
task = "never"
task_after = "2m"

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
        task_after: secs(30),
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
                    task: TaskMode::Always,
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
                    task: TaskMode::Never,
                    task_after: secs(120),
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
                task: TaskMode::Auto,
                task_after: secs(10),
                on_tool_change: toolwarden_protocol::OnToolChange::Warn,
            },
        )],
    );
}

// Annotations (docs/CONFIG.md, "Layering")

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
