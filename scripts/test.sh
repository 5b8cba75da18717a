#!/usr/bin/env bash
# Runs every test of toolwarden. Installs what the tests need first (scripts/setup-test-deps.sh):
# nothing is skipped for a missing prerequisite — a test whose prerequisite is missing fails.
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
cargo nextest run --workspace --locked --no-fail-fast
cargo test --workspace --doc --locked
