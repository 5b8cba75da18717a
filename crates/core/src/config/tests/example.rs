//! The example config of the docs loads, and every tool gets its policy.

use pretty_assertions::assert_eq;

use super::*;

// A full example: servers of both transports, `${VAR}`, a tool table, exec, gateway, http, store

#[test]
fn the_spec_example_loads_and_every_tool_gets_its_policy() {
    let config = parse_ok(EXAMPLE, &[("REMOTE_TOKEN", "s3cret")]);
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
