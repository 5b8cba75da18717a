#!/usr/bin/env bash
# Counts the instructions `toolwarden serve` spends per `tools/call` at /mcp, for a handshake
# client and for a stateless (2026-07-28) client, under valgrind's callgrind: exact counts,
# untouched by the noise of a shared machine (docs/PERFORMANCE.md, "Stateless").
#
# usage: bash scripts/gateway-instructions.sh [CALLS]   (default 2000 calls per block)
#        STORE=default bash scripts/gateway-instructions.sh [CALLS]
#   STORE=default records the calls in the default audit trail (SQLite, `before_execution`, in a
#   scratch file) instead of none: the difference is what the trail costs a call.
#        RELAY=1 bash scripts/gateway-instructions.sh [CALLS]
#   counts `mcp-relay` (crates/bench/src/bin/mcp-relay.rs: the same server behind nothing but
#   the transport) instead of toolwarden, with handshake blocks only (it keeps no session, so a
#   stateless call is the same to it): the least a gateway of this shape can spend a call.
# needs: a release build (cargo build --release -p toolwarden -p toolwarden-testkit, and
# -p toolwarden-bench for RELAY=1), valgrind, python3. Blocks alternate handshake, stateless,
# handshake, stateless (with RELAY=1: four handshake blocks).
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-2000}"
bin="${CARGO_TARGET_DIR:-target}/release"
for tool in valgrind callgrind_control callgrind_annotate python3; do
  command -v "$tool" >/dev/null || { echo "gateway-instructions: $tool is missing (apt-get install valgrind python3)" >&2; exit 2; }
done
for exe in toolwarden tw-test-server; do
  [ -x "$bin/$exe" ] || { echo "gateway-instructions: no $bin/$exe: cargo build --release -p toolwarden -p toolwarden-testkit" >&2; exit 2; }
done
relay="${RELAY:-0}"
if [ "$relay" = 1 ] && [ ! -x "$bin/mcp-relay" ]; then
  echo "gateway-instructions: no $bin/mcp-relay: cargo build --release -p toolwarden-bench" >&2; exit 2
fi
if [ "$relay" = 1 ] && [ -n "${STORE:-}" ]; then
  echo "gateway-instructions: STORE and RELAY=1 do not go together (the relay records nothing)" >&2; exit 2
fi
# shellcheck source=scripts/bench-config.sh
. scripts/bench-config.sh
bench_scratch
case "${STORE:-off}" in
  off) store=$'\n[store]\nenabled = false' ;;
  default) store=$'\n[store]\npath = "'"$work/trail.db"'"' ;;
  *) echo "gateway-instructions: STORE is off or default, not ${STORE}" >&2; exit 2 ;;
esac
bench_config "[servers.echo]
command = \"$(realpath "$bin/tw-test-server")\"" "$store" > "$work/toolwarden.toml"
if [ "$relay" = 1 ]; then
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out.%p" \
    "$bin/mcp-relay" -- "$(realpath "$bin/tw-test-server")" >"$work/serve.log" 2>&1 &
  gateway=$!
  ready='mcp-relay: listening on http://'
else
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out.%p" \
    "$bin/toolwarden" serve --config "$work/toolwarden.toml" --listen 127.0.0.1:0 \
    >"$work/serve.log" 2>&1 &
  gateway=$!
  ready='server "echo" is up'
fi
bench_wait_up "$work/serve.log" "$ready" || exit 1

block() { # KIND TAG
  coproc DRIVE { python3 scripts/mcp_drive.py "$address" "$1" "$calls"; }
  # bash forgets a coprocess's variables once it has exited: keep them.
  local pid=$DRIVE_PID in=${DRIVE[0]} to=${DRIVE[1]} line
  read -r line <&"$in"
  [ "$line" = ready ] || { echo "gateway-instructions: the $1 client failed" >&2; exit 1; }
  callgrind_control -z "$gateway" >/dev/null 2>&1
  echo go >&"$to"
  read -r line <&"$in"
  [ "$line" = done ] || { echo "gateway-instructions: the $1 client failed" >&2; exit 1; }
  callgrind_control -d "$2" "$gateway" >/dev/null 2>&1
  wait "$pid" 2>/dev/null || true
  local out
  out="$(grep -l "^desc: Trigger: dump $2\$" "$work"/callgrind.out.*)"
  local total sha
  total="$(sed -n 's/^summary: //p' "$out")"
  sha="$(callgrind_annotate --auto=no --threshold=100 "$out" 2>/dev/null \
    | awk '/compress256/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')"
  printf '%-10s %8d instructions per call (SHA-256 compression in software: %d)\n' \
    "$1" $((total / calls)) $((sha / calls))
}
for round in 1 2; do
  block handshake "h$round"
  if [ "$relay" = 1 ]; then block handshake "r$round"; else block stateless "s$round"; fi
done
