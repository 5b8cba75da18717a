//! Numbers as written versus as used: negative durations are errors, other negatives zero with a warning; idle and attempt deadlines above the total are clamped; interactions are capped by the ceiling.

use pretty_assertions::assert_eq;

use super::*;

// Negative durations (errors: read as 0, most would turn a limit off) and other negative
// numbers (treated as 0, with a warning)

#[test]
fn a_negative_duration_is_an_error_naming_key_and_line() {
    let negative = |at: &str, d: &str| {
        format!(
            "toolwarden.toml:{at}: negative duration -{d}: a duration cannot be negative (read as 0 it could turn a limit off); write a positive duration such as \"30s\""
        )
    };
    for (src, at, d) in [
        ("interaction_ceiling = -1\n", "1: interaction_ceiling", "1s"),
        (
            "[defaults]\ntimeout = \"-5s\"\n",
            "2: defaults.timeout",
            "5s",
        ),
        (
            "[defaults]\nbreaker = { window = -3 }\n",
            "2: defaults.breaker.window",
            "3s",
        ),
        (
            "[servers.s]\ncommand = \"s\"\nstartup_timeout = -20\n",
            "3: servers.s.startup_timeout",
            "20s",
        ),
        (
            "[tools.x]\ncache_ttl = \"-1m\"\n",
            "2: tools.x.cache_ttl",
            "1m",
        ),
        ("[store]\nretain = \"-2h\"\n", "2: store.retain", "2h"),
        (
            "[gateway]\nrequest_timeout = \"-2s\"\n",
            "2: gateway.request_timeout",
            "2s",
        ),
    ] {
        check_error(src, &[], ConfigErrorKind::InvalidValue, &negative(at, d));
    }
    check_error(
        "[gateway]\nrequest_timeout = 0\n",
        &[],
        ConfigErrorKind::InvalidValue,
        "toolwarden.toml:2: gateway.request_timeout: request_timeout must be positive: a forwarded request that a server never answers would wait forever; write e.g. \"30s\"",
    );
    // The first in file order is reported.
    check_error(
        "[defaults]\nidle_timeout = \"-1s\"\ntimeout = \"-5s\"\n",
        &[],
        ConfigErrorKind::InvalidValue,
        &negative("2: defaults.idle_timeout", "1s"),
    );
}

#[test]
fn negative_numbers_are_zero_with_a_warning_naming_key_and_line() {
    let src = r#"
interaction_ceiling = 0

[defaults]
timeout = "0s"
retries = -1
breaker = { failures = -2, window = 0 }
loop = { warn_after = -1 }
max_input = -10
backoff = { multiplier = -1.5 }

[servers.s]
command = "s"
startup_timeout = 0
cache_ttl = "0s"

[exec]
output_limit = -1

[store]
max_payload = "-1KiB"
"#;
    check_warnings(
        src,
        &[],
        &[
            "toolwarden.toml:1: interaction_ceiling: interaction_ceiling is 0s: no approval or confirm can be asked, so every call that needs one is denied at once; write e.g. \"15m\"",
            "toolwarden.toml:5: defaults.retries: negative value -1 is treated as 0; write 0 or a positive number",
            "toolwarden.toml:6: defaults.breaker.failures: negative value -2 is treated as 0; write 0 or a positive number",
            "toolwarden.toml:7: defaults.loop.warn_after: negative value -1 is treated as 0; write 0 or a positive number",
            "toolwarden.toml:8: defaults.max_input: negative size -10 bytes is treated as 0; write 0 or a positive size such as \"1MiB\"",
            "toolwarden.toml:9: defaults.backoff.multiplier: negative value -1.5 is treated as 0; write 0 or a positive number such as 2.0",
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

// Clamps (idle and attempt timeouts at most the total, approval deadlines at most the ceiling)

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

#[test]
fn a_task_after_past_the_timeout_is_a_warning() {
    check_warnings(
        "[defaults]\ntimeout = \"30s\"\n\n[tools.x]\ntask_after = \"1m\"\n\n[tools.y]\ntask_after = \"5s\"\n",
        &[],
        &[
            "toolwarden.toml:5: tools.x.task_after: task_after 1m is not shorter than timeout 30s (from [defaults]): with task = \"auto\", calls end before they could become tasks",
        ],
    );
}
