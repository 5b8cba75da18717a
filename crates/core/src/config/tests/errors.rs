//! Errors that name the file, the key and the line; entries for tools a server does not list; `[gateway] prefix`.

use pretty_assertions::assert_eq;

use super::*;

// Errors that name the file, the key and the line

#[test]
fn unknown_keys_are_errors() {
    use ConfigErrorKind::UnknownKey;
    check_error(
        "# toolwarden\nlisten = \"x\"\n",
        &[],
        UnknownKey,
        "toolwarden.toml:2: listen: unknown key \"listen\": expected one of interaction_ceiling, defaults, servers, tools, exec, gateway, http, store, redis, otel, auth, rules, hooks, quotas",
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
        "toolwarden.toml:3: exec.roots: unknown key \"roots\": expected one of enabled, allowed_roots, output_limit, shell, timeout, idle_timeout, attempt_timeout, max_timeout, cancel_grace, retries, backoff, idempotent, cache_ttl, breaker, concurrency, approval, approval_timeout, on_stuck, loop, retry_on_tool_error, breaker_counts_tool_errors, max_input, task, task_after, on_tool_change",
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
        "[otel]\nendpoint = \"127.0.0.1:4318\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: otel.endpoint: \"127.0.0.1:4318\" is not an http:// URL; write the collector's OTLP/HTTP address, e.g. \"http://127.0.0.1:4318\"",
    );
    check_error(
        "[otel]\nendpoint = \"https://collector:4318\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: otel.endpoint: \"https://collector:4318\": toolwarden sends spans over plain HTTP only; point it at a collector reached over http:// (a local OpenTelemetry Collector or agent that forwards over TLS)",
    );
    check_error(
        "[servers.everything]\ncommand = \"x\"\n\ntimeout = \"10x\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:4: servers.everything.timeout: invalid duration \"10x\": expected a number with a unit — ms, s, m, h or d, or spelled out: millisecond(s), sec(s) or second(s), min(s) or minute(s), hr(s) or hour(s), day(s) — (e.g. \"250ms\", \"30s\", \"2m\", \"1m30s\", \"1.5 hours\") or integer seconds",
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
        "[tools.x]\ntask = \"sometimes\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: tools.x.task: invalid value \"sometimes\": expected one of \"auto\", \"always\", \"never\"",
    );
    check_error(
        "[defaults]\ntask_after = \"soon\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: defaults.task_after: invalid duration \"soon\": expected a number with a unit — ms, s, m, h or d, or spelled out: millisecond(s), sec(s) or second(s), min(s) or minute(s), hr(s) or hour(s), day(s) — (e.g. \"250ms\", \"30s\", \"2m\", \"1m30s\", \"1.5 hours\") or integer seconds",
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

// Tools a server does not list

#[test]
fn a_tools_key_that_can_name_no_tool_is_a_warning() {
    let src = r#"
[servers.test]
command = "t"

[tools.sleep]
timeout = "5s"

[tools.test_sleep]
timeout = "5s"

[tools.exec]
timeout = "5s"

[tools.calc]
timeout = "5s"
"#;
    let config = parse_ok(src, &[]);
    let found: Vec<String> = config
        .unattached_tool_warnings(&["calc"])
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "toolwarden.toml:4: tools.sleep: applies to no tool, so these keys are ignored: MCP tools are named SERVER__TOOL, the shell tool exec; did you mean [tools.test__sleep]?",
            "toolwarden.toml:7: tools.test_sleep: applies to no tool, so these keys are ignored: MCP tools are named SERVER__TOOL, the shell tool exec; did you mean [tools.test__sleep]?",
        ]
    );
    // Several servers: the form is named; none: said so; unprefixed: nothing (the single
    // server's own names, checked once its tools are known).
    let two = parse_ok(
        "[servers.a]\ncommand = \"a\"\n[servers.b]\ncommand = \"b\"\n[tools.x]\nretries = 1\n",
        &[],
    );
    assert_eq!(
        two.unattached_tool_warnings(&[])[0].message,
        "applies to no tool, so these keys are ignored: MCP tools are named SERVER__TOOL, the shell tool exec; write [tools.\"SERVER__x\"] with one of the servers a, b"
    );
    let none = parse_ok("[tools.x]\nretries = 1\n", &[]);
    assert!(
        none.unattached_tool_warnings(&[])[0]
            .message
            .ends_with("no servers are configured")
    );
    let unprefixed = parse_ok(
        "[gateway]\nprefix = false\n[servers.a]\ncommand = \"a\"\n[tools.x]\nretries = 1\n",
        &[],
    );
    assert!(unprefixed.unattached_tool_warnings(&[]).is_empty());
}

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

