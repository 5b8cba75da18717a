#!/usr/bin/env bash
# Model-checks the lazy cancellation token's fence pairing (crates/core/src/cancel.rs) with loom:
# every interleaving and memory ordering of a cancel racing the first wait on a scope.
#
# `--cfg loom` goes to every crate of the build, so it builds in a target directory of its own
# (inside the usual one) and runs only the loom tests of toolwarden-core.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export CARGO_TARGET_DIR="$base/loom"
export RUSTFLAGS="--cfg loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
cargo test --locked -p toolwarden-core --lib loom_tests -- --test-threads=1
