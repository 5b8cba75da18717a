//! The environment: `${VAR}` in server definitions, `TOOLWARDEN_TOOL_TIMEOUT`, and where the config file is found.

use pretty_assertions::assert_eq;

use super::*;

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
        EXAMPLE,
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
    check_error(
        "",
        &[("TOOLWARDEN_TOOL_TIMEOUT", "-3s")],
        ConfigErrorKind::Environment,
        "environment: TOOLWARDEN_TOOL_TIMEOUT: negative duration -3s: a duration cannot be negative (read as 0 it could turn a limit off); write a positive duration such as \"30s\"",
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
        "environment: TOOLWARDEN_TOOL_TIMEOUT: invalid duration \"soon\": expected a number with a unit — ms, s, m, h or d, or spelled out: millisecond(s), sec(s) or second(s), min(s) or minute(s), hr(s) or hour(s), day(s) — (e.g. \"250ms\", \"30s\", \"2m\", \"1m30s\", \"1.5 hours\") or integer seconds",
    );
}

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
            "{}:3: defaults.bogus: unknown key \"bogus\": expected one of timeout, idle_timeout, attempt_timeout, max_timeout, cancel_grace, retries, backoff, idempotent, cache_ttl, breaker, concurrency, approval, approval_timeout, on_stuck, loop, retry_on_tool_error, breaker_counts_tool_errors, max_input, task, task_after, on_tool_change",
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
