#!/usr/bin/env bash
# Three toolwarden replicas on this machine, sharing a local Redis and PostgreSQL: the setup of
# deploy/compose.yaml without containers (docs/SCALE-OUT.md, "Deploying three replicas").
#
#   deploy/local.sh up       start the replicas (each waits until /healthz says ok)
#   deploy/local.sh check    show that they act as one (health, a turn seen and aborted anywhere)
#   deploy/local.sh status   each replica's /healthz
#   deploy/local.sh down     stop them (SIGTERM; each finishes its calls' records and exits)
#
# Settings, from the environment:
#   TOOLWARDEN_BIN  the binary (default: `toolwarden` on PATH, else the workspace's build)
#   REDIS_URL       default redis://127.0.0.1:6379/0
#   POSTGRES_URL    default postgres://postgres@127.0.0.1:5432/toolwarden (created if missing)
#   PORTS           the three replicas' ports, default "7421 7422 7423"
#   REDIS_PREFIX    the replicas' key prefix, default "toolwarden-local:"
#   RUN_DIR         their configs, logs and pids, default ${TMPDIR:-/tmp}/toolwarden-local
#   EXTRA_CONFIG    a TOML file appended to every replica's configuration (more servers, tools'
#                   policies), default none
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
POSTGRES_URL=${POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/toolwarden}
read -r -a ports <<<"${PORTS:-7421 7422 7423}"
REDIS_PREFIX=${REDIS_PREFIX:-toolwarden-local:}
RUN_DIR=${RUN_DIR:-${TMPDIR:-/tmp}/toolwarden-local}

die() { echo "local.sh: $*" >&2; exit 1; }
# A value as sed's replacement text.
esc() { printf '%s' "$1" | sed 's/[&|\\]/\\&/g'; }

[ "${#ports[@]}" -eq 3 ] || die "PORTS must name three ports, not '${ports[*]}'"

binary() {
  if [ -n "${TOOLWARDEN_BIN:-}" ]; then echo "$TOOLWARDEN_BIN"; return; fi
  if command -v toolwarden >/dev/null; then command -v toolwarden; return; fi
  local target=${CARGO_TARGET_DIR:-$here/../target}
  for b in "$target/release/toolwarden" "$target/debug/toolwarden"; do
    if [ -x "$b" ]; then echo "$b"; return; fi
  done
  die "no toolwarden binary: build it (cargo build --release -p toolwarden) or set TOOLWARDEN_BIN"
}

# `curl` of a replica's path; prints the body, then the status code on a line of its own.
get() { curl -sS -w '\n%{http_code}\n' "http://127.0.0.1:$1$2"; }
post() { curl -sS -w '\n%{http_code}\n' -X POST -H 'content-type: application/json' \
  ${3:+-d "$3"} "http://127.0.0.1:$1$2"; }

# Redis and PostgreSQL must answer before any replica starts (a replica would start degraded).
check_services() {
  if command -v redis-cli >/dev/null; then
    redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 || die "Redis does not answer at $REDIS_URL"
  fi
  if command -v psql >/dev/null && ! psql "$POSTGRES_URL" -qAtc 'select 1' >/dev/null 2>&1; then
    # A missing database is made (the URL's last path segment, when it has no query).
    case $POSTGRES_URL in *\?*) die "PostgreSQL does not answer at $POSTGRES_URL" ;; esac
    local db=${POSTGRES_URL##*/} server=${POSTGRES_URL%/*}
    psql "$server/postgres" -qAtc "CREATE DATABASE \"$db\"" >/dev/null \
      || die "PostgreSQL does not answer at $POSTGRES_URL, and $db could not be created"
    echo "created database $db"
  fi
}

