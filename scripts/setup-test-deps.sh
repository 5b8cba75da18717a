#!/usr/bin/env bash
# Installs the third-party programs the test suites run against into ./node_modules:
# the official MCP reference server `@modelcontextprotocol/server-everything`, pinned in
# package.json (exact version) and package-lock.json. Tests never download anything themselves;
# a test that needs one of these fails with a message pointing here when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null 2>&1; then
  echo "setup-test-deps: npm is required (install Node.js 18 or later)" >&2
  exit 1
fi
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi
test -x node_modules/.bin/mcp-server-everything || {
  echo "setup-test-deps: node_modules/.bin/mcp-server-everything is missing after install" >&2
  exit 1
}
echo "setup-test-deps: ok ($(node -p 'require("@modelcontextprotocol/server-everything/package.json").version'))"
