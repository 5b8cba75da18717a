//! Config errors: every command exits 2 with a message naming the file, the key and the line.

use crate::util::Dir;

#[tokio::test]
async fn every_command_names_file_key_and_line() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        "[defaults]\ntimeout = \"30s\"\nidle_timeout = \"10x\"\n",
    );
    for args in [
        &["serve"][..],
        &["mcp"],
        &["call", "exec"],
        &["check"],
        &["tools"],
        &["turns"],
        &["abort", "t_1"],
    ] {
        let out = dir.command(args).run().await;
        out.expect_code(2);
        assert!(
            out.stderr
                .contains("toolwarden.toml:3: defaults.idle_timeout: invalid duration \"10x\""),
            "{args:?}: {}",
            out.stderr
        );
    }
}

#[tokio::test]
async fn config_is_found_by_flag_before_or_after_the_command_then_by_variable() {
    let dir = Dir::new();
    dir.create("a.toml", "[tools.x]\ntimeout = 1\nnope = 2\n");
    dir.create("b.toml", "[exec]\nbogus = true\n");
    let flag_after = dir
        .command(&["check", "--offline", "--config", "a.toml"])
        .run()
        .await;
    flag_after.expect_code(2);
    assert!(
        flag_after.stderr.contains("a.toml:3: tools.x.nope"),
        "{}",
        flag_after.stderr
    );
    let flag_before = dir
        .command(&["--config", "a.toml", "check", "--offline"])
        .run()
        .await;
    flag_before.expect_code(2);
    assert!(
        flag_before.stderr.contains("a.toml:3: tools.x.nope"),
        "{}",
        flag_before.stderr
    );
    let by_env = dir
        .command(&["check", "--offline"])
        .env("TOOLWARDEN_CONFIG", "b.toml")
        .run()
        .await;
    by_env.expect_code(2);
    assert!(
        by_env.stderr.contains("b.toml:2: exec.bogus"),
        "{}",
        by_env.stderr
    );
}

#[tokio::test]
async fn without_a_file_the_defaults_apply() {
    let out = Dir::new().command(&["check", "--offline"]).run().await;
    out.expect_code(0);
    assert!(out.stdout.contains("built-in defaults"), "{}", out.stdout);
    assert!(out.stdout.contains("no tools"), "{}", out.stdout);
}

#[tokio::test]
async fn a_missing_file_named_by_the_flag_is_an_error() {
    let out = Dir::new()
        .command(&["call", "exec", "--config", "missing.toml"])
        .run()
        .await;
    out.expect_code(2);
    assert!(
        out.stderr
            .contains("missing.toml: cannot read the config file named by --config"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn an_exec_root_that_does_not_exist_is_a_config_error() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        "[exec]\nenabled = true\nallowed_roots = [\"nowhere\"]\n",
    );
    let out = dir.command(&["call", "exec"]).run().await;
    out.expect_code(2);
    assert!(
        out.stderr.contains(
            "toolwarden.toml:3: exec.allowed_roots: [exec] allowed_roots entry \"nowhere\""
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn bad_call_arguments_are_usage_errors() {
    let dir = Dir::new();
    dir.create("toolwarden.toml", "[exec]\nenabled = true\n");
    for (args, says) in [
        (
            &["call", "exec", "--input", "{nope"][..],
            "--input: not valid JSON",
        ),
        (
            &["call", "exec", "--input", "@missing.json"],
            "--input @missing.json: cannot read",
        ),
        (
            &["call", "exec", "--timeout", "soon"],
            "--timeout: invalid duration \"soon\"",
        ),
        (
            &["call", "exec", "--idle-timeout=-1s"],
            "--idle-timeout: \"-1s\" is negative",
        ),
    ] {
        let out = dir.command(args).run().await;
        out.expect_code(2);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
}

#[tokio::test]
async fn warnings_are_printed_on_start() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        "[exec]\nenabled = true\ntimeout = \"10s\"\nidle_timeout = \"1m\"\n",
    );
    let out = dir
        .command(&["call", "exec", "--input", r#"{"command": "true"}"#])
        .run()
        .await;
    out.expect_code(0);
    assert!(
        out.stderr
            .contains("warning: toolwarden.toml:4: exec.idle_timeout: idle_timeout 1m is longer than timeout 10s"),
        "{}",
        out.stderr
    );
}
