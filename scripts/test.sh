#!/usr/bin/env bash
# Runs every test of toolwarden. Installs what the tests need first (scripts/setup-test-deps.sh):
# nothing is skipped for a missing prerequisite — a test whose prerequisite is missing fails.
#
#   1. the Rust tests (nextest) and doc tests;
#   2. the model checks: every crate's module graph is one-way (scripts/check-module-cycles.py),
#      and loom explores the cancellation tree's races (scripts/loom.sh);
#   3. tests/e2e with pytest: the real binaries driven by the official Python MCP SDK, and the
#      official MCP conformance suite run directly and through the gateway;
#   4. tests/browser with node's test runner: the dashboard in Debian's Chromium (headless,
#      driven by playwright-core) against the real `toolwarden serve`, and the page's logic.
# Every step runs even when an earlier one failed; the exit code is non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -x scripts/setup-test-deps.sh ]; then
  bash scripts/setup-test-deps.sh
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "cargo-nextest is missing: installing it" >&2
  cargo install --locked cargo-nextest
fi

cargo build --workspace --all-targets --locked
# The README's commands build what they run on their own (`cargo run -p toolwarden`, and the
# example config's `cargo run --package toolwarden-testkit --bin tw-test-server`), with the
# features of that package alone; the test that follows the README finds them built.
cargo build --locked -p toolwarden
cargo build --locked --package toolwarden-testkit --bin tw-test-server

failed=()
cargo nextest run --workspace --locked --no-fail-fast || failed+=("cargo nextest")
cargo test --workspace --doc --locked || failed+=("doc tests")
python3 scripts/check-module-cycles.py crates/*/src crates/*/src/bin/*/ ||
  failed+=("module graphs")
bash scripts/loom.sh || failed+=("loom")

# The binaries the end-to-end tests drive: the ones just built.
target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
  .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export TOOLWARDEN_BIN="$target_dir/debug/toolwarden"
export TW_TEST_SERVER="$target_dir/debug/tw-test-server"
.venv/bin/python -m pytest tests/e2e -c tests/e2e/pytest.ini || failed+=("tests/e2e (pytest)")
# One file at a time: the frame-time measurement should not share the machine with other tests.
node_modules/.bin/node --test --test-concurrency=1 tests/browser/*.test.mjs || failed+=("tests/browser (node --test)")

if [ ${#failed[@]} -gt 0 ]; then
  echo "scripts/test.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "scripts/test.sh: every test passed"
