#!/usr/bin/env bash
# The OpenAI Node SDK against a built tandemd (tests/sdk/openai_check.mjs over TCP, then the
# batch flow tests/sdk/openai_batch.mjs over the Unix socket): installs the SDK
# from the npm registry into build/sdk-node on first use, so CI (no downloads) does not run it.
# Usage: scripts/sdk-check.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sdk="$build/sdk-node"
if [[ ! -d "$sdk/node_modules/openai" ]]; then
  mkdir -p "$sdk"
  npm install --prefix "$sdk" --silent --no-audit --no-fund openai >/dev/null
fi
dir=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
"$build/daemon/tandemd" --model models/stories260K.gguf --socket "$dir/tandem.sock" --threads 2 --log warn \
  --listen-tcp "127.0.0.1:$port" --set kv_pool_persist=false --set "state_dir=$dir/state" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.1
done
cp tests/sdk/openai_check.mjs tests/sdk/openai_batch.mjs "$sdk/"
TANDEM_URL="http://127.0.0.1:$port/v1" node "$sdk/openai_check.mjs"
TANDEM_SOCKET="$dir/tandem.sock" node "$sdk/openai_batch.mjs"