up() {
  local bin; bin=$(binary)
  check_services
  mkdir -p "$RUN_DIR"
  local i
  for i in 1 2 3; do
    local dir=$RUN_DIR/replica-$i port=${ports[$((i - 1))]}
    if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      die "replica-$i runs already (pid $(cat "$dir/pid")); run '$0 down' first"
    fi
    mkdir -p "$dir"
    # The example's one configuration, with this machine's addresses.
    sed -e "s|^listen = .*|listen = \"127.0.0.1:$port\"|" \
        -e "s|^url = \"postgres://.*\"|url = \"$(esc "$POSTGRES_URL")\"|" \
        -e "s|^url = \"redis://.*\"|url = \"$(esc "$REDIS_URL")\"|" \
        -e "s|^prefix = .*|prefix = \"$(esc "$REDIS_PREFIX")\"|" \
        "$here/toolwarden.toml" >"$dir/toolwarden.toml"
    if [ -n "${EXTRA_CONFIG:-}" ]; then
      [ -f "$EXTRA_CONFIG" ] || die "EXTRA_CONFIG names no file: $EXTRA_CONFIG"
      { echo; cat "$EXTRA_CONFIG"; } >>"$dir/toolwarden.toml"
    fi
    TOOLWARDEN_REPLICA=replica-$i nohup "$bin" serve --config "$dir/toolwarden.toml" \
      >"$dir/serve.log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
  done
  for i in 1 2 3; do
    local port=${ports[$((i - 1))]} deadline=$((SECONDS + 30))
    until get "$port" /healthz 2>/dev/null | grep -q '"status":"ok"'; do
      if ! kill -0 "$(cat "$RUN_DIR/replica-$i/pid")" 2>/dev/null; then
        cat "$RUN_DIR/replica-$i/serve.log" >&2
        die "replica-$i exited"
      fi
      [ $SECONDS -lt $deadline ] || { get "$port" /healthz >&2 || true; die "replica-$i never became ok"; }
      sleep 0.2
    done
    echo "replica-$i ok on http://127.0.0.1:$port (log: $RUN_DIR/replica-$i/serve.log)"
  done
}

status() {
  local i
  for i in 1 2 3; do
    echo "replica-$i: $(get "${ports[$((i - 1))]}" /healthz 2>&1 | head -1)"
  done
}

# Fails (exit 1) unless the replicas act as one.
check() {
  local p1=${ports[0]} p2=${ports[1]} p3=${ports[2]} out code
  status
  for p in "$p1" "$p2" "$p3"; do
    get "$p" /healthz | head -1 | grep -q '"redis":"ok"' || die "replica on $p does not reach Redis"
  done
  # A long call runs on replica 1 …
  out=$(post "$p1" /v1/turns \
    '{"detach": true, "calls": [{"type": "tool_use", "id": "c1", "name": "exec", "input": {"command": "sleep 30"}}]}')
  [ "$(tail -1 <<<"$out")" = 202 ] || die "the turn did not start on replica 1: $out"
  local turn; turn=$(head -1 <<<"$out" | sed -n 's/.*"turn_id":"\([^"]*\)".*/\1/p')
  echo "turn $turn runs on replica-1"
  # … replica 3 lists it, with the replica that runs it …
  out=$(get "$p3" /v1/turns/active)
  grep -q "\"turn_id\":\"$turn\"" <<<"$out" || die "replica 3 does not list $turn: $out"
  grep -q '"replica":"' <<<"$out" || die "replica 3 lists no replica: $out"
  echo "replica-3 lists it: $(head -1 <<<"$out" | cut -c1-160)…"
  # … and an abort posted to replica 2 stops it there.
  out=$(post "$p2" "/v1/turns/$turn/abort")
  code=$(tail -1 <<<"$out")
  [ "$code" = 200 ] || die "the abort through replica 2 answered $code: $out"
  echo "aborted through replica-2: $(head -1 <<<"$out")"
  local deadline=$((SECONDS + 10))
  while get "$p1" /v1/turns/active | grep -q "\"turn_id\":\"$turn\""; do
    [ $SECONDS -lt $deadline ] || die "the turn still runs on replica 1"
    sleep 0.1
  done
  echo "replica-1 no longer runs it: the three replicas act as one"
}

down() {
  local i pid
  for i in 1 2 3; do
    local file=$RUN_DIR/replica-$i/pid
    [ -f "$file" ] || continue
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      local deadline=$((SECONDS + 20))
      while kill -0 "$pid" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
        sleep 0.1
      done
      echo "replica-$i stopped"
    fi
    rm -f "$file"
  done
}

case ${1:-} in
  up) up ;;
  check) check ;;
  status) status ;;
  down) down ;;
  *) echo "usage: $0 up|check|status|down" >&2; exit 2 ;;
esac
