#!/usr/bin/env bash
# The reference server's floor against the path through toolwarden, with the load generator
# mcp-load (docs/PERFORMANCE.md, "The benchmark's floor"): `@modelcontextprotocol/server-everything`'s
# `echo` tool called by rmcp's client straight over stdio, and through `toolwarden serve`'s
# `/mcp` with the audit trail off and with the default store (the `[store]` section left out:
# SQLite, `before_execution`, in a temporary XDG_DATA_HOME). In each round every path runs once
# at concurrency 1 (direct, store off) and once at concurrency 16 (direct, store off, default
# store), the order rotating round by round, each run preceded by the machine's load average;
# with GATEWAY_BENCH=1 each round ends with one `gateway-bench 16000 everything` run. With RELAY=1
# each round also runs the path through `mcp-relay` (crates/bench/src/bin/mcp-relay.rs: the same
# chain of processes with nothing but the transport between them) at both concurrencies.
#
# usage: bash scripts/gateway-floor.sh [ROUNDS] [DURATION] [WARMUP]   (default 2 8s 2s)
# needs: the release build (cargo build --release -p toolwarden -p toolwarden-testkit
#   -p toolwarden-bench), mcp-load ($MCP_LOAD, else /var/tmp/mcp-load-target/release/mcp-load;
#   build it in ../shared/tools/mcp-load), scripts/setup-test-deps.sh's node_modules, jq.
# Prints one line per run and, per round, the three ratios (and the relay's two with RELAY=1);
# the raw JSON of every run (mcp-load's last line, with `load` and `round` added) goes to $OUT
# (default /tmp/gateway-floor-PID.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
duration="${2:-8s}"
warmup="${3:-2s}"
bin="${CARGO_TARGET_DIR:-target}/release"
load_gen="${MCP_LOAD:-/var/tmp/mcp-load-target/release/mcp-load}"
everything="$(realpath node_modules/.bin/mcp-server-everything 2>/dev/null || true)"
[ -x "$bin/toolwarden" ] || { echo "gateway-floor: no $bin/toolwarden: cargo build --release -p toolwarden -p toolwarden-testkit -p toolwarden-bench" >&2; exit 2; }
[ -x "$load_gen" ] || { echo "gateway-floor: no mcp-load at $load_gen (set MCP_LOAD)" >&2; exit 2; }
[ -n "$everything" ] || { echo "gateway-floor: no node_modules/.bin/mcp-server-everything: bash scripts/setup-test-deps.sh" >&2; exit 2; }
command -v jq >/dev/null || { echo "gateway-floor: jq is missing" >&2; exit 2; }
if [ "${GATEWAY_BENCH:-0}" = 1 ] && [ ! -x "$bin/gateway-bench" ]; then
  echo "gateway-floor: no $bin/gateway-bench" >&2; exit 2
fi
if [ "${RELAY:-0}" = 1 ] && [ ! -x "$bin/mcp-relay" ]; then
  echo "gateway-floor: no $bin/mcp-relay" >&2; exit 2
fi

