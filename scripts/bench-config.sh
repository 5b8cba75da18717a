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
