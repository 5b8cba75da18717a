//! The README's first screen, as a newcomer runs it on a fresh checkout: the `serve` command of
//! its first code block with the shipped example config, and — the moment `serve` says it
//! listens — the `curl` of the next block. The first curl works on the first try, although the
//! example's MCP server is still being compiled by cargo (the call waits for it). The build
//! directory is empty, as on a fresh clone (`CARGO_TARGET_DIR` in the test's own directory), so
//! this test compiles toolwarden and the test server from nothing: it takes minutes, and runs
//! alone (`.config/nextest.toml`). The only change to what is written: an ephemeral port
//! instead of 7420.

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
    let target = dir.path().join("target");
    let target = target.to_str().unwrap();
    let mut argv: Vec<&str> = serve.split_whitespace().skip(1).collect();
    argv.extend(["--listen", "127.0.0.1:0"]);
    let mut server = dir
        .program("cargo", &argv)
        .current_dir(&repo())
        .env("CARGO_TARGET_DIR", target)
        .spawn();
    // cargo builds toolwarden from nothing first (about two minutes on two cores).
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
