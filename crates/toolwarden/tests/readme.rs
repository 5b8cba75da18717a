//! The README's first screen, as a newcomer runs it on a checkout: the `serve` command of its
//! first code block with the shipped example config, and — the moment `serve` says it listens —
//! the `curl` of the next block. The first curl works on the first try, although the example's
//! MCP server is still being compiled by cargo (the call waits for it). The only change to what
//! is written: an ephemeral port instead of 7420.
//!
//! The build directory (`CARGO_TARGET_DIR`) is one of the test's own, kept between runs outside
//! the checkout (`/var/tmp/toolwarden-readme-target`, or `$TOOLWARDEN_README_TARGET`), with the
//! example's server deleted from it before each run: so the curl always finds that server
//! unbuilt, while toolwarden and the dependencies are rebuilt only where they changed. On a
//! machine that never ran it, cargo compiles everything first, as on a fresh clone (minutes on
//! two cores): it runs alone (`.config/nextest.toml`). A fresh clone's first run is tried by
//! hand before a release, not on every CI run, whose time it would double.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::util::{Dir, wait_for_process};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `sh` code blocks of the README, each as its lines (comments cut, continuations joined).
fn sh_blocks() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    let mut pending = String::new();
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), text) => {
                let text = text.split("   #").next().unwrap_or(text).trim_end();
                match text.strip_suffix('\\') {
                    Some(head) => pending.push_str(head),
                    None => {
                        pending.push_str(text);
                        block.push(std::mem::take(&mut pending));
                    }
                }
            }
            (None, _) => {}
        }
    }
    blocks
}

/// Deletes the example's MCP server from a build directory — its binaries and cargo's record of
/// having built it (the fingerprint holding `bin-tw-test-server`) — so that cargo compiles it
/// again when it is first called.
fn forget_the_example_server(target: &std::path::Path) {
    let debug = target.join("debug");
    let entries = |dir: &str| {
        std::fs::read_dir(debug.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
    };
    let _ = std::fs::remove_file(debug.join("tw-test-server"));
    for path in entries("deps") {
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("tw_test_server-"))
        {
            let _ = std::fs::remove_file(path);
        }
    }
    for path in entries(".fingerprint") {
        if path.join("bin-tw-test-server").exists() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

#[tokio::test]
async fn the_first_curl_of_the_readme_works_on_the_first_try() {
    let blocks = sh_blocks();
    let serve = &blocks[0][0];
    assert_eq!(
        serve, "cargo run -p toolwarden -- serve --config examples/toolwarden.toml",
        "the README's first command"
    );
    let curl = blocks[1]
        .iter()
        .find(|l| l.starts_with("curl "))
        .expect("a curl in the README's second block")
        .clone();

    let dir = Dir::new();
    let target = std::env::var("TOOLWARDEN_README_TARGET")
        .unwrap_or_else(|_| "/var/tmp/toolwarden-readme-target".to_owned());
    forget_the_example_server(std::path::Path::new(&target));
    let target = target.as_str();
    let mut argv: Vec<&str> = serve.split_whitespace().skip(1).collect();
    argv.extend(["--listen", "127.0.0.1:0"]);
    let mut server = dir
        .program("cargo", &argv)
        .current_dir(&repo())
        .env("CARGO_TARGET_DIR", target)
        .spawn();
    // cargo builds toolwarden first (from nothing on a new machine: minutes on two cores).
    let listening = server
        .wait_stderr("listening on http://", Duration::from_secs(900))
        .await;
    let url = &listening[listening.find("http://").unwrap()..];
    let address = url.trim().trim_start_matches("http://");

    // The example's MCP server is not built yet: cargo compiles it now, and the call waits.
    assert!(
        !std::path::Path::new(target)
            .join("debug/tw-test-server")
            .exists()
    );
    let line = curl.replace("localhost:7420", address);
    let out = dir
        .program("sh", &["-c", &line])
        .run_within(Duration::from_secs(900))
        .await;
    out.expect_code(0);
    let answer: Value = out.json();
    let result = &answer["results"][0];
    assert_eq!(result["toolwarden"]["status"], "ok", "{answer:#}");
    assert_eq!(result["is_error"], false);

    // The example's server (a `cargo run` of tw-test-server) runs below `serve`; both are gone
    // after SIGTERM.
    let children = wait_for_process(server.pid(), "tw-test-server", Duration::from_secs(30)).await;
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(30)).await.expect_code(0);
    for pid in children {
        assert!(
            !toolwarden_testkit::pid_alive(pid),
            "the example's MCP server (pid {pid}) outlived serve"
        );
    }
}
