#!/usr/bin/env bash
# Counts the context switches a gateway process makes per `tools/call` at concurrency 1: all its
# threads' voluntary and involuntary switches (/proc/PID/task/*/status) over CALLS calls of one
# keep-alive handshake client (scripts/mcp_drive.py), `tw-test-server` behind it
# (docs/PERFORMANCE.md, "A relay that does nothing"). A count, so a noisy machine moves it less
# than it moves a time. A thread that ends during the calls takes its count with it.
#
# usage: bash scripts/gateway-switches.sh toolwarden|relay [CALLS]   (default 3000)
#   toolwarden: `toolwarden serve` with the store off; relay: `mcp-relay`.
# needs: the release build (cargo build --release -p toolwarden -p toolwarden-testkit
#   -p toolwarden-bench), python3.
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-}"
calls="${2:-3000}"
bin="${CARGO_TARGET_DIR:-target}/release"
for exe in toolwarden tw-test-server mcp-relay; do
  [ -x "$bin/$exe" ] || { echo "gateway-switches: no $bin/$exe: cargo build --release -p toolwarden -p toolwarden-testkit -p toolwarden-bench" >&2; exit 2; }
done
# shellcheck source=scripts/bench-config.sh
. scripts/bench-config.sh
bench_scratch
server="$(realpath "$bin/tw-test-server")"
case "$which" in
  relay)
    "$bin/mcp-relay" -- "$server" 2>"$work/log" &
    gateway=$!
    ready='mcp-relay: listening on'
    ;;
  toolwarden)
    bench_config "[servers.echo]
command = \"$server\"" $'\n[store]\nenabled = false' > "$work/toolwarden.toml"
    RUST_LOG=warn "$bin/toolwarden" serve --config "$work/toolwarden.toml" \
      --listen 127.0.0.1:0 2>"$work/log" &
    gateway=$!
    ready='server "echo" is up'
    ;;
  *) echo "usage: bash scripts/gateway-switches.sh toolwarden|relay [CALLS]" >&2; exit 2 ;;
esac
bench_wait_up "$work/log" "$ready" || exit 1

switches() { # the process's switches so far, all its live threads
  cat /proc/"$gateway"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }' || true
}
coproc DRIVE { python3 scripts/mcp_drive.py "$address" handshake "$calls"; }
in=${DRIVE[0]} to=${DRIVE[1]}
read -r line <&"$in"
[ "$line" = ready ] || { echo "gateway-switches: the client failed" >&2; exit 1; }
before="$(switches)"
echo go >&"$to"
read -r line <&"$in"
[ "$line" = done ] || { echo "gateway-switches: the client failed" >&2; exit 1; }
after="$(switches)"
awk -v d="$((after - before))" -v n="$calls" -v w="$which" -v t="$(ls /proc/"$gateway"/task | wc -l)" \
  'BEGIN { printf "%-10s %.2f context switches per call (%d threads)\n", w, d / n, t }'