work="$(mktemp -d)"
out="${OUT:-/tmp/gateway-floor-$$.jsonl}"
: > "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The same server and settings as gateway-bench's rows (crates/bench/src/everything.rs).
# shellcheck source=scripts/bench-config.sh
. scripts/bench-config.sh
config() { # $1: extra text (the [store] section or nothing)
  bench_config "[servers.everything]
command = \"$everything\"
args = [\"stdio\"]" "$1"
}
config $'\n[store]\nenabled = false' > "$work/off.toml"
config "" > "$work/default.toml"
mkdir -p "$work/data"

up() { # $1: the log of a gateway just started (its pid in $pid); sets url once it lists echo
  pids+=("$pid")
  local addr=""
  for _ in $(seq 600); do
    addr="$(sed -n 's|.*listening on http://\([0-9.:]*\).*|\1|p' "$1" | head -n1)"
    url="http://$addr/mcp"
    if [ -n "$addr" ] && "$load_gen" --url "$url" --list-tools 2>/dev/null | grep -qx echo; then
      return
    fi
    sleep 0.1
  done
  echo "gateway-floor: the gateway logging to $1 did not come up" >&2
  cat "$1" >&2
  exit 1
}

serve() { # $1: config; sets pid and url once the echo tool is listed
  local log
  log="$work/$(basename "$1").log"
  XDG_DATA_HOME="$work/data" RUST_LOG=warn "$bin/toolwarden" serve --config "$1" \
    --listen 127.0.0.1:0 >/dev/null 2>"$log" &
  pid=$!
  up "$log"
}
serve "$work/off.toml"
off_pid="$pid" off_url="$url"
serve "$work/default.toml"
def_pid="$pid" def_url="$url"
echo "node $(node --version); store-off serve pid $off_pid, default-store serve pid $def_pid"
grep -h "audit trail" "$work"/*.log
paths1=(direct off)
paths16=(direct off default)
if [ "${RELAY:-0}" = 1 ]; then
  "$bin/mcp-relay" -- node "$everything" stdio 2>"$work/relay.log" &
  pid=$!
  up "$work/relay.log"
  relay_pid="$pid" relay_url="$url"
  echo "mcp-relay pid $relay_pid"
  paths1+=(relay)
  paths16+=(relay)
fi

run() { # $1 round, $2 label, $3 concurrency
  local load args
  load="$(cut -d' ' -f1-3 /proc/loadavg)"
  args=(--tool echo --args '{"message":"hi"}' -d "$duration" --warmup "$warmup" -c "$3" --label "$2")
  case "$2" in
    direct) args+=(--stdio -- node "$everything" stdio) ;;
    off) args+=(--url "$off_url" --watch-pid "$off_pid") ;;
    default) args+=(--url "$def_url" --watch-pid "$def_pid") ;;
    relay) args+=(--url "$relay_url" --watch-pid "$relay_pid") ;;
  esac
  local json
  json="$("$load_gen" "${args[@]}" | tail -n1)"
  json="$(jq -c --arg load "$load" --argjson round "$1" '. + {load: $load, round: $round}' <<<"$json")"
  echo "$json" >> "$out"
  jq -r '"round \(.round) c=\(.concurrency) \(.label): \(.calls_per_s) calls/s, p50 \(.p50_us) µs, p99 \(.p99_us) µs, errors \(.errors); load \(.load); cpu " + ([.cpu[] | "\(.role) \(.comm) \(.cpu_pct)%"] | join(", ")) + "; machine \(.machine_cpu_pct)%"' <<<"$json"
}

rotate() { # $1 offset, rest: items; prints them rotated
  local k="$1"; shift
  local items=("$@") n="$#"
  for i in $(seq 0 $((n - 1))); do echo "${items[$(((i + k) % n))]}"; done
}

for r in $(seq 1 "$rounds"); do
  for label in $(rotate "$r" "${paths1[@]}"); do run "$r" "$label" 1; done
  for label in $(rotate "$r" "${paths16[@]}"); do run "$r" "$label" 16; done
  if [ "${GATEWAY_BENCH:-0}" = 1 ]; then
    echo "round $r gateway-bench 16000 everything; load $(cut -d' ' -f1-3 /proc/loadavg)"
    "$bin/gateway-bench" 16000 everything 2>/dev/null | grep -E '^\| (everything|path)'
  fi
  jq -rs --argjson r "$r" '
    map(select(.round == $r)) as $runs
    | def pick(l; c): ($runs[] | select(.label == l and .concurrency == c));
    "round \($r): c=1 p50 through ÷ direct \((pick("off"; 1).p50_us / pick("direct"; 1).p50_us * 100 | round / 100)) (target ≤ 3.0); "
    + "c=16 calls/s through ÷ direct \((pick("off"; 16).calls_per_s / pick("direct"; 16).calls_per_s * 100 | round / 100)) (target ≥ 0.30); "
    + "default store ÷ store off \((pick("default"; 16).calls_per_s / pick("off"; 16).calls_per_s * 100 | round / 100)) (target ≥ 0.85)"
    + (if [pick("relay"; 1)] | length > 0 then
        "; relay: c=1 p50 ÷ direct \((pick("relay"; 1).p50_us / pick("direct"; 1).p50_us * 100 | round / 100)), "
        + "c=16 calls/s ÷ direct \((pick("relay"; 16).calls_per_s / pick("direct"; 16).calls_per_s * 100 | round / 100))"
      else "" end)
  ' "$out"
done
echo "runs: $out"
