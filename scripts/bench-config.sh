# What the measuring scripts (gateway-instructions.sh, gateway-floor.sh, gateway-switches.sh)
# share, sourced by each. First the config they run `toolwarden serve` with: the server table
# given, tools unprefixed, a 30 s timeout, the loop detector off, then the extra text given (a
# `[store]` table, or nothing).
#
# usage: bench_config SERVER_TABLE [EXTRA]
bench_config() {
  cat <<TOML
$1

[gateway]
prefix = false

[defaults]
timeout = "30s"

[defaults.loop]
warn_after = 0
block_after = 0
${2:-}
TOML
}

# A scratch directory in $work for a measuring script, removed when the script exits, together
# with the gateway process whose pid the script puts in $gateway (killed and waited for).
bench_scratch() {
  work="$(mktemp -d)"
  gateway=""
  trap bench_cleanup EXIT
}
bench_cleanup() {
  if [ -n "$gateway" ]; then
    kill "$gateway" 2>/dev/null && wait "$gateway" 2>/dev/null
  fi
  rm -rf "$work"
}

# Waits, up to a minute, until the log file $1 of a gateway (toolwarden or mcp-relay) names the
# address it listens on and holds the text $2 (what says it is ready); sets $address
# (HOST:PORT). If it does not come, prints the log and fails.
bench_wait_up() {
  address=""
  for _ in $(seq 1 600); do
    address="$(sed -n 's#^\(toolwarden\|mcp-relay\): listening on http://##p' "$1")"
    [ -n "$address" ] && grep -q "$2" "$1" && return 0
    sleep 0.1
  done
  cat "$1" >&2
  return 1
}
