# The config the measuring scripts (gateway-instructions.sh, gateway-floor.sh) run
# `toolwarden serve` with, sourced by both: the server table given, tools unprefixed, a 30 s
# timeout, the loop detector off, then the extra text given (a `[store]` table, or nothing).
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