#[test]
fn a_key_whose_feature_is_not_built_yet_is_a_warning() {
    check_warnings(
        r#"
[servers.db]
command = "db-server"
env_prompt = ["DB_PASSWORD"]
"#,
        &[],
        &[
            "toolwarden.toml:3: servers.db.env_prompt: env_prompt is not acted on yet: server \"db\" starts without asking anyone for DB_PASSWORD; give the values in env (e.g. env = { VAR = \"${VAR}\" })",
        ],
    );
}

#[test]
fn token_entries_and_oauth_are_checked_where_they_are_written() {
    use ConfigErrorKind::{InvalidValue, UnknownKey};
    let sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    check_error(
        "[[auth.tokens]]\nprincipal = \"ci\"\ntoken_env = \"T\"\nscopes = [\"call\", \"aprove\"]\n",
        &[],
        InvalidValue,
        "toolwarden.toml:4: auth.tokens[0].scopes[1]: unknown scope \"aprove\": expected call, read, abort, approve, admin; did you mean \"approve\"?",
    );
    check_error(
        &format!(
            "[[auth.tokens]]\nprincipal = \"ci\"\ntoken_env = \"T\"\ntoken_sha256 = \"{sha}\"\n"
        ),
        &[],
        InvalidValue,
        "toolwarden.toml:3: auth.tokens[0].token_env: set one of token_sha256 and token_env, not both",
    );
    check_error(
        "[[auth.tokens]]\nprincipal = \"ci\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:1: auth.tokens[0]: a token entry needs one of token_sha256 (the hex SHA-256 of the token: `printf %s TOKEN | sha256sum`) and token_env (the variable that holds the token)",
    );
    check_error(
        "[[auth.tokens]]\ntoken_env = \"T\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:1: auth.tokens[0]: a token entry needs principal = \"NAME\": the name its calls are recorded under",
    );
    check_error(
        "[[auth.tokens]]\nprincipal = \"local\"\ntoken_env = \"T\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:2: auth.tokens[0].principal: \"local\" is reserved (\"local\" is loopback without authentication, \"default\" is the token of [http] token_env); choose another name",
    );
    check_error(
        "[[auth.tokens]]\nprincipal = \"ci\"\ntoken_sha256 = \"abc\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:3: auth.tokens[0].token_sha256: expected 64 hex digits (the SHA-256 of the token: `printf %s TOKEN | sha256sum`), got 3 characters",
    );
    check_error(
        &format!(
            "[[auth.tokens]]\nprincipal = \"a\"\ntoken_sha256 = \"{sha}\"\n\n[[auth.tokens]]\nprincipal = \"b\"\ntoken_sha256 = \"{}\"\n",
            sha.to_uppercase()
        ),
        &[],
        InvalidValue,
        "toolwarden.toml:7: auth.tokens[1].token_sha256: the same token as auth.tokens[0]: each token names one principal",
    );
    check_error(
        "[[auth.tokens]]\nprincipal = \"ci\"\ntoken_env = \"T\"\ntoken = \"s3cret\"\n",
        &[],
        UnknownKey,
        "toolwarden.toml:4: auth.tokens[0].token: unknown key \"token\": did you mean \"token_sha256\"?",
    );
    check_error(
        "[auth.oauth]\nissuer = \"https://login.example.com\"\naudience = \"tw\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:1: auth.oauth: [auth.oauth] needs jwks_url (where the issuer publishes its signing keys) or jwks_file",
    );
    check_error(
        "[auth.oauth]\nissuer = \"https://login.example.com\"\njwks_url = \"https://login.example.com/keys\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:1: auth.oauth.audience: [auth.oauth] needs audience: what tokens for this server carry in aud (often this server's URL)",
    );
    check_error(
        "[auth.oauth]\nissuer = \"i\"\naudience = \"a\"\njwks_url = \"login.example.com/keys\"\n",
        &[],
        InvalidValue,
        "toolwarden.toml:4: auth.oauth.jwks_url: \"login.example.com/keys\" is not an http:// or https:// URL",
    );
}

#[test]
fn rules_on_exec_under_another_shell_are_warned_about() {
    let rule = "[[rules]]\ntools = [\"exec\"]\nwhen = 'args.commands.all(c, c.name == \"ls\")'\ndecision = \"allow\"\n";
    check_warnings(
        &format!("[exec]\nenabled = true\nshell = \"/usr/bin/zsh\"\n\n{rule}"),
        &[],
        &[
            "toolwarden.toml:3: exec.shell: rules judge exec lines as sh and bash read them, but commands run with \"/usr/bin/zsh\", which may read a line otherwise: a rule's args.commands may not be what runs",
        ],
    );
    check_warnings(
        &format!("[exec]\nenabled = true\nshell = \"/bin/bash\"\n\n{rule}"),
        &[],
        &[],
    );
}
